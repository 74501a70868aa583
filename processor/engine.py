"""The vectorized batch engine: one micro-batch of one vehicle bucket at a time. Pure, no I/O.

Logically the state is per vehicle; physically it is grouped in buckets (a few hundred to a few
thousand vehicles each), because Spark's per-key overhead (~1.1 ms per key per core, measured) would
cap a per-vehicle layout at ~9k events/s on two cores. Inside a bucket the work is columnar:

1. de-duplicate and order fixes by `seq` (vectorized; only vehicles with a gap take the Python
   reorder buffer of `domain.reorder`);
2. resolve each fix's route from the master data as of this batch and test the whole batch against
   the corridors and the zone index in one vectorized pass (`processor.geometry`);
3. vehicles whose fixes change nothing but position (on route, under the limit, no zone, no pending
   condition) — the overwhelming majority — are advanced with column operations (the fast path);
   the rest are folded through `domain.step`, the reference semantics. A property test holds the
   two paths to the same result;
4. event-time silence is checked against the watermark for every vehicle in the bucket.

The same function serves the Spark streaming job, the tests and batch restatement.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd
import shapely

from fleetfence.rules import RouteRules
from processor.domain import Alert, EngineConfig, Fix, RawFix, VehicleState, check_silence, reorder, step
from processor.geometry import (
    CompiledRoute,
    CompiledZone,
    ZoneIndex,
    compile_route,
    compile_zone,
    corridor_tests,
    inner_band_tests,
)

logger = logging.getLogger(__name__)

FIX_COLUMNS = ["vehicle_id", "seq", "ts_ms", "lat", "lon", "speed_kmh", "received_ms"]


# --------------------------------------------------------------------------- master data


@dataclass
class MasterState:
    """Routes, zones and assignments as of the current batch, with their versions.

    Deleted entities keep a tombstone (`data=None`) so a re-sent older version is still ignored.
    """

    routes: dict[str, tuple[int, dict[str, Any] | None]] = field(default_factory=dict)
    zones: dict[str, tuple[int, dict[str, Any] | None]] = field(default_factory=dict)
    assignments: dict[str, tuple[int, dict[str, Any] | None]] = field(default_factory=dict)
    vehicles: dict[str, tuple[int, dict[str, Any] | None]] = field(default_factory=dict)

    def apply(self, event: dict[str, Any]) -> bool:
        """Apply one `fleet.master` change event; False when it is stale or unknown."""
        table = {
            "route": self.routes,
            "zone": self.zones,
            "assignment": self.assignments,
            "vehicle": self.vehicles,
        }.get(event.get("entity", ""))
        if table is None:
            return False
        key, version = str(event["id"]), int(event["version"])
        current = table.get(key)
        if current is not None and current[0] >= version:
            return False
        table[key] = (version, None if event.get("op") == "delete" else event.get("data"))
        return True

    def zone_key(self) -> tuple[tuple[str, int], ...]:
        return tuple(sorted((z, v) for z, (v, d) in self.zones.items() if d is not None))


class Catalog:
    """Compiled geometry cached by (id, version): immutable, so caching keeps replays deterministic."""

    def __init__(self, cfg: EngineConfig) -> None:
        self.cfg = cfg
        self._routes: dict[tuple[str, int], CompiledRoute] = {}
        self._zone_index: tuple[tuple[tuple[str, int], ...], ZoneIndex] | None = None
        self._zones: dict[tuple[str, int], CompiledZone] = {}

    def route(self, route_id: str, version: int, data: dict[str, Any]) -> CompiledRoute:
        key = (route_id, version)
        r = self._routes.get(key)
        if r is None:
            r = compile_route(route_id, version, data, self.cfg.hysteresis_m)
            self._routes[key] = r
        return r

    def zone_index(self, master: MasterState) -> ZoneIndex:
        key = master.zone_key()
        if self._zone_index is None or self._zone_index[0] != key:
            zones = []
            for zid, (v, data) in master.zones.items():
                if data is None:
                    continue
                z = self._zones.get((zid, v))
                if z is None:
                    z = compile_zone(zid, v, data, self.cfg.hysteresis_m)
                    self._zones[(zid, v)] = z
                zones.append(z)
            self._zone_index = (key, ZoneIndex.build(zones))
        return self._zone_index[1]


# --------------------------------------------------------------------------- vehicle state table

INT_COLS = (
    "last_seq",
    "last_ts_ms",
    "last_received_ms",
    "route_version",
    "outside_fixes",
    "outside_since_ms",
    "inside_fixes",
    "over_since_ms",
)
FLOAT_COLS = ("lat", "lon", "speed_kmh", "over_max_kmh")
BOOL_COLS = ("off_route", "overspeed", "silent")


class StateTable:
    """The vehicle states of one bucket, column by column (numpy), with an id -> row index.

    Columnar so the fast path is a handful of fancy-index assignments per batch and the blob that
    goes to the state store is a few numpy buffers, not thousands of Python objects.
    """

    def __init__(self, ids: list[str] | None = None, cols: dict[str, np.ndarray] | None = None) -> None:
        self.ids: list[str] = ids or []
        n = len(self.ids)
        if cols is None:
            cols = {c: np.zeros(n, dtype=np.int64) for c in INT_COLS}
            cols.update({c: np.zeros(n, dtype=np.float64) for c in FLOAT_COLS})
            cols.update({c: np.zeros(n, dtype=bool) for c in BOOL_COLS})
            cols["route_id"] = np.full(n, None, dtype=object)
            cols["zones"] = np.full(n, None, dtype=object)
        self.cols = cols
        self.index = {v: i for i, v in enumerate(self.ids)}

    def __len__(self) -> int:
        return len(self.ids)

    def __getstate__(self) -> dict[str, Any]:
        return {"ids": self.ids, "cols": self.cols}

    def __setstate__(self, d: dict[str, Any]) -> None:
        self.__init__(d["ids"], d["cols"])  # type: ignore[misc]

    def add(self, vehicle_ids: list[str]) -> None:
        new = [v for v in vehicle_ids if v not in self.index]
        if not new:
            return
        k = len(new)
        base = len(self.ids)
        self.ids.extend(new)
        for v_i, v in enumerate(new):
            self.index[v] = base + v_i
        for c, arr in self.cols.items():
            ext = np.full(k, None, dtype=object) if arr.dtype == object else np.zeros(k, dtype=arr.dtype)
            self.cols[c] = np.concatenate([arr, ext])
        self.cols["last_seq"][base:] = -1
        self.cols["outside_since_ms"][base:] = -1
        self.cols["over_since_ms"][base:] = -1

    def get(self, i: int) -> VehicleState:
        c = self.cols
        return VehicleState(
            self.ids[i],
            int(c["last_seq"][i]),
            int(c["last_ts_ms"][i]),
            int(c["last_received_ms"][i]),
            float(c["lat"][i]),
            float(c["lon"][i]),
            float(c["speed_kmh"][i]),
            c["route_id"][i],
            int(c["route_version"][i]),
            bool(c["off_route"][i]),
            int(c["outside_fixes"][i]),
            int(c["outside_since_ms"][i]),
            int(c["inside_fixes"][i]),
            bool(c["overspeed"][i]),
            int(c["over_since_ms"][i]),
            float(c["over_max_kmh"][i]),
            bool(c["silent"][i]),
            dict(c["zones"][i] or {}),
        )

    def put(self, i: int, s: VehicleState) -> None:
        c = self.cols
        for f in INT_COLS + FLOAT_COLS + BOOL_COLS:
            c[f][i] = getattr(s, f)
        c["route_id"][i] = s.route_id
        c["zones"][i] = dict(s.zones) if s.zones else None

    def state(self, vehicle_id: str) -> VehicleState:
        return self.get(self.index[vehicle_id])

    def states(self) -> list[VehicleState]:
        return [self.get(i) for i in range(len(self))]


def empty_states() -> StateTable:
    return StateTable()


def states_from_objects(states: Iterable[VehicleState]) -> StateTable:
    states = list(states)
    t = StateTable()
    t.add([s.vehicle_id for s in states])
    for s in states:
        t.put(t.index[s.vehicle_id], s)
    return t


# --------------------------------------------------------------------------- batch result


@dataclass
class BucketResult:
    states: StateTable
    held: dict[str, list[RawFix]]
    alerts: list[Alert]
    live: list[dict[str, Any]]
    accepted: int = 0
    dropped_duplicates: int = 0
    fast_vehicles: int = 0
    slow_vehicles: int = 0


def _route_rules(master: MasterState, catalog: Catalog, route_id: str | None) -> CompiledRoute | None:
    if route_id is None:
        return None
    entry = master.routes.get(route_id)
    if entry is None or entry[1] is None:
        return None
    return catalog.route(route_id, entry[0], entry[1])


@dataclass
class Fixes:
    """A batch of fixes as numpy columns (what the Spark operator hands over)."""

    vehicle_id: np.ndarray  # object
    seq: np.ndarray
    ts_ms: np.ndarray
    lat: np.ndarray
    lon: np.ndarray
    speed_kmh: np.ndarray
    received_ms: np.ndarray

    @staticmethod
    def from_frame(df: pd.DataFrame) -> Fixes:
        return Fixes(
            df["vehicle_id"].to_numpy(dtype=object),
            df["seq"].to_numpy(dtype=np.int64),
            df["ts_ms"].to_numpy(dtype=np.int64),
            df["lat"].to_numpy(dtype=np.float64),
            df["lon"].to_numpy(dtype=np.float64),
            df["speed_kmh"].to_numpy(dtype=np.float64),
            df["received_ms"].to_numpy(dtype=np.int64),
        )

    @staticmethod
    def empty() -> Fixes:
        i, f = np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.float64)
        return Fixes(np.zeros(0, dtype=object), i, i, f, f, f, i)

    def take(self, idx: np.ndarray) -> Fixes:
        return Fixes(
            self.vehicle_id[idx],
            self.seq[idx],
            self.ts_ms[idx],
            self.lat[idx],
            self.lon[idx],
            self.speed_kmh[idx],
            self.received_ms[idx],
        )

    def __len__(self) -> int:
        return len(self.seq)

    def raw(self, i: int) -> RawFix:
        return RawFix(
            int(self.seq[i]),
            int(self.ts_ms[i]),
            float(self.lat[i]),
            float(self.lon[i]),
            float(self.speed_kmh[i]),
            int(self.received_ms[i]),
        )


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
    ev = np.array([v for v, _ in extra], dtype=object)
    add = Fixes(
        ev,
        np.array([f.seq for _, f in extra], dtype=np.int64),
        np.array([f.ts_ms for _, f in extra], dtype=np.int64),
        np.array([f.lat for _, f in extra]),
        np.array([f.lon for _, f in extra]),
        np.array([f.speed_kmh for _, f in extra]),
        np.array([f.received_ms for _, f in extra], dtype=np.int64),
    )
    allf = Fixes(
        *(
            np.concatenate([getattr(base, k), getattr(add, k)])
            for k in ("vehicle_id", "seq", "ts_ms", "lat", "lon", "speed_kmh", "received_ms")
        )
    )
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
    force_slow: bool = False,
) -> BucketResult:
    """Advance one bucket by one micro-batch of fixes. `states` is updated in place and returned."""
    fx = Fixes.from_frame(fixes) if isinstance(fixes, pd.DataFrame) else fixes
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
    ru = np.full(len(uniq_list), -1, dtype=np.int64)
    lo_u = np.zeros(len(uniq_list), dtype=np.int64)
    hi_u = np.full(len(uniq_list), np.iinfo(np.int64).max, dtype=np.int64)
    for k, v in enumerate(uniq_list):
        a = master.assignments.get(v)
        if a is None or a[1] is None:
            continue
        data = a[1]
        rid = data.get("route_id")
        pos = route_pos.get(rid) if rid is not None else None
        if pos is None:
            cr = _route_rules(master, catalog, rid)
            if cr is None:
                continue
            pos = route_pos[cr.route_id] = len(route_list)
            route_list.append(cr)
        ru[k] = pos
        lo_u[k] = int(data.get("valid_from_ms") or 0)
        if data.get("valid_to_ms") is not None:
            hi_u[k] = int(data["valid_to_ms"])
    route_idx = ru[codes] if n else np.zeros(0, dtype=np.int64)
    if n:
        route_idx = np.where((ts >= lo_u[codes]) & (ts < hi_u[codes]), route_idx, -1)
    in_corr, _ = corridor_tests(route_list, route_idx, lon, lat, inner_mask=np.zeros(n, dtype=bool))
    limits = np.array([cr.rules.speed_limit_kmh for cr in route_list] + [np.inf], dtype=np.float64)[route_idx]

    zindex = catalog.zone_index(master)
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
    calm = ~c["off_route"][rows_u] & ~c["overspeed"][rows_u]
    no_zones = np.array([not z for z in c["zones"][rows_u].tolist()], dtype=bool)
    fast = known & (bad_count == 0) & same_route_batch & (cur_route == fix_route) & calm & no_zones
    if force_slow:
        fast[:] = False
    # The inner band only matters to vehicles folded fix by fix.
    in_inner = inner_band_tests(route_list, route_idx, lon, lat, ~fast[codes]) if n else in_corr

    alerts: list[Alert] = []
    touched = np.zeros(len(states), dtype=bool)
    # ---- fast path: only the last fix of each vehicle matters.
    if fast.any():
        fr = rows_u[fast]
        last = ends[fast] - 1
        c["lat"][fr], c["lon"][fr], c["speed_kmh"][fr] = lat[last], lon[last], speed[last]
        c["last_seq"][fr], c["last_ts_ms"][fr], c["last_received_ms"][fr] = seq[last], ts[last], recv[last]
        c["outside_fixes"][fr] = 0
        c["outside_since_ms"][fr] = -1
        c["over_since_ms"][fr] = -1
        c["over_max_kmh"][fr] = 0.0
        c["silent"][fr] = False
        versions = np.array([cr.version for cr in route_list] + [0], dtype=np.int64)
        c["route_version"][fr] = versions[r_last[fast]]
        touched[fr] = True

    # ---- slow path: the reference state machine, fix by fix.
    for k in np.flatnonzero(~fast).tolist():
        row = int(rows_u[k])
        s = states.get(row)
        for i in range(int(starts[k]), int(ends[k])):
            ri = int(route_idx[i])
            cr = route_list[ri] if ri >= 0 else None
            f = Fix(
                int(seq[i]),
                int(ts[i]),
                float(lat[i]),
                float(lon[i]),
                float(speed[i]),
                int(recv[i]),
                cr.route_id if cr else None,
                cr.version if cr else 0,
                bool(in_corr[i]),
                bool(in_inner[i]),
                frozenset(zones_in.get(i, ())),
                frozenset(zones_outer.get(i, ())),
            )
            s, out = step(s, f, cr.rules if cr else None, cfg)
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
    return BucketResult(states, new_held, alerts, live, n, dropped, int(fast.sum()), int((~fast).sum()))


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
    cr = _route_rules(master, catalog, route_id if isinstance(route_id, str) else None)
    return cr.rules.silent_after_s if cr is not None else cfg.default_silent_after_s


def live_rows(
    states: StateTable, rows: np.ndarray, master: MasterState, catalog: Catalog
) -> list[dict[str, Any]]:
    """The live read model (docs/contracts.md) for the vehicles a batch touched."""
    if not len(rows):
        return []
    c = states.cols
    routes = c["route_id"][rows]
    lon, lat = c["lon"][rows], c["lat"][rows]
    progress = np.zeros(len(rows))
    ratio = np.zeros(len(rows))
    dist = np.full(len(rows), np.nan)
    codes, uniq = pd.factorize(routes, use_na_sentinel=True)
    compiled = [_route_rules(master, catalog, rid) for rid in uniq.tolist()]
    ok = np.array([cr is not None for cr in compiled] + [False], dtype=bool)[codes]
    if ok.any():
        # One vectorized call over every vehicle, each against its own route's metric projection.
        crs = [cr for cr in compiled if cr is not None]
        pos = np.cumsum([cr is not None for cr in compiled]) - 1
        ri = pos[codes[ok]]
        lon0 = np.array([cr.projection.lon0 for cr in crs])[ri]
        lat0 = np.array([cr.projection.lat0 for cr in crs])[ri]
        kx = np.array([cr.projection.kx for cr in crs])[ri]
        ky = np.array([cr.projection.ky for cr in crs])[ri]
        lines = np.array([cr.line_m for cr in crs], dtype=object)[ri]
        length = np.array([cr.length_m for cr in crs])[ri]
        pts = shapely.points((lon[ok] - lon0) * kx, (lat[ok] - lat0) * ky)
        p = shapely.line_locate_point(lines, pts)
        progress[ok], dist[ok] = p, shapely.distance(lines, pts)
        ratio[ok] = np.where(length > 0, p / np.maximum(length, 1e-9), 0.0)
    cols = [
        c[f][rows].tolist()
        for f in (
            "last_seq",
            "last_ts_ms",
            "lat",
            "lon",
            "speed_kmh",
            "off_route",
            "overspeed",
            "silent",
            "route_version",
        )
    ]
    zones = c["zones"][rows].tolist()
    rl = routes.tolist()
    prog, rat, dis = np.round(progress, 1).tolist(), np.round(ratio, 4).tolist(), np.round(dist, 1).tolist()
    out = []
    for k, row in enumerate(rows.tolist()):
        rid = rl[k]
        out.append(
            {
                "vehicle_id": states.ids[row],
                "seq": cols[0][k],
                "ts_ms": cols[1][k],
                "lat": cols[2][k],
                "lon": cols[3][k],
                "speed_kmh": cols[4][k],
                "status": "unassigned" if rid is None else ("off_route" if cols[5][k] else "on_route"),
                "overspeed": cols[6][k],
                "silent": cols[7][k],
                "route_id": rid,
                "route_version": cols[8][k],
                "progress_m": prog[k],
                "progress_ratio": rat[k],
                "distance_m": None if dis[k] != dis[k] else dis[k],
                "zones": sorted(zones[k]) if zones[k] else [],
            }
        )
    return out


def rules_for(master: MasterState, catalog: Catalog, route_id: str | None) -> RouteRules | None:
    cr = _route_rules(master, catalog, route_id)
    return cr.rules if cr else None
