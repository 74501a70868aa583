"""Routes and zones of a simulated city: road-like synthetic polylines or routes from GeoJSON.

Pure (no I/O besides parsing a GeoJSON document handed in). Zones are rectangles laid across a
*straight* run of a route, away from every other route and from the rest of their own route, so a
vehicle of that route is inside a zone exactly when its arc length lies between the zone's two
edges; the ground truth can then be derived from the planned arc length alone (see
`simulator.scenario`), without testing polygons. A share of them can be circles centred on the run
instead (`ScenarioConfig.circle_zones`): along the run, inside a circle is again an interval of arc
length around its centre (`simulator.plan.Fleet` works out its ends in the circle's own frame).
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import shapely
from shapely.geometry import LineString, Polygon
from shapely.ops import substring

from fleetfence.errors import ConfigError
from fleetfence.geo import LocalProjection, circle_polygon_m
from fleetfence.rules import STOP_ZONE_KINDS
from simulator.geo import FloatArray, Polyline

logger = logging.getLogger(__name__)

DEFAULT_BBOX = (13.30, 52.47, 13.50, 52.56)  # lon/lat of central Berlin
EDGE_MARGIN_M = 3.0  # how far a decisive fix stays from any edge the processor tests


@dataclass(frozen=True)
class Run:
    """A straight stretch of a route, as arc lengths along it."""

    start_m: float
    end_m: float

    @property
    def length_m(self) -> float:
        return self.end_m - self.start_m


@dataclass
class ZoneGeom:
    """A rectangular zone across a straight run: inside <=> start_m < arc length < end_m. Or a
    circle centred on the run at (start_m + end_m) / 2, of radius (end_m - start_m) / 2: then
    `circle` is its registered centre (lon, lat) and radius, `polygon_m` a polygon containing the
    disc (in the city's frame), and `ring_lonlat` empty."""

    zone_id: str
    name: str
    kind: str
    route_index: int
    start_m: float
    end_m: float
    polygon_m: Polygon
    ring_lonlat: list[list[float]]
    circle: tuple[float, float, float] | None = None

    def geometry(self) -> dict[str, Any]:
        """The zone's GeoJSON geometry as registered in the vehicle master."""
        if self.circle is not None:
            lon, lat, radius = self.circle
            return {"type": "Point", "coordinates": [lon, lat], "radius_m": radius}
        return {"type": "Polygon", "coordinates": [self.ring_lonlat]}

    @property
    def planned_stop(self) -> bool:
        """Stopping here is planned (no UNPLANNED_STOP): registered explicitly with the zone."""
        return self.kind in STOP_ZONE_KINDS


@dataclass
class RouteGeom:
    route_id: str
    name: str
    line: Polyline
    line_m: LineString
    coords_lonlat: list[list[float]]
    runs: list[Run]
    zones: list[ZoneGeom] = field(default_factory=list)


@dataclass
class CityMap:
    projection: LocalProjection
    routes: list[RouteGeom]

    @property
    def zones(self) -> list[ZoneGeom]:
        return [z for r in self.routes for z in r.zones]


def parse_bbox(text: str) -> tuple[float, float, float, float]:
    """`min_lon,min_lat,max_lon,max_lat` -> tuple, validated."""
    try:
        a, b, c, d = (float(p) for p in text.split(","))
    except ValueError as exc:
        raise ConfigError(f"bbox must be min_lon,min_lat,max_lon,max_lat, got {text!r}") from exc
    if not (-180 <= a < c <= 180 and -85 <= b < d <= 85):
        raise ConfigError(f"bbox {text!r} is not a valid lon/lat box")
    return a, b, c, d


def _distance_to_box(x: float, y: float, h: float, box: tuple[float, float, float, float]) -> float:
    """How far one can go from (x, y) with heading h before leaving the box."""
    dx, dy = math.cos(h), math.sin(h)
    best = math.inf
    for lo, hi, p, d in ((box[0], box[2], x, dx), (box[1], box[3], y, dy)):
        if abs(d) > 1e-12:
            t = ((hi if d > 0 else lo) - p) / d
            best = min(best, t)
    return max(best, 0.0)


def synthetic_route(
    rng: np.random.Generator, box_m: tuple[float, float, float, float], length_m: float
) -> tuple[FloatArray, FloatArray, list[Run]]:
    """A street-like polyline: straight runs of 150-700 m with a vertex every 20-40 m, joined by
    rounded turns (mostly right angles, sometimes gentle bends), kept inside the box."""
    cx, cy = (box_m[0] + box_m[2]) / 2, (box_m[1] + box_m[3]) / 2
    w, h = box_m[2] - box_m[0], box_m[3] - box_m[1]
    x = float(rng.uniform(cx - 0.3 * w, cx + 0.3 * w))
    y = float(rng.uniform(cy - 0.3 * h, cy + 0.3 * h))
    heading = float(rng.uniform(0, 2 * math.pi))
    xs, ys, runs = [x], [y], []
    total = 0.0
    while total < length_m:
        room = _distance_to_box(x, y, heading, box_m)
        if room < 250:
            # Turn by a right angle towards the centre (or straight at it when boxed in).
            options = [heading + math.pi / 2, heading - math.pi / 2]
            to_c = math.atan2(cy - y, cx - x)
            heading = max(options, key=lambda a: math.cos(a - to_c))
            if _distance_to_box(x, y, heading, box_m) < 250:
                heading = to_c
            room = _distance_to_box(x, y, heading, box_m)
        run = min(float(rng.uniform(150, 700)), room - 60, length_m - total + 1)
        run = max(run, 20.0)
        n = max(1, round(run / float(rng.uniform(20, 40))))
        x0, y0 = x, y
        for i in range(1, n + 1):
            xs.append(x0 + math.cos(heading) * run * i / n)
            ys.append(y0 + math.sin(heading) * run * i / n)
        x, y = xs[-1], ys[-1]
        runs.append(Run(total, total + run))
        total += run
        if total >= length_m:
            break
        turn = math.pi / 2 if rng.random() < 0.6 else math.radians(float(rng.uniform(15, 40)))
        turn *= 1 if rng.random() < 0.5 else -1
        radius = 12.0
        step = radius * abs(turn) / 4
        for j in range(1, 4):  # a rounded corner: three short chords
            a = heading + turn * (j - 0.5) / 3
            x, y = x + math.cos(a) * step, y + math.sin(a) * step
            xs.append(x)
            ys.append(y)
            total += step
        heading += turn
    return np.asarray(xs), np.asarray(ys), runs


def straight_runs(line: Polyline, min_length_m: float = 0.0) -> list[Run]:
    """Maximal stretches of consecutive collinear segments (any polyline, e.g. from GeoJSON)."""
    runs: list[Run] = []
    start = 0
    n = len(line.ux)
    for i in range(1, n + 1):
        if (
            i == n
            or abs(line.ux[i] * line.uy[start] - line.uy[i] * line.ux[start]) > 1e-7
            or (line.ux[i] * line.ux[start] + line.uy[i] * line.uy[start] < 0)
        ):
            run = Run(float(line.cum_m[start]), float(line.cum_m[i]))
            if run.length_m >= min_length_m:
                runs.append(run)
            start = i
    return runs


def routes_from_geojson(doc: Any) -> list[tuple[str | None, str | None, list[list[float]]]]:
    """(id, name, lon/lat coordinates) of every LineString in a GeoJSON document."""
    out: list[tuple[str | None, str | None, list[list[float]]]] = []

    def visit(obj: Any, fid: str | None, name: str | None) -> None:
        if not isinstance(obj, dict):
            return
        kind = obj.get("type")
        if kind == "FeatureCollection":
            for f in obj.get("features") or []:
                visit(f, None, None)
        elif kind == "Feature":
            props = obj.get("properties") or {}
            rid = obj.get("id", props.get("route_id"))
            visit(obj.get("geometry"), None if rid is None else str(rid), props.get("name"))
        elif kind == "LineString":
            out.append((fid, name, [[float(c[0]), float(c[1])] for c in obj["coordinates"]]))
        elif kind == "MultiLineString":
            for i, part in enumerate(obj["coordinates"]):
                out.append(
                    (None if fid is None else f"{fid}-{i}", name, [[float(c[0]), float(c[1])] for c in part])
                )

    visit(doc, None, None)
    if not out:
        raise ConfigError("the GeoJSON file holds no LineString to use as a route")
    return out


def place_zones(
    city: CityMap,
    rng: np.random.Generator,
    zones_per_route: int,
    corridor_half_m: float,
    hysteresis_m: float,
    noise_bound_m: float,
    prefix: str,
    end_clear_m: float = 0.0,
    circle_share: float = 0.0,
) -> None:
    """Lay up to `zones_per_route` rectangles across straight runs of each route; each is a circle
    instead with probability `circle_share` (drawn only when it is above 0, so a seed keeps its
    zones without circles).

    A candidate is kept only if its grown shape (hysteresis + noise + margin) touches no other
    route, no other zone and no part of its own route outside the run it was laid on; so the only
    fixes that can ever be inside it are those of its own route on that run. Zones also keep
    `end_clear_m` from the route's end, where the completion rule moves fixes of its own
    (simulator.trips.end_nudge, which would undo the zone edges' clamp): along the route, and in
    the plane too, since a route that loops back passes its end point again far from its end.
    """
    guard = hysteresis_m + noise_bound_m + EDGE_MARGIN_M
    lateral = corridor_half_m + 25.0
    placed: list[Polygon] = []
    for ri, route in enumerate(city.routes):
        others = [r.line_m for j, r in enumerate(city.routes) if j != ri]
        end_point = shapely.Point(route.line.x[-1], route.line.y[-1])
        for k in range(zones_per_route):
            circle = circle_share > 0 and float(rng.random()) < circle_share
            for _attempt in range(60):
                length = float(rng.uniform(80, 200))
                need = length + 2 * (guard + 2.0)
                runs = [r for r in route.runs if r.length_m >= need]
                if not runs:
                    break
                run = runs[int(rng.integers(len(runs)))]
                a = run.start_m + guard + 2.0 + float(rng.uniform(0, run.length_m - need))
                b = a + length
                (x, y, tx, ty) = route.line.at(np.array([a, b]))
                nx, ny = -ty[0], tx[0]
                corners = [
                    (x[0] + nx * lateral, y[0] + ny * lateral),
                    (x[0] - nx * lateral, y[0] - ny * lateral),
                    (x[1] - nx * lateral, y[1] - ny * lateral),
                    (x[1] + nx * lateral, y[1] + ny * lateral),
                ]
                rect = Polygon(corners)
                if not rect.exterior.is_ccw:
                    rect = Polygon(corners[::-1])
                centre: tuple[float, float, float] | None = None
                if circle:
                    # The disc on the run's axis, its diameter the rectangle's length; the polygon
                    # standing for it contains it (its chords tangent to a slightly larger circle).
                    (cx, cy, _tx, _ty) = route.line.at(np.array([(a + b) / 2]))
                    ring = circle_polygon_m(length / 2 + 0.5, outside=True)
                    rect = Polygon(np.add(ring, (float(cx[0]), float(cy[0]))))
                    clon, clat = city.projection.inverse(cx, cy)
                    centre = (round(float(clon[0]), 8), round(float(clat[0]), 8), round(length / 2, 3))
                grown = rect.buffer(guard)
                lo, hi = a - guard - 1.0, b + guard + 1.0
                if hi + end_clear_m > route.line.length_m or grown.distance(end_point) < end_clear_m:
                    continue
                own_rest = [substring(route.line_m, 0, lo), substring(route.line_m, hi, route.line.length_m)]
                if any(grown.intersects(g) for g in [*others, *own_rest] if not g.is_empty) or any(
                    grown.intersects(p) for p in placed
                ):
                    continue
                placed.append(grown)
                ex, ey = rect.exterior.coords.xy
                lon, lat = city.projection.inverse(np.asarray(ex), np.asarray(ey))
                ring_ll = [[round(float(o), 8), round(float(t), 8)] for o, t in zip(lon, lat, strict=True)]
                ring_ll[-1] = ring_ll[0]
                # A depot and a restricted zone first: a long stop in the one is planned, in the
                # other it raises UNPLANNED_STOP (the ground truth knows which from the kind).
                kind = "depot" if k == 0 else "restricted" if k == 1 else "customer"
                route.zones.append(
                    ZoneGeom(
                        f"{prefix}z{ri:03d}-{k}",
                        f"{kind} {ri}-{k}",
                        kind,
                        ri,
                        a,
                        b,
                        rect,
                        [] if centre else ring_ll,
                        centre,
                    )
                )
                break
            else:
                logger.info("no room for a zone route=%s zone=%s", route.route_id, k)


def build_city(
    rng: np.random.Generator,
    *,
    n_routes: int,
    route_length_m: float,
    bbox: tuple[float, float, float, float],
    prefix: str,
    geojson: Any | None = None,
) -> CityMap:
    """Routes in one metric frame around the box centre (synthetic, or the GeoJSON's lines)."""
    proj = LocalProjection((bbox[0] + bbox[2]) / 2, (bbox[1] + bbox[3]) / 2)
    routes: list[RouteGeom] = []
    if geojson is not None:
        lines = routes_from_geojson(geojson)
        mean_lon = float(np.mean([c[0] for _i, _n, cs in lines for c in cs]))
        mean_lat = float(np.mean([c[1] for _i, _n, cs in lines for c in cs]))
        proj = LocalProjection(mean_lon, mean_lat)
        for i, (rid, name, coords) in enumerate(lines):
            x, y = proj.forward([c[0] for c in coords], [c[1] for c in coords])
            line = Polyline.of(x, y)
            routes.append(
                RouteGeom(
                    rid or f"{prefix}r{i:03d}",
                    name or f"route {i}",
                    line,
                    LineString(np.column_stack([line.x, line.y])),
                    [[c[0], c[1]] for c in coords],
                    straight_runs(line),
                )
            )
    else:
        bx0, by0 = proj.forward(bbox[0], bbox[1])
        bx1, by1 = proj.forward(bbox[2], bbox[3])
        box_m = (float(bx0), float(by0), float(bx1), float(by1))
        for i in range(n_routes):
            x, y, runs = synthetic_route(rng, box_m, route_length_m)
            lon, lat = proj.inverse(x, y)
            # Coordinates as registered (rounded to ~1 mm); the metric line is rebuilt from them.
            coords = [[round(float(o), 8), round(float(t), 8)] for o, t in zip(lon, lat, strict=True)]
            mx, my = proj.forward([c[0] for c in coords], [c[1] for c in coords])
            line = Polyline.of(mx, my)
            routes.append(
                RouteGeom(
                    f"{prefix}r{i:03d}",
                    f"simulated route {i}",
                    line,
                    LineString(np.column_stack([line.x, line.y])),
                    coords,
                    runs,
                )
            )
    return CityMap(proj, routes)


def excursion_points(
    route: RouteGeom, s: FloatArray, side: FloatArray, offsets_m: FloatArray
) -> tuple[FloatArray, FloatArray]:
    """Points `offsets_m` to the left (side=+1) or right (-1) of the route at arc lengths s."""
    x, y, tx, ty = route.line.at(s)
    return x - ty * side * offsets_m, y + tx * side * offsets_m


def excursion_safe(
    route: RouteGeom,
    zones_grown: shapely.Geometry | None,
    s: FloatArray,
    side: FloatArray,
    offsets_m: list[float],
    min_route_distance_m: float,
    min_zone_distance_m: float,
) -> np.ndarray:
    """Whether every excursion point is clearly outside the corridor and clear of every zone."""
    ok = np.ones(len(s), dtype=bool)
    for off in offsets_m:
        x, y = excursion_points(route, s, side, np.full(len(s), off))
        pts = shapely.points(x, y)
        ok &= shapely.distance(route.line_m, pts) >= min_route_distance_m
        if zones_grown is not None:
            ok &= shapely.distance(zones_grown, pts) >= min_zone_distance_m
    return ok
