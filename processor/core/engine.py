"""The vectorized batch engine: one micro-batch of one vehicle bucket at a time. Pure, no I/O.

Logically the state is per vehicle; physically it is grouped in buckets (a few hundred to a few
thousand vehicles each), because Spark's fixed cost per state key, paid per vehicle, would cap the
throughput far below a fleet's rate. Inside a bucket the work is columnar:

1. de-duplicate and order fixes by `seq` (vectorized; only vehicles with a gap take the Python
   reorder buffer of `domain.reorder`);
2. resolve each fix's route from the master data as of this batch and test the whole batch against
   the corridors and the zone index in one vectorized pass (`processor.core.geometry`);
3. vehicles whose fixes raise nothing and start nothing (on route, under the limit, no zone, no
   pending condition, no stop, no wrong way, no completion, an ETA clear of the plan) — the
   overwhelming majority — are advanced with column operations (the fast path): their position,
   and their trip's progress, direction reference point, start and ETA (`_advance_trips`);
   the rest are folded through `domain.step`, the reference semantics. A property test holds the
   two paths to the same result;
4. event-time silence is checked against the watermark for every vehicle in the bucket.

The same function serves the Spark streaming job, the tests and batch restatement.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import pandas as pd

from processor.core.columns import Fixes, StateTable, at_defaults, reset_columns
from processor.core.domain import (
    DEVIATION_COUNT,
    OPEN_CONDITIONS,
    OVERSPEED_COUNT,
    Alert,
    EngineConfig,
    Fix,
    RawFix,
    check_silence,
    reorder,
    step,
)
from processor.core.geometry import CompiledRoute, corridor_tests, inner_band_tests, route_progress
from processor.core.live import live_rows
from processor.core.master import Catalog, MasterState, assignment_ms, compiled_route
from processor.core.trip import eta_ms

logger = logging.getLogger(__name__)


@dataclass(kw_only=True)
class BucketResult:
    """One bucket's micro-batch: its states (updated in place), the fixes still held for a missing
    one, the alerts and live rows it raised, and its counts."""

    states: StateTable
    held: dict[str, list[RawFix]]
    alerts: list[Alert]
    live: list[dict[str, Any]]
    accepted: int = 0
    dropped_duplicates: int = 0
    fast_vehicles: int = 0
    slow_vehicles: int = 0
    # Accepted fixes with no assignment valid at their event time (no route alerts for them).
    unassigned: int = 0
    # Fixes further behind the watermark than `late_bound_ms`: not applied, dead-lettered `late`.
    late: Fixes = field(default_factory=Fixes.empty)


def _group_bounds(codes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Start and end (exclusive) of each run of equal codes in a sorted array."""
    n = len(codes)
    if n == 0:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    change = np.flatnonzero(codes[1:] != codes[:-1]) + 1
    starts = np.concatenate([[0], change])
    ends = np.concatenate([change, [n]])
    return starts, ends


