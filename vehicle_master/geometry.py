"""Pure GeoJSON geometry validation for routes and zones (no I/O, no Redis).

The processor trusts what the vehicle master publishes, so every geometry is checked here once,
at the front door, with a message an admin can act on ("ring 0 self-intersects near 13.4, 52.5")
rather than a shapely exception text or a silent wrong corridor later.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import shapely
from shapely.geometry import shape
from shapely.validation import explain_validity

from vehicle_master.errors import GeometryError

Position = Sequence[float]

MAX_POINTS = 100_000  # a route or zone beyond this is a data error, and would slow every fix check


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


def _rings_of(geometry: dict[str, Any]) -> list[list[list[float]]]:
    if geometry["type"] == "Polygon":
        return list(geometry["coordinates"])
    return [r for poly in geometry["coordinates"] for r in poly]
