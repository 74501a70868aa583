"""Route geometry: corridors and progress along a route. Pure functions, no I/O.

Everything a micro-batch needs is answered by one vectorized Shapely 2 call over the whole batch:
corridors are buffered in metres (a local tangent-plane projection around each route) and then
mapped back to lon/lat, and the fixes of a batch are grouped by route so each route's prepared
corridor tests all of its fixes in one `shapely.contains_xy` call. An H3 pre-filter does not pay
for corridors (nearly every fix of a narrow corridor falls in a boundary cell, which needs the exact
test anyway); H3 is used where it does pay: finding candidate zones among thousands
(processor.core.zones).

Hysteresis is spatial as well as temporal: a fix counts as *outside* when it leaves the corridor and
as *back inside* only once it is within the inner corridor (narrower by `hysteresis_m`). GPS jitter
smaller than the band cannot make alerts flap.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import shapely
from shapely.geometry import LineString, MultiPolygon, Polygon, shape

from fleetfence.geo import LocalProjection
from fleetfence.rules import RouteRules


@dataclass
class CompiledRoute:
    """A route version ready for vectorized tests (built once per (route_id, version))."""

    route_id: str
    version: int
    rules: RouteRules
    line_lonlat: LineString
    projection: LocalProjection
    line_m: LineString
    length_m: float
    corridor: Polygon | MultiPolygon  # lon/lat, prepared
    inner: Polygon | MultiPolygon  # lon/lat, prepared; the "back inside" band
    segments: RouteSegments | None = None


@dataclass
class RouteSegments:
    """The route line as metric segments with their progress, and an R-tree over them: what finds
    every pass of the route near a fix (`route_progress`)."""

    ax: np.ndarray
    ay: np.ndarray
    dx: np.ndarray
    dy: np.ndarray
    length: np.ndarray
    start_m: np.ndarray  # progress at each segment's start
    tree: shapely.STRtree
    end_x: float
    end_y: float

    @staticmethod
    def of(line_m: LineString) -> RouteSegments:
        xy = np.asarray(line_m.coords)[:, :2]
        a, b = xy[:-1], xy[1:]
        d = b - a
        length = np.hypot(d[:, 0], d[:, 1])
        start = np.concatenate(([0.0], np.cumsum(length)[:-1]))
        tree = shapely.STRtree(shapely.linestrings(np.stack([a, b], axis=1)))
        return RouteSegments(
            a[:, 0].copy(),
            a[:, 1].copy(),
            d[:, 0].copy(),
            d[:, 1].copy(),
            length,
            start,
            tree,
            float(xy[-1, 0]),
            float(xy[-1, 1]),
        )


def compile_route(route_id: str, version: int, data: dict[str, Any], hysteresis_m: float) -> CompiledRoute:
    """Build the corridor polygons of one route version from its master-data `data`."""
    line = shape(data["geometry"])
    if not isinstance(line, LineString):
        raise ValueError(f"route {route_id} geometry must be a LineString")
    rules = RouteRules.from_master(data)
    c = line.centroid
    proj = LocalProjection(c.x, c.y)
    line_m = proj.to_metric(line)
    half = rules.corridor_width_m / 2.0
    inner_half = max(half - hysteresis_m, half / 2.0)
    # quad_segs=4: round joins within 1 m of the true arc at a 50 m half width, and half the
    # vertices of the default (the point-in-polygon cost grows with them).
    corridor = proj.to_lonlat(shapely.buffer(line_m, half, quad_segs=4))
    inner = proj.to_lonlat(shapely.buffer(line_m, inner_half, quad_segs=4))
    shapely.prepare(corridor)
    shapely.prepare(inner)
    return CompiledRoute(
        route_id,
        version,
        rules,
        line,
        proj,
        line_m,
        float(line_m.length),
        corridor,
        inner,
        RouteSegments.of(line_m),
    )


def _group_by_route(route_index: np.ndarray, sel: np.ndarray) -> np.ndarray:
    """`sel` reordered so fixes of the same route are contiguous (stable, so arrival order holds
    within a route). The index is narrowed to 16 bits where it fits: numpy's stable sort is then a
    radix sort instead of a merge sort of 64-bit keys."""
    keys = route_index[sel]
    if len(keys) and int(keys.max()) < 65536:
        keys = keys.astype(np.uint16)
    return sel[np.argsort(keys, kind="stable")]


def contains_by_route(
    shapes: Sequence[shapely.Geometry | None], route_index: np.ndarray, lon: np.ndarray, lat: np.ndarray
) -> np.ndarray:
    """`shapes[route_index[i]]` contains fix i, for fixes with `route_index >= 0` (True elsewhere).

    Fixes are grouped by route, and each group is one `contains_xy` call against one prepared
    polygon: the polygon's index stays hot in cache (arrival order would hop between polygons), and
    a scalar geometry spares building and walking an object array as long as the batch. Clipping
    corridors into planar tiles to shorten each point-in-polygon test does not pay: nearly every fix
    lands in a partial tile, and hopping between thousands of small pieces thrashes the cache.
    """
    out = np.ones(len(lon), dtype=bool)
    sel = np.flatnonzero(route_index >= 0)
    if not len(sel):
        return out
    sel = _group_by_route(route_index, sel)
    idx = route_index[sel]
    x, y = lon[sel], lat[sel]
    res = np.ones(len(sel), dtype=bool)
    cuts = np.flatnonzero(idx[1:] != idx[:-1]) + 1
    starts = np.concatenate(([0], cuts)).tolist()
    ends = np.concatenate((cuts, [len(sel)])).tolist()
    for a, b in zip(starts, ends, strict=True):
        shape_ = shapes[int(idx[a])]
        if shape_ is not None:
            res[a:b] = shapely.contains_xy(shape_, x[a:b], y[a:b])
    out[sel] = res
    return out


def corridor_tests(
    routes: Sequence[CompiledRoute | None],
    route_index: np.ndarray,
    lon: np.ndarray,
    lat: np.ndarray,
    inner_mask: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """For each fix, (inside the corridor, inside the inner band) of its own route.

    `route_index[i]` indexes `routes`; -1 (or a None route) means "no route" and yields True for
    both (an unassigned vehicle is never off-route). The inner band is only tested where
    `inner_mask` says it can matter.
    """
    inside = contains_by_route([r.corridor if r is not None else None for r in routes], route_index, lon, lat)
    if inner_mask is None or inner_mask.any():
        inner = inner_band_tests(routes, route_index, lon, lat, inner_mask)
    else:
        inner = np.ones(len(lon), dtype=bool)
    return inside, inner


def inner_band_tests(
    routes: Sequence[CompiledRoute | None],
    route_index: np.ndarray,
    lon: np.ndarray,
    lat: np.ndarray,
    mask: np.ndarray | None = None,
) -> np.ndarray:
    """Inside the inner ("back on route") band of its own route, tested only where `mask` is set."""
    idx = route_index if mask is None else np.where(mask, route_index, -1)
    return contains_by_route([r.inner if r is not None else None for r in routes], idx, lon, lat)


# Near-ties inside a pass (fractions of the corridor's half width): points within _TIE of the
# nearest, more than _LEG apart along the route, are separate legs.
_TIE = 0.25
_LEG = 0.5


class SegmentTable(Protocol):
    """Metric segments with their progress: one route's (`RouteSegments`) or a set's (`RouteSetIndex`)."""

    ax: np.ndarray
    ay: np.ndarray
    dx: np.ndarray
    dy: np.ndarray
    length: np.ndarray
    start_m: np.ndarray


@dataclass
class RouteSetIndex:
    """Every segment of a set of routes in one R-tree (in lon/lat), with each segment's metric
    numbers in its own route's frame: what lets `route_progress` find the passes of a whole batch
    with one query, however many routes it touches.

    Why one tree and not one per route: a live batch holds a fix or two per vehicle spread over
    hundreds of routes, and a query per route pays its Python and NumPy set-up for those one or two
    fixes, which then outweighs the rest of the engine's work on them. A route's frame is an affine
    image of lon/lat (`LocalProjection`), so a segment within `d` metres of a fix in the frame
    crosses the lon/lat box of half-sides `d/kx`, `d/ky` around it: the box query finds every
    candidate, and the exact distance is then computed in the route's frame."""

    keys: dict[tuple[str, int], int]
    lon0: np.ndarray  # per route position
    lat0: np.ndarray
    kx: np.ndarray
    ky: np.ndarray
    half: np.ndarray  # the corridor's half width
    end_x: np.ndarray
    end_y: np.ndarray
    segments: list[RouteSegments]  # per route position: its own segments and R-tree (metric)
    seg_route: np.ndarray  # per segment: its route's position
    ax: np.ndarray
    ay: np.ndarray
    dx: np.ndarray
    dy: np.ndarray
    length: np.ndarray
    start_m: np.ndarray
    tree: shapely.STRtree

    @staticmethod
    def of(routes: Iterable[CompiledRoute]) -> RouteSetIndex:
        rs = [r for r in routes if r.segments is not None]
        segs = [r.segments for r in rs if r.segments is not None]
        lines = []
        for r in rs:
            c = np.asarray(r.line_lonlat.coords)[:, :2]
            lines.append(shapely.linestrings(np.stack([c[:-1], c[1:]], axis=1)) if len(c) > 1 else [])

        def cat(arrays: list[np.ndarray], dtype: Any = np.float64) -> np.ndarray:
            return np.concatenate(arrays) if arrays else np.zeros(0, dtype=dtype)

        return RouteSetIndex(
            {(r.route_id, r.version): i for i, r in enumerate(rs)},
            np.array([r.projection.lon0 for r in rs], dtype=np.float64),
            np.array([r.projection.lat0 for r in rs], dtype=np.float64),
            np.array([r.projection.kx for r in rs], dtype=np.float64),
            np.array([r.projection.ky for r in rs], dtype=np.float64),
            np.array([r.rules.corridor_width_m / 2.0 for r in rs], dtype=np.float64),
            np.array([s.end_x for s in segs], dtype=np.float64),
            np.array([s.end_y for s in segs], dtype=np.float64),
            segs,
            cat([np.full(len(s.ax), i, dtype=np.int64) for i, s in enumerate(segs)], np.int64),
            cat([s.ax for s in segs]),
            cat([s.ay for s in segs]),
            cat([s.dx for s in segs]),
            cat([s.dy for s in segs]),
            cat([s.length for s in segs]),
            cat([s.start_m for s in segs]),
            shapely.STRtree(cat([np.asarray(g, dtype=object) for g in lines], object)),
        )

    def positions(self, routes: Sequence[CompiledRoute | None]) -> np.ndarray | None:
        """Each route's position here (-1 for None or a route without segments), or None when one
        of them is not in this index."""
        out = np.full(len(routes), -1, dtype=np.int64)
        for i, r in enumerate(routes):
            if r is None or r.segments is None:
                continue
            p = self.keys.get((r.route_id, r.version))
            if p is None:
                return None
            out[i] = p
        return out