def _order(
    states: StateTable, held: dict[str, list[RawFix]], fx: Fixes, watermark_ms: int, cfg: EngineConfig
) -> tuple[Fixes, dict[str, list[RawFix]], int]:
    """De-duplicate and order by seq; return (ready fixes grouped by vehicle in seq order, held, dropped)."""
    n_in = len(fx)
    codes, uniques = pd.factorize(fx.vehicle_id)
    order = np.lexsort((fx.seq, codes))
    codes = codes[order]
    seq = fx.seq[order]
    dup = np.zeros(len(order), dtype=bool)
    if len(order) > 1:
        dup[1:] = (codes[1:] == codes[:-1]) & (seq[1:] == seq[:-1])
    uniq_list = uniques.tolist()
    rows = np.array([states.index.get(v, -1) for v in uniq_list], dtype=np.int64)
    last_u = np.where(rows >= 0, states.cols["last_seq"][np.maximum(rows, 0)] if len(states) else -1, -1)
    last = last_u[codes]
    keep = ~dup & (seq > last)
    dropped = int(n_in - keep.sum())
    order, codes, seq, last = order[keep], codes[keep], seq[keep], last[keep]
    starts, ends = _group_bounds(codes)
    group_of = np.repeat(np.arange(len(starts)), ends - starts)
    rank = np.arange(len(codes)) - starts[group_of]
    first = seq[starts][group_of]
    expected = np.where(last >= 0, last + 1 + rank, first + rank)
    gap_codes = set(np.unique(codes[seq != expected]).tolist())
    slow_v = {uniq_list[c] for c in gap_codes} | set(held)
    new_held: dict[str, list[RawFix]] = {}
    if not slow_v:
        return fx.take(order), new_held, dropped
    slow_code_set = {i for i, v in enumerate(uniq_list) if v in slow_v}
    is_slow = np.isin(codes, list(slow_code_set)) if slow_code_set else np.zeros(len(codes), dtype=bool)
    fast_idx = order[~is_slow]
    by_vehicle: dict[str, list[int]] = {}
    for i in order[is_slow].tolist():
        by_vehicle.setdefault(fx.vehicle_id[i], []).append(i)
    extra: list[tuple[str, RawFix]] = []
    for v in sorted(slow_v):
        arrived = [fx.raw(i) for i in by_vehicle.get(v, [])]
        r = states.index.get(v, -1)
        last_seq = int(states.cols["last_seq"][r]) if r >= 0 else -1
        ready, still, d = reorder(
            last_seq, held.get(v, []), arrived, watermark_ms, cfg.max_pending_per_vehicle
        )
        dropped += d
        if still:
            new_held[v] = still
        extra.extend((v, f) for f in ready)
    base = fx.take(fast_idx)
    if not extra:
        return base, new_held, dropped
    allf = Fixes.concat([base, Fixes.of_raw([v for v, _ in extra], [f for _, f in extra])])
    c2, _ = pd.factorize(allf.vehicle_id)
    return allf.take(np.lexsort((allf.seq, c2))), new_held, dropped


