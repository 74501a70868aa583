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
from dataclasses import dataclass, field, fields
from typing import Any

import numpy as np
import pandas as pd

from processor.domain import Alert, EngineConfig, Fix, RawFix, VehicleState, check_silence, reorder, step
from processor.geometry import (
    CompiledRoute,
    CompiledZone,
    RouteRules,
    ZoneIndex,
    compile_route,
    compile_zone,
    corridor_tests,
    distance_and_progress_m,
)

logger = logging.getLogger(__name__)

STATE_FIELDS = [f.name for f in fields(VehicleState)]
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


def empty_states() -> pd.DataFrame:
    return states_from_objects([])


def states_from_objects(states: Iterable[VehicleState]) -> pd.DataFrame:
    rows = [[getattr(s, f) for f in STATE_FIELDS] for s in states]
    df = pd.DataFrame(rows, columns=STATE_FIELDS)
    return _typed(df).set_index("vehicle_id", drop=False)


def _typed(df: pd.DataFrame) -> pd.DataFrame:
    ints = [
        "last_seq",
        "last_ts_ms",
        "last_received_ms",
        "route_version",
        "outside_fixes",
        "outside_since_ms",
        "inside_fixes",
        "over_since_ms",
    ]
    floats = ["lat", "lon", "speed_kmh", "over_max_kmh"]
    bools = ["off_route", "overspeed", "silent"]
    for c in ints:
        df[c] = df[c].astype("int64")
    for c in floats:
        df[c] = df[c].astype("float64")
    for c in bools:
        df[c] = df[c].astype(bool)
    df["vehicle_id"] = df["vehicle_id"].astype(object)
    df["route_id"] = df["route_id"].astype(object)
    df["zones"] = df["zones"].astype(object)
    return df


def state_of(row: Any) -> VehicleState:
    d = {f: getattr(row, f) for f in STATE_FIELDS}
    d["zones"] = dict(d["zones"] or {})
    d["route_id"] = None if d["route_id"] is None or d["route_id"] != d["route_id"] else d["route_id"]
    for k in ("off_route", "overspeed", "silent"):
        d[k] = bool(d[k])
    for k in (
        "last_seq",
        "last_ts_ms",
        "last_received_ms",
        "route_version",
        "outside_fixes",
        "outside_since_ms",
        "inside_fixes",
        "over_since_ms",
    ):
        d[k] = int(d[k])
    for k in ("lat", "lon", "speed_kmh", "over_max_kmh"):
        d[k] = float(d[k])
    return VehicleState(**d)


# --------------------------------------------------------------------------- batch result


@dataclass
class BucketResult:
    states: pd.DataFrame
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