# A route with at least this many fixes in a batch is queried in its own R-tree (one query's set-up
# is then spread over many fixes); the others share one query of the whole set's tree.
_OWN_TREE_MIN_FIXES = 64


def _candidate_segments(
    index: RouteSetIndex,
    gr: np.ndarray,
    x: np.ndarray,
    y: np.ndarray,
    lon: np.ndarray,
    lat: np.ndarray,
    half: np.ndarray,
) -> list[tuple[np.ndarray, np.ndarray, SegmentTable, float | None]]:
    """Groups of (fix, segment) pairs, positions in the batch's selection and in the group's
    segment table, holding every segment within the corridor's half width of each fix (and possibly
    more): one group per route with its own query (its own table, small enough to stay in cache, and
    its half width: GEOS kept only the segments within it), one for the rest (the whole set's table,
    None: `_passes` keeps the pairs within each fix's half width).

    The trade-off: the whole set's tree costs more per fix (its boxes catch other routes' segments
    and are built per fix), a route's own tree costs a query's set-up per route. A route with many
    fixes in the batch repays its own query; a route with a few does not, so only routes with at
    least `_OWN_TREE_MIN_FIXES` fixes keep their own tree."""
    per_route = np.bincount(gr, minlength=len(index.kx))
    own = per_route[gr] >= _OWN_TREE_MIN_FIXES
    groups: list[tuple[np.ndarray, np.ndarray, SegmentTable, float | None]] = []
    shared = np.flatnonzero(~own)
    if len(shared):
        g = gr[shared]
        ex, ey = half[shared] / index.kx[g] * _BOX_PAD, half[shared] / index.ky[g] * _BOX_PAD
        lo, la = lon[shared], lat[shared]
        # Envelope overlap only: a superset of the segments near the fix, which the caller's exact
        # distance narrows (a GEOS predicate per candidate would only repeat that work, slower).
        p, sg = index.tree.query(shapely.box(lo - ex, la - ey, lo + ex, la + ey))
        mine = index.seg_route[sg] == g[p]
        groups.append((shared[p[mine]], sg[mine], index, None))
    if own.any():
        fixes = _group_by_route(gr, np.flatnonzero(own))
        routes = gr[fixes]
        cuts = np.flatnonzero(routes[1:] != routes[:-1]) + 1
        for f in np.split(fixes, cuts):
            r = int(gr[f[0]])
            own_segments = index.segments[r]
            pts = shapely.points(x[f], y[f])
            p, sg = own_segments.tree.query(pts, predicate="dwithin", distance=index.half[r])
            groups.append((f[p], sg, own_segments, float(index.half[r])))
    return groups


