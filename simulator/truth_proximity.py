"""Vehicle proximity's ground truth: which pairs of simulated vehicles come near and part, under each
proximity rule the processor is run with (`fleetfence.rules.ProximityRule`), among the vehicles in
the rule's scope (the fleet, a route's or a group's: `Scenario.in_scope`).

The other alert rules are judged on planned facts with margins the GPS noise cannot cross. A pair's
distance is not planned: vehicles overtake each other, stop in the same zone, meet where a route
turns back. So this truth judges the published fixes themselves, with the one definition of the
distance the processor uses too (`fleetfence.geo.haversine_m`, the same float operations); what
keeps it exact is the shape of the stream, not margins:
- every vehicle reports at the tick's event time, and the rule's tolerance is shorter than a tick
  (`ScenarioConfig.validate`), so a meeting joins two fixes of one tick: no skew, no reach, and the
  gap the processor judges is the distance;
- a fix within the watch distance of another vehicle (`observe`: the only fixes that make a meeting)
  is never delayed by the transport faults (`Scenario` keeps it out of the swapped and late ones),
  so each pair's meetings reach the processor in event-time order, whatever the batches;
- duplicates are left in: the processor's cells keep one fix per vehicle and event time;
- distances are taken between the coordinates as published (rounded to 7 decimals).
The pair rules (processor.core.proximity's `pair_step` and `pair_expire`, restated for meetings of
one tick) are then applied pair by pair, tick by tick. A pair lost to a silence (or to parting
faster than the watch distance between two ticks) is lost at its deadline, which the processor
decides once its watermark passes it: that alert is due, like a silence's, at the first tick whose
time moves the watermark past it, or at the pair's next meeting, whichever comes first. One still
pending when the run ends is undecided (`undecided_alert_ids`: later traffic may move the watermark
on), and `verify` counts it neither way.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from fleetfence.contracts import AlertType
from fleetfence.geo import haversine_m
from fleetfence.rules import ProximityRule
from simulator.geo import BoolArray, FloatArray, IntArray
from simulator.truth import TruthAlert

# Metres per degree of latitude, for the coarse filter before the exact distance (a filter only:
# its radius is padded well past what the flat approximation can miss at city scale).
_M_PER_DEG = 111_320.0


@dataclass(slots=True)
class _Meeting:
    """The fixes of a pair's latest meeting: where each vehicle's alert is raised."""

    ts_ms: int
    seq: int
    lat: tuple[float, float]
    lon: tuple[float, float]


@dataclass(slots=True)
class _Pair:
    near_since_ms: int = -1
    entered: bool = False
    last: _Meeting | None = None

    @property
    def open(self) -> bool:
        return self.entered or self.near_since_ms >= 0


class ProximityTruth:
    """The expected PROXIMITY_ENTER / PROXIMITY_EXIT alerts of one rule, tick by tick, among the
    vehicles in its scope (`members`; None: the fleet)."""

    def __init__(
        self,
        rule: ProximityRule,
        vehicle_ids: list[str],
        start_ms: int,
        period_ms: int,
        lateness_ms: int,
        members: BoolArray | None = None,
    ):
        self.rule = rule
        self.vids = vehicle_ids
        self.members = np.ones(len(vehicle_ids), bool) if members is None else np.asarray(members, bool)
        self.start_ms, self.period_ms, self.lateness_ms = start_ms, period_ms, lateness_ms
        self.pairs: dict[tuple[int, int], _Pair] = {}  # the pairs with something open
        # Exits by loss not yet due: the tick at which the watermark passes the deadline.
        self.pending: dict[tuple[int, int], tuple[int, list[TruthAlert]]] = {}
        self._lat, self._lon = np.zeros(0), np.zeros(0)
        self._met: dict[tuple[int, int], float] = {}

    def close_pairs(
        self, alive: BoolArray, lat: FloatArray, lon: FloatArray, within_m: float
    ) -> tuple[IntArray, IntArray, FloatArray]:
        """The pairs (i < j) of live vehicles within `within_m` of each other, and their distances:
        a sweep along the longitude after the coarse filter, the exact distance after it."""
        idx = np.flatnonzero(alive)
        if len(idx) < 2:
            empty = np.zeros(0, np.int64)
            return empty, empty, np.zeros(0)
        y = lat[idx] * _M_PER_DEG
        # Scaled at the live vehicle farthest from the equator: distances never overestimated.
        x = lon[idx] * _M_PER_DEG * math.cos(math.radians(float(np.abs(lat[idx]).max())))
        r = within_m * 1.1 + 10.0
        order = np.argsort(x, kind="stable")
        xs, ys = x[order], y[order]
        first: list[IntArray] = []
        second: list[IntArray] = []
        for shift in range(1, len(order)):
            band = xs[shift:] - xs[:-shift] <= r
            if not band.any():
                break
            hit = np.flatnonzero(band & (np.abs(ys[shift:] - ys[:-shift]) <= r))
            first.append(order[hit])
            second.append(order[hit + shift])
        if not first:
            empty = np.zeros(0, np.int64)
            return empty, empty, np.zeros(0)
        a, b = idx[np.concatenate(first)], idx[np.concatenate(second)]
        i, j = np.minimum(a, b), np.maximum(a, b)
        d = np.asarray(haversine_m(lon[i], lat[i], lon[j], lat[j]), np.float64)
        keep = d <= within_m
        return i[keep], j[keep], d[keep]

    def observe(self, alive: BoolArray, lat: FloatArray, lon: FloatArray) -> BoolArray:
        """Take this tick's fixes as published (the wire rounds coordinates to 7 decimals:
        simulator.fleet_sink) and find its meetings; returns the live vehicles whose fix meets
        another's (within the watch distance, and a metre more against rounding): the fixes the
        transport faults must leave in order. `tick` then folds the meetings found here."""
        self._lat = np.array([round(v, 7) for v in lat.tolist()])
        self._lon = np.array([round(v, 7) for v in lon.tolist()])
        i, j, d = self.close_pairs(alive & self.members, self._lat, self._lon, self.rule.watch_m + 1.0)
        out = np.zeros(len(alive), dtype=bool)
        out[i] = True
        out[j] = True
        met = d <= self.rule.watch_m
        self._met = dict(
            zip(zip(i[met].tolist(), j[met].tolist(), strict=True), d[met].tolist(), strict=True)
        )
        return out

    def undecided_alert_ids(self) -> list[str]:
        """At the run's end, the exits by loss not yet due (pending, or of pairs still entered): the
        processor raises one only once its watermark passes the deadline, which the run's last fixes
        did not move it to (later traffic on the topic may): the truth can say neither that they
        come nor that they do not."""
        ids = [a.alert_id for _due, alerts in self.pending.values() for a in alerts]
        for key, p in self.pairs.items():
            if p.entered and p.last is not None:
                deadline = p.last.ts_ms + self.rule.lost_after_ms
                lost = self._alerts(AlertType.PROXIMITY_EXIT, key, p.last, deadline, p.near_since_ms, -1)
                ids += [a.alert_id for a in lost]
        return ids

    def tick(self, k: int, ts: int, seq: int) -> list[TruthAlert]:
        """This tick's expected alerts: the meetings `observe` found folded into their pairs, the
        exits by loss that come due."""
        rule = self.rule
        out: list[TruthAlert] = []
        lat, lon, met = self._lat, self._lon, self._met
        # Deadlines reached: the pair is lost (an entered one exits at its last meeting).
        for key, p in list(self.pairs.items()):
            if p.last is None or ts < p.last.ts_ms + rule.lost_after_ms:
                continue
            deadline = p.last.ts_ms + rule.lost_after_ms
            if p.entered:
                # Due at the first tick whose time moves the watermark past the deadline (Spark fires
                # an event-time timer once the watermark is beyond it).
                due = (deadline + self.lateness_ms - self.start_ms) // self.period_ms + 1
                lost = self._alerts(AlertType.PROXIMITY_EXIT, key, p.last, deadline, p.near_since_ms, due)
                self.pending[key] = (due, lost)
            del self.pairs[key]
        for key, d in sorted(met.items()):
            if key in self.pending:  # the processor raises an exit by loss at the pair's next meeting
                for a in self.pending.pop(key)[1]:
                    a.publish_tick = k
                    out.append(a)
            p = self.pairs.get(key) or _Pair()
            if not p.open and d > rule.enter_m:
                continue  # nothing open, not near: nothing to remember
            i, j = key
            p.last = _Meeting(ts, seq, (float(lat[i]), float(lat[j])), (float(lon[i]), float(lon[j])))
            if p.entered:
                if d > rule.exit_m:
                    out.extend(self._alerts(AlertType.PROXIMITY_EXIT, key, p.last, ts, p.near_since_ms, k))
                    p.entered, p.near_since_ms = False, -1
            elif d > rule.enter_m:
                p.near_since_ms = -1
            else:
                if p.near_since_ms < 0:
                    p.near_since_ms = ts  # two fixes that close: a run of nearness starts
                if ts - p.near_since_ms >= rule.min_duration_ms:
                    out.extend(self._alerts(AlertType.PROXIMITY_ENTER, key, p.last, ts, p.near_since_ms, k))
                    p.entered = True
            if p.open:
                self.pairs[key] = p
            else:
                self.pairs.pop(key, None)
        for key, (due, lost) in list(self.pending.items()):
            if due <= k:
                out.extend(lost)
                del self.pending[key]
        return out

    def _alerts(
        self,
        kind: AlertType,
        key: tuple[int, int],
        at: _Meeting,
        ts_ms: int,
        since_ms: int,
        publish_tick: int,
    ) -> list[TruthAlert]:
        """The pair's two alerts, one per vehicle at its own fix, each naming the other."""
        i, j = key
        a, b = self.vids[i], self.vids[j]
        out = []
        for side, me, other in ((0, a, b), (1, b, a)):
            out.append(
                TruthAlert(
                    me,
                    kind.value,
                    at.seq,
                    ts_ms,
                    None,
                    publish_tick,
                    None,
                    at.lat[side],  # the wire's coordinates already (`observe`)
                    at.lon[side],
                    other_vehicle_id=other,
                    subject=f"{self.rule.rule_id}:{other}:{since_ms}",
                )
            )
        return out
