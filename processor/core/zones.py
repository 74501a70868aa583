"""Zone geometry: polygon and circle zones and the H3 index that finds a fix's candidate zones
among thousands. Pure functions, no I/O.

A fix *enters* a zone inside its polygon and *leaves* it only outside the polygon grown by
`hysteresis_m` (in the local projection around its centroid): GPS jitter smaller than the band
cannot make alerts flap.

A circle zone (a Point with `radius_m`) is decided exactly, never by a polygon of it: a fix enters
within `radius_m` of the centre (`fleetfence.geo.circle_distance_m`, in the local projection around
the centre: the frame a polygon zone is grown in around its centroid) and leaves beyond
`radius_m + hysteresis_m`, which is the disc grown by the band, as a polygon's `outer` is the polygon
grown by it. Its polygons (`polygon`, `outer`) only cover the disc for the H3 index.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import h3
import numpy as np
import shapely
from h3ronpy.vector import coordinates_to_cells
from shapely.geometry import MultiPolygon, Polygon, shape

from fleetfence.geo import LocalProjection, circle_distance_m, circle_polygon_m
from fleetfence.rules import STOP_ZONE_KINDS

ZONE_H3_RESOLUTION = 9  # ~0.1 km² cells: a few hundred cells for a depot-sized zone


@dataclass(frozen=True)
class Circle:
    """A circle zone's exact shape: inside within `radius_m` of the centre, still inside within
    `outer_m` (the radius grown by the hysteresis band)."""

    lon: float
    lat: float
    radius_m: float
    outer_m: float


@dataclass
class CompiledZone:
    zone_id: str
    version: int
    kind: str
    dwell_limit_s: float | None
    # A zone where stopping is planned (a depot, a customer, a rest area): no UNPLANNED_STOP in it.
    planned_stop: bool
    # lon/lat, prepared: the "enter" shape (for a circle: a polygon around the disc, the index's only)
    polygon: Polygon | MultiPolygon
    # lon/lat, prepared: grown by the hysteresis band, the "still inside" shape (for a circle: a
    # polygon around the grown disc, for the index)
    outer: Polygon | MultiPolygon
    circle: Circle | None = None  # a circle zone, decided by its distance from the centre


# A circle's index polygons lie this far outside its discs (metres): the H3 cells found from them
# must cover every point of the disc despite rounding in the lon/lat <-> metre maps, and a cell's
# planar outline (what decides a "full" cell) departs from its geodesic edges by far less.
CIRCLE_COVER_PAD_M = 1.0


def _circle_cover(proj: LocalProjection, radius_m: float) -> Polygon:
    """A polygon (lon/lat) containing the whole disc of `radius_m` around the projection's reference."""
    ring = circle_polygon_m(radius_m + CIRCLE_COVER_PAD_M, outside=True)
    lon, lat = proj.inverse(ring[:, 0], ring[:, 1])
    return Polygon(np.column_stack((lon, lat)))


def compile_zone(zone_id: str, version: int, data: dict[str, Any], hysteresis_m: float) -> CompiledZone:
    geometry = data["geometry"]
    circle: Circle | None = None
    if geometry.get("type") == "Point":
        lon, lat = (float(v) for v in geometry["coordinates"][:2])
        radius = float(geometry["radius_m"])
        circle = Circle(lon, lat, radius, radius + hysteresis_m)
        proj = LocalProjection(lon, lat)
        poly: Polygon | MultiPolygon = _circle_cover(proj, radius)
        outer = _circle_cover(proj, circle.outer_m)
    else:
        poly = shape(geometry)
        if not isinstance(poly, Polygon | MultiPolygon):
            raise ValueError(f"zone {zone_id} geometry must be a Polygon, a MultiPolygon or a circle")
        c = poly.centroid
        proj = LocalProjection(c.x, c.y)
        outer = proj.to_lonlat(shapely.buffer(proj.to_metric(poly), hysteresis_m, quad_segs=4))
    shapely.prepare(poly)
    shapely.prepare(outer)
    dwell = data.get("dwell_limit_s")
    kind = str(data.get("kind", "other"))
    planned = data.get("planned_stop")
    return CompiledZone(
        zone_id,
        version,
        kind,
        None if dwell is None else float(dwell),
        kind in STOP_ZONE_KINDS if planned is None else bool(planned),
        poly,
        outer,
        circle,
    )