# A box's margin over the corridor's half width: rounding in the lon/lat <-> metre maps must never
# drop a segment the exact distance keeps.
_BOX_PAD = 1.0 + 1e-6


def route_progress(
    routes: Sequence[CompiledRoute | None],
    route_index: np.ndarray,
    lon: np.ndarray,
    lat: np.ndarray,
    mask: np.ndarray,
    index: RouteSetIndex | None = None,
) -> tuple[np.ndarray, dict[int, tuple[float, ...]], np.ndarray]:
    """Progress along its own route, and distance to the route's end, of each fix where `mask` is
    set (fixes in the corridor): (progress, the fixes near more than one pass, end distance).

    A "pass" is a stretch of the route near the fix: the nearest points of the segments within half
    the corridor width, grouped where they lie within a corridor's width of each other along the
    route (a hairpin's two legs are neighbouring segments yet two passes), and within a pass, the
    near-equally near points of a U-turn's two legs kept apart. Most fixes are near one
    pass and get its nearest point's progress (NaN elsewhere); a fix where the route uses the same
    street twice (out and back, or a crossing) is near several, and gets all of their progress
    values, sorted, in the dict: which one continues the vehicle's
    progress is the state machine's call (`domain.continue_progress`), since it needs the previous
    fix. The whole batch is one R-tree query over every segment of `index` (the catalog keeps one
    for every route it compiled, `Catalog.route_set`; without one, it is built from `routes`).
    """
    n = len(lon)
    progress = np.full(n, np.nan)
    end_dist = np.full(n, np.inf)
    multi: dict[int, tuple[float, ...]] = {}
    sel = np.flatnonzero(mask & (route_index >= 0))
    if not len(sel):
        return progress, multi, end_dist
    pos = index.positions(routes) if index is not None else None
    if index is None or pos is None:
        index = RouteSetIndex.of(r for r in routes if r is not None)
        pos = index.positions(routes)
        assert pos is not None
    gr = pos[route_index[sel]]
    sel, gr = sel[gr >= 0], gr[gr >= 0]
    if not len(sel):
        return progress, multi, end_dist
    # Each fix in its own route's frame (the same operations as `LocalProjection.forward`).
    x = (lon[sel] - index.lon0[gr]) * index.kx[gr]
    y = (lat[sel] - index.lat0[gr]) * index.ky[gr]
    end_dist[sel] = np.hypot(x - index.end_x[gr], y - index.end_y[gr])
    half = index.half[gr]
    for pi, si, table, route_half in _candidate_segments(index, gr, x, y, lon[sel], lat[sel], half):
        _passes(table, sel, x, y, half if route_half is None else route_half, pi, si, progress, multi)
    return progress, multi, end_dist


