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
  a circle zone on a run (`circle_zones`) is an interval of the run too, its ends worked out in the
  circle's own frame, and a fix inside stays inside by the chord its sideways noise could cost;
- speeds are reported exactly as planned, cruising below limit - hysteresis, speeding well above;
- a vehicle goes silent early enough that the rest of the fleet moves the watermark past its due
  time; only "calm" fixes (whose loss changes no alert) are delivered late.
- every vehicle drives its route forward from a random point; at the end (ROUTE_COMPLETED, its
  distance to the end kept clear of the radius) it turns and drives back, which the processor no
  longer judges (a completed trip raises no direction, stop or arrival alert);
- stops are planned with exact reported speeds and move less than the stop radius by far, so the
  stop rules decide on the speeds and the zone alone;
- wrong-way stretches and scheduled trips are driven without noise (simulator.trips).
The alert rules (processor.core.domain's semantics, restated in simulator.truth_rules) are then applied
to those planned facts per vehicle, in seq order.

The pieces: simulator.plan draws the fleet and its episodes from the seed, simulator.kinematics moves
it tick by tick, simulator.truth_rules judges each tick's planned facts; `Scenario` ties them
together and adds the transport faults (duplicates, swaps, late fixes) and the silences.
"""

from __future__ import annotations

import math
from collections.abc import Iterator

import numpy as np

from fleetfence.contracts import AlertType
from fleetfence.rules import ProximityScope
from simulator.batch import Message, ScenarioStats, TickBatch, make_batch
from simulator.config import ScenarioConfig
from simulator.geo import BoolArray, IntArray
from simulator.kinematics import advance
from simulator.plan import WW_DONE, Fleet
from simulator.routes import EDGE_MARGIN_M, CityMap, build_city, place_zones
from simulator.truth import TruthAlert, vehicle_id
from simulator.truth_proximity import ProximityTruth
from simulator.truth_rules import Trigger, TruthRules

# The fleet groups simulated vehicles belong to, in turn (`Scenario.vehicle_groups`).
SIM_GROUPS = ("north", "south")

__all__ = ["WW_DONE", "Scenario", "ScenarioStats", "TickBatch"]


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
            circle_share=cfg.circle_zones,
        )
        self.stats = ScenarioStats()
        self.fleet = Fleet(cfg, self.city, rng, self.stats)
        self.rules = TruthRules(self.fleet)
        self.withheld_until = np.full(self.n, -1, dtype=np.int64)
        self._vids: list[str] | None = None
        self.proximity = [
            ProximityTruth(
                rule,
                self.vehicle_ids_cached(),
                cfg.start_ms,
                cfg.period_ms,
                cfg.assume.lateness_ms,
                members=self.in_scope(rule.scope),
            )
            for rule in cfg.proximity
        ]

    # ------------------------------------------------------------------ identity

    @property
    def n(self) -> int:
        return self.cfg.vehicles

    def vehicle_ids(self) -> list[str]:
        return [vehicle_id(self.cfg.vehicle_prefix, i) for i in range(self.n)]

    def vehicle_ids_cached(self) -> list[str]:
        if self._vids is None:
            self._vids = self.vehicle_ids()
        return self._vids

    def seq_base(self) -> int:
        """Seqs continue across runs: tick k of a run starting at t has seq t / period + k."""
        return self.cfg.start_ms // self.cfg.period_ms

    def undecided_alert_ids(self) -> list[str]:
        """Alerts the truth cannot decide at the run's end (`ProximityTruth.undecided_alert_ids`):
        `verify` counts them neither way."""
        return [a for truth in self.proximity for a in truth.undecided_alert_ids()]

    def vehicle_groups(self) -> list[str]:
        """Each vehicle's fleet group (its attribute `group` in the vehicle master: a proximity
        rule's scope may be one): the vehicles alternate between SIM_GROUPS."""
        return [SIM_GROUPS[i % len(SIM_GROUPS)] for i in range(self.n)]

    def in_scope(self, scope: ProximityScope) -> BoolArray:
        """The vehicles a proximity rule of `scope` compares, as the processor reads them from the
        vehicle master (simulator.register): every vehicle's assignment holds for the whole run."""
        if scope.route_id is not None:
            ids = [r.route_id for r in self.city.routes]
            if scope.route_id not in ids:
                return np.zeros(self.n, dtype=bool)
            return np.asarray(self.route_idx == ids.index(scope.route_id), dtype=bool)
        if scope.group is not None:
            return np.array([g == scope.group for g in self.vehicle_groups()], dtype=bool)
        return np.ones(self.n, dtype=bool)

    @property
    def route_idx(self) -> IntArray:
        """Each vehicle's route, an index into `city.routes`."""
        return self.fleet.route_idx

    @property
    def planned_arrival_ms(self) -> IntArray:
        """Each scheduled trip's planned arrival (-1: not a scheduled trip)."""
        return self.fleet.planned_arrival_ms

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
        self, k: int, pending_silence: list[TruthAlert], withheld: dict[int, list[Message]]
    ) -> TickBatch:
        cfg, rng, n, fleet, rules = self.cfg, self.rng, self.n, self.fleet, self.rules
        period = cfg.period_ms
        ts = cfg.start_ms + k * period
        seq = self.seq_base() + k
        truth: list[TruthAlert] = []
        vids = self.vehicle_ids_cached()

        # Silence: the vehicle publishes nothing from this tick on.
        going = np.nonzero(fleet.alive & (fleet.silent_tick == k))[0]
        for i in going.tolist():
            fleet.alive[i] = False
            due = ts - period + int(cfg.rules.silent_after_s * 1000)
            tick_due = math.ceil((due + cfg.assume.lateness_ms - cfg.start_ms) / period)
            pending_silence.append(
                TruthAlert(vids[i], AlertType.VEHICLE_SILENT.value, seq - 1, due, None, tick_due)
            )
            self.stats.silences += 1
        alive = fleet.alive

        m = advance(fleet, k, rules.completed)
        speed_kmh, lat, lon, heading = m.speed_kmh, m.lat, m.lon, m.heading

        # ---- truth: the alert rules over the planned facts (vehicles publishing this tick)
        quiet_before = rules.quiet()
        trig: list[Trigger] = []
        alerted = rules.zones(alive, m.in_poly, m.in_outer, trig)
        alerted |= rules.corridor(k, alive, m.excursion, trig)
        alerted |= rules.speed(k, alive, speed_kmh, trig)
        # Route awareness: completion, stops, direction and arrival.
        alerted |= rules.trip(k, alive, m, trig)

        # ---- transport faults
        u = rng.random(n)
        p = cfg.inject
        limit = cfg.rules.speed_limit_kmh
        near_silence = (fleet.silent_tick >= 0) & (k >= fleet.silent_tick - 3)
        can_hold = alive & (k >= 3) & ~near_silence & (self.withheld_until < k) & (k < cfg.n_ticks - 1)
        for prox in self.proximity:
            # A fix that meets another vehicle's is never held back: its pair's meetings reach the
            # processor in event-time order (simulator.truth_proximity).
            can_hold &= ~prox.observe(alive, lat, lon)
        calm = (
            ~alerted
            & quiet_before
            & rules.quiet()
            & (speed_kmh <= limit)
            # A fix that comes too late is lost: never one a trip rule counts on (a stop's first
            # fix, a fix near the end, one of a noise-free episode or a trip at risk).
            & ~m.exact
            & ~rules.wrong
            & ~rules.at_risk
            & (rules.stop_since < 0)
            & (speed_kmh > cfg.rules.stop_speed_kmh + cfg.assume.stop_hysteresis_kmh)
            & (m.d_end > cfg.rules.completion_radius_m + 30.0)
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
        for prox in self.proximity:
            truth.extend(prox.tick(k, ts, seq))

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