def _order(
    states: pd.DataFrame,
    held: dict[str, list[RawFix]],
    fixes: pd.DataFrame,
    watermark_ms: int,
    cfg: EngineConfig,
) -> tuple[pd.DataFrame, dict[str, list[RawFix]], int]:
    """De-duplicate and order by seq; return (ready fixes sorted by vehicle and seq, held, dropped)."""
    n_in = len(fixes)
    f = fixes.sort_values(["vehicle_id", "seq"], kind="stable").drop_duplicates(["vehicle_id", "seq"])
    dup_in_batch = n_in - len(f)
    last = f["vehicle_id"].map(states["last_seq"]).fillna(-1).astype("int64").to_numpy()
    keep = f["seq"].to_numpy() > last
    dropped = dup_in_batch + int((~keep).sum())
    f = f[keep]
    last = last[keep]
    vid = f["vehicle_id"].to_numpy()
    seq = f["seq"].to_numpy()
    rank = f.groupby("vehicle_id", sort=False).cumcount().to_numpy()
    first = f.groupby("vehicle_id", sort=False)["seq"].transform("first").to_numpy()
    expected = np.where(last >= 0, last + 1 + rank, first + rank)
    gap = seq != expected
    held_vehicles = set(held)
    slow_v = set(pd.unique(vid[gap])) | (held_vehicles & set(pd.unique(vid)))
    # Vehicles with held fixes but no new arrivals still get a chance as the watermark advances.
    slow_v |= held_vehicles
    new_held: dict[str, list[RawFix]] = {}
    if not slow_v:
        return f, new_held, dropped
    is_slow = np.isin(vid, list(slow_v))
    fast_part = f[~is_slow]
    extra: list[tuple[Any, ...]] = []
    slow_f = f[is_slow]
    groups: dict[str, pd.DataFrame] = {}
    if len(slow_f):
        for v, grp in slow_f.groupby("vehicle_id", sort=False):
            groups[str(v)] = grp
    for v in sorted(slow_v):
        g = groups.get(v)
        arrived = _raw_fixes(g) if g is not None else []
        last_seq = int(states["last_seq"].get(v, -1))
        ready, still, dup = reorder(
            last_seq, held.get(v, []), arrived, watermark_ms, cfg.max_pending_per_vehicle
        )
        dropped += dup
        if still:
            new_held[v] = still
        extra.extend((v, r.seq, r.ts_ms, r.lat, r.lon, r.speed_kmh, r.received_ms) for r in ready)
    ready_df = (
        pd.concat([fast_part, pd.DataFrame(extra, columns=FIX_COLUMNS)], ignore_index=True)
        if extra
        else fast_part
    )
    ready_df = ready_df.astype({"seq": "int64", "ts_ms": "int64", "received_ms": "int64"})
    return ready_df.sort_values(["vehicle_id", "seq"], kind="stable"), new_held, dropped


def _raw_fixes(g: pd.DataFrame) -> list[RawFix]:
    cols = [g[c].to_numpy().tolist() for c in ("seq", "ts_ms", "lat", "lon", "speed_kmh", "received_ms")]
    return [
        RawFix(int(a), int(b), float(c), float(d), float(e), int(f))
        for a, b, c, d, e, f in zip(*cols, strict=True)
    ]