def _tail(h: np.ndarray | float) -> np.ndarray | float:
    """Per-pair half widths from the second pair on (what a comparison with the previous pair uses)."""
    return h[1:] if isinstance(h, np.ndarray) else h


def _passes(
    index: SegmentTable,
    sel: np.ndarray,
    x: np.ndarray,
    y: np.ndarray,
    half: np.ndarray | float,
    pi: np.ndarray,
    si: np.ndarray,
    progress: np.ndarray,
    multi: dict[int, tuple[float, ...]],
) -> None:
    """The passes of the fixes of one group of candidate pairs (`route_progress`), written into
    `progress` and `multi`. Groups hold disjoint fixes; a route's own group keeps its sorts small.
    `half`: one route's half width (its pairs are within it), or each selected fix's (its pairs are
    candidates, kept where within it)."""
    px, py = x[pi] - index.ax[si], y[pi] - index.ay[si]
    sdx, sdy = index.dx[si], index.dy[si]
    l2 = np.maximum(sdx**2 + sdy**2, 1e-12)
    t = np.clip((px * sdx + py * sdy) / l2, 0.0, 1.0)
    dist = np.hypot(px - t * sdx, py - t * sdy)
    h: np.ndarray | float = half
    if isinstance(half, np.ndarray):
        hp = half[pi]
        within = dist <= hp
        pi, si, t, dist, h = pi[within], si[within], t[within], dist[within], hp[within]
    if not len(pi):
        return
    prog = index.start_m[si] + t * index.length[si]
    # Passes by progress, not by segment alone: a hairpin's two legs are neighbouring segments,
    # yet a fix beside one leg is ~2 x its distance to the turn away, along the route, from the
    # other. Nearest points within a corridor's width of each other along the route are one pass,
    # unless a segment between them is out of reach: then the route left the fix's corridor and
    # came back (a narrow hairpin whose tip lies beyond the half width), and the chain of near
    # points along it must not join its legs into one pass, or the nearer leg alone would be kept.
    order = np.lexsort((si, prog, pi))
    pi, si, dist, prog = pi[order], si[order], dist[order], prog[order]
    if isinstance(h, np.ndarray):
        h = h[order]
    new = np.ones(len(pi), dtype=bool)
    if len(pi) > 1:
        new[1:] = (pi[1:] != pi[:-1]) | (prog[1:] - prog[:-1] > 2.0 * _tail(h)) | (si[1:] - si[:-1] > 1)
    run = np.cumsum(new) - 1
    # Inside a pass, points about as near as its nearest one but far apart along the route are
    # the two legs of a U-turn on one street (out and back meet at the turn): which leg the
    # vehicle is on is continuity's call, so they stay apart; a bend's neighbouring segments
    # give near points close along the route and stay one pass.
    starts = np.flatnonzero(new)
    near = dist <= np.minimum.reduceat(dist, starts)[run] + _TIE * h
    pi, dist, prog, run = pi[near], dist[near], prog[near], run[near]
    if isinstance(h, np.ndarray):
        h = h[near]
    leg = np.ones(len(pi), dtype=bool)
    if len(pi) > 1:
        leg[1:] = (run[1:] != run[:-1]) | (prog[1:] - prog[:-1] > _LEG * _tail(h))
    run = np.cumsum(leg) - 1
    best = np.lexsort((dist, run))
    first = np.ones(len(best), dtype=bool)
    first[1:] = run[best[1:]] != run[best[:-1]]
    best = best[first]  # one pair per pass: its nearest point
    run_fix, run_prog = pi[best], prog[best]
    # run_fix is sorted (pairs were ordered by fix): a fix with one pass differs from both neighbours.
    same = run_fix[1:] == run_fix[:-1]
    single = np.ones(len(run_fix), dtype=bool)
    single[1:] &= ~same
    single[:-1] &= ~same
    progress[sel[run_fix[single]]] = run_prog[single]
    several = ~single
    if several.any():
        # run_fix is sorted (pairs were ordered by fix), so each fix's passes are contiguous.
        mf, mp = run_fix[several], run_prog[several]
        bounds = np.flatnonzero(np.diff(mf)) + 1
        for f, ps in zip(mf[np.concatenate(([0], bounds))].tolist(), np.split(mp, bounds), strict=True):
            multi[int(sel[f])] = tuple(sorted(ps.tolist()))
