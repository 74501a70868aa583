"""The per-vehicle geofencing state machine: `step(state, fix) -> (state, alerts)`. Pure, no I/O.

This is the specification of FleetFence's alert semantics. The vectorized batch engine
(`processor.core.engine`) must produce exactly what folding `step` over a vehicle's fixes produces; a
property test holds it to that. Geometric facts (inside the corridor, inside the inner band, zone
memberships) are computed before, in one vectorized pass per micro-batch, and arrive on the `Fix`.

Semantics, all in event time:
- ROUTE_DEVIATION: outside the corridor for >= `deviation_min_fixes` consecutive fixes *and*
  >= `deviation_min_s` seconds; ROUTE_RETURN: then back inside the inner band for
  >= `return_min_fixes` consecutive fixes. Spatial and temporal hysteresis: no flapping.
- OVERSPEED: above the route's limit for >= `overspeed_min_s`; the episode ends only when the speed
  drops `overspeed_hysteresis_kmh` below the limit, and a new episode alerts again.
- ZONE_ENTER when a fix is inside a zone polygon; ZONE_EXIT (with the dwell time) when a fix is
  outside the zone grown by the hysteresis band. A circle zone (a centre and `radius_m`) is the same
  rule over the distance d from its centre (`fleetfence.geo.circle_distance_m`, in the local
  projection around the centre): inside iff d <= radius_m, the boundary included; outside the grown
  zone iff d > radius_m + hysteresis_m. Exact, not a polygon of the circle.
- VEHICLE_SILENT when the watermark passes the last fix's time plus `silent_after_s`; once per silence.
- VEHICLE_RESUMED at the first fix after a silence, with the length of the gap in event time (a
  tracker back from a dead zone uploads what it stored: its stretch is then applied in order).

Route awareness, for a vehicle on an assigned route, from its progress along the route
(continuous: of the route's passes near a fix, the one nearest the previous progress, so a street
the route uses both ways or a route crossing itself never makes progress jump; `continue_progress`):
- WRONG_DIRECTION once progress has gone back `wrong_way_min_m` from its highest point since the
  direction was last settled, over >= `wrong_way_min_fixes` fixes and >= `wrong_way_min_s`;
  DIRECTION_RESTORED once it has gone forward as far from its lowest point. Leaving the corridor
  forgets the reference point (progress off the corridor means nothing).
- UNPLANNED_STOP after `stop_min_s` at <= `stop_speed_kmh` within `stop_radius_m` of where the
  stop began, unless the fix that completes that time is in a zone marked as a stop, or within the
  hysteresis band around one (a planned stop: no alert). STOP_ENDED, with the duration, once it
  moves again: above the stop speed plus `stop_hysteresis_kmh`, or out of the radius grown by
  `hysteresis_m`.
- ARRIVAL_AT_RISK once the ETA (remaining distance at the trip's average speed so far, see
  `eta_ms`) is later than the planned arrival by more than `arrival_risk_s`; ARRIVAL_BACK_ON_TIME
  once it is `arrival_hysteresis_s` below that again.
- ROUTE_COMPLETED at the first fix in the corridor within `completion_radius_m` of the route's end
  and past half its length (on every pass near the fix, while the vehicle cannot be placed yet:
  a vehicle first seen at its route's end completes there, its trip starting at that fix); with
  the actual and planned duration and the distance driven outside the corridor. Once completed, the
  trip raises no direction, stop or arrival alert.
"""

from __future__ import annotations

import math
from dataclasses import MISSING, dataclass, field, fields, replace
from typing import Any

from fleetfence.contracts import AlertRecord, AlertType, alert_id, alert_json, alert_record
from fleetfence.geo import haversine_m
from fleetfence.rules import ProcessorRules, RouteRules
from processor.core.trip import eta_ms, planned_arrival_ms


