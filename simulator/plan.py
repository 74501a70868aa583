"""The fleet's plan: where each vehicle starts, how fast it cruises, and which behaviour it shows
when, drawn once from the seed before the first tick.

Every behaviour gets its own slot of a vehicle's timeline (silence, excursion, overspeed, dwell),
and wrong-way stretches and scheduled trips go to vehicles with no other behaviour so each can use
the whole run. The draws happen in a fixed order: a seed keeps its fleet, so changing what is drawn
here (or when) changes every scenario and its truth.

A scheduled trip is driven ahead here, tick by tick with the same float operations the kinematics
apply, because its planned arrival must be chosen against the ETAs the processor will compute.
"""

from __future__ import annotations

import math

import numpy as np
import shapely

from fleetfence.geo import LocalProjection
from simulator.batch import ScenarioStats
from simulator.config import ScenarioConfig
from simulator.geo import BoolArray, FloatArray, IntArray
from simulator.routes import EDGE_MARGIN_M, CityMap
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

ACCEL_MS2 = 1.5
DECEL_MS2 = 3.0
RAMP = (0.6, 0.8)  # fractions of the excursion offset on the way out and (reversed) back
ZONE_CLAMP_M = 1.5  # a fix stays at least this far on its planned side of every zone edge
WW_APPROACH = 6  # noise-free ticks of normal driving before a wrong-way turn (the anchor is exact)
WW_HOLD = 2  # ticks standing at each turn
WW_TAIL = 3  # noise-free ticks after the stretch
SCHEDULE_HOLD_S = 60.0  # a scheduled trip stands this long at its start: it departs late
# A convoy's follower starts this far behind its leader along their route and cruises this much
# slower: near at first, apart a minute or two later (vehicle proximity's enter and exit).
CONVOY_GAP_M = 10.0
CONVOY_DRIFT_MPS = 1.0

# Wrong-way phases: 0 pending, 1 approach, 2 braking, 3 turn, 4 reverse, 5 braking, 6 turn,
# 7 forward, 8 tail, 9 done, 10 skipped.
WW_ACTIVE = (1, 2, 3, 4, 5, 6, 7, 8)
WW_DONE, WW_SKIPPED = 9, 10


def _count(p: float, n: int) -> int:
    return math.floor(p * n + 0.5)


