"""A reproducible fleet workload for benchmarks: routes, assignments and canonical telemetry.

Vectorized with numpy so a million fixes take a second or two to build: vehicles drive their route
forward at 1 Hz and a steady speed; a share of them leave the corridor for a while (300 m off) and
come back, so every contender has real alerts to produce and the alert counts can be compared.

The route-awareness rules (issue #26) are master data, so one telemetry stream serves two master
data sets (`Workload.master_for`): `off`, the routes' wrong-way, stop and arrival rules set to null
and no planned times; `on`, the rules' defaults and assignments with a planned departure and arrival
(on time for most vehicles, `late_share` of them planned so early that ARRIVAL_AT_RISK fires once
the ETA warms up). The vehicles never stop (>= 30 km/h), never turn back and stay clear of their
route's end. Their route-awareness alerts: the late trips' ARRIVAL_AT_RISK, and a WRONG_DIRECTION
and DIRECTION_RESTORED where a deviation (300 m north) lands in the corridor of an earlier stretch
of the same route: no deviation then, for any contender, but progress jumps back (seed 1, 10,000
vehicles: 48 such, against 445 deviations).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import orjson
import shapely

from fleetfence.geo import LocalProjection

T0_MS = 1_795_000_000_000
CENTER = (13.40, 52.52)
# A route's master data with the route-awareness rules switched off (fleetfence.rules.RouteRules).
ROUTE_RULES_OFF: dict[str, Any] = {"wrong_way_min_m": None, "stop_min_s": None, "arrival_risk_s": None}


@dataclass
class Workload:
    master: list[dict[str, Any]]
    routes: dict[str, dict[str, Any]]  # route_id -> master data
    assignment: dict[str, str]  # vehicle_id -> route_id
    vehicle: np.ndarray  # object array of vehicle ids, one per fix
    seq: np.ndarray
    ts_ms: np.ndarray
    lat: np.ndarray
    lon: np.ndarray
    speed_kmh: np.ndarray
    # Per vehicle (in id order): its first fix's time and its expected arrival at the route's end
    # at its steady speed (epoch ms), what the `on` master data plans its trip from.
    departure_ms: np.ndarray | None = None
    arrival_ms: np.ndarray | None = None
    seed: int = 1

    def master_for(self, route_rules: str, late_share: float = 0.01) -> list[dict[str, Any]]:
        """The master data of this workload with the route-awareness rules `off` or `on` (see the
        module's doc); `default` is `master` itself (today's defaults, no planned times)."""
        if route_rules == "default":
            return self.master
        if route_rules not in ("off", "on"):
            raise ValueError(f"route_rules must be off, on or default, not {route_rules!r}")
        off = route_rules == "off"
        out = [
            {**e, "data": {**e["data"], **ROUTE_RULES_OFF}} if e["entity"] == "route" and off else e
            for e in self.master
        ]
        if off:
            return out
        if self.departure_ms is None or self.arrival_ms is None:
            raise ValueError("this workload has no trip times")
        rng = np.random.default_rng(self.seed + 7919)
        n = len(self.departure_ms)
        late = rng.random(n) < late_share
        # On time: planned 0-10 min after the expected arrival. Late: 15-30 min before it, beyond
        # the default arrival_risk_s (600 s) whatever the ETA's rounding.
        slack_s = np.where(late, -rng.uniform(900, 1800, n), rng.uniform(0, 600, n))
        planned = (self.arrival_ms + slack_s * 1000).astype(np.int64)
        dep, arr = self.departure_ms.tolist(), planned.tolist()
        for j, e in enumerate(out):
            if e["entity"] == "assignment":
                k = int(e["id"].rsplit("-", 1)[1])  # veh-000123
                times = {"planned_departure_ms": dep[k], "planned_arrival_ms": arr[k]}
                out[j] = {**e, "data": {**e["data"], **times}}
        return out

    def __len__(self) -> int:
        return len(self.seq)

    def records(
        self, start: int = 0, stop: int | None = None, shift_ms: int = 0
    ) -> list[tuple[bytes, bytes]]:
        """Records [start, stop) as the telemetry topic holds them; `shift_ms` moves their event
        (and received) times, e.g. into the past for a fleet that has since gone quiet."""
        stop = len(self) if stop is None else stop
        out = []
        v, s, t, la, lo, sp = (
            self.vehicle[start:stop].tolist(),
            self.seq[start:stop].tolist(),
            (self.ts_ms[start:stop] + shift_ms).tolist(),
            self.lat[start:stop].tolist(),
            self.lon[start:stop].tolist(),
            self.speed_kmh[start:stop].tolist(),
        )
        for i in range(stop - start):
            out.append(
                (
                    v[i].encode(),
                    orjson.dumps(
                        {
                            "vehicle_id": v[i],
                            "seq": s[i],
                            "ts_ms": t[i],
                            "lat": la[i],
                            "lon": lo[i],
                            "speed_kmh": sp[i],
                            "heading_deg": None,
                            "accuracy_m": None,
                            "received_ms": t[i],
                        }
                    ),
                )
            )
        return out


def make_route(rng: np.random.Generator, proj: LocalProjection, vertices: int = 200) -> list[list[float]]:
    """A road-like polyline: a random walk with bounded turns, ~50 m segments."""
    heading = rng.uniform(0, 2 * np.pi)
    turns = rng.normal(0, 0.15, vertices).cumsum() + heading
    step = rng.uniform(40, 60, vertices)
    start = rng.uniform(-8000, 8000, 2)
    x = start[0] + np.concatenate([[0], (step * np.cos(turns)).cumsum()[:-1]])
    y = start[1] + np.concatenate([[0], (step * np.sin(turns)).cumsum()[:-1]])
    lon, lat = proj.inverse(x, y)
    return [[round(float(a), 7), round(float(b), 7)] for a, b in zip(lon, lat, strict=True)]


def build(
    n_vehicles: int,
    fixes_per_vehicle: int,
    n_routes: int = 300,
    deviating_share: float = 0.05,
    seed: int = 1,
    corridor_width_m: float = 100.0,
    speed_limit_kmh: float = 80.0,
) -> Workload:
    rng = np.random.default_rng(seed)
    proj = LocalProjection(*CENTER)
    routes: dict[str, dict[str, Any]] = {}
    lines_m = []
    for r in range(n_routes):
        coords = make_route(rng, proj)
        rid = f"r{r}"
        routes[rid] = {
            "route_id": rid,
            "name": rid,
            "geometry": {"type": "LineString", "coordinates": coords},
            "corridor_width_m": corridor_width_m,
            "speed_limit_kmh": speed_limit_kmh,
            "deviation_min_fixes": 3,
            "deviation_min_s": 0,
            "overspeed_min_s": 10,
            "silent_after_s": 3600,
        }
        c = np.array(coords)
        x, y = proj.forward(c[:, 0], c[:, 1])
        lines_m.append(shapely.linestrings(np.column_stack([x, y])))
    master: list[dict[str, Any]] = [
        {"entity": "route", "id": rid, "version": 1, "op": "upsert", "ts_ms": T0_MS, "data": d}
        for rid, d in routes.items()
    ]
    vids = np.array([f"veh-{i:06d}" for i in range(n_vehicles)], dtype=object)
    route_of = rng.integers(0, n_routes, n_vehicles)
    assignment = {v: f"r{route_of[i]}" for i, v in enumerate(vids.tolist())}
    master += [
        {
            "entity": "assignment",
            "id": v,
            "version": 1,
            "op": "upsert",
            "ts_ms": T0_MS,
            "data": {"vehicle_id": v, "route_id": r, "valid_from_ms": 0, "valid_to_ms": None},
        }
        for v, r in assignment.items()
    ]

    k = np.tile(np.arange(fixes_per_vehicle), n_vehicles)  # fix index per vehicle
    vi = np.repeat(np.arange(n_vehicles), fixes_per_vehicle)
    speed = rng.uniform(30, 60, n_vehicles)[vi]
    start = rng.uniform(0, 0.3, n_vehicles)[vi]
    lengths = np.array([ln.length for ln in lines_m])
    dist = (start * lengths[route_of[vi]] + k * speed / 3.6) % lengths[route_of[vi]]
    pts = shapely.line_interpolate_point(np.array(lines_m, dtype=object)[route_of[vi]], dist)
    x, y = shapely.get_x(pts), shapely.get_y(pts)
    # Deviations: 300 m north for 20 fixes starting at a random fix.
    dev = rng.random(n_vehicles) < deviating_share
    dev_start = rng.integers(5, max(6, fixes_per_vehicle - 25), n_vehicles)
    off = dev[vi] & (k >= dev_start[vi]) & (k < dev_start[vi] + 20)
    y = y + np.where(off, 300.0, 0.0)
    lon, lat = proj.inverse(x, y)
    ts = T0_MS + k * 1000 + (vi % 1000)
    # Time order across the fleet, like a live stream.
    order = np.lexsort((vi, k))
    v_speed = speed[::fixes_per_vehicle] / 3.6 if fixes_per_vehicle else np.ones(n_vehicles)
    v_len = lengths[route_of]
    v_start = start[::fixes_per_vehicle] * v_len if fixes_per_vehicle else np.zeros(n_vehicles)
    departure = T0_MS + np.arange(n_vehicles) % 1000
    arrival = departure + ((v_len - v_start) / v_speed * 1000).astype(np.int64)
    return Workload(
        master,
        routes,
        assignment,
        vids[vi][order],
        k[order].astype(np.int64),
        ts[order],
        lat[order],
        lon[order],
        speed[order],
        departure.astype(np.int64),
        arrival.astype(np.int64),
        seed,
    )
