"""Pure GeoJSON geometry validation for routes and zones (no I/O, no Redis).

The processor trusts what the vehicle master publishes, so every geometry is checked here once,
at the front door, with a message an admin can act on ("ring 0 self-intersects near 13.4, 52.5")
rather than a shapely exception text or a silent wrong corridor later.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import shapely
from shapely.geometry import shape
from shapely.validation import explain_validity

from fleetfence.geo import EARTH_RADIUS_M, MAX_CIRCLE_RADIUS_M, LocalProjection, circle_polygon_m
from vehicle_master.errors import GeometryError

Position = Sequence[float]

MAX_POINTS = 100_000  # a route or zone beyond this is a data error, and would slow every fix check
# A circle's centre stays off the poles, where the local projection its distance is measured in
# degenerates (as the map's Web Mercator does at 85.05 degrees).
MAX_CIRCLE_LAT = 85.0


def check_position(pos: Any, where: str) -> tuple[float, float]:
    """One GeoJSON position: [lon, lat] or [lon, lat, alt], finite and in range."""
    if not isinstance(pos, list | tuple) or not 2 <= len(pos) <= 3:
        raise GeometryError(f"{where}: a position is [lon, lat] (optionally with altitude), got {pos!r}")
    for v in pos:
        if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
            raise GeometryError(f"{where}: coordinates must be finite numbers, got {pos!r}")
    lon, lat = float(pos[0]), float(pos[1])
    if not -180.0 <= lon <= 180.0:
        raise GeometryError(f"{where}: longitude {lon} outside [-180, 180]")
    if not -90.0 <= lat <= 90.0:
        raise GeometryError(f"{where}: latitude {lat} outside [-90, 90]")
    return lon, lat


def validate_line_string(geometry: dict[str, Any]) -> dict[str, Any]:
    """A route line: a GeoJSON LineString with at least 2 distinct points, all in range.

    Returns the canonical geometry (floats, 2-D) so equal routes serialise identically.
    """
    if geometry.get("type") != "LineString":
        raise GeometryError(f"route geometry must be a LineString, got {geometry.get('type')!r}")
    coords = geometry.get("coordinates")
    if not isinstance(coords, list):
        raise GeometryError("LineString coordinates must be a list of positions")
    if len(coords) > MAX_POINTS:
        raise GeometryError(f"LineString has {len(coords)} points, at most {MAX_POINTS} are allowed")
    points = [check_position(p, f"point {i}") for i, p in enumerate(coords)]
    if len(set(points)) < 2:
        raise GeometryError(f"a route needs at least 2 distinct points, got {len(set(points))}")
    return {"type": "LineString", "coordinates": [list(p) for p in points]}


def _ring(ring: Any, where: str) -> list[list[float]]:
    if not isinstance(ring, list):
        raise GeometryError(f"{where}: a ring is a list of positions")
    pts = [check_position(p, f"{where} point {i}") for i, p in enumerate(ring)]
    if len(pts) < 4:
        raise GeometryError(f"{where}: a linear ring needs at least 4 positions, got {len(pts)}")
    if pts[0] != pts[-1]:
        raise GeometryError(f"{where}: a linear ring must be closed (first position equal to the last)")
    if len(set(pts)) < 3:
        raise GeometryError(f"{where}: a ring needs at least 3 distinct points")
    return [list(p) for p in pts]


def _polygon_rings(rings: Any, where: str) -> list[list[list[float]]]:
    if not isinstance(rings, list) or not rings:
        raise GeometryError(f"{where}: a polygon is a non-empty list of rings")
    return [_ring(r, f"{where} ring {i}") for i, r in enumerate(rings)]


def validate_zone_geometry(geometry: dict[str, Any]) -> dict[str, Any]:
    """A zone area: a valid GeoJSON Polygon or MultiPolygon (closed rings, no self-intersection,
    holes inside their shell, non-zero area), all coordinates in range. Returns it canonical."""
    kind = geometry.get("type")
    coords = geometry.get("coordinates")
    if kind == "Polygon":
        canonical: dict[str, Any] = {"type": "Polygon", "coordinates": _polygon_rings(coords, "polygon")}
    elif kind == "MultiPolygon":
        if not isinstance(coords, list) or not coords:
            raise GeometryError("MultiPolygon coordinates must be a non-empty list of polygons")
        canonical = {
            "type": "MultiPolygon",
            "coordinates": [_polygon_rings(p, f"polygon {i}") for i, p in enumerate(coords)],
        }
    else:
        raise GeometryError(f"zone geometry must be a Polygon or MultiPolygon, got {kind!r}")
    total = sum(len(r) for r in _rings_of(canonical))
    if total > MAX_POINTS:
        raise GeometryError(f"zone has {total} points, at most {MAX_POINTS} are allowed")
    geom = shape(canonical)
    if not shapely.is_valid(geom):
        raise GeometryError(f"invalid {kind}: {explain_validity(geom)}")
    if geom.area <= 0:
        raise GeometryError(f"{kind} has zero area")
    return canonical


def validate_circle(geometry: dict[str, Any]) -> dict[str, Any]:
    """A circle zone: a GeoJSON Point (its centre) with `radius_m`, a foreign member of the geometry
    object (RFC 7946, 6.1), as Tile38, Traccar and Amazon Location model circles. The radius is a
    finite number in (0, MAX_CIRCLE_RADIUS_M]; the centre is within MAX_CIRCLE_LAT of the equator,
    and the disc does not reach across the antimeridian. Returns it canonical (2-D, floats)."""
    if geometry.get("type") != "Point":
        raise GeometryError(f"a circle zone is a Point with radius_m, got {geometry.get('type')!r}")
    lon, lat = check_position(geometry.get("coordinates"), "centre")
    r = geometry.get("radius_m")
    if isinstance(r, bool) or not isinstance(r, int | float) or not math.isfinite(r):
        raise GeometryError(f"radius_m must be a finite number, got {r!r}")
    if not 0 < r <= MAX_CIRCLE_RADIUS_M:
        raise GeometryError(f"radius_m {r} outside (0, {MAX_CIRCLE_RADIUS_M:g}]")
    if abs(lat) > MAX_CIRCLE_LAT:
        raise GeometryError(f"a circle's centre must be within {MAX_CIRCLE_LAT} degrees of the equator")
    half_lon = float(r) / (math.radians(1.0) * EARTH_RADIUS_M * math.cos(math.radians(lat)))
    if abs(lon) + half_lon > 180.0:
        raise GeometryError("a circle must not reach across the antimeridian")
    return {"type": "Point", "coordinates": [lon, lat], "radius_m": float(r)}


def zone_area(geometry: dict[str, Any]) -> shapely.Geometry:
    """A valid zone geometry as a lon/lat Shapely geometry for overlap questions (which zones lie in
    an area): its polygon, or for a circle a polygon containing its disc (64 chords tangent to it).
    Never what decides a fix: that is `fleetfence.geo.circle_distance_m`."""
    if geometry.get("type") != "Point":
        return shape(geometry)
    lon0, lat0 = (float(v) for v in geometry["coordinates"][:2])
    ring = circle_polygon_m(float(geometry["radius_m"]), outside=True)
    lon, lat = LocalProjection(lon0, lat0).inverse(ring[:, 0], ring[:, 1])
    return shapely.polygons(np.column_stack((lon, lat)))


def _rings_of(geometry: dict[str, Any]) -> list[list[list[float]]]:
    if geometry["type"] == "Polygon":
        return list(geometry["coordinates"])
    return [r for poly in geometry["coordinates"] for r in poly]