@dataclass(frozen=True)
class EngineConfig(ProcessorRules):
    """The processor-wide rules as the engine applies them (route-specific ones live in RouteRules),
    and the engine's own knobs, which change how it works but not what it emits."""

    # How many fixes a vehicle's reorder buffer holds before it gives up waiting for a missing one.
    max_pending_per_vehicle: int = 1000
    # False folds every vehicle fix by fix through `step`, the reference semantics, instead of
    # advancing the quiet ones in columns (`processor.core.engine`): the same alerts and states, slower.
    # The engine's property tests run both ways to hold the fast path to the reference.
    fast_path: bool = True

    @classmethod
    def of(cls, rules: ProcessorRules, **engine: Any) -> EngineConfig:
        """The engine applying `rules` (the engine's own knobs from `engine`, else their defaults)."""
        return cls(**{f.name: getattr(rules, f.name) for f in fields(ProcessorRules)}, **engine)


@dataclass(frozen=True, slots=True)
class RawFix:
    """One fix of one vehicle before ordering: what the vehicle's reorder buffer holds (`reorder`).

    The engine's own record of a fix, apart from the wire's `fleetfence.contracts.Telemetry`: only
    what the state machine reads, without the vehicle (the buffer's key). The state store keeps the
    buffers pickled, so these fields, in this order, are part of the checkpoint's format."""

    seq: int
    ts_ms: int
    lat: float
    lon: float
    speed_kmh: float
    received_ms: int = 0


@dataclass(frozen=True, slots=True, kw_only=True)
class Fix(RawFix):
    """A fix once ordered and placed: the `RawFix` with the facts of its assigned route and the
    zones, computed for a whole batch in one vectorized pass (`processor.core.engine`) so that `step`
    itself does no geometry. The facts are keyword-only: most are of one type, and a swapped pair
    would go unnoticed."""

    route_id: str | None = None
    route_version: int = 0
    in_corridor: bool = True
    in_inner: bool = True
    zones_in: frozenset[str] = frozenset()
    zones_outer: frozenset[str] = frozenset()
    # Route awareness: the progress (m along the route) of each pass of the route near the fix,
    # empty outside the corridor; the distance to the route's end; the route's length; whether the
    # fix is in a zone marked as a stop (or in the hysteresis band around one); the assignment's planned
    # departure and arrival (-1: none).
    progress_m: tuple[float, ...] = ()
    end_distance_m: float = math.inf
    route_length_m: float = 0.0
    stop_zone: bool = False
    planned_departure_ms: int = -1
    planned_arrival_ms: int = -1
    # The assignment the fix falls under, by when it became valid (-1: none): a new one is a new trip.
    trip_from_ms: int = -1


@dataclass(frozen=True, slots=True, kw_only=True)
class Alert:
    """One alert as the state machine raises it (keywords only, like `Fix`); its record on
    `fleet.alerts` is `to_dict`."""

    type: AlertType
    vehicle_id: str
    seq: int
    ts_ms: int
    lat: float
    lon: float
    route_id: str | None
    route_version: int
    subject: str = ""  # the zone id for zone alerts
    received_ms: int = 0
    details: tuple[tuple[str, Any], ...] = ()
    # Raised late: its triggering fix's event time was already behind the watermark (a fix a vehicle
    # stored and forwarded, or one that waited in the reorder buffer). The batch engine sets it; the
    # id does not depend on it.
    late: bool = False

    @property
    def alert_id(self) -> str:
        return alert_id(self.vehicle_id, self.type.value, self.seq, self.subject)

    def to_dict(self) -> AlertRecord:
        """The alert's record on `fleet.alerts` (`fleetfence.contracts.AlertRecord`)."""
        return alert_record(
            alert_type=self.type,
            vehicle_id=self.vehicle_id,
            seq=self.seq,
            ts_ms=self.ts_ms,
            lat=self.lat,
            lon=self.lon,
            route_id=self.route_id,
            route_version=self.route_version,
            details=dict(self.details),
            trigger_received_ms=self.received_ms,
            zone_id=self.subject,
            late=self.late,
        )

    def to_json(self) -> bytes:
        """The record's bytes on `fleet.alerts`; receivers keep them as they are."""
        return alert_json(self.to_dict())