def process_bucket(
    states: pd.DataFrame,
    held: dict[str, list[RawFix]],
    master: MasterState,
    fixes: pd.DataFrame,
    watermark_ms: int,
    cfg: EngineConfig,
    catalog: Catalog,
    force_slow: bool = False,
) -> BucketResult:
    """Advance one bucket by one micro-batch of fixes (columns FIX_COLUMNS)."""
    fixes = fixes[FIX_COLUMNS]
    ready, new_held, dropped = _order(states, held, fixes, watermark_ms, cfg)
    n = len(ready)
    vid = ready["vehicle_id"].to_numpy(dtype=object)
    seq = ready["seq"].to_numpy()
    ts = ready["ts_ms"].to_numpy()
    lat = ready["lat"].to_numpy(dtype="float64")
    lon = ready["lon"].to_numpy(dtype="float64")
    speed = ready["speed_kmh"].to_numpy(dtype="float64")
    recv = ready["received_ms"].to_numpy()

    # Route of each fix from the assignment valid at its event time.
    route_list: list[CompiledRoute] = []
    route_pos: dict[str, int] = {}
    route_idx = np.full(n, -1, dtype=np.int64)
    if n:
        uv = pd.unique(vid)
        for v in uv:
            a = master.assignments.get(v)
            if a is None or a[1] is None:
                continue
            data = a[1]
            cr = _route_rules(master, catalog, data.get("route_id"))
            if cr is None:
                continue
            if cr.route_id not in route_pos:
                route_pos[cr.route_id] = len(route_list)
                route_list.append(cr)
            sel = vid == v
            lo = int(data.get("valid_from_ms") or 0)
            hi = data.get("valid_to_ms")
            ok = ts >= lo
            if hi is not None:
                ok &= ts < int(hi)
            route_idx[sel & ok] = route_pos[cr.route_id]
    in_corr, in_inner = corridor_tests(route_list, route_idx, lon, lat)
    limits = np.array([cr.rules.speed_limit_kmh for cr in route_list] + [np.inf], dtype=np.float64)[route_idx]

    zindex = catalog.zone_index(master)
    zones_in: dict[int, set[str]] = {}
    zones_outer: dict[int, set[str]] = {}
    if len(zindex) and n:
        inner_pairs, outer_pairs = zindex.memberships(lon, lat)
        for i, zi in inner_pairs:
            zones_in.setdefault(i, set()).add(zindex.zones[zi].zone_id)
        for i, zi in outer_pairs:
            zones_outer.setdefault(i, set()).add(zindex.zones[zi].zone_id)

    # ---- classify vehicles: fast (vectorized) or slow (domain.step).
    frame = pd.DataFrame({"v": vid, "ok": in_corr & (speed <= limits), "r": route_idx})
    in_zone = np.zeros(n, dtype=bool)
    if zones_in:
        in_zone[list(zones_in)] = True
    frame["ok"] &= ~in_zone
    agg = frame.groupby("v", sort=False).agg(ok=("ok", "all"), rmin=("r", "min"), rmax=("r", "max"))
    known = agg.index.isin(states.index)
    st = states.reindex(agg.index)
    cur_route = st["route_id"].to_numpy(dtype=object)
    fix_route = np.array(
        [route_list[i].route_id if i >= 0 else None for i in agg["rmin"].to_numpy()], dtype=object
    )
    same_route = (agg["rmin"].to_numpy() == agg["rmax"].to_numpy()) & (cur_route == fix_route)
    calm = known.copy()
    known_st = states.loc[agg.index[known]]
    calm[known] = ~known_st["off_route"].to_numpy(dtype=bool) & ~known_st["overspeed"].to_numpy(dtype=bool)
    no_zones = np.array([not z for z in st["zones"].to_numpy(dtype=object)], dtype=bool)
    fast_mask = known & agg["ok"].to_numpy() & same_route & calm & no_zones
    if force_slow:
        fast_mask[:] = False
    fast_v = agg.index[fast_mask]
    slow_v = agg.index[~fast_mask]

    new_states = states.copy()
    alerts: list[Alert] = []
    touched: set[str] = set()

    # ---- fast path: only the last fix of each vehicle matters.
    if len(fast_v):
        is_fast = np.isin(vid, fast_v.to_numpy())
        last_rows = ready[is_fast].groupby("vehicle_id", sort=False).tail(1).set_index("vehicle_id")
        idx = last_rows.index
        for col in ("lat", "lon", "speed_kmh"):
            new_states.loc[idx, col] = last_rows[col].to_numpy()
        new_states.loc[idx, "last_seq"] = last_rows["seq"].to_numpy()
        new_states.loc[idx, "last_ts_ms"] = last_rows["ts_ms"].to_numpy()
        new_states.loc[idx, "last_received_ms"] = last_rows["received_ms"].to_numpy()
        new_states.loc[idx, "outside_fixes"] = 0
        new_states.loc[idx, "outside_since_ms"] = -1
        new_states.loc[idx, "over_since_ms"] = -1
        new_states.loc[idx, "over_max_kmh"] = 0.0
        new_states.loc[idx, "silent"] = False
        versions = np.array([r.version for r in route_list] + [0], dtype=np.int64)
        last_route = (
            pd.Series(route_idx[is_fast], index=ready.index[is_fast])
            .groupby(ready["vehicle_id"].to_numpy()[is_fast], sort=False)
            .last()
        )
        new_states.loc[idx, "route_version"] = versions[last_route.reindex(idx).to_numpy()]
        touched.update(idx.tolist())

    # ---- slow path: the reference state machine, fix by fix.
    if len(slow_v):
        slow_set = set(slow_v.tolist())
        positions: dict[str, list[int]] = {}
        for i, v in enumerate(vid.tolist()):
            if v in slow_set:
                positions.setdefault(v, []).append(i)
        rows = []
        for v, pos in positions.items():
            s = state_of(new_states.loc[v]) if v in new_states.index else VehicleState(v)
            for i in pos:
                ri = int(route_idx[i])
                cr = route_list[ri] if ri >= 0 else None
                fx = Fix(
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
                s, out = step(s, fx, cr.rules if cr else None, cfg)
                alerts.extend(out)
            rows.append(s)
            touched.add(v)
        upd = states_from_objects(rows)
        new_states = _typed(pd.concat([new_states.drop(index=upd.index, errors="ignore"), upd]))

    # ---- event-time silence for every vehicle of the bucket.
    if len(new_states):
        silent_after = np.array(
            [_silent_after(master, catalog, r, cfg) for r in new_states["route_id"].to_numpy()]
        )
        due = new_states["last_ts_ms"].to_numpy() + (silent_after * 1000).astype("int64")
        cand = (
            (~new_states["silent"].to_numpy(dtype=bool))
            & (new_states["last_seq"].to_numpy() >= 0)
            & (due <= watermark_ms)
        )
        if cand.any():
            rows = []
            for k in np.nonzero(cand)[0].tolist():
                s = state_of(new_states.iloc[k])
                s, out = check_silence(s, watermark_ms, float(silent_after[k]))
                alerts.extend(out)
                rows.append(s)
                touched.add(s.vehicle_id)
            upd = states_from_objects(rows)
            new_states = _typed(pd.concat([new_states.drop(index=upd.index), upd]))

    new_states = new_states.sort_index()
    live = live_rows(new_states, sorted(touched), master, catalog)
    return BucketResult(new_states, new_held, alerts, live, n, dropped, int(fast_mask.sum()), len(slow_v))


def _silent_after(master: MasterState, catalog: Catalog, route_id: Any, cfg: EngineConfig) -> float:
    cr = _route_rules(master, catalog, route_id if isinstance(route_id, str) else None)
    return cr.rules.silent_after_s if cr is not None else cfg.default_silent_after_s


def live_rows(
    states: pd.DataFrame, vehicles: list[str], master: MasterState, catalog: Catalog
) -> list[dict[str, Any]]:
    """The live read model (docs/contracts.md) for the vehicles a batch touched."""
    if not vehicles:
        return []
    sub = states.loc[vehicles]
    progress = np.zeros(len(sub))
    ratio = np.zeros(len(sub))
    dist = np.full(len(sub), np.nan)
    routes = sub["route_id"].to_numpy(dtype=object)
    lon = sub["lon"].to_numpy()
    lat = sub["lat"].to_numpy()
    for rid in {r for r in routes if isinstance(r, str)}:
        cr = _route_rules(master, catalog, rid)
        if cr is None:
            continue
        sel = routes == rid
        d, p = distance_and_progress_m(cr, lon[sel], lat[sel])
        progress[sel], dist[sel] = p, d
        ratio[sel] = p / cr.length_m if cr.length_m > 0 else 0.0
    out = []
    r: Any
    for k, r in enumerate(sub.itertuples(index=False)):
        status = (
            "unassigned" if not isinstance(r.route_id, str) else ("off_route" if r.off_route else "on_route")
        )
        out.append(
            {
                "vehicle_id": r.vehicle_id,
                "seq": int(r.last_seq),
                "ts_ms": int(r.last_ts_ms),
                "lat": float(r.lat),
                "lon": float(r.lon),
                "speed_kmh": float(r.speed_kmh),
                "status": status,
                "overspeed": bool(r.overspeed),
                "silent": bool(r.silent),
                "route_id": r.route_id if isinstance(r.route_id, str) else None,
                "route_version": int(r.route_version),
                "progress_m": round(float(progress[k]), 1),
                "progress_ratio": round(float(ratio[k]), 4),
                "distance_m": None if np.isnan(dist[k]) else round(float(dist[k]), 1),
                "zones": sorted((r.zones or {}).keys()),
            }
        )
    return out


def rules_for(master: MasterState, catalog: Catalog, route_id: str | None) -> RouteRules | None:
    cr = _route_rules(master, catalog, route_id)
    return cr.rules if cr else None
