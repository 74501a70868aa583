"""The per-vehicle geofencing state machine: `step(state, fix) -> (state, alerts)`. Pure, no I/O.

This is the specification of FleetFence's alert semantics. The vectorized batch engine
(`processor.engine`) must produce exactly what folding `step` over a vehicle's fixes produces; a
property test holds it to that. Geometric facts (inside the corridor, inside the inner band, zone
memberships) are computed before, in one vectorized pass per micro-batch, and arrive on the `Fix`.

Semantics, all in event time:
- ROUTE_DEVIATION: outside the corridor for >= `deviation_min_fixes` consecutive fixes *and*
  >= `deviation_min_s` seconds; ROUTE_RETURN: then back inside the inner band for
  >= `return_min_fixes` consecutive fixes. Spatial and temporal hysteresis: no flapping.
- OVERSPEED: above the route's limit for >= `overspeed_min_s`; the episode ends only when the speed
  drops `overspeed_hysteresis_kmh` below the limit, and a new episode alerts again.
- ZONE_ENTER when a fix is inside a zone polygon; ZONE_EXIT (with the dwell time) when a fix is
  outside the zone grown by the hysteresis band.
- VEHICLE_SILENT when the watermark passes the last fix's time plus `silent_after_s`; once per silence.
- VEHICLE_RESUMED at the first fix after a silence, with the length of the gap in event time (a
  tracker back from a dead zone uploads what it stored: its stretch is then applied in order).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from fleetfence.contracts import AlertType, alert_id, ms_to_iso
from fleetfence.rules import ProcessorRules, RouteRules


@dataclass(frozen=True)
class EngineConfig:
    """Processor-wide rules (route-specific ones live in RouteRules); defaults from ProcessorRules."""

    hysteresis_m: float = ProcessorRules.hysteresis_m
    return_min_fixes: int = ProcessorRules.return_min_fixes
    overspeed_hysteresis_kmh: float = ProcessorRules.overspeed_hysteresis_kmh
    default_silent_after_s: float = ProcessorRules.default_silent_after_s
    allowed_lateness_ms: int = ProcessorRules.lateness_ms
    late_bound_ms: int = ProcessorRules.late_bound_ms
    max_pending_per_vehicle: int = 1000


@dataclass(frozen=True, slots=True)
class Fix:
    """One accepted fix, with the geometric facts of its assigned route and the zones."""

    seq: int
    ts_ms: int
    lat: float
    lon: float
    speed_kmh: float
    received_ms: int = 0
    route_id: str | None = None
    route_version: int = 0
    in_corridor: bool = True
    in_inner: bool = True
    zones_in: frozenset[str] = frozenset()
    zones_outer: frozenset[str] = frozenset()


@dataclass(frozen=True, slots=True)
class Alert:
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

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {
            "alert_id": self.alert_id,
            "type": self.type.value,
            "vehicle_id": self.vehicle_id,
            "route_id": self.route_id,
            "route_version": self.route_version,
            "seq": self.seq,
            "ts_ms": self.ts_ms,
            "ts": ms_to_iso(self.ts_ms),
            "lat": self.lat,
            "lon": self.lon,
            "details": dict(self.details),
            "trigger_received_ms": self.received_ms,
        }
        if self.subject:
            d["zone_id"] = self.subject
        if self.late:
            d["late"] = True
        return d


@dataclass(slots=True)
class VehicleState:
    """Everything the processor remembers about one vehicle between fixes."""

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


def _alert(s: VehicleState, t: AlertType, f: Fix, subject: str = "", **details: Any) -> Alert:
    return Alert(
        t,
        s.vehicle_id,
        f.seq,
        f.ts_ms,
        f.lat,
        f.lon,
        f.route_id,
        f.route_version,
        subject,
        f.received_ms,
        tuple(sorted(details.items())),
    )


def step(
    state: VehicleState, fix: Fix, rules: RouteRules | None, cfg: EngineConfig
) -> tuple[VehicleState, list[Alert]]:
    """Apply one in-order fix (seq > state.last_seq) to a vehicle; return the new state and alerts.

    `rules` are those of `fix.route_id` (None when the vehicle has no valid assignment).
    """
    s = replace(state, zones=dict(state.zones))
    alerts: list[Alert] = []
    if fix.route_id != s.route_id:
        # A new assignment starts a clean corridor and speed record; no alert for the switch.
        s.off_route, s.outside_fixes, s.outside_since_ms, s.inside_fixes = False, 0, -1, 0
        s.overspeed, s.over_since_ms, s.over_max_kmh = False, -1, 0.0
    s.route_id, s.route_version = fix.route_id, fix.route_version
    if s.silent:
        gap_s = round((fix.ts_ms - state.last_ts_ms) / 1000.0, 3)
        alerts.append(
            Alert(
                AlertType.VEHICLE_RESUMED,
                s.vehicle_id,
                fix.seq,
                fix.ts_ms,
                fix.lat,
                fix.lon,
                fix.route_id,
                fix.route_version,
                "",
                fix.received_ms,
                (("gap_s", gap_s), ("last_seq", state.last_seq)),
            )
        )
    s.silent = False

    if rules is not None and fix.route_id is not None:
        if not s.off_route:
            if fix.in_corridor:
                s.outside_fixes, s.outside_since_ms = 0, -1
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
                s.off_route, s.outside_fixes, s.outside_since_ms, s.inside_fixes = False, 0, -1, 0
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
                s.over_since_ms, s.over_max_kmh = -1, 0.0
        elif fix.speed_kmh <= limit - cfg.overspeed_hysteresis_kmh:
            s.overspeed, s.over_since_ms, s.over_max_kmh = False, -1, 0.0
        else:
            s.over_max_kmh = max(s.over_max_kmh, fix.speed_kmh)

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


def check_silence(
    state: VehicleState, watermark_ms: int, silent_after_s: float
) -> tuple[VehicleState, list[Alert]]:
    """Event-time silence: the watermark says no fix older than it can still arrive."""
    due_ms = state.last_ts_ms + int(silent_after_s * 1000)
    if state.silent or state.last_seq < 0 or watermark_ms < due_ms:
        return state, []
    s = replace(state, zones=dict(state.zones), silent=True)
    a = Alert(
        AlertType.VEHICLE_SILENT,
        s.vehicle_id,
        s.last_seq,
        due_ms,
        s.lat,
        s.lon,
        s.route_id,
        s.route_version,
        "",
        s.last_received_ms,
        (("last_ts_ms", s.last_ts_ms), ("silent_s", silent_after_s)),
    )
    return s, [a]


@dataclass(frozen=True, slots=True)
class RawFix:
    """A fix before ordering: what the reorder buffer holds."""

    seq: int
    ts_ms: int
    lat: float
    lon: float
    speed_kmh: float
    received_ms: int


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