@dataclass(slots=True)
class VehicleState:
    """Everything the processor remembers about one vehicle between fixes: the one definition of
    the state, from which the engine's columns (`processor.core.columns`) take their names, kinds and
    "nothing yet" values (each field's default).

    A new field goes at the end. A parked vehicle's row is packed by position, its int, float and
    bool fields each in their order here (`processor.core.parking`), and a row packed before a field
    existed unpacks with the field's default only if every older field kept its place
    (tests/processor/test_processor_parking.py holds a row packed by an older version).
    """

    vehicle_id: str
    last_seq: int = -1
    last_ts_ms: int = 0
    last_received_ms: int = 0
    lat: float = 0.0
    lon: float = 0.0
    speed_kmh: float = 0.0
    route_id: str | None = None
    route_version: int = 0
    off_route: bool = False
    outside_fixes: int = 0
    outside_since_ms: int = -1
    inside_fixes: int = 0
    overspeed: bool = False
    over_since_ms: int = -1
    over_max_kmh: float = 0.0
    silent: bool = False
    zones: dict[str, int] = field(default_factory=dict)  # zone_id -> entered at ts_ms
    # Route awareness (reset when the route changes). Progress of the last fix in the corridor
    # (-1: none yet); the direction's reference point: highest progress while the direction is
    # right, lowest while wrong (-1: none), its time and the fixes since.
    progress_m: float = -1.0
    wrong_way: bool = False
    dir_anchor_m: float = -1.0
    dir_anchor_ts_ms: int = -1
    dir_anchor_fixes: int = 0
    # A stop: since when (-1: moving), where it began, and 0 pending / 1 unplanned (alerted) / 2 planned.
    stop_since_ms: int = -1
    stop_lat: float = 0.0
    stop_lon: float = 0.0
    stop_phase: int = 0
    # The trip: its assignment (valid from; -1: none), its first fix in the corridor, the ETA of the
    # last fix (-1: none), the arrival state, the distance driven outside the corridor, and whether
    # the route's end was reached.
    trip_from_ms: int = -1
    trip_start_ms: int = -1
    trip_start_m: float = 0.0
    eta_ms: int = -1
    at_risk: bool = False
    off_route_m: float = 0.0
    completed: bool = False


# Each field's "nothing yet" (its default): a new vehicle's value, and what `reset` returns it to.
STATE_DEFAULTS: dict[str, Any] = {f.name: f.default for f in fields(VehicleState) if f.default is not MISSING}

# The fields that start again together, each group at its defaults (`reset`): `step` resets them at a
# route switch, a new trip, a completion and the end of a condition, and the engine's fast path
# resets the counts its quiet fixes end (on columns) from the same groups.
DEVIATION_COUNT = ("outside_fixes", "outside_since_ms")  # fixes outside, not yet a deviation
CORRIDOR = ("off_route", *DEVIATION_COUNT, "inside_fixes")
OVERSPEED_COUNT = ("over_since_ms", "over_max_kmh")  # time above the limit, not yet an overspeed
SPEED = ("overspeed", *OVERSPEED_COUNT)
DIRECTION_ANCHOR = ("dir_anchor_m", "dir_anchor_ts_ms", "dir_anchor_fixes")
DIRECTION = ("wrong_way", *DIRECTION_ANCHOR)
STOP = ("stop_since_ms", "stop_phase")  # where it began (stop_lat, stop_lon) is read only during one
TRIP = (
    "progress_m",
    *DIRECTION,
    *STOP,
    "stop_lat",
    "stop_lon",
    "trip_start_ms",
    "trip_start_m",
    "eta_ms",
    "at_risk",
    "off_route_m",
    "completed",
)
# The fields of the conditions a later fix may close with an alert (a silent vehicle's next fix raises
# VEHICLE_RESUMED): each is at its default while its condition is closed. A zone entered is such a
# condition too, kept in `zones`.
OPEN_CONDITIONS = ("off_route", "overspeed", "silent", "wrong_way", "stop_since_ms", "at_risk")


