"""The one definition of "inside a circle zone" (fleetfence.geo.circle_distance_m) and the
polygons drawn around a circle."""

from __future__ import annotations

import numpy as np
import shapely

from fleetfence.geo import LocalProjection, circle_distance_m, circle_polygon_m, haversine_m


def test_circle_distance_is_the_local_projection_around_the_centre() -> None:
    rng = np.random.default_rng(4)
    # (centre, how far its 5 km may stray from great-circle metres: the projection's distortion,
    # which grows with the latitude; docs/contracts.md, "Circle zones")
    cases = (((13.4, 52.5), 3e-4), ((-70.6, -33.4), 2e-4), ((151.2, -33.9), 2e-4), ((0.0, 0.0), 1e-6))
    for (lon0, lat0), ground_rtol in (*cases, ((25.0, 84.9), 3e-3)):
        proj = LocalProjection(lon0, lat0)
        x, y = rng.uniform(-5000, 5000, 500), rng.uniform(-5000, 5000, 500)
        lon, lat = proj.inverse(x, y)
        d = circle_distance_m(lon, lat, lon0, lat0)
        np.testing.assert_allclose(d, np.hypot(x, y), rtol=1e-9)
        np.testing.assert_allclose(d, haversine_m(lon0, lat0, lon, lat), rtol=ground_rtol)
    # Broadcast over many centres at once, as the zone index calls it.
    d = circle_distance_m(np.array([13.4, 13.5]), np.array([52.5, 52.6]), np.array([13.4, 13.5]), 52.6)
    assert d[1] == 0.0
    assert d[0] > 11_000


def test_circle_polygons_inscribed_and_containing() -> None:
    inside = shapely.Polygon(circle_polygon_m(100.0))
    around = shapely.Polygon(circle_polygon_m(100.0, outside=True))
    ang = np.linspace(0, 2 * np.pi, 3600)
    on_circle = shapely.points(100.0 * np.cos(ang), 100.0 * np.sin(ang))
    assert shapely.covers(around, on_circle).all()
    assert not shapely.covers(inside, on_circle).all()  # the chords cut inside the circle
    assert np.allclose(np.hypot(*np.asarray(inside.exterior.coords).T), 100.0)
    assert inside.area < np.pi * 100.0**2 < around.area < 1.001 * np.pi * 100.0**2