def process_bucket(
    states: StateTable,
    held: dict[str, list[RawFix]],
    master: MasterState,
    fixes: Fixes | pd.DataFrame,
    watermark_ms: int,
    cfg: EngineConfig,
    catalog: Catalog,
) -> BucketResult:
    """Advance one bucket by one micro-batch of fixes. `states` is updated in place and returned.

    A fix is applied however late it arrives (a tracker stores and forwards), up to
    `cfg.late_bound_ms` behind the watermark; one further behind comes back in `late`."""
    fx = Fixes.from_frame(fixes) if isinstance(fixes, pd.DataFrame) else fixes
    late = Fixes.empty()
    if watermark_ms > 0 and len(fx):
        too_late = fx.ts_ms < watermark_ms - cfg.late_bound_ms
        if too_late.any():
            late, fx = fx.take(np.flatnonzero(too_late)), fx.take(np.flatnonzero(~too_late))
    ready, new_held, dropped = _order(states, held, fx, watermark_ms, cfg)
    n = len(ready)
    vid, seq, ts, lat, lon, speed, recv = (
        ready.vehicle_id,
        ready.seq,
        ready.ts_ms,
        ready.lat,
        ready.lon,
        ready.speed_kmh,
        ready.received_ms,
    )
    codes, uniques = pd.factorize(vid) if n else (np.zeros(0, dtype=np.int64), np.zeros(0, dtype=object))
    uniq_list: list[str] = list(uniques.tolist()) if n else []
    states.add(uniq_list)
    rows_u = np.array([states.index[v] for v in uniq_list], dtype=np.int64)

    # Route of each fix from the assignment valid at its event time.
    route_list: list[CompiledRoute] = []
    route_pos: dict[str, int] = {}
    # Per vehicle (the `_u` columns: one per unique vehicle of the batch): the position of its
    # assignment's route in `route_list` (-1: none), the assignment's validity and planned times.
    route_pos_u = np.full(len(uniq_list), -1, dtype=np.int64)
    valid_from_ms_u = np.zeros(len(uniq_list), dtype=np.int64)
    valid_to_ms_u = np.full(len(uniq_list), np.iinfo(np.int64).max, dtype=np.int64)
    departure_ms_u = np.full(len(uniq_list), -1, dtype=np.int64)
    arrival_ms_u = np.full(len(uniq_list), -1, dtype=np.int64)
    for k, v in enumerate(uniq_list):
        a = master.assignments.get(v)
        if a is None or a[1] is None:
            continue
        data = a[1]
        rid = data.get("route_id")
        pos = route_pos.get(rid) if rid is not None else None
        if pos is None:
            cr = compiled_route(master, catalog, rid)
            if cr is None:
                continue
            pos = route_pos[cr.route_id] = len(route_list)
            route_list.append(cr)
        route_pos_u[k] = pos
        valid_from_ms_u[k] = int(data.get("valid_from_ms") or 0)
        if data.get("valid_to_ms") is not None:
            valid_to_ms_u[k] = int(data["valid_to_ms"])
        departure_ms_u[k], arrival_ms_u[k] = (
            assignment_ms(data, "planned_departure_ms"),
            assignment_ms(data, "planned_arrival_ms"),
        )
    route_idx = route_pos_u[codes] if n else np.zeros(0, dtype=np.int64)
    if n:
        route_idx = np.where((ts >= valid_from_ms_u[codes]) & (ts < valid_to_ms_u[codes]), route_idx, -1)
    if n and (route_idx < 0).any():
        np.add.at(states.cols["unassigned_fixes"], rows_u[codes[route_idx < 0]], 1)
    in_corr, _ = corridor_tests(route_list, route_idx, lon, lat, inner_mask=np.zeros(n, dtype=bool))
    limits = np.array([cr.rules.speed_limit_kmh for cr in route_list] + [np.inf], dtype=np.float64)[route_idx]

    has_route = route_idx >= 0
    progress, passes, end_dist = route_progress(
        route_list, route_idx, lon, lat, in_corr & has_route, catalog.route_set()
    )

    zindex = catalog.zone_index(master)
    stop_zones = {z.zone_id for z in zindex.zones if z.planned_stop}
    zones_in: dict[int, set[str]] = {}
    zones_outer: dict[int, set[str]] = {}
    if len(zindex) and n:
        (in_fix, in_zone), (out_fix, out_zone) = zindex.memberships(lon, lat)
        zone_ids = [z.zone_id for z in zindex.zones]
        for i, zi in zip(in_fix.tolist(), in_zone.tolist(), strict=True):
            zones_in.setdefault(i, set()).add(zone_ids[zi])
        for i, zi in zip(out_fix.tolist(), out_zone.tolist(), strict=True):
            zones_outer.setdefault(i, set()).add(zone_ids[zi])

    # ---- classify vehicles: fast (vectorized) or slow (domain.step).
    starts, ends = _group_bounds(codes)
    bad = ~(in_corr & (speed <= limits))
    if zones_in:
        bad[list(zones_in)] = True
    bad_count = np.add.reduceat(bad.astype(np.int64), starts) if n else np.zeros(0, dtype=np.int64)
    r_first, r_last = route_idx[starts], route_idx[ends - 1] if n else route_idx
    switch = np.zeros(n, dtype=np.int64)
    if n > 1:
        switch[1:] = route_idx[1:] != route_idx[:-1]
        switch[starts] = 0
    same_route_batch = (np.add.reduceat(switch, starts) == 0) if n else np.zeros(0, dtype=bool)
    c = states.cols
    cur_route = c["route_id"][rows_u]
    fix_route = np.array([route_list[i].route_id if i >= 0 else None for i in r_first.tolist()], dtype=object)
    known = c["last_seq"][rows_u] >= 0
    # An open condition (a silent vehicle's next fix raises VEHICLE_RESUMED) is domain.step's to close.
    calm = at_defaults(states, rows_u, OPEN_CONDITIONS)
    no_zones = np.array([not z for z in c["zones"][rows_u].tolist()], dtype=bool)
    # The trip each vehicle's fixes fall under (its assignment, by valid-from): a new one is `step`'s.
    trip_from = np.where(route_idx >= 0, valid_from_ms_u[codes], -1) if n else np.zeros(0, dtype=np.int64)
    calm &= c["trip_from_ms"][rows_u] == (trip_from[starts] if n else trip_from)
    fast = known & (bad_count == 0) & same_route_batch & (cur_route == fix_route) & calm & no_zones
    trip = _TripColumns.of(route_list, route_idx) if n else None
    plan = None
    if trip is not None and fast.any():
        # Computed once: it decides who stays on the fast path, and then advances them.
        plan = _trip_plan(states, rows_u, starts, ends, ts, progress, trip, departure_ms_u, arrival_ms_u, cfg)
        fast &= _trip_is_quiet(states, rows_u, starts, speed, progress, passes, end_dist, trip, plan)
    if not cfg.fast_path:
        fast[:] = False
    # The inner band only matters to vehicles folded fix by fix.
    in_inner = inner_band_tests(route_list, route_idx, lon, lat, ~fast[codes]) if n else in_corr

    alerts: list[Alert] = []
    touched = np.zeros(len(states), dtype=bool)
    # ---- fast path: only the last fix of each vehicle matters.
    if fast.any():
        fast_rows = rows_u[fast]
        last = ends[fast] - 1
        for name, per_fix in (
            ("lat", lat),
            ("lon", lon),
            ("speed_kmh", speed),
            ("last_seq", seq),
            ("last_ts_ms", ts),
            ("last_received_ms", recv),
        ):
            c[name][fast_rows] = per_fix[last]
        # Each fix is in the corridor and under the limit: no deviation or overspeed being counted.
        reset_columns(states, fast_rows, DEVIATION_COUNT + OVERSPEED_COUNT)
        versions = np.array([cr.version for cr in route_list] + [0], dtype=np.int64)
        c["route_version"][fast_rows] = versions[r_last[fast]]
        touched[fast_rows] = True
        if plan is not None:
            _advance_trips(states, rows_u, starts, ends, fast, r_last, ts, plan)

    # ---- slow path: the reference state machine, fix by fix.
    for k in np.flatnonzero(~fast).tolist():
        row = int(rows_u[k])
        s = states.get(row)
        for i in range(int(starts[k]), int(ends[k])):
            ri = int(route_idx[i])
            cr = route_list[ri] if ri >= 0 else None
            f = Fix(
                seq=int(seq[i]),
                ts_ms=int(ts[i]),
                lat=float(lat[i]),
                lon=float(lon[i]),
                speed_kmh=float(speed[i]),
                received_ms=int(recv[i]),
                route_id=cr.route_id if cr else None,
                route_version=cr.version if cr else 0,
                in_corridor=bool(in_corr[i]),
                in_inner=bool(in_inner[i]),
                zones_in=frozenset(zones_in.get(i, ())),
                zones_outer=frozenset(zones_outer.get(i, ())),
                progress_m=passes.get(i) or (() if progress[i] != progress[i] else (float(progress[i]),)),
                end_distance_m=float(end_dist[i]),
                route_length_m=cr.length_m if cr else 0.0,
                stop_zone=bool(stop_zones & zones_outer.get(i, set())),
                planned_departure_ms=int(departure_ms_u[k]),
                planned_arrival_ms=int(arrival_ms_u[k]),
                trip_from_ms=int(trip_from[i]),
            )
            s, out = step(s, f, cr.rules if cr else None, cfg)
            if out and f.ts_ms < watermark_ms:
                out = [replace(a, late=True) for a in out]
            alerts.extend(out)
        states.put(row, s)
        touched[row] = True

    # ---- event-time silence for every vehicle of the bucket.
    if len(states):
        after_s = silent_after_s(states, master, catalog, cfg)
        due = c["last_ts_ms"] + (after_s * 1000).astype(np.int64)
        cand = ~c["silent"] & (c["last_seq"] >= 0) & (due <= watermark_ms)
        for row in np.flatnonzero(cand).tolist():
            s, out = check_silence(states.get(row), watermark_ms, float(after_s[row]))
            alerts.extend(out)
            states.put(row, s)
            touched[row] = True

    live = live_rows(states, np.flatnonzero(touched), master, catalog)
    unassigned = int((route_idx < 0).sum()) if n else 0
    return BucketResult(
        states=states,
        held=new_held,
        alerts=alerts,
        live=live,
        accepted=n,
        dropped_duplicates=dropped,
        fast_vehicles=int(fast.sum()),
        slow_vehicles=int((~fast).sum()),
        unassigned=unassigned,
        late=late,
    )


