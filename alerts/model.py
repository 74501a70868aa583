"""Pure alert domain logic: parsing the `fleet.alerts` contract, filters, open conditions.

No I/O here, so the rules every receiver shares (what a valid alert is, which receiver wants
which alert, which alert opens or closes a condition) are tested without any service.
Receivers forward the record's original bytes (`Alert.raw`) rather than a re-serialisation, so a
webhook signature, an MQTT payload and the history copy are byte-identical to what the processor
wrote.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Never

import orjson

from alerts.errors import UnmappedAlertTypeError
from fleetfence.contracts import VEHICLE_ID_RE, AlertType, ms_to_iso
from fleetfence.errors import ContractError

INVALID_ALERT = "invalid_alert"
MAX_ALERT_BYTES = 64 * 1024
MAX_ALERT_ID_LEN = 128


@dataclass(frozen=True, slots=True)
class Alert:
    """One validated alert; `raw` is the record value exactly as it was on `fleet.alerts`. Its fields
    are those of the wire form (`fleetfence.contracts.AlertRecord`) a receiver routes and indexes on;
    `data` is the whole record as parsed, typed loosely because a record from another producer may lack
    what the processor always writes (`parse_alert` says what it requires)."""

    alert_id: str
    type: AlertType
    vehicle_id: str
    ts_ms: int
    seq: int
    route_id: str | None
    zone_id: str | None
    lat: float | None
    lon: float | None
    details: dict[str, Any]
    raw: bytes
    data: dict[str, Any] = field(repr=False)


@dataclass(frozen=True)
class SourceRecord:
    """Where an alert's record was read: the runner hands it to the sink with the alert, and a dead
    letter names it as the origin (here, beside the alert, so both can use it without importing
    each other)."""

    topic: str
    partition: int
    offset: int
    key: bytes | None


def _bad(message: str) -> ContractError:
    return ContractError(INVALID_ALERT, message)


def _opt_float(d: dict[str, Any], name: str) -> float | None:
    v = d.get(name)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(float(v)):
        raise _bad(f"field {name!r} must be a finite number, got {v!r}")
    return float(v)


def _int(d: dict[str, Any], name: str) -> int:
    v = d.get(name)
    if v is None:
        raise _bad(f"field {name!r} is required")
    if isinstance(v, bool) or not isinstance(v, int):
        raise _bad(f"field {name!r} must be an integer, got {type(v).__name__}")
    return v


def parse_alert(raw: bytes | None) -> Alert:
    """Validate one `fleet.alerts` record value (`fleetfence.contracts.AlertRecord`);
    ContractError(reason='invalid_alert') otherwise.

    Validation is deliberately limited to the fields receivers route and index on: an alert with an
    unknown `details` shape is still delivered, because receivers must not silently drop alerts
    when the processor adds a detail field.
    """
    if raw is None:
        raise _bad("record has no value")
    if len(raw) > MAX_ALERT_BYTES:
        raise _bad(f"alert of {len(raw)} bytes exceeds {MAX_ALERT_BYTES}")
    try:
        d = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise _bad(f"alert is not JSON: {str(exc)[:80]}") from exc
    if not isinstance(d, dict):
        raise _bad(f"alert must be a JSON object, got {type(d).__name__}")
    aid = d.get("alert_id")
    if not isinstance(aid, str) or not aid or len(aid) > MAX_ALERT_ID_LEN or not aid.isprintable():
        raise _bad(f"field 'alert_id' must be a non-empty printable string, got {aid!r:.80}")
    if " " in aid:
        raise _bad(f"field 'alert_id' {aid!r:.80} contains a space")
    t = d.get("type")
    try:
        atype = AlertType(str(t))
    except ValueError as exc:
        raise _bad(f"field 'type' {t!r:.40} is not one of {[x.value for x in AlertType]}") from exc
    vid = d.get("vehicle_id")
    if not isinstance(vid, str) or not VEHICLE_ID_RE.match(vid):
        raise _bad(f"field 'vehicle_id' {vid!r:.80} is not a valid vehicle id")
    route_id = d.get("route_id")
    if route_id is not None and not isinstance(route_id, str):
        raise _bad("field 'route_id' must be a string or null")
    details = d.get("details") or {}
    if not isinstance(details, dict):
        raise _bad("field 'details' must be an object")
    zone = d.get("zone_id", details.get("zone_id"))
    if zone is not None and not isinstance(zone, str):
        raise _bad("field 'zone_id' must be a string")
    if atype in (AlertType.ZONE_ENTER, AlertType.ZONE_EXIT) and not zone:
        raise _bad(f"{atype.value} alert needs a 'zone_id' (top level or in 'details')")
    return Alert(
        alert_id=aid,
        type=atype,
        vehicle_id=vid,
        ts_ms=_int(d, "ts_ms"),
        seq=_int(d, "seq"),
        route_id=route_id,
        zone_id=zone,
        lat=_opt_float(d, "lat"),
        lon=_opt_float(d, "lon"),
        details=details,
        raw=raw,
        data=d,
    )


@dataclass(frozen=True, slots=True)
class AlertFilter:
    """Which alerts a receiver wants: OR within a dimension, AND across; empty means any."""

    types: frozenset[AlertType] = frozenset()
    vehicles: frozenset[str] = frozenset()
    routes: frozenset[str] = frozenset()

    @staticmethod
    def of(
        types: Iterable[str] = (), vehicles: Iterable[str] = (), routes: Iterable[str] = ()
    ) -> AlertFilter:
        try:
            ts = frozenset(AlertType(t.upper()) for t in types)
        except ValueError as exc:
            raise ContractError(
                "bad_filter", f"{exc}; alert types are {', '.join(t.value for t in AlertType)}"
            ) from exc
        return AlertFilter(ts, frozenset(vehicles), frozenset(routes))

    def matches(self, alert: Alert) -> bool:
        if self.types and alert.type not in self.types:
            return False
        if self.vehicles and alert.vehicle_id not in self.vehicles:
            return False
        return not self.routes or alert.route_id in self.routes

    def describe(self) -> str:
        parts = [
            f"{name}={','.join(sorted(values))}"
            for name, values in (("types", self.types), ("vehicles", self.vehicles), ("routes", self.routes))
            if values
        ]
        return " ".join(parts) or "all alerts"


_TRIP_CLOSES = {
    AlertType.DIRECTION_RESTORED: AlertType.WRONG_DIRECTION,
    AlertType.STOP_ENDED: AlertType.UNPLANNED_STOP,
    AlertType.ARRIVAL_BACK_ON_TIME: AlertType.ARRIVAL_AT_RISK,
}
_TRIP_OPENS = tuple(_TRIP_CLOSES.values())


@dataclass(frozen=True, slots=True)
class ConditionChange:
    """How an alert changes the vehicle's open-conditions hash (`ff:alerts:open:{vehicle_id}`)."""

    opens: str | None = None
    closes: tuple[str, ...] = ()