def _cell_inside(z: CompiledZone, cell: str, cell_poly: Polygon) -> bool:
    """Whether every point of an H3 cell is inside the zone's "enter" shape (then its fixes need no
    test). A circle's disc is convex in the frame it is measured in, and that frame is an affine map
    of lon/lat, so the cell's outline is inside when its vertices are, with the pad for its geodesic
    edges."""
    if z.circle is None:
        return bool(shapely.contains(z.polygon, cell_poly))
    lat, lon = np.asarray(h3.cell_to_boundary(cell)).T
    d = circle_distance_m(lon, lat, z.circle.lon, z.circle.lat)
    return bool((d <= z.circle.radius_m - CIRCLE_COVER_PAD_M).all())


def _h3_shape(geom: Polygon | MultiPolygon) -> Any:
    return h3.geo_to_h3shape(shapely.geometry.mapping(geom))


def h3_cells_int(lat: np.ndarray, lon: np.ndarray, resolution: int) -> np.ndarray:
    """H3 cells (uint64) of many points in one native call: h3ronpy's vectorized
    `coordinates_to_cells`, with the same cells as h3-py's per-point `latlng_to_cell` and no
    Python call per point."""
    if not len(lat):
        return np.zeros(0, dtype=np.uint64)
    cells = coordinates_to_cells(
        np.ascontiguousarray(lat, dtype=np.float64), np.ascontiguousarray(lon, dtype=np.float64), resolution
    )
    return np.asarray(cells, dtype=np.uint64)