def reset(s: VehicleState, names: tuple[str, ...]) -> None:
    """Return these fields of `s` to their defaults."""
    for name in names:
        setattr(s, name, STATE_DEFAULTS[name])


def _alert(s: VehicleState, t: AlertType, f: Fix, subject: str = "", **details: Any) -> Alert:
    return Alert(
        type=t,
        vehicle_id=s.vehicle_id,
        seq=f.seq,
        ts_ms=f.ts_ms,
        lat=f.lat,
        lon=f.lon,
        route_id=f.route_id,
        route_version=f.route_version,
        subject=subject,
        received_ms=f.received_ms,
        details=tuple(sorted(details.items())),
    )


def step(
    state: VehicleState, fix: Fix, rules: RouteRules | None, cfg: EngineConfig
) -> tuple[VehicleState, list[Alert]]:
    """Apply one in-order fix (seq > state.last_seq) to a vehicle; return the new state and alerts.

    `rules` are those of `fix.route_id` (None when the vehicle has no valid assignment).
    """
    s = replace(state, zones=dict(state.zones))
    alerts: list[Alert] = []
    switched = fix.route_id != s.route_id
    if switched:
        # A new route starts a clean corridor and speed record, and a new trip; no alert for the
        # switch.
        reset(s, CORRIDOR + SPEED)
    if switched or fix.trip_from_ms != s.trip_from_ms:
        # So does a new assignment to the same route (tomorrow's run of today's route): a trip is
        # an assignment, known by when it became valid. A changed plan (new planned times on the
        # same assignment) keeps the trip.
        reset(s, TRIP)
    s.route_id, s.route_version, s.trip_from_ms = fix.route_id, fix.route_version, fix.trip_from_ms
    if s.silent:
        gap_s = round((fix.ts_ms - state.last_ts_ms) / 1000.0, 3)
        alerts.append(_alert(s, AlertType.VEHICLE_RESUMED, fix, gap_s=gap_s, last_seq=state.last_seq))
    s.silent = False

    if rules is not None and fix.route_id is not None:
        if not s.off_route:
            if fix.in_corridor:
                reset(s, DEVIATION_COUNT)
            else:
                if s.outside_fixes == 0:
                    s.outside_since_ms = fix.ts_ms
                s.outside_fixes += 1
                outside_s = (fix.ts_ms - s.outside_since_ms) / 1000.0
                if s.outside_fixes >= rules.deviation_min_fixes and outside_s >= rules.deviation_min_s:
                    s.off_route, s.inside_fixes = True, 0
                    alerts.append(
                        _alert(
                            s,
                            AlertType.ROUTE_DEVIATION,
                            fix,
                            outside_fixes=s.outside_fixes,
                            outside_s=outside_s,
                        )
                    )
        elif fix.in_inner:
            s.inside_fixes += 1
            if s.inside_fixes >= cfg.return_min_fixes:
                off_s = (fix.ts_ms - s.outside_since_ms) / 1000.0
                reset(s, CORRIDOR)
                alerts.append(_alert(s, AlertType.ROUTE_RETURN, fix, off_route_s=off_s))
        else:
            s.inside_fixes = 0

        limit = rules.speed_limit_kmh
        if not s.overspeed:
            if fix.speed_kmh > limit:
                if s.over_since_ms < 0:
                    s.over_since_ms, s.over_max_kmh = fix.ts_ms, fix.speed_kmh
                s.over_max_kmh = max(s.over_max_kmh, fix.speed_kmh)
                over_s = (fix.ts_ms - s.over_since_ms) / 1000.0
                if over_s >= rules.overspeed_min_s:
                    s.overspeed = True
                    alerts.append(
                        _alert(
                            s,
                            AlertType.OVERSPEED,
                            fix,
                            speed_kmh=fix.speed_kmh,
                            limit_kmh=limit,
                            max_kmh=s.over_max_kmh,
                            over_s=over_s,
                        )
                    )
            else:
                reset(s, OVERSPEED_COUNT)
        elif fix.speed_kmh <= limit - cfg.overspeed_hysteresis_kmh:
            reset(s, SPEED)
        else:
            s.over_max_kmh = max(s.over_max_kmh, fix.speed_kmh)

        _route_awareness(s, fix, rules, cfg, alerts, moved_on_route=not switched and state.last_seq >= 0)

    for zone_id in sorted(s.zones):
        if zone_id not in fix.zones_outer:
            entered = s.zones.pop(zone_id)
            alerts.append(
                _alert(s, AlertType.ZONE_EXIT, fix, zone_id, dwell_s=(fix.ts_ms - entered) / 1000.0)
            )
    for zone_id in sorted(fix.zones_in - s.zones.keys()):
        s.zones[zone_id] = fix.ts_ms
        alerts.append(_alert(s, AlertType.ZONE_ENTER, fix, zone_id))

    s.last_seq, s.last_ts_ms, s.last_received_ms = fix.seq, fix.ts_ms, fix.received_ms
    s.lat, s.lon, s.speed_kmh = fix.lat, fix.lon, fix.speed_kmh
    return s, alerts


