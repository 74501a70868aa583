"""The one local metric projection: metres east/north of a reference point.

The processor buffers corridors in metres, the simulator plans its kinematics in metres, the
reports and the benchmarks draw in metres; all of them must agree on what a metre is, or a corridor
the simulator thinks it respected is one the processor says was left. So the projection has one
definition, here.

It is equirectangular, i.e. an affine map of lon/lat: straight lines stay straight and "inside a
polygon" does not change between the two frames, so a shape drawn in metres is tested identically by
anyone who tests it in lon/lat. Accurate to well under 0.1% within ~50 km of the reference (routes
are city/regional scale), and exactly invertible, which buffering in metres and mapping back needs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
import shapely

EARTH_RADIUS_M = 6_371_008.8  # mean Earth radius (IUGG)

FloatArray = npt.NDArray[np.float64]


@dataclass(frozen=True)
class LocalProjection:
    """Equirectangular projection around (lon0, lat0)."""

    lon0: float
    lat0: float

    @property
    def kx(self) -> float:
        """Metres per degree of longitude at the reference latitude."""
        return math.radians(1.0) * EARTH_RADIUS_M * math.cos(math.radians(self.lat0))

    @property
    def ky(self) -> float:
        """Metres per degree of latitude."""
        return math.radians(1.0) * EARTH_RADIUS_M

    def forward(self, lon: Any, lat: Any) -> tuple[FloatArray, FloatArray]:
        """lon/lat (scalars or arrays) to metres east/north of the reference."""
        return (
            (np.asarray(lon, dtype=np.float64) - self.lon0) * self.kx,
            (np.asarray(lat, dtype=np.float64) - self.lat0) * self.ky,
        )

    def inverse(self, x: Any, y: Any) -> tuple[FloatArray, FloatArray]:
        """Metres east/north of the reference back to lon/lat."""
        return (
            np.asarray(x, dtype=np.float64) / self.kx + self.lon0,
            np.asarray(y, dtype=np.float64) / self.ky + self.lat0,
        )

    def to_metric(self, geom: shapely.Geometry) -> shapely.Geometry:
        """A lon/lat Shapely geometry in metres."""
        return shapely.transform(geom, lambda c: np.column_stack(self.forward(c[:, 0], c[:, 1])))

    def to_lonlat(self, geom: shapely.Geometry) -> shapely.Geometry:
        """A metric Shapely geometry back in lon/lat."""
        return shapely.transform(geom, lambda c: np.column_stack(self.inverse(c[:, 0], c[:, 1])))


def haversine_m(lon1: Any, lat1: Any, lon2: Any, lat2: Any) -> Any:
    """Great-circle distance in metres (scalars or arrays): for distances travelled, where the
    projection's distortion over long trips would add up."""
    lon1, lat1, lon2, lat2 = map(np.radians, (lon1, lat1, lon2, lat2))
    a = np.sin((lat2 - lat1) / 2) ** 2 + np.cos(lat1) * np.cos(lat2) * np.sin((lon2 - lon1) / 2) ** 2
    return 2 * EARTH_RADIUS_M * np.arcsin(np.sqrt(a))


# A circle zone's radius is at most this: a zone is city-scale, and the projection its distance is
# measured in strays from great-circle metres with the distance (at 52.5 degrees: 0.004% at 1 km,
# 0.02% at 5 km, 0.2% at 50 km; more towards the poles, 1.8% at 50 km and 85 degrees).
MAX_CIRCLE_RADIUS_M = 50_000.0


def circle_distance_m(lon: Any, lat: Any, centre_lon: Any, centre_lat: Any) -> FloatArray:
    """Distance in metres from a circle zone's centre (scalars or arrays, broadcast): the one
    definition of "within a circle zone", which is `circle_distance_m(...) <= radius_m`.

    Measured in the local projection around the centre (`LocalProjection(centre_lon, centre_lat)`),
    the frame the processor grows a polygon zone's hysteresis band in around its centroid: a circle
    and the polygon drawn around it by `circle_polygon_m` are the same shape in the same frame, so the
    two agree up to the polygon's chords. The processor, the simulator's truth and the reports all
    decide with this function (the reports in SQL, the same formula: docs/reports.md)."""
    clat = np.asarray(centre_lat, dtype=np.float64)
    kx = np.radians(1.0) * EARTH_RADIUS_M * np.cos(np.radians(clat))
    ky = np.radians(1.0) * EARTH_RADIUS_M
    dx = (np.asarray(lon, dtype=np.float64) - np.asarray(centre_lon, dtype=np.float64)) * kx
    dy = (np.asarray(lat, dtype=np.float64) - clat) * ky
    out: FloatArray = np.hypot(dx, dy)
    return out


def circle_polygon_m(radius_m: float, segments: int = 64, outside: bool = False) -> FloatArray:
    """A closed ring of `segments` chords around a circle of `radius_m` centred at the origin, in
    metres: on the circle (inscribed), or with its chords tangent to it (`outside`), which contains
    the whole disc, what a spatial index needs of a circle's cover."""
    r = radius_m / math.cos(math.pi / segments) if outside else radius_m
    a = np.linspace(0.0, 2.0 * math.pi, segments + 1)
    ring: FloatArray = np.column_stack((r * np.cos(a), r * np.sin(a)))
    ring[-1] = ring[0]
    return ring
