"""The fleet model: kinematics, injected behaviour, transport faults and the exact ground truth.

Pure and deterministic for a seed (numpy Generator, no clock, no I/O). The fleet advances one tick
at a time over arrays of N vehicles, so 100k vehicles cost a few array operations per tick and
O(N) memory, never O(N x ticks).

Why the ground truth is exact: every fact an alert depends on is *planned* with a margin the GPS
noise cannot cross, and the truth is derived from the plan, never from geometry tests on the
noisy fixes or from processor code:
- on the route, a fix lies within the noise bound of the line, well inside the inner band;
- a deviation jumps straight from the route to >= 0.6 x (3 x half width + 5 sigma) off it (checked
  against the whole line, so no turn brings it back near), and later straight back: no fix ever
  lies in the ambiguous band around the corridor edge;
- zones are rectangles across straight runs; a fix's along-route noise is clamped so it never
  crosses a zone edge (or the edge grown by the hysteresis band) relative to the planned position;
- speeds are reported exactly as planned, cruising below limit - hysteresis, speeding well above;
- a vehicle goes silent early enough that the rest of the fleet moves the watermark past its due
  time; only "calm" fixes (whose loss changes no alert) are delivered late.
- every vehicle drives its route forward from a random point; at the end (ROUTE_COMPLETED, its
  distance to the end kept clear of the radius) it turns and drives back, which the processor no
  longer judges (a completed trip raises no direction, stop or arrival alert);
- stops are planned with exact reported speeds and move less than the stop radius by far, so the
  stop rules decide on the speeds and the zone alone;
- wrong-way stretches and scheduled trips are driven without noise (simulator.trips).
The alert rules (processor.domain's semantics, restated here) are then applied to those planned
facts per vehicle, in seq order.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterator

import numpy as np
import numpy.typing as npt
import shapely

from fleetfence.contracts import AlertType
from simulator.batch import Message, ScenarioStats, TickBatch, make_batch
from simulator.config import ScenarioConfig
from simulator.geo import BoolArray, FloatArray, IntArray, clip_radius
from simulator.routes import EDGE_MARGIN_M, CityMap, build_city, excursion_safe, place_zones
from simulator.trips import (
    ProcessorFrame,
    end_nudge,
    eta_ms,
    is_shared,
    placeable_start,
    plan_schedule,
    shared_stretches,
    unplaceable_completions,
    wrong_way_profile,
)
from simulator.truth import TruthAlert, vehicle_id

__all__ = ["WW_DONE", "Scenario", "ScenarioStats", "TickBatch"]

logger = logging.getLogger(__name__)

ACCEL_MS2 = 1.5
DECEL_MS2 = 3.0
SIDE_STREET_KMH = 15.0
RAMP = (0.6, 0.8)  # fractions of the excursion offset on the way out and (reversed) back
ZONE_CLAMP_M = 1.5  # a fix stays at least this far on its planned side of every zone edge
WW_APPROACH = 6  # noise-free ticks of normal driving before a wrong-way turn (the anchor is exact)
WW_HOLD = 2  # ticks standing at each turn
WW_TAIL = 3  # noise-free ticks after the stretch
SCHEDULE_HOLD_S = 60.0  # a scheduled trip stands this long at its start: it departs late

# Wrong-way phases: 0 pending, 1 approach, 2 braking, 3 turn, 4 reverse, 5 braking, 6 turn,
# 7 forward, 8 tail, 9 done, 10 skipped.
WW_ACTIVE = (1, 2, 3, 4, 5, 6, 7, 8)
WW_DONE, WW_SKIPPED = 9, 10


def _count(p: float, n: int) -> int:
    return math.floor(p * n + 0.5)


class Scenario:
    """A fleet on a city map; iterate `ticks()` once to get every message and the truth."""

    def __init__(self, cfg: ScenarioConfig) -> None:
        cfg.validate()
        self.cfg = cfg
        rng = np.random.default_rng(cfg.seed)
        self.rng = rng
        self.city: CityMap = build_city(
            rng,
            n_routes=cfg.n_routes,
            route_length_m=cfg.route_length_m,
            bbox=cfg.bbox,
            prefix=cfg.vehicle_prefix,
            geojson=cfg.routes_geojson,
        )
        place_zones(
            self.city,
            rng,
            cfg.zones_per_route,
            cfg.rules.corridor_width_m / 2,
            cfg.assume.hysteresis_m,
            cfg.noise_bound_m,
            cfg.vehicle_prefix,
            end_clear_m=cfg.rules.completion_radius_m + cfg.noise_bound_m + EDGE_MARGIN_M + 10.0,
        )
        grown = [shapely.buffer(z.polygon_m, cfg.assume.hysteresis_m) for z in self.city.zones]
        self.zones_grown = shapely.union_all(grown) if grown else None
        self.stats = ScenarioStats()
        self._plan()

    # ------------------------------------------------------------------ identity

    @property
    def n(self) -> int:
        return self.cfg.vehicles

    def vehicle_ids(self) -> list[str]:
        return [vehicle_id(self.cfg.vehicle_prefix, i) for i in range(self.n)]

    def seq_base(self) -> int:
        """Seqs continue across runs: tick k of a run starting at t has seq t / period + k."""
        return self.cfg.start_ms // self.cfg.period_ms

    # ------------------------------------------------------------------ plan

    def _plan(self) -> None:
        cfg, rng, n = self.cfg, self.rng, self.n
        n_routes = len(self.city.routes)
        self.route_idx = (np.arange(n) % n_routes).astype(np.int64)
        self.by_route = [np.nonzero(self.route_idx == r)[0] for r in range(n_routes)]
        lengths = np.array([r.line.length_m for r in self.city.routes])
        self.length = lengths[self.route_idx]
        self.s = rng.uniform(0, 1, n) * self.length
        rng.random(n)  # the draw that once chose each vehicle's direction: a seed keeps its fleet
        self.direction = np.ones(n)  # along the route: backwards is an alert now (WRONG_DIRECTION)
        limit = cfg.rules.speed_limit_kmh
        cruise_kmh = np.minimum(
            rng.uniform(0.55, 0.85, n) * limit, limit - cfg.assume.overspeed_hysteresis_kmh - 2
        )
        self.cruise = cruise_kmh / 3.6
        self.v = self.cruise.copy()
        self.v_over = (limit + cfg.assume.overspeed_hysteresis_kmh + max(15.0, 0.25 * limit)) / 3.6
        self.stop_until = np.full(n, -1, dtype=np.int64)
        self.alive = np.ones(n, dtype=bool)

        # Zones of each vehicle's route, padded to the same count.
        zmax = max([len(r.zones) for r in self.city.routes] + [0])
        self.zmax = zmax
        za = np.full((n_routes, max(zmax, 1)), np.nan)
        zb = np.full((n_routes, max(zmax, 1)), np.nan)
        tzx = np.zeros((n_routes, max(zmax, 1)))
        tzy = np.zeros((n_routes, max(zmax, 1)))
        self.zone_ids: list[list[str]] = []
        for ri, r in enumerate(self.city.routes):
            self.zone_ids.append([z.zone_id for z in r.zones])
            for zi, z in enumerate(r.zones):
                za[ri, zi], zb[ri, zi] = z.start_m, z.end_m
                _x, _y, ux, uy = r.line.at(np.array([z.start_m + 1.0]))
                tzx[ri, zi], tzy[ri, zi] = ux[0], uy[0]
        self.za, self.zb, self.tzx, self.tzy = za, zb, tzx, tzy
        self.zone_planned = np.zeros((n_routes, max(zmax, 1)), dtype=bool)
        for ri, r in enumerate(self.city.routes):
            for zi, z in enumerate(r.zones):
                self.zone_planned[ri, zi] = z.planned_stop
        self.in_zone = np.zeros((n, max(zmax, 1)), dtype=bool)

        # Injection schedule: each behaviour in its own slot of the vehicle's timeline.
        t = cfg.n_ticks
        per_s = 1000 / cfg.period_ms
        silence_margin = math.ceil(
            (cfg.rules.silent_after_s * 1000 + cfg.assume.lateness_ms + 3 * cfg.period_ms) / cfg.period_ms
        )
        self.silent_tick = np.full(n, -1, dtype=np.int64)
        n_silent = min(_count(cfg.inject.silent, n), n - 1)
        latest_silence = t - 1 - silence_margin
        if n_silent > 0 and latest_silence > 10:
            chosen = rng.permutation(n)[:n_silent]
            self.silent_tick[chosen] = rng.integers(
                max(10, latest_silence // 2), latest_silence + 1, n_silent
            )
        elif n_silent > 0:
            self.stats.skipped += n_silent
        # Route awareness: wrong-way stretches and scheduled trips, on vehicles with no other
        # behaviour (so each episode can use the whole timeline).
        rules = cfg.rules
        pool = rng.permutation(np.flatnonzero(self.silent_tick < 0))
        n_ww = _count(cfg.inject.wrong_way, n) if math.isfinite(rules.wrong_way_min_m) else 0
        n_sc = _count(cfg.inject.schedule, n) if math.isfinite(rules.arrival_risk_s) else 0
        n_ww = min(n_ww, len(pool))
        n_sc = min(n_sc, len(pool) - n_ww)
        self.ww = np.zeros(n, dtype=bool)
        self.ww[pool[:n_ww]] = True
        self.sched = np.zeros(n, dtype=bool)
        self.sched[pool[n_ww : n_ww + n_sc]] = True
        self.exclusive = self.ww | self.sched
        self.ww_profile = (
            wrong_way_profile(rules.wrong_way_min_m, ACCEL_MS2, cfg.period_ms / 1000) if n_ww else np.zeros(1)
        )
        self.ww_back = len(self.ww_profile)
        ww_need = WW_APPROACH + 2 * (8 + WW_HOLD + self.ww_back) + WW_TAIL + 2
        self.ww_tick = np.full(n, -1, dtype=np.int64)
        self.ww_deadline = np.full(n, -1, dtype=np.int64)
        latest = t - 2 - ww_need
        ww_ids = np.flatnonzero(self.ww)
        if len(ww_ids) and latest > 5:
            # Early on the route and early in the run: the stretch must be over before the end.
            self.s[ww_ids] = (
                rules.wrong_way_min_m + 150.0 + rng.uniform(0, 0.1, len(ww_ids)) * self.length[ww_ids]
            )
            self.ww_tick[ww_ids] = rng.integers(5, 15, len(ww_ids))
            self.ww_deadline[ww_ids] = latest
        else:
            self.stats.skipped += len(ww_ids)
        self.ww_phase = np.where(self.ww & (self.ww_tick >= 0), 0, WW_SKIPPED).astype(np.int8)
        self.ww_i = np.zeros(n, dtype=np.int64)
        self.frames = [ProcessorFrame(route.coords_lonlat) for route in self.city.routes]
        slack = cfg.noise_bound_m + EDGE_MARGIN_M
        self.shared = [
            shared_stretches(route.line, rules.corridor_width_m / 2, slack) for route in self.city.routes
        ]
        self.end_xy = np.array([[route.line.x[-1], route.line.y[-1]] for route in self.city.routes])
        # Starts the processor could not judge: moved back along the route, with no random draw, so
        # a seed keeps the rest of its fleet (simulator.trips.unplaceable_completions).
        skip = self.v_over * cfg.period_ms / 1000 + slack
        refused = [
            unplaceable_completions(
                route.line, rules.corridor_width_m / 2, slack, rules.completion_radius_m, skip
            )
            for route in self.city.routes
        ]
        for i in np.flatnonzero(~self.exclusive).tolist():
            self.s[i] = placeable_start(refused[int(self.route_idx[i])], float(self.s[i]), skip)
        sc_ids = np.flatnonzero(self.sched)
        self.s[sc_ids] = rng.uniform(0, 0.25, len(sc_ids)) * self.length[sc_ids]
        self.v[sc_ids] = 0.0
        self.stop_until[sc_ids] = math.ceil(SCHEDULE_HOLD_S * per_s) - 1
        self.planned_arrival_ms = np.full(n, -1, dtype=np.int64)
        self.eta_table: dict[int, FloatArray] = {}
        for i in sc_ids.tolist():
            self._plan_schedule(i)

        horizon = np.where(self.silent_tick >= 0, self.silent_tick - 5, t - 2)
        slot = (horizon - 5) // 3

        def schedule(p: float, k: int, need: int) -> tuple[IntArray, IntArray]:
            at = np.full(n, -1, dtype=np.int64)
            deadline = np.full(n, -1, dtype=np.int64)
            cnt = _count(p, n)
            if cnt == 0:
                return at, deadline
            chosen = rng.permutation(n)[:cnt]
            start = 5 + k * slot[chosen]
            ok = slot[chosen] >= need + 3
            self.stats.skipped += int((~ok).sum())
            chosen, start = chosen[ok], start[ok]
            at[chosen] = start + (rng.random(len(chosen)) * (slot[chosen] - need) / 3).astype(np.int64)
            deadline[chosen] = start + slot[chosen] - need
            return at, deadline

        j_star = max(cfg.rules.deviation_min_fixes, math.ceil(cfg.rules.deviation_min_s * per_s) + 1)
        self.dev_hold = np.maximum(j_star - len(RAMP), 0) + rng.integers(2, 7, n)
        dev_need = int(self.dev_hold.max()) + 2 * len(RAMP) + cfg.assume.return_min_fixes + 2
        self.dev_tick, self.dev_deadline = schedule(cfg.inject.deviation, 0, dev_need)
        self.dev_phase = np.zeros(n, dtype=np.int8)  # 0 pending/none, 1 excursion, 2 done, 3 skipped
        self.dev_i = np.zeros(n, dtype=np.int64)
        self.dev_s = np.zeros(n)
        self.dev_side = np.ones(n)

        self.ovs_extra_ms = rng.integers(2, 8, n) * 1000
        ramp = math.ceil(self.v_over / ACCEL_MS2 * per_s) + math.ceil(self.v_over / DECEL_MS2 * per_s)
        ovs_need = ramp + math.ceil((cfg.rules.overspeed_min_s + 8) * per_s) + 4
        self.ovs_tick, self.ovs_deadline = schedule(cfg.inject.overspeed, 1, ovs_need)
        self.ovs_phase = np.zeros(n, dtype=np.int8)  # 0 pending/none, 1 speeding, 2 done, 3 skipped
        self.ovs_first_over = np.full(n, -1, dtype=np.int64)

        self.dwell_ticks = (rng.uniform(20, 90, n) * per_s).astype(np.int64)
        has_zone = np.array([len(r.zones) > 0 for r in self.city.routes])[self.route_idx]
        self.dwell_tick, self.dwell_deadline = schedule(
            cfg.inject.dwell if has_zone.any() else 0.0, 2, int(self.dwell_ticks.max()) + 4
        )
        self.dwell_tick[~has_zone] = -1
        self.dwell_phase = np.zeros(n, dtype=np.int8)
        for at in (self.dev_tick, self.ovs_tick, self.dwell_tick):
            at[self.exclusive] = -1

        # Truth state: the alert rules over the planned facts.
        self.off_route = np.zeros(n, dtype=bool)
        self.outside = np.zeros(n, dtype=np.int64)
        self.outside_since = np.full(n, -1, dtype=np.int64)
        self.inside = np.zeros(n, dtype=np.int64)
        self.overspeed = np.zeros(n, dtype=bool)
        self.over_since = np.full(n, -1, dtype=np.int64)
        self.withheld_until = np.full(n, -1, dtype=np.int64)
        self.completed = np.zeros(n, dtype=bool)
        self.stop_since = np.full(n, -1, dtype=np.int64)  # tick of the stop's first slow fix
        self.stop_phase = np.zeros(n, dtype=np.int8)  # 0 pending, 1 unplanned (alerted), 2 planned
        self.stop_x = np.zeros(n)
        self.stop_y = np.zeros(n)
        self.wrong = np.zeros(n, dtype=bool)
        self.anchor_s = np.full(n, -1.0)
        self.anchor_k = np.full(n, -1, dtype=np.int64)
        self.anchor_fixes = np.zeros(n, dtype=np.int64)
        self.at_risk = np.zeros(n, dtype=bool)

    def _plan_schedule(self, i: int) -> None:
        """Drive scheduled vehicle i's whole trip ahead (its kinematics involve no random event: the
        same float operations `_tick` applies) and choose its planned arrival (simulator.trips)."""
        cfg = self.cfg
        dt = cfg.period_ms / 1000.0
        ri = int(self.route_idx[i])
        route = self.city.routes[ri]
        length = float(self.length[i])
        s, v, cruise, hold_until = float(self.s[i]), 0.0, float(self.cruise[i]), int(self.stop_until[i])
        track: list[float] = []
        for k in range(cfg.n_ticks):
            target = 0.0 if hold_until >= k else cruise
            v = v + min(max(target - v, -DECEL_MS2 * dt), ACCEL_MS2 * dt)
            s = s + 1.0 * v * dt
            if s > length:
                break
            track.append(s)
        if len(track) < 3 or is_shared(self.shared[ri], track[0], reach_m=50.0):
            # Too short, or starting where the processor cannot place it (its ETA would start later).
            self.stats.skipped += 1
            return
        sa = np.array(track)
        x, y, _tx, _ty = route.line.at(sa)
        zero = np.zeros(len(sa))
        on = np.ones(len(sa), dtype=bool)
        nx, ny, _p, _o, _shift = self._zone_clamp(np.full(len(sa), ri), sa, on, zero, zero)
        ex, ey = np.full(len(sa), self.end_xy[ri, 0]), np.full(len(sa), self.end_xy[ri, 1])
        nx, ny = end_nudge(x, y, nx, ny, ex, ey, cfg.rules.completion_radius_m)
        lon, lat = self.city.projection.inverse(x + nx, y + ny)
        frame = self.frames[ri]
        prog = frame.progress_m(lon, lat)
        done = (sa >= length / 2) & (np.hypot(x + nx - ex, y + ny - ey) <= cfg.rules.completion_radius_m)
        end = int(np.argmax(done)) if done.any() else len(sa)
        ts = (cfg.start_ms + np.arange(len(sa)) * cfg.period_ms).astype(np.float64)
        eta = eta_ms(
            ts[:end], prog[:end], frame.length_m, cfg.assume.eta_warmup_s, cfg.assume.eta_min_speed_kmh
        )
        planned = plan_schedule(eta, cfg.rules.arrival_risk_s, cfg.assume.arrival_hysteresis_s)
        if planned is None:
            self.stats.skipped += 1
            return
        self.planned_arrival_ms[i] = planned
        self.eta_table[i] = eta
        self.stats.schedules += 1

    # ------------------------------------------------------------------ ticks

    def ticks(self) -> Iterator[TickBatch]:
        cfg = self.cfg
        pending_silence: list[TruthAlert] = []
        withheld: dict[int, list[Message]] = {}
        for k in range(cfg.n_ticks):
            batch = self._tick(k, pending_silence, withheld)
            yield batch
        # Whatever is still withheld (late fixes near the end) goes out last.
        rest = [m for t in sorted(withheld) for m in withheld[t]]
        if rest:
            self.stats.messages += len(rest)
            yield make_batch(cfg.n_ticks, cfg.start_ms + cfg.n_ticks * cfg.period_ms, rest, [])

    def _tick(
        self,
        k: int,
        pending_silence: list[TruthAlert],
        withheld: dict[int, list[Message]],
    ) -> TickBatch:
        cfg, rng, n = self.cfg, self.rng, self.n
        period = cfg.period_ms
        dt = period / 1000.0
        ts = cfg.start_ms + k * period
        seq = self.seq_base() + k
        truth: list[TruthAlert] = []
        vids = self.vehicle_ids_cached()

        # Silence: the vehicle publishes nothing from this tick on.
        going = np.nonzero(self.alive & (self.silent_tick == k))[0]
        for i in going.tolist():
            self.alive[i] = False
            due = ts - period + int(cfg.rules.silent_after_s * 1000)
            tick_due = math.ceil((due + cfg.assume.lateness_ms - cfg.start_ms) / period)
            pending_silence.append(
                TruthAlert(vids[i], AlertType.VEHICLE_SILENT.value, seq - 1, due, None, tick_due)
            )
            self.stats.silences += 1
        alive = self.alive

        # Behaviour state transitions.
        excursion = self.dev_phase == 1
        ended = excursion & (self.dev_i >= self.dev_hold + 2 * len(RAMP))
        self.dev_phase[ended] = 2
        self.s[ended] = self.dev_s[ended]
        self.v[ended] = SIDE_STREET_KMH / 3.6
        cand = alive & (self.dev_phase == 0) & (self.dev_tick >= 0) & (k >= self.dev_tick)
        late_c = cand & (k > self.dev_deadline)
        self.dev_phase[late_c] = 3
        self.stats.skipped += int(late_c.sum())
        cand &= ~late_c
        if cand.any():
            self._start_excursions(np.nonzero(cand)[0])
        excursion = self.dev_phase == 1

        start_o = alive & (self.ovs_phase == 0) & (self.ovs_tick >= 0) & (k >= self.ovs_tick) & ~excursion
        late_o = start_o & (k > self.ovs_deadline)
        self.ovs_phase[late_o] = 3
        self.stats.skipped += int(late_o.sum())
        start_o &= ~late_o
        self.ovs_phase[start_o] = 1
        self.stop_until[start_o] = -1
        self.stats.overspeeds += int(start_o.sum())
        speeding = self.ovs_phase == 1
        done_o = (
            speeding
            & (self.ovs_first_over >= 0)
            & ((k - self.ovs_first_over) * period >= cfg.rules.overspeed_min_s * 1000 + self.ovs_extra_ms)
        )
        self.ovs_phase[done_o] = 2
        speeding &= ~done_o

        seek = alive & (self.dwell_phase == 0) & (self.dwell_tick >= 0) & (k >= self.dwell_tick)
        self.dwell_phase[seek] = 1
        seeking = self.dwell_phase == 1
        if seeking.any() and self.zmax:
            deep = (self.s[:, None] > self.za[self.route_idx] + 10) & (
                self.s[:, None] < self.zb[self.route_idx] - 10
            )
            arrived = seeking & deep.any(axis=1) & ~excursion
            self.stop_until[arrived] = k + self.dwell_ticks[arrived]
            self.dwell_phase[arrived] = 2
            self.stats.dwells += int(arrived.sum())
            missed = seeking & ~arrived & (k > self.dwell_deadline)
            self.dwell_phase[missed] = 3
            self.stats.skipped += int(missed.sum())

        # Wrong-way stretches: approach, brake, turn, reverse, turn, forward, tail.
        ww = self.ww_phase
        go = (
            alive
            & (ww == 0)
            & (k >= self.ww_tick)
            & ~self.completed
            & (self.s > cfg.rules.wrong_way_min_m + 100.0)
            & (self.s < self.length - cfg.rules.completion_radius_m - 3 * cfg.rules.wrong_way_min_m - 300.0)
        )
        for i in np.flatnonzero(go).tolist():
            # The whole stretch (and the way to it) on a part of the route the processor can place.
            reach = cfg.rules.wrong_way_min_m + 250.0
            go[i] = not is_shared(self.shared[int(self.route_idx[i])], float(self.s[i]), reach_m=reach)
        missed_w = self.ww & (ww == 0) & ~go & (k > self.ww_deadline)
        ww[missed_w] = WW_SKIPPED
        self.stats.skipped += int(missed_w.sum())
        ww[go] = 1
        self.ww_i[go] = 0
        self.stop_until[go] = -1
        self.stats.wrong_ways += int(go.sum())
        cur = ww.copy()  # one phase per tick at most
        for phase, done in (
            (1, self.ww_i >= WW_APPROACH),
            (2, self.v == 0.0),
            (3, self.ww_i >= WW_HOLD),
            (4, self.ww_i >= self.ww_back),
            (5, self.v == 0.0),
            (6, self.ww_i >= WW_HOLD),
            (7, self.ww_i >= self.ww_back),
            (8, self.ww_i >= WW_TAIL),
        ):
            nxt = (cur == phase) & done & ~go
            ww[nxt] = phase + 1
            self.ww_i[nxt] = 0
        ww_active = np.isin(ww, WW_ACTIVE)
        exact = self.sched | ww_active  # driven without GPS noise (simulator.trips)

        # Random stops (traffic lights, deliveries) for vehicles in no episode.
        free = alive & ~excursion & ~speeding & (self.stop_until < k) & ~exact
        p_stop = cfg.stops_per_hour / 3600 * dt
        starts = free & (rng.random(n) < p_stop)
        self.stop_until[starts] = k + (rng.uniform(5, 40, int(starts.sum())) / dt).astype(np.int64)

        # Kinematics: accelerate towards the target speed, advance along the route, bounce at ends.
        moving = alive & ~excursion
        target = np.where(self.stop_until >= k, 0.0, self.cruise)
        target = np.where(speeding, self.v_over, target)
        target = np.where((ww == 2) | (ww == 5), 0.0, target)
        dv = np.clip(target - self.v, -DECEL_MS2 * dt, ACCEL_MS2 * dt)
        self.v = np.where(moving, self.v + dv, self.v)
        # The wrong-way legs follow their profile (simulator.trips) from standstill at each turn.
        leg = (ww == 4) | (ww == 7)
        profile_v = self.ww_profile[np.clip(self.ww_i, 0, self.ww_back - 1)]
        self.v = np.where(leg, profile_v, np.where((ww == 3) | (ww == 6), 0.0, self.v))
        self.direction = np.where(ww == 4, -1.0, np.where(ww == 7, 1.0, self.direction))
        s = np.where(moving, self.s + self.direction * self.v * dt, self.s)
        over = s > self.length
        s = np.where(over, 2 * self.length - s, s)
        self.direction = np.where(over, -1.0, self.direction)
        under = s < 0
        s = np.where(under, -s, s)
        self.direction = np.where(under, 1.0, self.direction)
        self.s = s
        speed_kmh = np.where(excursion, SIDE_STREET_KMH, np.round(self.v * 3.6, 1))

        # Positions: on the line (or off it on an excursion), plus bounded noise.
        s_eff = np.where(excursion, self.dev_s, self.s)
        x = np.empty(n)
        y = np.empty(n)
        hx = np.empty(n)
        hy = np.empty(n)
        fracs = np.concatenate([RAMP, [1.0], RAMP[::-1]])
        step_i = np.clip(self.dev_i, 0, None)
        idx_in_plan = np.where(
            step_i < len(RAMP),
            step_i,
            np.where(step_i < len(RAMP) + self.dev_hold, len(RAMP), step_i - self.dev_hold + 1),
        )
        frac = np.where(excursion, fracs[np.clip(idx_in_plan, 0, len(fracs) - 1)], 0.0)
        offset = frac * cfg.excursion_m * self.dev_side
        for ri, route in enumerate(self.city.routes):
            idx = self.by_route[ri]
            px, py, tx, ty = route.line.at(s_eff[idx])
            x[idx] = px - ty * offset[idx]
            y[idx] = py + tx * offset[idx]
            hx[idx], hy[idx] = tx * self.direction[idx], ty * self.direction[idx]
        nx, ny = clip_radius(
            rng.normal(0, cfg.noise_sigma_m, n), rng.normal(0, cfg.noise_sigma_m, n), cfg.noise_bound_m
        )
        on_route = ~excursion
        nx, ny = np.where(exact, 0.0, nx), np.where(exact, 0.0, ny)
        nx, ny, in_poly, in_outer, shift_m = self._zone_clamp(self.route_idx, s_eff, on_route, nx, ny)
        ends = self.end_xy[self.route_idx]
        nx, ny = end_nudge(x, y, nx, ny, ends[:, 0], ends[:, 1], cfg.rules.completion_radius_m)
        fx, fy = x + nx, y + ny
        lon, lat = self.city.projection.inverse(fx, fy)
        heading = np.degrees(np.arctan2(hx, hy)) % 360.0

        # ---- truth: the alert rules over the planned facts (vehicles publishing this tick)
        dev_idle_before = ~self.off_route & (self.outside == 0)
        ovs_idle_before = ~self.overspeed & (self.over_since < 0)
        alerted = np.zeros(n, dtype=bool)
        trig: list[tuple[int, str, str | None]] = []

        # Zones: exits first, then enters (as processor.domain does).
        if self.zmax:
            exits = alive[:, None] & self.in_zone & ~in_outer
            enters = alive[:, None] & in_poly & ~(self.in_zone & ~exits)
            for i, zi in zip(*np.nonzero(exits), strict=True):
                trig.append((int(i), AlertType.ZONE_EXIT.value, self.zone_ids[self.route_idx[i]][zi]))
            for i, zi in zip(*np.nonzero(enters), strict=True):
                trig.append((int(i), AlertType.ZONE_ENTER.value, self.zone_ids[self.route_idx[i]][zi]))
            self.in_zone = (self.in_zone & ~exits) | enters
            alerted |= exits.any(axis=1) | enters.any(axis=1)

        # Corridor: outside = on an excursion step, inner band = on the route.
        in_corr = ~excursion
        in_inner = ~excursion
        a_ = alive & ~self.off_route
        reset = a_ & in_corr
        self.outside[reset] = 0
        self.outside_since[reset] = -1
        out_ = a_ & ~in_corr
        first = out_ & (self.outside == 0)
        self.outside_since[first] = k
        self.outside[out_] += 1
        dev = (
            out_
            & (self.outside >= cfg.rules.deviation_min_fixes)
            & ((k - self.outside_since) * period / 1000.0 >= cfg.rules.deviation_min_s)
        )
        b_ = alive & self.off_route
        back = b_ & in_inner
        self.inside[back] += 1
        self.inside[b_ & ~in_inner] = 0
        ret = back & (self.inside >= cfg.assume.return_min_fixes)
        self.off_route[dev] = True
        self.inside[dev] = 0
        self.off_route[ret] = False
        self.outside[ret] = 0
        self.outside_since[ret] = -1
        self.inside[ret] = 0
        for i in np.nonzero(dev)[0].tolist():
            trig.append((i, AlertType.ROUTE_DEVIATION.value, None))
        for i in np.nonzero(ret)[0].tolist():
            trig.append((i, AlertType.ROUTE_RETURN.value, None))
        alerted |= dev | ret

        # Speed: above the limit for >= overspeed_min_s; the episode ends at limit - hysteresis.
        limit = cfg.rules.speed_limit_kmh
        c_ = alive & ~self.overspeed
        above = c_ & (speed_kmh > limit)
        self.over_since[above & (self.over_since < 0)] = k
        self.over_since[c_ & ~(speed_kmh > limit)] = -1
        ovs = above & ((k - self.over_since) * period / 1000.0 >= cfg.rules.overspeed_min_s)
        self.overspeed[ovs] = True
        calm_down = alive & self.overspeed & ~ovs & (speed_kmh <= limit - cfg.assume.overspeed_hysteresis_kmh)
        self.overspeed[calm_down] = False
        self.over_since[calm_down] = -1
        for i in np.nonzero(ovs)[0].tolist():
            trig.append((i, AlertType.OVERSPEED.value, None))
        alerted |= ovs
        first_over = speeding & (self.ovs_first_over < 0) & (speed_kmh > limit)
        self.ovs_first_over[first_over] = k
        self.dev_i[excursion] += 1

        # Route awareness: completion, stops, direction and arrival.
        d_end = np.hypot(fx - ends[:, 0], fy - ends[:, 1])
        alerted |= self._trip_truth(
            k, alive, excursion, go, ww, s_eff, s_eff + shift_m, fx, fy, d_end, speed_kmh, in_outer, trig
        )
        self.ww_i[ww_active] += 1

        # ---- transport faults
        u = rng.random(n)
        p = cfg.inject
        near_silence = (self.silent_tick >= 0) & (k >= self.silent_tick - 3)
        can_hold = alive & (k >= 3) & ~near_silence & (self.withheld_until < k) & (k < cfg.n_ticks - 1)
        calm = (
            ~alerted
            & dev_idle_before
            & ~self.off_route
            & (self.outside == 0)
            & ovs_idle_before
            & ~self.overspeed
            & (self.over_since < 0)
            & (speed_kmh <= limit)
            # A fix that comes too late is lost: never one a trip rule counts on (a stop's first
            # fix, a fix near the end, one of a noise-free episode or a trip at risk).
            & ~exact
            & ~self.wrong
            & ~self.at_risk
            & (self.stop_since < 0)
            & (speed_kmh > cfg.rules.stop_speed_kmh + cfg.assume.stop_hysteresis_kmh)
            & (d_end > cfg.rules.completion_radius_m + 30.0)
        )
        dup = alive & (u < p.duplicate)
        ooo = can_hold & (u >= p.duplicate) & (u < p.duplicate + p.out_of_order)
        late = (
            can_hold
            & calm
            & (u >= p.duplicate + p.out_of_order)
            & (u < p.duplicate + p.out_of_order + p.late)
        )
        self.withheld_until[ooo] = k + 1
        self.withheld_until[late] = k + cfg.late_ticks
        self.stats.duplicates += int(dup.sum())
        self.stats.out_of_order += int(ooo.sum())
        self.stats.late += int(late.sum())

        # Truth rows for this tick's triggers (published now, or next tick when swapped).
        for i, typ, zone in trig:
            at = (round(float(lat[i]), 7), round(float(lon[i]), 7))
            truth.append(TruthAlert(vids[i], typ, seq, ts, zone, k + int(ooo[i]), None, *at))

        send = alive & ~ooo & ~late
        order = np.nonzero(send)[0]
        dups = np.nonzero(dup & send)[0]
        all_idx = np.concatenate([order, dups])
        msgs_v = all_idx
        cols: list[Message] = []
        lat_l, lon_l, sp_l, hd_l = lat.tolist(), lon.tolist(), speed_kmh.tolist(), heading.tolist()
        for i in msgs_v.tolist():
            cols.append((i, seq, ts, lat_l[i], lon_l[i], sp_l[i], hd_l[i]))
        for i in np.nonzero(ooo | late)[0].tolist():
            release = k + 1 if ooo[i] else k + cfg.late_ticks
            withheld.setdefault(release, []).append((i, seq, ts, lat_l[i], lon_l[i], sp_l[i], hd_l[i]))
        cols.extend(withheld.pop(k, []))

        # Silence truth is "published" with the first tick whose time moves the watermark past it.
        ready = [a for a in pending_silence if a.publish_tick <= k]
        if ready:
            pending_silence[:] = [a for a in pending_silence if a.publish_tick > k]
            truth.extend(ready)
        for a in truth:
            self.stats.truth[a.type] = self.stats.truth.get(a.type, 0) + 1
        self.stats.messages += len(cols)
        return make_batch(k, ts, cols, truth)

    def _zone_clamp(
        self, route_idx: IntArray, s_eff: FloatArray, on_route: BoolArray, nx: FloatArray, ny: FloatArray
    ) -> tuple[FloatArray, FloatArray, BoolArray, BoolArray, FloatArray]:
        """Noise clamped so no fix crosses a zone edge (or the edge grown by the hysteresis band)
        relative to its planned position; with each fix's zone memberships as planned, and the
        along-route shift the clamp added (all there is of a noise-free fix's offset)."""
        n, h = len(s_eff), self.cfg.assume.hysteresis_m
        in_poly = np.zeros((n, max(self.zmax, 1)), dtype=bool)
        in_outer = np.zeros_like(in_poly)
        shift = np.zeros(n)
        if not self.zmax:
            return nx, ny, in_poly, in_outer, shift
        clamp = min(ZONE_CLAMP_M, h / 4) if h > 0 else ZONE_CLAMP_M
        for zi in range(self.zmax):
            a = self.za[route_idx, zi]
            b = self.zb[route_idx, zi]
            valid = on_route & ~np.isnan(a)
            a0, b0 = np.nan_to_num(a, nan=-1e12), np.nan_to_num(b, nan=-1e12)
            tzx, tzy = self.tzx[route_idx, zi], self.tzy[route_idx, zi]
            along = nx * tzx + ny * tzy
            new = s_eff + along
            for thr in (a0 - h, a0, b0, b0 + h):
                above = s_eff > thr
                new = np.where(valid & above, np.maximum(new, thr + clamp), new)
                new = np.where(valid & ~above, np.minimum(new, thr - clamp), new)
            fix = new - s_eff - along
            shift += fix
            nx, ny = nx + fix * tzx, ny + fix * tzy
            in_poly[:, zi] = valid & (s_eff > a0) & (s_eff < b0)
            in_outer[:, zi] = valid & (s_eff > a0 - h) & (s_eff < b0 + h)
        return nx, ny, in_poly, in_outer, shift

    def _trip_truth(
        self,
        k: int,
        alive: BoolArray,
        excursion: BoolArray,
        go: BoolArray,
        ww: npt.NDArray[np.int8],
        s_eff: FloatArray,
        progress: FloatArray,
        fx: FloatArray,
        fy: FloatArray,
        d_end: FloatArray,
        speed_kmh: FloatArray,
        in_outer: BoolArray,
        trig: list[tuple[int, str, str | None]],
    ) -> BoolArray:
        """The trip rules of processor.domain over this tick's planned facts; returns who alerted."""
        cfg, n = self.cfg, self.n
        rules, assume, period = cfg.rules, cfg.assume, cfg.period_ms
        alerted = np.zeros(n, dtype=bool)
        trip = alive & ~self.completed

        # Completion: in the corridor, past half the route, within the radius of its end.
        fin = trip & ~excursion & (s_eff >= self.length / 2) & (d_end <= rules.completion_radius_m)
        self.completed |= fin
        self.wrong[fin], self.at_risk[fin], self.stop_since[fin], self.stop_phase[fin] = False, False, -1, 0
        for i in np.flatnonzero(fin).tolist():
            trig.append((i, AlertType.ROUTE_COMPLETED.value, None))
        alerted |= fin
        trip &= ~fin

        # Direction: only a wrong-way stretch moves progress back by the threshold; its reference
        # point starts with the stretch's first (noise-free) fix. Its progress is the planned one
        # plus the zone-edge clamp's shift, the only offset a noise-free fix has.
        start = trip & go
        self.anchor_s[start], self.anchor_k[start], self.anchor_fixes[start] = progress[start], k, 0
        self.wrong[start] = False
        for i in np.flatnonzero(trip & np.isin(ww, WW_ACTIVE) & ~start).tolist():
            p, a = float(progress[i]), float(self.anchor_s[i])
            if (p < a) if self.wrong[i] else (p > a):
                self.anchor_s[i], self.anchor_k[i], self.anchor_fixes[i] = p, k, 0
                continue
            self.anchor_fixes[i] += 1
            moved = p - a if self.wrong[i] else a - p
            if (
                moved >= rules.wrong_way_min_m
                and self.anchor_fixes[i] >= rules.wrong_way_min_fixes
                and (k - self.anchor_k[i]) * period / 1000.0 >= rules.wrong_way_min_s
            ):
                t = AlertType.DIRECTION_RESTORED if self.wrong[i] else AlertType.WRONG_DIRECTION
                trig.append((i, t.value, None))
                alerted[i] = True
                self.wrong[i] = not self.wrong[i]
                self.anchor_s[i], self.anchor_k[i], self.anchor_fixes[i] = p, k, 0

        # Stops: exact reported speeds; a stopped vehicle moves far less than the radius.
        if math.isfinite(rules.stop_min_s):
            slow = speed_kmh <= rules.stop_speed_kmh
            since, phase = self.stop_since.copy(), self.stop_phase.copy()
            away = np.hypot(fx - self.stop_x, fy - self.stop_y)
            stopped_s = (k - since) * period / 1000.0
            begin = trip & (since < 0) & slow
            pend = trip & (since >= 0) & (phase == 0)
            conf = pend & slow & (away <= rules.stop_radius_m) & (stopped_s >= rules.stop_min_s)
            planned: BoolArray = np.asarray((in_outer & self.zone_planned[self.route_idx]).any(axis=1))
            creep = pend & slow & (away > rules.stop_radius_m)
            moved = pend & ~slow
            held = trip & (since >= 0) & (phase > 0)
            end = held & (
                (speed_kmh > rules.stop_speed_kmh + assume.stop_hysteresis_kmh)
                | (away > rules.stop_radius_m + assume.hysteresis_m)
            )
            self.stop_phase[conf] = np.where(planned[conf], 2, 1)
            unplanned = conf & ~planned
            ended = end & (phase == 1)
            for i in np.flatnonzero(unplanned).tolist():
                trig.append((i, AlertType.UNPLANNED_STOP.value, None))
            for i in np.flatnonzero(ended).tolist():
                trig.append((i, AlertType.STOP_ENDED.value, None))
            alerted |= unplanned | ended
            self.stop_since[moved | end] = -1
            self.stop_phase[end] = 0
            fresh = begin | creep | (end & slow)
            self.stop_since[fresh] = k
            self.stop_x[fresh], self.stop_y[fresh] = fx[fresh], fy[fresh]
            self.stop_phase[fresh] = 0

        # Arrival: the scheduled trips' ETAs were computed when they were planned.
        for i, eta in self.eta_table.items():
            if not trip[i] or k >= len(eta) or np.isnan(eta[k]):
                continue
            delay_s = (float(eta[k]) - float(self.planned_arrival_ms[i])) / 1000.0
            if not self.at_risk[i] and delay_s > rules.arrival_risk_s:
                self.at_risk[i] = True
                trig.append((i, AlertType.ARRIVAL_AT_RISK.value, None))
                alerted[i] = True
            elif self.at_risk[i] and delay_s <= rules.arrival_risk_s - assume.arrival_hysteresis_s:
                self.at_risk[i] = False
                trig.append((i, AlertType.ARRIVAL_BACK_ON_TIME.value, None))
                alerted[i] = True
        return alerted

    _vids: list[str] | None = None

    def vehicle_ids_cached(self) -> list[str]:
        if self._vids is None:
            self._vids = self.vehicle_ids()
        return self._vids

    def _start_excursions(self, cand: IntArray) -> None:
        cfg = self.cfg
        half = cfg.rules.corridor_width_m / 2
        offsets = [f * cfg.excursion_m for f in (*RAMP, 1.0)]
        side = np.where(self.rng.random(len(cand)) < 0.5, 1.0, -1.0)
        started = np.zeros(len(cand), dtype=bool)
        for ri, route in enumerate(self.city.routes):
            m = self.route_idx[cand] == ri
            if not m.any():
                continue
            s = self.s[cand[m]]
            for flip in (1.0, -1.0):
                sd = side[m] * flip
                ok = (
                    excursion_safe(
                        route,
                        self.zones_grown,
                        s,
                        sd,
                        offsets,
                        half + cfg.noise_bound_m + EDGE_MARGIN_M,
                        cfg.noise_bound_m + EDGE_MARGIN_M,
                    )
                    & ~started[m]
                )
                sel = cand[m][ok]
                self.dev_phase[sel] = 1
                self.dev_i[sel] = 0
                self.dev_s[sel] = self.s[sel]
                self.dev_side[sel] = sd[ok]
                st = started[m]
                st[ok] = True
                started[m] = st
        self.stats.deviations += int(started.sum())
