"""The fleet's movement, one tick at a time: the behaviour episodes' phases, random stops, speed
and position along the route, and each fix as published (bounded GPS noise, clamped at zone edges).

Everything is an array operation over the whole fleet, so a tick costs the same few operations for
10 or 100k vehicles. The random draws happen in a fixed order per tick (excursion sides, stops,
noise): a seed keeps its fleet only while that order holds.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from simulator.geo import BoolArray, FloatArray, IntArray, clip_radius
from simulator.plan import (
    ACCEL_MS2,
    DECEL_MS2,
    RAMP,
    WW_ACTIVE,
    WW_APPROACH,
    WW_HOLD,
    WW_SKIPPED,
    WW_TAIL,
    Fleet,
)
from simulator.routes import EDGE_MARGIN_M, excursion_safe
from simulator.trips import end_nudge, is_shared

SIDE_STREET_KMH = 15.0  # an excursion's reported speed, and its speed back on the route


@dataclass
class Motion:
    """One tick's planned facts: what the episodes are doing and where each fix lies (its planned
    position `s_eff` and progress, its published position with noise, its zone memberships)."""

    excursion: BoolArray
    speeding: BoolArray
    go: BoolArray  # a wrong-way stretch starts this tick
    ww: npt.NDArray[np.int8]  # wrong-way phases
    exact: BoolArray  # driven without GPS noise
    speed_kmh: FloatArray
    s_eff: FloatArray
    progress: FloatArray
    fx: FloatArray
    fy: FloatArray
    lat: FloatArray
    lon: FloatArray
    heading: FloatArray
    in_poly: BoolArray
    in_outer: BoolArray
    d_end: FloatArray


def advance(fleet: Fleet, k: int, completed: BoolArray) -> Motion:
    """Move the fleet to tick k; `completed`: the vehicles whose trip the truth saw complete (no
    wrong-way stretch starts on a completed trip)."""
    cfg, rng, n = fleet.cfg, fleet.rng, fleet.n
    dt = cfg.period_ms / 1000.0
    alive = fleet.alive
    excursion, speeding, go, ww_active, exact = _episodes(fleet, k, completed)
    ww = fleet.ww_phase

    # Random stops (traffic lights, deliveries) for vehicles in no episode.
    free = alive & ~excursion & ~speeding & (fleet.stop_until < k) & ~exact
    p_stop = cfg.stops_per_hour / 3600 * dt
    starts = free & (rng.random(n) < p_stop)
    fleet.stop_until[starts] = k + (rng.uniform(5, 40, int(starts.sum())) / dt).astype(np.int64)

    # Kinematics: accelerate towards the target speed, advance along the route, bounce at ends.
    moving = alive & ~excursion
    target = np.where(fleet.stop_until >= k, 0.0, fleet.cruise)
    target = np.where(speeding, fleet.v_over, target)
    target = np.where((ww == 2) | (ww == 5), 0.0, target)
    dv = np.clip(target - fleet.v, -DECEL_MS2 * dt, ACCEL_MS2 * dt)
    fleet.v = np.where(moving, fleet.v + dv, fleet.v)
    # The wrong-way legs follow their profile (simulator.trips) from standstill at each turn.
    leg = (ww == 4) | (ww == 7)
    profile_v = fleet.ww_profile[np.clip(fleet.ww_i, 0, fleet.ww_back - 1)]
    fleet.v = np.where(leg, profile_v, np.where((ww == 3) | (ww == 6), 0.0, fleet.v))
    fleet.direction = np.where(ww == 4, -1.0, np.where(ww == 7, 1.0, fleet.direction))
    s = np.where(moving, fleet.s + fleet.direction * fleet.v * dt, fleet.s)
    over = s > fleet.length
    s = np.where(over, 2 * fleet.length - s, s)
    fleet.direction = np.where(over, -1.0, fleet.direction)
    under = s < 0
    s = np.where(under, -s, s)
    fleet.direction = np.where(under, 1.0, fleet.direction)
    fleet.s = s
    speed_kmh = np.where(excursion, SIDE_STREET_KMH, np.round(fleet.v * 3.6, 1))

    # Positions: on the line (or off it on an excursion), plus bounded noise.
    s_eff = np.where(excursion, fleet.dev_s, fleet.s)
    x = np.empty(n)
    y = np.empty(n)
    hx = np.empty(n)
    hy = np.empty(n)
    fracs = np.concatenate([RAMP, [1.0], RAMP[::-1]])
    step_i = np.clip(fleet.dev_i, 0, None)
    idx_in_plan = np.where(
        step_i < len(RAMP),
        step_i,
        np.where(step_i < len(RAMP) + fleet.dev_hold, len(RAMP), step_i - fleet.dev_hold + 1),
    )
    frac = np.where(excursion, fracs[np.clip(idx_in_plan, 0, len(fracs) - 1)], 0.0)
    offset = frac * cfg.excursion_m * fleet.dev_side
    for ri, route in enumerate(fleet.city.routes):
        idx = fleet.by_route[ri]
        px, py, tx, ty = route.line.at(s_eff[idx])
        x[idx] = px - ty * offset[idx]
        y[idx] = py + tx * offset[idx]
        hx[idx], hy[idx] = tx * fleet.direction[idx], ty * fleet.direction[idx]
    nx, ny = clip_radius(
        rng.normal(0, cfg.noise_sigma_m, n), rng.normal(0, cfg.noise_sigma_m, n), cfg.noise_bound_m
    )
    on_route = ~excursion
    nx, ny = np.where(exact, 0.0, nx), np.where(exact, 0.0, ny)
    nx, ny, in_poly, in_outer, shift_m = fleet.zone_clamp(fleet.route_idx, s_eff, on_route, nx, ny)
    ends = fleet.end_xy[fleet.route_idx]
    nx, ny = end_nudge(x, y, nx, ny, ends[:, 0], ends[:, 1], cfg.rules.completion_radius_m)
    fx, fy = x + nx, y + ny
    lon, lat = fleet.city.projection.inverse(fx, fy)
    heading = np.degrees(np.arctan2(hx, hy)) % 360.0

    # The episodes' counters move on with the tick.
    limit = cfg.rules.speed_limit_kmh
    first_over = speeding & (fleet.ovs_first_over < 0) & (speed_kmh > limit)
    fleet.ovs_first_over[first_over] = k
    fleet.dev_i[excursion] += 1
    fleet.ww_i[ww_active] += 1
    d_end = np.hypot(fx - ends[:, 0], fy - ends[:, 1])
    return Motion(
        excursion,
        speeding,
        go,
        ww,
        exact,
        speed_kmh,
        s_eff,
        s_eff + shift_m,
        fx,
        fy,
        lat,
        lon,
        heading,
        in_poly,
        in_outer,
        d_end,
    )


def _episodes(
    fleet: Fleet, k: int, completed: BoolArray
) -> tuple[BoolArray, BoolArray, BoolArray, BoolArray, BoolArray]:
    """Each behaviour episode's phase at tick k: (on an excursion, speeding, starting a wrong-way
    stretch, on one, driven without noise)."""
    cfg = fleet.cfg
    period = cfg.period_ms
    alive = fleet.alive
    excursion = fleet.dev_phase == 1
    ended = excursion & (fleet.dev_i >= fleet.dev_hold + 2 * len(RAMP))
    fleet.dev_phase[ended] = 2
    fleet.s[ended] = fleet.dev_s[ended]
    fleet.v[ended] = SIDE_STREET_KMH / 3.6
    cand = alive & (fleet.dev_phase == 0) & (fleet.dev_tick >= 0) & (k >= fleet.dev_tick)
    late_c = cand & (k > fleet.dev_deadline)
    fleet.dev_phase[late_c] = 3
    fleet.stats.skipped += int(late_c.sum())
    cand &= ~late_c
    if cand.any():
        _start_excursions(fleet, np.nonzero(cand)[0])
    excursion = fleet.dev_phase == 1

    start_o = alive & (fleet.ovs_phase == 0) & (fleet.ovs_tick >= 0) & (k >= fleet.ovs_tick) & ~excursion
    late_o = start_o & (k > fleet.ovs_deadline)
    fleet.ovs_phase[late_o] = 3
    fleet.stats.skipped += int(late_o.sum())
    start_o &= ~late_o
    fleet.ovs_phase[start_o] = 1
    fleet.stop_until[start_o] = -1
    fleet.stats.overspeeds += int(start_o.sum())
    speeding = fleet.ovs_phase == 1
    done_o = (
        speeding
        & (fleet.ovs_first_over >= 0)
        & ((k - fleet.ovs_first_over) * period >= cfg.rules.overspeed_min_s * 1000 + fleet.ovs_extra_ms)
    )
    fleet.ovs_phase[done_o] = 2
    speeding &= ~done_o

    seek = alive & (fleet.dwell_phase == 0) & (fleet.dwell_tick >= 0) & (k >= fleet.dwell_tick)
    fleet.dwell_phase[seek] = 1
    seeking = fleet.dwell_phase == 1
    if seeking.any() and fleet.zmax:
        deep = (fleet.s[:, None] > fleet.za[fleet.route_idx] + 10) & (
            fleet.s[:, None] < fleet.zb[fleet.route_idx] - 10
        )
        arrived = seeking & deep.any(axis=1) & ~excursion
        fleet.stop_until[arrived] = k + fleet.dwell_ticks[arrived]
        fleet.dwell_phase[arrived] = 2
        fleet.stats.dwells += int(arrived.sum())
        missed = seeking & ~arrived & (k > fleet.dwell_deadline)
        fleet.dwell_phase[missed] = 3
        fleet.stats.skipped += int(missed.sum())

    # Wrong-way stretches: approach, brake, turn, reverse, turn, forward, tail.
    ww = fleet.ww_phase
    go = (
        alive
        & (ww == 0)
        & (k >= fleet.ww_tick)
        & ~completed
        & (fleet.s > cfg.rules.wrong_way_min_m + 100.0)
        & (fleet.s < fleet.length - cfg.rules.completion_radius_m - 3 * cfg.rules.wrong_way_min_m - 300.0)
    )
    for i in np.flatnonzero(go).tolist():
        # The whole stretch (and the way to it) on a part of the route the processor can place.
        reach = cfg.rules.wrong_way_min_m + 250.0
        go[i] = not is_shared(fleet.shared[int(fleet.route_idx[i])], float(fleet.s[i]), reach_m=reach)
    missed_w = fleet.ww & (ww == 0) & ~go & (k > fleet.ww_deadline)
    ww[missed_w] = WW_SKIPPED
    fleet.stats.skipped += int(missed_w.sum())
    ww[go] = 1
    fleet.ww_i[go] = 0
    fleet.stop_until[go] = -1
    fleet.stats.wrong_ways += int(go.sum())
    cur = ww.copy()  # one phase per tick at most
    for phase, done in (
        (1, fleet.ww_i >= WW_APPROACH),
        (2, fleet.v == 0.0),
        (3, fleet.ww_i >= WW_HOLD),
        (4, fleet.ww_i >= fleet.ww_back),
        (5, fleet.v == 0.0),
        (6, fleet.ww_i >= WW_HOLD),
        (7, fleet.ww_i >= fleet.ww_back),
        (8, fleet.ww_i >= WW_TAIL),
    ):
        nxt = (cur == phase) & done & ~go
        ww[nxt] = phase + 1
        fleet.ww_i[nxt] = 0
    ww_active = np.isin(ww, WW_ACTIVE)
    exact = fleet.sched | ww_active  # driven without GPS noise (simulator.trips)
    return excursion, speeding, go, ww_active, exact


def _start_excursions(fleet: Fleet, cand: IntArray) -> None:
    """Send the candidates off the route on a side (the one drawn, else the other) where every point
    of the excursion lies clearly outside the corridor and clear of every zone; a candidate with
    neither side clear tries again next tick."""
    cfg = fleet.cfg
    half = cfg.rules.corridor_width_m / 2
    offsets = [f * cfg.excursion_m for f in (*RAMP, 1.0)]
    side = np.where(fleet.rng.random(len(cand)) < 0.5, 1.0, -1.0)
    started = np.zeros(len(cand), dtype=bool)
    for ri, route in enumerate(fleet.city.routes):
        m = fleet.route_idx[cand] == ri
        if not m.any():
            continue
        s = fleet.s[cand[m]]
        for flip in (1.0, -1.0):
            sd = side[m] * flip
            ok = (
                excursion_safe(
                    route,
                    fleet.zones_grown,
                    s,
                    sd,
                    offsets,
                    half + cfg.noise_bound_m + EDGE_MARGIN_M,
                    cfg.noise_bound_m + EDGE_MARGIN_M,
                )
                & ~started[m]
            )
            sel = cand[m][ok]
            fleet.dev_phase[sel] = 1
            fleet.dev_i[sel] = 0
            fleet.dev_s[sel] = fleet.s[sel]
            fleet.dev_side[sel] = sd[ok]
            st = started[m]
            st[ok] = True
            started[m] = st
    fleet.stats.deviations += int(started.sum())
