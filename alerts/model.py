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
from typing import Any

import orjson

from alerts.errors import UnmappedAlertTypeError
from fleetfence.contracts import VEHICLE_ID_RE, AlertType, ProximityExitReason, ms_to_iso
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
    if atype.meta.zone and not zone:
        raise _bad(f"{atype.value} alert needs a 'zone_id' (top level or in 'details')")
    other = details.get("other_vehicle_id")
    if atype.meta.pair and not (isinstance(other, str) and VEHICLE_ID_RE.match(other)):
        raise _bad(f"{atype.value} alert needs the other vehicle's id in 'details.other_vehicle_id'")
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


@dataclass(frozen=True, slots=True)
class ConditionChange:
    """How an alert changes the vehicle's open-conditions hash (`ff:alerts:open:{vehicle_id}`)."""

    opens: str | None = None
    closes: tuple[str, ...] = ()


# Conditions no alert of their own ends: any later alert of the vehicle closes them.
_CLOSED_BY_ANY = tuple(t for t in AlertType if t.meta.closed_by_any)
# What ROUTE_COMPLETED ends: the trip's conditions still open.
_TRIP_OPENS = tuple(t for t in AlertType if t.meta.trip and t.meta.opens)


def _condition(opener: AlertType, alert: Alert) -> str:
    """The name of the condition `opener` opens: a zone's is per zone, a pair's per proximity rule
    and other vehicle (two vehicles may be near under two rules, each entered and exited on its own;
    a pair alert that names no rule, which FleetFence never sends, keys by the vehicle alone)."""
    if opener.meta.zone:
        return f"ZONE:{alert.zone_id}"
    if opener.meta.pair:
        rule = alert.details.get("rule_id")
        other = alert.details["other_vehicle_id"]
        return f"PROXIMITY:{rule}:{other}" if isinstance(rule, str) and rule else f"PROXIMITY:{other}"
    return opener.value


def condition_change(alert: Alert) -> ConditionChange:
    """The open condition an alert opens or closes, as its type's `AlertMeta` declares it.

    Deviation is closed by the return, a zone by its exit, a trip's conditions by their ends and
    all of them by ROUTE_COMPLETED. OVERSPEED and VEHICLE_SILENT end with a normal fix, which never
    reaches `fleet.alerts`; the only evidence the history receiver sees is a later alert of the
    same vehicle, so any later alert closes VEHICLE_SILENT (the vehicle spoke again). Closing
    OVERSPEED needs the fixes themselves; see docs/alerts.md.

    A type that neither opens nor closes anything (an instant) closes only those. Every type has a
    rule by construction (`AlertType` members carry their `AlertMeta`); a value that is no member
    (only reachable past mypy) raises rather than be taken for another type's condition (the
    history receiver then holds the alert and retries, as for a Redis outage).
    """
    t = alert.type
    if not isinstance(t, AlertType):
        raise UnmappedAlertTypeError(
            f"alert type {t!r} has no open-condition rule: it is no fleetfence.contracts.AlertType"
        )
    m = t.meta
    closes: list[str] = []
    if m.closes is not None:
        closes.append(_condition(AlertType[m.closes], alert))
        legacy = f"PROXIMITY:{alert.details.get('other_vehicle_id')}"
        if m.pair and legacy not in closes:
            # Conditions opened before they were keyed by rule (`PROXIMITY:{other}`): closed too,
            # so that an upgrade leaves none open for ever.
            closes.append(legacy)
    if m.ends_trip:
        closes.extend(o.value for o in _TRIP_OPENS)
    # Any alert raised at a new fix proves the vehicle spoke; a pair lost at its deadline is no
    # such proof (the vehicle may be the one gone silent).
    if not (m.pair and alert.details.get("reason") == ProximityExitReason.LOST):
        closes.extend(c.value for c in _CLOSED_BY_ANY if c is not t and c.value not in closes)
    return ConditionChange(opens=_condition(t, alert) if m.opens else None, closes=tuple(closes))


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
