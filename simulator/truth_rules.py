"""The ground truth's alert rules: processor.core.domain's semantics, restated over the planned facts.

Each rule is a state machine per vehicle, stepped once per tick for the vehicles publishing that
tick, in seq order. Its inputs are what the plan guarantees (on an excursion or on the route, the
reported speed, the zone memberships, the planned progress), never geometry tests on the noisy
fixes and never processor code: that is what makes the truth independent of the engine it checks.
Each step appends its triggers, (vehicle index, alert type, zone id), and returns who alerted.
"""

from __future__ import annotations

import math

import numpy as np

from fleetfence.contracts import AlertType
from simulator.geo import BoolArray, FloatArray
from simulator.kinematics import Motion
from simulator.plan import WW_ACTIVE, Fleet

Trigger = tuple[int, str, str | None]


class TruthRules:
    """The alert rules' state for every vehicle of a fleet."""

    def __init__(self, fleet: Fleet) -> None:
        self.fleet = fleet
        self.cfg = fleet.cfg
        n = fleet.n
        self.in_zone = np.zeros((n, max(fleet.zmax, 1)), dtype=bool)
        self.off_route = np.zeros(n, dtype=bool)
        self.outside = np.zeros(n, dtype=np.int64)
        self.outside_since = np.full(n, -1, dtype=np.int64)
        self.inside = np.zeros(n, dtype=np.int64)
        self.overspeed = np.zeros(n, dtype=bool)
        self.over_since = np.full(n, -1, dtype=np.int64)
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

    def quiet(self) -> BoolArray:
        """Neither off the route nor speeding, nor on the way to either: losing such a fix changes
        no corridor or speed alert."""
        quiet: BoolArray = ~self.off_route & (self.outside == 0) & ~self.overspeed & (self.over_since < 0)
        return quiet

    def zones(
        self, alive: BoolArray, in_poly: BoolArray, in_outer: BoolArray, trig: list[Trigger]
    ) -> BoolArray:
        """Exits first, then enters (as processor.core.domain does)."""
        fleet = self.fleet
        if not fleet.zmax:
            return np.zeros(fleet.n, dtype=bool)
        exits = alive[:, None] & self.in_zone & ~in_outer
        enters = alive[:, None] & in_poly & ~(self.in_zone & ~exits)
        for i, zi in zip(*np.nonzero(exits), strict=True):
            trig.append((int(i), AlertType.ZONE_EXIT.value, fleet.zone_ids[fleet.route_idx[i]][zi]))
        for i, zi in zip(*np.nonzero(enters), strict=True):
            trig.append((int(i), AlertType.ZONE_ENTER.value, fleet.zone_ids[fleet.route_idx[i]][zi]))
        self.in_zone = (self.in_zone & ~exits) | enters
        alerted: BoolArray = np.asarray(exits.any(axis=1) | enters.any(axis=1))
        return alerted

    def corridor(self, k: int, alive: BoolArray, excursion: BoolArray, trig: list[Trigger]) -> BoolArray:
        """Outside = on an excursion step, inner band = on the route."""
        cfg, period = self.cfg, self.cfg.period_ms
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
        alerted: BoolArray = dev | ret
        return alerted

    def speed(self, k: int, alive: BoolArray, speed_kmh: FloatArray, trig: list[Trigger]) -> BoolArray:
        """Above the limit for >= overspeed_min_s; the episode ends at limit - hysteresis."""
        cfg, period = self.cfg, self.cfg.period_ms
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
        return ovs

    def trip(self, k: int, alive: BoolArray, m: Motion, trig: list[Trigger]) -> BoolArray:
        """The trip rules of processor.core.domain over this tick's planned facts; returns who alerted."""
        cfg, fleet = self.cfg, self.fleet
        rules, assume, period = cfg.rules, cfg.assume, cfg.period_ms
        excursion, go, ww, s_eff, progress = m.excursion, m.go, m.ww, m.s_eff, m.progress
        fx, fy, d_end, speed_kmh, in_outer = m.fx, m.fy, m.d_end, m.speed_kmh, m.in_outer
        alerted = np.zeros(fleet.n, dtype=bool)
        trip = alive & ~self.completed

        # Completion: in the corridor, past half the route, within the radius of its end.
        fin = trip & ~excursion & (s_eff >= fleet.length / 2) & (d_end <= rules.completion_radius_m)
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
            planned: BoolArray = np.asarray((in_outer & fleet.zone_planned[fleet.route_idx]).any(axis=1))
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
        for i, eta in fleet.eta_table.items():
            if not trip[i] or k >= len(eta) or np.isnan(eta[k]):
                continue
            delay_s = (float(eta[k]) - float(fleet.planned_arrival_ms[i])) / 1000.0
            if not self.at_risk[i] and delay_s > rules.arrival_risk_s:
                self.at_risk[i] = True
                trig.append((i, AlertType.ARRIVAL_AT_RISK.value, None))
                alerted[i] = True
            elif self.at_risk[i] and delay_s <= rules.arrival_risk_s - assume.arrival_hysteresis_s:
                self.at_risk[i] = False
                trig.append((i, AlertType.ARRIVAL_BACK_ON_TIME.value, None))
                alerted[i] = True
        return alerted