def _pairs(keys: np.ndarray, values: np.ndarray, query: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """All (i, values[j]) with keys[j] == query[i], for `keys` sorted: a vectorized multimap lookup
    (one searchsorted over every query, a second only over the hits)."""
    empty = np.zeros(0, dtype=np.int64)
    if not len(keys) or not len(query):
        return empty, empty
    lo = np.searchsorted(keys, query, "left")
    hit = np.flatnonzero(keys[np.minimum(lo, len(keys) - 1)] == query)
    if not len(hit):
        return empty, empty
    lo = lo[hit]
    count = np.searchsorted(keys, query[hit], "right") - lo
    fix = np.repeat(hit, count)
    offset = np.arange(len(fix)) - np.repeat(np.cumsum(count) - count, count)
    return fix, values[np.repeat(lo, count) + offset]


Pairs = tuple[np.ndarray, np.ndarray]  # (fix positions, zone positions), same length


@dataclass
class ZoneIndex:
    """H3 index over many zones: cell -> zones that cover it fully or partly.

    A fix looks up its cell; zones whose *outer* shape covers the cell fully contain the fix without
    a polygon test; zones that only overlap the cell get the exact vectorized test. Built from the
    outer (grown) shapes so the same candidates serve the enter and the stay-inside tests. The two
    cell -> zone multimaps are sorted uint64 arrays, so a whole batch is looked up with numpy
    instead of one dict probe per fix.
    """

    zones: list[CompiledZone]
    resolution: int = ZONE_H3_RESOLUTION
    full_cells: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.uint64))
    full_zones: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    partial_cells: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.uint64))
    partial_zones: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    _polygons: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=object), repr=False)
    _outers: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=object), repr=False)
    _is_circle: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=bool), repr=False)
    _circle: np.ndarray = field(default_factory=lambda: np.zeros((0, 4)), repr=False)  # lon, lat, r, outer

    @staticmethod
    def build(zones: Iterable[CompiledZone], resolution: int = ZONE_H3_RESOLUTION) -> ZoneIndex:
        idx = ZoneIndex(sorted(zones, key=lambda z: z.zone_id), resolution)
        full: list[tuple[int, int]] = []
        partial: list[tuple[int, int]] = []
        for zi, z in enumerate(idx.zones):
            shp = _h3_shape(z.outer)
            overlap = set(h3.h3shape_to_cells_experimental(shp, resolution, "overlap"))
            full_cells = set(h3.h3shape_to_cells_experimental(shp, resolution, "full"))
            # Trust "full" only where planar Shapely agrees, so a fix decided without a polygon test
            # gets the same answer the exact test would give.
            for cell in full_cells:
                cell_poly = Polygon([(lng, lat) for lat, lng in h3.cell_to_boundary(cell)])
                dest = full if _cell_inside(z, cell, cell_poly) else partial
                dest.append((h3.str_to_int(cell), zi))
            partial.extend((h3.str_to_int(cell), zi) for cell in overlap - full_cells)
        idx.full_cells, idx.full_zones = _sorted_multimap(full)
        idx.partial_cells, idx.partial_zones = _sorted_multimap(partial)
        idx._polygons = np.array([z.polygon for z in idx.zones] + [None], dtype=object)[:-1]
        idx._outers = np.array([z.outer for z in idx.zones] + [None], dtype=object)[:-1]
        circles = [z.circle for z in idx.zones]
        idx._is_circle = np.array([c is not None for c in circles], dtype=bool)
        idx._circle = np.array(
            [(c.lon, c.lat, c.radius_m, c.outer_m) if c else (0.0, 0.0, 0.0, 0.0) for c in circles],
            dtype=np.float64,
        ).reshape(-1, 4)
        return idx

    def __len__(self) -> int:
        return len(self.zones)

    def memberships(self, lon: np.ndarray, lat: np.ndarray) -> tuple[Pairs, Pairs]:
        """(fix, zone) pairs inside the zone polygon, and pairs inside the grown outer shape, each
        as two index arrays (fix positions, positions in `zones`).

        Pairs from fully covered cells skip the polygon test; the rest are tested in one
        contains_xy call per shape kind, grouped by zone so each prepared polygon stays in cache,
        and the circle zones' pairs by their distance from the centre, in one vectorized call.
        """
        if not self.zones or not len(lon):
            empty = np.zeros(0, dtype=np.int64)
            return (empty, empty), (empty, empty)
        cells = h3_cells_int(lat, lon, self.resolution)
        full_fix, full_zone = _pairs(self.full_cells, self.full_zones, cells)
        test_fix, test_zone = _pairs(self.partial_cells, self.partial_zones, cells)
        inner_fix, inner_zone = [full_fix], [full_zone]
        outer_fix, outer_zone = [full_fix], [full_zone]
        if len(test_fix):
            keys = test_zone.astype(np.uint16) if len(self.zones) < 65536 else test_zone
            order = np.argsort(keys, kind="stable")  # a radix sort for 16-bit keys
            test_fix, test_zone = test_fix[order], test_zone[order]
            x, y = lon[test_fix], lat[test_fix]
            circle = self._is_circle[test_zone]
            if not circle.any():  # polygons only: one call per shape kind, no copies
                in_poly = shapely.contains_xy(self._polygons[test_zone], x, y)
                in_outer = shapely.contains_xy(self._outers[test_zone], x, y)
            else:
                in_poly, in_outer = self._mixed_tests(test_zone, x, y, circle)
            inner_fix.append(test_fix[in_poly])
            inner_zone.append(test_zone[in_poly])
            outer_fix.append(test_fix[in_outer])
            outer_zone.append(test_zone[in_outer])
        return (
            (np.concatenate(inner_fix), np.concatenate(inner_zone)),
            (np.concatenate(outer_fix), np.concatenate(outer_zone)),
        )

    def _mixed_tests(
        self, zone: np.ndarray, x: np.ndarray, y: np.ndarray, circle: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        """(inside, inside the grown shape) of candidate pairs among polygons and circles: the
        polygons' by `contains_xy`, the circles' by their distance from the centre."""
        in_poly = np.zeros(len(zone), dtype=bool)
        in_outer = np.zeros(len(zone), dtype=bool)
        poly = np.flatnonzero(~circle)
        if len(poly):
            in_poly[poly] = shapely.contains_xy(self._polygons[zone[poly]], x[poly], y[poly])
            in_outer[poly] = shapely.contains_xy(self._outers[zone[poly]], x[poly], y[poly])
        disc = np.flatnonzero(circle)
        c = self._circle[zone[disc]]
        d = circle_distance_m(x[disc], y[disc], c[:, 0], c[:, 1])
        in_poly[disc] = d <= c[:, 2]
        in_outer[disc] = d <= c[:, 3]
        return in_poly, in_outer


def _sorted_multimap(pairs: list[tuple[int, int]]) -> tuple[np.ndarray, np.ndarray]:
    if not pairs:
        return np.zeros(0, dtype=np.uint64), np.zeros(0, dtype=np.int64)
    arr = np.array(pairs, dtype=np.uint64)
    order = np.lexsort((arr[:, 1], arr[:, 0]))
    return arr[order, 0], arr[order, 1].astype(np.int64)