@dataclass
class _TripColumns:
    """Per fix: the route-awareness rules of its own route (the fast path's tests as columns)."""

    length_m: np.ndarray
    wrong_way_min_m: np.ndarray
    stop_on: np.ndarray
    stop_speed_kmh: np.ndarray
    completion_radius_m: np.ndarray
    arrival_risk_s: np.ndarray
    planned_duration_s: np.ndarray

    @staticmethod
    def of(routes: list[CompiledRoute], route_idx: np.ndarray) -> _TripColumns:
        def col(values: list[float], none: float) -> np.ndarray:
            out: np.ndarray = np.array([*values, none], dtype=np.float64)[route_idx]
            return out

        r = [cr.rules for cr in routes]
        return _TripColumns(
            col([cr.length_m for cr in routes], 0.0),
            col([x.wrong_way_min_m for x in r], np.inf),
            col([float(np.isfinite(x.stop_min_s)) for x in r], 0.0) > 0,
            col([x.stop_speed_kmh for x in r], -1.0),
            col([x.completion_radius_m for x in r], -1.0),
            col([x.arrival_risk_s for x in r], np.inf),
            col([x.planned_duration_s for x in r], np.inf),
        )


def _group_first_max(
    values: np.ndarray, starts: np.ndarray, ends: np.ndarray, group_of: np.ndarray
) -> np.ndarray:
    """Per group: the position of the first occurrence of its maximum."""
    gmax = np.maximum.reduceat(values, starts)
    pos = np.where(values == gmax[group_of], np.arange(len(values)), len(values))
    return np.minimum.reduceat(pos, starts)