def condition_change(alert: Alert) -> ConditionChange:
    """The open condition an alert opens or closes.

    Deviation is closed by the return, a zone by its exit. OVERSPEED and VEHICLE_SILENT end with a
    normal fix, which never reaches `fleet.alerts`; the only evidence the history receiver sees is a
    later alert of the same vehicle, so any later alert closes VEHICLE_SILENT (the vehicle spoke
    again). Closing OVERSPEED needs the fixes themselves; see docs/alerts.md.

    Every alert type has its own case: a type without one is a mypy error here, fails
    tests/alerts/test_alerts_model.py, and at run time raises rather than be taken for another
    type's condition (the history receiver then holds the alert and retries, as for a Redis
    outage, instead of writing a wrong open condition).
    """
    t = alert.type
    silent: tuple[str, ...] = () if t is AlertType.VEHICLE_SILENT else (AlertType.VEHICLE_SILENT.value,)
    match t:
        case (
            AlertType.ROUTE_DEVIATION
            | AlertType.OVERSPEED
            | AlertType.VEHICLE_SILENT
            | AlertType.WRONG_DIRECTION
            | AlertType.UNPLANNED_STOP
            | AlertType.ARRIVAL_AT_RISK
        ):
            return ConditionChange(opens=t.value, closes=silent)
        case AlertType.ROUTE_RETURN:
            return ConditionChange(closes=(AlertType.ROUTE_DEVIATION.value, *silent))
        case AlertType.DIRECTION_RESTORED | AlertType.STOP_ENDED | AlertType.ARRIVAL_BACK_ON_TIME:
            return ConditionChange(closes=(_TRIP_CLOSES[t].value, *silent))
        case AlertType.VEHICLE_RESUMED:
            return ConditionChange(closes=silent)
        case AlertType.ROUTE_COMPLETED:
            # The trip is over: whatever of it was still open ends with it (the processor clears them).
            return ConditionChange(closes=(*(o.value for o in _TRIP_OPENS), *silent))
        case AlertType.ZONE_ENTER:
            return ConditionChange(opens=f"ZONE:{alert.zone_id}", closes=silent)
        case AlertType.ZONE_EXIT:
            return ConditionChange(closes=(f"ZONE:{alert.zone_id}", *silent))
        case _:
            raise _unmapped(t)


def _unmapped(t: Never) -> UnmappedAlertTypeError:
    """mypy rejects the call while an alert type has no case of its own (`t` is then not Never)."""
    return UnmappedAlertTypeError(
        f"alert type {t!r} has no open-condition rule: add its case to alerts.model.condition_change "
        "(docs/alerts.md, Open conditions)"
    )


TYPE_STYLES: dict[AlertType, str] = {
    AlertType.ROUTE_DEVIATION: "bold red",
    AlertType.ROUTE_RETURN: "green",
    AlertType.OVERSPEED: "bold yellow",
    AlertType.ZONE_ENTER: "cyan",
    AlertType.ZONE_EXIT: "blue",
    AlertType.VEHICLE_SILENT: "magenta",
    AlertType.VEHICLE_RESUMED: "green",
    AlertType.WRONG_DIRECTION: "bold red",
    AlertType.DIRECTION_RESTORED: "green",
    AlertType.UNPLANNED_STOP: "bold magenta",
    AlertType.STOP_ENDED: "green",
    AlertType.ARRIVAL_AT_RISK: "bold yellow",
    AlertType.ARRIVAL_BACK_ON_TIME: "green",
    AlertType.ROUTE_COMPLETED: "bold green",
}


def _fmt_detail(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.1f}"
    return str(v)


def summary(alert: Alert) -> str:
    """One human line (without markup) for terminals and logs."""
    where = f"{alert.lat:.5f},{alert.lon:.5f}" if alert.lat is not None and alert.lon is not None else "-"
    details = " ".join(f"{k}={_fmt_detail(v)}" for k, v in sorted(alert.details.items()))
    route = alert.route_id or "-"
    return (
        f"{ms_to_iso(alert.ts_ms)} {alert.type.value:<15} {alert.vehicle_id} route={route} "
        f"seq={alert.seq} at={where} {details}"
    ).rstrip()