# How much further back than forward a pass may lie and still be taken as the continuation: at the
# tip of a U-turn on one street both legs are about equally near the previous progress, and a vehicle
# following its route is on the leg ahead.
FORWARD_BIAS_M = 50.0


def continue_progress(candidates: tuple[float, ...], previous_m: float) -> float | None:
    """Of the route's passes near a fix, the progress that continues the previous one: the nearest
    to it, a pass behind counting `FORWARD_BIAS_M` further than it is. Continuity is what keeps a
    street the route drives both ways, or a crossing, from making progress jump to the other pass.
    With no previous progress a fix near several passes is not placed at all (None): a vehicle
    driving east on a street the route uses eastbound and later westbound is either on time on the
    first pass or wrong-way on the second, and only where it came from can tell; the first fix near
    a single pass places it."""
    if len(candidates) == 1:
        return candidates[0]
    if previous_m < 0:
        return None
    return min(
        candidates, key=lambda p: (p - previous_m if p >= previous_m else previous_m - p + FORWARD_BIAS_M, p)
    )


def _route_awareness(
    s: VehicleState, fix: Fix, rules: RouteRules, cfg: EngineConfig, alerts: list[Alert], moved_on_route: bool
) -> None:
    """Progress, completion, direction, stops and arrival of one fix on an assigned route
    (`s` still holds the previous fix's position)."""
    p = continue_progress(fix.progress_m, s.progress_m) if fix.in_corridor and fix.progress_m else None
    if p is not None:
        s.progress_m = p
    if s.completed:
        return
    if p is not None and s.trip_start_ms < 0:
        s.trip_start_ms, s.trip_start_m = fix.ts_ms, p
    if not fix.in_corridor and moved_on_route and s.trip_start_ms >= 0:
        s.off_route_m += float(haversine_m(s.lon, s.lat, fix.lon, fix.lat))
    planned = planned_arrival_ms(
        fix.planned_arrival_ms, fix.planned_departure_ms, s.trip_start_ms, rules.planned_duration_s
    )
    # Completion needs progress past half the route, not the pass: a fix near several passes that
    # are all past half completes whichever it is on (a route whose last stretch retraces a street,
    # or passes near its own end), even before the vehicle has been placed. Such a trip starts there.
    past_half = p >= fix.route_length_m / 2 if p is not None else _all_past_half(fix)
    if past_half and fix.end_distance_m <= rules.completion_radius_m:
        s.completed = True
        if s.trip_start_ms < 0:
            s.trip_start_ms, s.trip_start_m = fix.ts_ms, min(fix.progress_m)
        duration_s = (fix.ts_ms - s.trip_start_ms) / 1000.0
        done_m = p if p is not None else s.trip_start_m
        details: dict[str, Any] = {
            "duration_s": duration_s,
            "distance_m": round(done_m - s.trip_start_m, 1),
            "off_route_m": round(s.off_route_m, 1),
        }
        if planned >= 0:
            details["planned_arrival_ms"] = planned
            details["delay_s"] = (fix.ts_ms - planned) / 1000.0
        if math.isfinite(rules.planned_duration_s):
            details["planned_duration_s"] = rules.planned_duration_s
        alerts.append(_alert(s, AlertType.ROUTE_COMPLETED, fix, **details))
        reset(s, (*DIRECTION, *STOP, "at_risk"))
        s.eta_ms = fix.ts_ms
        return
    _direction(s, fix, p, rules, alerts)
    _stop(s, fix, rules, cfg, alerts)
    if p is not None and s.trip_start_ms >= 0:
        eta = float(
            eta_ms(
                fix.ts_ms,
                p,
                s.trip_start_ms,
                s.trip_start_m,
                fix.route_length_m,
                cfg.eta_warmup_s,
                cfg.eta_min_speed_kmh,
            )
        )
        s.eta_ms = int(eta) if eta >= 0 else -1
        if planned >= 0 and eta >= 0:
            delay_s = (eta - planned) / 1000.0
            if not s.at_risk and delay_s > rules.arrival_risk_s:
                s.at_risk = True
                alerts.append(
                    _alert(
                        s,
                        AlertType.ARRIVAL_AT_RISK,
                        fix,
                        eta_ms=int(eta),
                        planned_arrival_ms=planned,
                        delay_s=round(delay_s, 1),
                        remaining_m=round(fix.route_length_m - p, 1),
                    )
                )
            elif s.at_risk and delay_s <= rules.arrival_risk_s - cfg.arrival_hysteresis_s:
                s.at_risk = False
                alerts.append(
                    _alert(
                        s,
                        AlertType.ARRIVAL_BACK_ON_TIME,
                        fix,
                        eta_ms=int(eta),
                        planned_arrival_ms=planned,
                        delay_s=round(delay_s, 1),
                    )
                )