@dataclass
class _TripPlan:
    """Per fix, what `domain.step` would compute for vehicles whose fixes all have one known
    progress: the direction's running reference point, the progress (-1 where unknown), the ETA and
    the planned arrival; and each fix's vehicle group."""

    running: np.ndarray
    progress: np.ndarray
    eta: np.ndarray
    planned: np.ndarray
    group_of: np.ndarray


def _trip_plan(
    states: StateTable,
    rows_u: np.ndarray,
    starts: np.ndarray,
    ends: np.ndarray,
    ts: np.ndarray,
    progress: np.ndarray,
    trip: _TripColumns,
    departure_ms_u: np.ndarray,
    arrival_ms_u: np.ndarray,
    cfg: EngineConfig,
) -> _TripPlan:
    """The trip plan of every fix (the fast path uses it only for vehicles it keeps); the `_u`
    arguments are per vehicle, the others per fix."""
    c = states.cols
    group_of = np.repeat(np.arange(len(starts)), ends - starts)
    progress_m = np.nan_to_num(progress, nan=-1.0)
    anchor_m = c["dir_anchor_m"][rows_u][group_of]
    running = np.maximum(pd.Series(progress_m).groupby(group_of).cummax().to_numpy(), anchor_m)
    start_ms_u = c["trip_start_ms"][rows_u].copy()
    start_m_u = c["trip_start_m"][rows_u].copy()
    unset = start_ms_u < 0
    start_ms_u[unset], start_m_u[unset] = ts[starts][unset], progress_m[starts][unset]
    start_ms, start_m = start_ms_u[group_of], start_m_u[group_of]
    eta = eta_ms(ts, progress_m, start_ms, start_m, trip.length_m, cfg.eta_warmup_s, cfg.eta_min_speed_kmh)
    duration_s = trip.planned_duration_s
    departure_ms, arrival_ms = departure_ms_u[group_of], arrival_ms_u[group_of]
    base = np.where(departure_ms >= 0, departure_ms, start_ms)
    from_duration = np.where(
        np.isfinite(duration_s) & (base >= 0),
        base + (np.where(np.isfinite(duration_s), duration_s, 0.0) * 1000).astype(np.int64),
        -1,
    )
    planned = np.where(arrival_ms >= 0, arrival_ms, from_duration)
    return _TripPlan(running=running, progress=progress_m, eta=eta, planned=planned, group_of=group_of)