class Fleet:
    """The vehicles' state arrays (position, speed, behaviour phases) and the plan they follow;
    the kinematics advance it tick by tick (simulator.kinematics)."""

    def __init__(
        self, cfg: ScenarioConfig, city: CityMap, rng: np.random.Generator, stats: ScenarioStats
    ) -> None:
        self.cfg, self.city, self.rng, self.stats = cfg, city, rng, stats
        self.n = n = cfg.vehicles
        grown = [shapely.buffer(z.polygon_m, cfg.assume.hysteresis_m) for z in city.zones]
        self.zones_grown = shapely.union_all(grown) if grown else None
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
        # Per zone, along its route: the enter edges (za, zb), the stay-inside edges grown by the
        # hysteresis band (zao, zbo), and how much further inside its edges a noisy fix must stay
        # to be inside whatever its sideways noise (zpi at the enter edges, zpo at the grown ones:
        # 0 for a rectangle, whose sides lie far beyond the noise; a circle's chord shortens).
        h = cfg.assume.hysteresis_m
        shape_ = (n_routes, max(zmax, 1))
        za, zb, zao, zbo = (np.full(shape_, np.nan) for _ in range(4))
        zpi, zpo = np.zeros(shape_), np.zeros(shape_)
        tzx = np.zeros(shape_)
        tzy = np.zeros(shape_)
        self.zone_ids: list[list[str]] = []
        for ri, r in enumerate(self.city.routes):
            self.zone_ids.append([z.zone_id for z in r.zones])
            for zi, z in enumerate(r.zones):
                _x, _y, ux, uy = r.line.at(np.array([z.start_m + 1.0]))
                tzx[ri, zi], tzy[ri, zi] = ux[0], uy[0]
                if z.circle is None:
                    za[ri, zi], zb[ri, zi] = z.start_m, z.end_m
                    zao[ri, zi], zbo[ri, zi] = z.start_m - h, z.end_m + h
                    continue
                edges = circle_edges(
                    city.projection, z.circle, float(ux[0]), float(uy[0]), h, cfg.noise_bound_m
                )
                c = (z.start_m + z.end_m) / 2
                za[ri, zi], zb[ri, zi] = c - edges[0], c + edges[0]
                zao[ri, zi], zbo[ri, zi] = c - edges[1], c + edges[1]
                zpi[ri, zi], zpo[ri, zi] = edges[2], edges[3]
        self.za, self.zb, self.tzx, self.tzy = za, zb, tzx, tzy
        self.zao, self.zbo, self.zpi, self.zpo = zao, zbo, zpi, zpo
        self.zone_planned = np.zeros((n_routes, max(zmax, 1)), dtype=bool)
        for ri, r in enumerate(self.city.routes):
            for zi, z in enumerate(r.zones):
                self.zone_planned[ri, zi] = z.planned_stop

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
        self.follows = np.full(n, -1, dtype=np.int64)
        if cfg.inject.convoy > 0:
            self._plan_convoys(_count(cfg.inject.convoy, n), refused, skip)

    def _plan_convoys(self, wanted: int, refused: list[FloatArray], skip: float) -> None:
        """Followers close behind a leader of their route, drifting back (CONVOY_GAP_M,
        CONVOY_DRIFT_MPS); a follower has no episode of its own, so the pair parts by the drift or
        by the leader's episodes. Drawn last, so a configuration without convoys keeps its fleet."""
        taken = self.exclusive | (self.silent_tick >= 0)
        made = 0
        for f in self.rng.permutation(np.flatnonzero(~taken)).tolist():
            if made == wanted:
                break
            if taken[f]:
                continue
            ri = int(self.route_idx[f])
            mates = [int(m) for m in self.by_route[ri] if m != f and not taken[m]]
            if not mates:
                continue
            lead = mates[int(self.rng.integers(len(mates)))]
            s_f = float(self.s[lead]) - CONVOY_GAP_M
            cruise = float(self.cruise[lead]) - CONVOY_DRIFT_MPS
            if s_f < 0 or placeable_start(refused[ri], s_f, skip) != s_f or cruise <= 2 * CONVOY_DRIFT_MPS:
                continue  # no room behind the leader where the processor can place a trip start
            self.s[f], self.cruise[f], self.v[f] = s_f, cruise, cruise
            for at in (self.dev_tick, self.ovs_tick, self.dwell_tick):
                self.stats.skipped += int(at[f] >= 0)  # the follower's own episode, not driven
                at[f] = -1
            self.follows[f] = lead
            taken[f] = taken[lead] = True
            made += 1
        self.stats.skipped += wanted - made

    def _plan_schedule(self, i: int) -> None:
        """Drive scheduled vehicle i's whole trip ahead (its kinematics involve no random event: the
        same float operations simulator.kinematics applies) and choose its planned arrival
        (simulator.trips)."""
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
        nx, ny, _p, _o, _shift = self.zone_clamp(np.full(len(sa), ri), sa, on, zero, zero)
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

    def zone_clamp(
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
            ao, bo = (np.nan_to_num(e[route_idx, zi], nan=-1e12) for e in (self.zao, self.zbo))
            pi, po = self.zpi[route_idx, zi], self.zpo[route_idx, zi]
            tzx, tzy = self.tzx[route_idx, zi], self.tzy[route_idx, zi]
            along = nx * tzx + ny * tzy
            new = s_eff + along
            # Each edge with the extra margin on its inside: above the lower edges, below the upper.
            for thr, pad_above, pad_below in ((ao, po, 0.0), (a0, pi, 0.0), (b0, 0.0, pi), (bo, 0.0, po)):
                above = s_eff > thr
                new = np.where(valid & above, np.maximum(new, thr + clamp + pad_above), new)
                new = np.where(valid & ~above, np.minimum(new, thr - clamp - pad_below), new)
            fix = new - s_eff - along
            shift += fix
            nx, ny = nx + fix * tzx, ny + fix * tzy
            in_poly[:, zi] = valid & (s_eff > a0) & (s_eff < b0)
            in_outer[:, zi] = valid & (s_eff > ao) & (s_eff < bo)
        return nx, ny, in_poly, in_outer, shift


def circle_edges(
    city: LocalProjection,
    circle: tuple[float, float, float],
    tx: float,
    ty: float,
    hysteresis_m: float,
    noise_bound_m: float,
) -> tuple[float, float, float, float]:
    """A circle zone on a straight run (direction (tx, ty) in the city's frame), in arc length from
    its centre: how far the enter edge and the grown edge lie, and how much further inside them a
    fix with sideways noise up to `noise_bound_m` must stay to be inside (a chord is shorter than the
    diameter).

    The processor measures in the circle's own frame (`fleetfence.geo.circle_distance_m`), which
    differs from the city's by its longitude scale: along the run a metre of the city's frame is
    `sigma` metres of the circle's, so the radius r lies r / sigma along the run. The sideways margin
    is the chord's shortening with a little slack for the frames' skew and the centre's rounding."""
    lon, lat, radius = circle
    sx = LocalProjection(lon, lat).kx / city.kx
    sigma = math.hypot(tx * sx, ty)
    side = noise_bound_m * max(sx, 1.0) * 1.01 + 0.01

    def chord_pad(r_along: float) -> float:
        return r_along - math.sqrt(max(r_along**2 - side**2, 0.0)) + 0.05

    enter, grown = radius / sigma, (radius + hysteresis_m) / sigma
    return enter, grown, chord_pad(enter), chord_pad(grown)