def _all_past_half(fix: Fix) -> bool:
    """Whether a fix that cannot be placed (near several passes, no previous progress) is past half
    its route on every pass it is near."""
    return fix.in_corridor and bool(fix.progress_m) and min(fix.progress_m) >= fix.route_length_m / 2


def _direction(s: VehicleState, fix: Fix, p: float | None, rules: RouteRules, alerts: list[Alert]) -> None:
    if p is None:
        reset(s, DIRECTION_ANCHOR)
        return
    if s.dir_anchor_m < 0 or (p < s.dir_anchor_m if s.wrong_way else p > s.dir_anchor_m):
        s.dir_anchor_m, s.dir_anchor_ts_ms, s.dir_anchor_fixes = p, fix.ts_ms, 0
        return
    s.dir_anchor_fixes += 1
    moved_m = p - s.dir_anchor_m if s.wrong_way else s.dir_anchor_m - p
    over_s = (fix.ts_ms - s.dir_anchor_ts_ms) / 1000.0
    if (
        moved_m >= rules.wrong_way_min_m
        and s.dir_anchor_fixes >= rules.wrong_way_min_fixes
        and over_s >= rules.wrong_way_min_s
    ):
        t = AlertType.DIRECTION_RESTORED if s.wrong_way else AlertType.WRONG_DIRECTION
        alerts.append(_alert(s, t, fix, moved_m=round(moved_m, 1), over_s=over_s, progress_m=round(p, 1)))
        s.wrong_way = not s.wrong_way
        s.dir_anchor_m, s.dir_anchor_ts_ms, s.dir_anchor_fixes = p, fix.ts_ms, 0