def _trip_is_quiet(
    states: StateTable,
    rows_u: np.ndarray,
    starts: np.ndarray,
    speed: np.ndarray,
    progress: np.ndarray,
    passes: dict[int, tuple[float, ...]],
    end_dist: np.ndarray,
    trip: _TripColumns,
    plan: _TripPlan,
) -> np.ndarray:
    """Per vehicle: True when none of its fixes can change the route-awareness state machines beyond
    what `_advance_trips` replays in columns (no alert can fire, no stop can begin)."""
    has_route = np.isfinite(trip.length_m) & (trip.length_m > 0)
    bad = has_route & np.isnan(progress)  # outside the corridor: already slow; or unknown progress
    if passes:
        bad[list(passes)] = True
    bad |= trip.stop_on & (speed <= trip.stop_speed_kmh)
    running, progress_m, eta = plan.running, plan.progress, plan.eta
    planned, group_of = plan.planned, plan.group_of
    live = has_route & ~states.cols["completed"][rows_u][group_of]
    bad |= live & (running - progress_m >= trip.wrong_way_min_m)
    bad |= live & (progress_m >= trip.length_m / 2) & (end_dist <= trip.completion_radius_m)
    bad |= live & (planned >= 0) & (eta >= 0) & ((eta - planned) / 1000.0 > trip.arrival_risk_s)
    quiet: np.ndarray = np.add.reduceat(bad.astype(np.int64), starts) == 0
    return quiet


def _advance_trips(
    states: StateTable,
    rows_u: np.ndarray,
    starts: np.ndarray,
    ends: np.ndarray,
    fast: np.ndarray,
    r_last: np.ndarray,
    ts: np.ndarray,
    plan: _TripPlan,
) -> None:
    """The fast path's route awareness: progress, the direction's reference point, the trip's start
    and ETA, exactly as folding `domain.step` over quiet fixes leaves them."""
    c = states.cols
    progress_m, eta, group_of = plan.progress, plan.eta, plan.group_of
    last = ends - 1
    on_route = fast & (r_last >= 0)
    if not on_route.any():
        return
    rows = rows_u[on_route]
    c["progress_m"][rows] = progress_m[last[on_route]]
    live = on_route & ~c["completed"][rows_u]
    if not live.any():
        return
    rows = rows_u[live]
    anchor_m = c["dir_anchor_m"][rows]
    first_max = _group_first_max(progress_m, starts, ends, group_of)[live]
    max_m = progress_m[first_max]
    moved = max_m > anchor_m
    live_last = last[live]
    c["dir_anchor_m"][rows] = np.where(moved, max_m, anchor_m)
    c["dir_anchor_ts_ms"][rows] = np.where(moved, ts[first_max], c["dir_anchor_ts_ms"][rows])
    n_fixes = (ends - starts)[live]
    c["dir_anchor_fixes"][rows] = np.where(
        moved, live_last - first_max, c["dir_anchor_fixes"][rows] + n_fixes
    )
    unset = c["trip_start_ms"][rows] < 0
    first = starts[live]
    c["trip_start_m"][rows] = np.where(unset, progress_m[first], c["trip_start_m"][rows])
    c["trip_start_ms"][rows] = np.where(unset, ts[first], c["trip_start_ms"][rows])
    live_eta = eta[live_last]
    c["eta_ms"][rows] = np.where(live_eta >= 0, live_eta, -1).astype(np.int64)


def silent_after_s(
    states: StateTable, master: MasterState, catalog: Catalog, cfg: EngineConfig
) -> np.ndarray:
    """Per vehicle row: the silence threshold of its route (the default without one)."""
    codes, uniq = pd.factorize(states.cols["route_id"], use_na_sentinel=True)
    per = np.array(
        [_silent_after(master, catalog, r, cfg) for r in uniq.tolist()] + [cfg.default_silent_after_s]
    )
    return per[codes]


def _silent_after(master: MasterState, catalog: Catalog, route_id: Any, cfg: EngineConfig) -> float:
    cr = compiled_route(master, catalog, route_id if isinstance(route_id, str) else None)
    return cr.rules.silent_after_s if cr is not None else cfg.default_silent_after_s