def _stop(s: VehicleState, fix: Fix, rules: RouteRules, cfg: EngineConfig, alerts: list[Alert]) -> None:
    if not math.isfinite(rules.stop_min_s):
        return
    slow = fix.speed_kmh <= rules.stop_speed_kmh
    if s.stop_since_ms < 0:
        if slow:
            s.stop_since_ms, s.stop_lat, s.stop_lon, s.stop_phase = fix.ts_ms, fix.lat, fix.lon, 0
        return
    away_m = float(haversine_m(s.stop_lon, s.stop_lat, fix.lon, fix.lat))
    stopped_s = (fix.ts_ms - s.stop_since_ms) / 1000.0
    if s.stop_phase == 0:
        if slow and away_m <= rules.stop_radius_m:
            if stopped_s >= rules.stop_min_s:
                if fix.stop_zone:
                    s.stop_phase = 2
                else:
                    s.stop_phase = 1
                    alerts.append(
                        _alert(
                            s, AlertType.UNPLANNED_STOP, fix, stopped_s=stopped_s, since_ms=s.stop_since_ms
                        )
                    )
        elif slow:  # crept out of the radius: a new stop may begin here
            s.stop_since_ms, s.stop_lat, s.stop_lon = fix.ts_ms, fix.lat, fix.lon
        else:
            reset(s, STOP)
        return
    if (
        fix.speed_kmh > rules.stop_speed_kmh + cfg.stop_hysteresis_kmh
        or away_m > rules.stop_radius_m + cfg.hysteresis_m
    ):
        if s.stop_phase == 1:
            alerts.append(
                _alert(s, AlertType.STOP_ENDED, fix, duration_s=stopped_s, since_ms=s.stop_since_ms)
            )
        reset(s, STOP)
        if slow:
            s.stop_since_ms, s.stop_lat, s.stop_lon = fix.ts_ms, fix.lat, fix.lon


def check_silence(
    state: VehicleState, watermark_ms: int, silent_after_s: float
) -> tuple[VehicleState, list[Alert]]:
    """Event-time silence: the watermark says no fix older than it can still arrive."""
    due_ms = state.last_ts_ms + int(silent_after_s * 1000)
    if state.silent or state.last_seq < 0 or watermark_ms < due_ms:
        return state, []
    s = replace(state, zones=dict(state.zones), silent=True)
    a = Alert(
        type=AlertType.VEHICLE_SILENT,
        vehicle_id=s.vehicle_id,
        seq=s.last_seq,
        ts_ms=due_ms,
        lat=s.lat,
        lon=s.lon,
        route_id=s.route_id,
        route_version=s.route_version,
        received_ms=s.last_received_ms,
        details=(("last_ts_ms", s.last_ts_ms), ("silent_s", silent_after_s)),
    )
    return s, [a]


def reorder(
    last_seq: int, held: list[RawFix], arrived: list[RawFix], watermark_ms: int, max_pending: int
) -> tuple[list[RawFix], list[RawFix], int]:
    """Decide which fixes can be applied now, in seq order; return (ready, still held, dropped).

    Duplicates and anything at or below `last_seq` are dropped. A fix after a gap in `seq` waits
    for the missing one until the watermark passes its event time (then the gap is given up), or
    until more than `max_pending` fixes wait. A vehicle seen for the first time starts at its
    lowest seq.
    """
    by_seq: dict[int, RawFix] = {f.seq: f for f in held if f.seq > last_seq}
    dropped = 0
    for f in arrived:
        if f.seq <= last_seq or f.seq in by_seq:
            dropped += 1
        else:
            by_seq[f.seq] = f
    ordered = [by_seq[k] for k in sorted(by_seq)]
    ready: list[RawFix] = []
    expected = last_seq + 1 if last_seq >= 0 else (ordered[0].seq if ordered else 0)
    i = 0
    while i < len(ordered):
        f = ordered[i]
        if f.seq == expected or f.ts_ms <= watermark_ms or len(ordered) - i > max_pending:
            ready.append(f)
            expected = f.seq + 1
            i += 1
        else:
            break
    return ready, ordered[i:], dropped
