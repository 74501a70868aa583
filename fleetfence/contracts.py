"""Wire contracts: MQTT telemetry, the Kafka topics, alerts and master-data change events.

Plain JSON everywhere, so `mosquitto_pub` and `kcat` interoperate; see docs/contracts.md for
examples. Validation is hand-written rather than pydantic because it runs once per message on the
gateway's hot path (tens of thousands per second per core) and must turn *any* input into either a
canonical record or a machine-readable reason, never an exception that escapes.
"""

from __future__ import annotations

import hashlib
import math
import re
import zlib
from dataclasses import dataclass
from datetime import UTC, datetime
from enum import StrEnum
from functools import lru_cache
from typing import Annotated, Any, Literal, TypedDict

import msgspec
import orjson

from fleetfence.errors import ContractError

MQTT_TELEMETRY_FILTER = "fleet/+/telemetry"
MAX_PAYLOAD_BYTES = 16 * 1024
MAX_FUTURE_MS = 5 * 60 * 1000  # a fix more than 5 minutes ahead of the gateway clock is absurd
MIN_TS_MS = 946_684_800_000  # 2000-01-01: anything older is a broken clock, not telemetry
MAX_TS_MS = 2**53  # a static bound (replays must judge alike); in microseconds it still fits int64
VEHICLE_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,63}$")
MAX_SEQ = 2**63 - 1


class DlqReason(StrEnum):
    """Machine-readable dead-letter reasons (also the `reason` label of gateway metrics)."""

    TOO_LARGE = "too_large"
    NOT_JSON = "not_json"
    NOT_OBJECT = "not_object"
    MISSING_FIELD = "missing_field"
    WRONG_TYPE = "wrong_type"
    NOT_FINITE = "not_finite"
    OUT_OF_RANGE = "out_of_range"
    BAD_TIMESTAMP = "bad_timestamp"
    TS_IN_FUTURE = "ts_in_future"
    BAD_TOPIC = "bad_topic"
    BAD_VEHICLE_ID = "bad_vehicle_id"
    VEHICLE_MISMATCH = "vehicle_mismatch"
    # A device published on a topic its login does not own (another vehicle's, or not telemetry).
    FORBIDDEN_TOPIC = "forbidden_topic"
    # Not a property of the input: the validator itself failed (a bug); the message is kept anyway.
    INTERNAL_ERROR = "internal_error"
    # The processor's own verdict on a record of fleet.telemetry that is not canonical telemetry
    # (written there by a producer other than the gateway).
    NOT_CANONICAL = "not_canonical"
    # The processor's: a fix further behind the watermark than FLEETFENCE_PROCESSOR_LATE_BOUND_S.
    LATE = "late"


MAX_DLQ_VALUE_BYTES = 512 * 1024

DlqHeaders = list[tuple[str, bytes]]


def dead_letter(
    original: bytes, *, reason: str, detail: str, origin: tuple[str, bytes], received_ms: int
) -> tuple[bytes, DlqHeaders]:
    """The value and headers of a record on `fleet.telemetry.dlq` (docs/contracts.md), whoever
    dead-letters it: the original bytes (capped at MAX_DLQ_VALUE_BYTES) and the headers that say
    why. `origin` names where the bytes came from: `("mqtt_topic", topic)` at the gateway,
    `("source", b"topic:partition:offset")` in the processor. One builder, so a DLQ consumer reads
    the same headers from both."""
    truncated = len(original) > MAX_DLQ_VALUE_BYTES
    headers: DlqHeaders = [
        ("reason", reason.encode()),
        ("detail", detail[:500].encode("utf-8", "replace")),
        origin,
        ("received_ms", str(received_ms).encode()),
        ("original_size", str(len(original)).encode()),
        ("truncated", b"true" if truncated else b"false"),
    ]
    return (original[:MAX_DLQ_VALUE_BYTES] if truncated else original), headers


# How the alert list writes one number of an alert's `details` (admin_api/static/alerts.js):
# km (fmtKm), duration (fmtDuration), delay (fmtDelay, early/late), number (one decimal).
DetailFormat = Literal["km", "duration", "delay", "number"]


@dataclass(frozen=True, slots=True)
class AlertMeta:
    """What an alert type means beyond its name, declared with it (`AlertType`) and read by every
    component that shows or tracks alerts, so a new type is described in one place.

    - label, tone: the map's words and colour family (admin_api/static/app.css `.tone-*`; `plain`
      for none), served by the admin API at /map/alert-types.json.
    - style: its rich style in terminals (`alerts tail`, the demo).
    - opens: it opens a condition that stays open (docs/alerts.md, "Open conditions"): named after
      the type, or `ZONE:{zone_id}` for a zone type; `closes`: the type whose condition it closes.
    - zone: its subject is a zone (it must carry a `zone_id`).
    - pair: its subject is another vehicle (`details.other_vehicle_id`): vehicle proximity; its
      condition is `PROXIMITY:{rule_id}:{other_vehicle_id}` (`details.rule_id`: its proximity rule).
    - trip: part of the trip along the assigned route: ROUTE_COMPLETED (`ends_trip`) closes it.
    - closed_by_any: no alert of its own ends it, so any later alert of the vehicle does (a vehicle
      that was silent and raised something has spoken again).
    - detail: the facts of `details` the map's alert list shows, each (template, field, format),
      the template's `{}` the formatted number; those present are joined with ", ".
    """

    label: str
    tone: str
    style: str
    opens: bool = False
    closes: str | None = None
    zone: bool = False
    pair: bool = False
    trip: bool = False
    ends_trip: bool = False
    closed_by_any: bool = False
    detail: tuple[tuple[str, str, DetailFormat], ...] = ()


# The alert types of `fleet.alerts`, each declared with its `AlertMeta` (a member without one fails
# at import). docs/contracts.md says when each fires and what its `details` hold.
class AlertType(StrEnum):
    _value_: str
    meta: AlertMeta

    # `meta` is optional only in the signature, for mypy's sake: a lookup by value, `AlertType("X")`,
    # type-checks against it, while declaring a member goes through here and needs one.
    def __new__(cls, value: str, meta: AlertMeta | None = None) -> AlertType:
        if meta is None:
            raise TypeError(f"AlertType.{value} is declared without its AlertMeta")
        member = str.__new__(cls, value)
        member._value_ = value
        member.meta = meta
        return member

    ROUTE_DEVIATION = "ROUTE_DEVIATION", AlertMeta("Route deviation", "deviating", "bold red", opens=True)
    ROUTE_RETURN = "ROUTE_RETURN", AlertMeta("Back on route", "calm", "green", closes="ROUTE_DEVIATION")
    OVERSPEED = "OVERSPEED", AlertMeta("Speeding", "speeding", "bold yellow", opens=True)
    ZONE_ENTER = "ZONE_ENTER", AlertMeta("Zone entered", "plain", "cyan", opens=True, zone=True)
    ZONE_EXIT = "ZONE_EXIT", AlertMeta("Zone left", "plain", "blue", closes="ZONE_ENTER", zone=True)
    VEHICLE_SILENT = (
        "VEHICLE_SILENT",
        AlertMeta("Vehicle silent", "silent", "magenta", opens=True, closed_by_any=True),
    )
    VEHICLE_RESUMED = "VEHICLE_RESUMED", AlertMeta("Vehicle back", "calm", "green", closes="VEHICLE_SILENT")
    # Route awareness: the trip along the assigned route.
    WRONG_DIRECTION = (
        "WRONG_DIRECTION",
        AlertMeta(
            "Wrong direction",
            "wrong-way",
            "bold red",
            opens=True,
            trip=True,
            detail=(("{} back", "moved_m", "km"),),
        ),
    )
    DIRECTION_RESTORED = (
        "DIRECTION_RESTORED",
        AlertMeta(
            "Direction restored",
            "calm",
            "green",
            closes="WRONG_DIRECTION",
            trip=True,
            detail=(("{} forward", "moved_m", "km"),),
        ),
    )
    UNPLANNED_STOP = (
        "UNPLANNED_STOP",
        AlertMeta(
            "Unplanned stop",
            "stop",
            "bold magenta",
            opens=True,
            trip=True,
            detail=(("stopped {}", "stopped_s", "duration"),),
        ),
    )
    STOP_ENDED = (
        "STOP_ENDED",
        AlertMeta(
            "Stop ended",
            "calm",
            "green",
            closes="UNPLANNED_STOP",
            trip=True,
            detail=(("after {}", "duration_s", "duration"),),
        ),
    )
    ARRIVAL_AT_RISK = (
        "ARRIVAL_AT_RISK",
        AlertMeta(
            "Arrival at risk",
            "risk",
            "bold yellow",
            opens=True,
            trip=True,
            detail=(("ETA {}", "delay_s", "delay"),),
        ),
    )
    ARRIVAL_BACK_ON_TIME = (
        "ARRIVAL_BACK_ON_TIME",
        AlertMeta(
            "Back on time",
            "calm",
            "green",
            closes="ARRIVAL_AT_RISK",
            trip=True,
            detail=(("ETA {}", "delay_s", "delay"),),
        ),
    )
    ROUTE_COMPLETED = (
        "ROUTE_COMPLETED",
        AlertMeta(
            "Route completed",
            "done",
            "bold green",
            trip=True,
            ends_trip=True,
            detail=(("in {}", "duration_s", "duration"), ("{}", "delay_s", "delay")),
        ),
    )

    # Vehicle proximity (processor.core.proximity): one alert per vehicle of the pair.
    PROXIMITY_ENTER = (
        "PROXIMITY_ENTER",
        AlertMeta(
            "Vehicles near",
            "plain",
            "bold cyan",
            opens=True,
            pair=True,
            detail=(("{} apart", "distance_m", "km"),),
        ),
    )
    PROXIMITY_EXIT = (
        "PROXIMITY_EXIT",
        AlertMeta(
            "Vehicles parted",
            "plain",
            "blue",
            closes="PROXIMITY_ENTER",
            pair=True,
            detail=(("after {}", "near_s", "duration"),),
        ),
    )


class ProximityExitReason(StrEnum):
    """Why a PROXIMITY_EXIT was raised (its `details.reason`)."""

    APART = "apart"  # a meeting put the vehicles more than the exit distance apart
    LOST = "lost"  # no meeting for the rule's lost_after: raised at that deadline, not at a new fix


def _check_alert_types() -> None:
    """A type that closes must name one that opens (a misspelt `closes` fails at import)."""
    for t in AlertType:
        c = t.meta.closes
        if c is not None and not (c in AlertType.__members__ and AlertType[c].meta.opens):
            raise TypeError(f"AlertType.{t.name} closes {c!r}, which is no alert type that opens a condition")


_check_alert_types()


def telemetry_topic(vehicle_id: str) -> str:
    return f"fleet/{vehicle_id}/telemetry"


@lru_cache(maxsize=65536)
def vehicle_from_topic(topic: str) -> str:
    """`fleet/{vehicle_id}/telemetry` -> vehicle_id, or ContractError."""
    parts = topic.split("/")
    if len(parts) != 3 or parts[0] != "fleet" or parts[2] != "telemetry" or not parts[1]:
        raise ContractError(DlqReason.BAD_TOPIC, f"topic {topic!r} is not fleet/{{vehicle_id}}/telemetry")
    if not VEHICLE_ID_RE.match(parts[1]):
        raise ContractError(DlqReason.BAD_VEHICLE_ID, f"vehicle id {parts[1]!r} in topic is not allowed")
    return parts[1]


class Telemetry(msgspec.Struct, frozen=True):
    """A validated fix in canonical form, as it travels on `fleet.telemetry`: the one definition of
    the fix on the wire, its fields in the order its JSON writes them.

    The gateway builds it (`validate_telemetry`; `fast_canonical` encodes one straight from the
    message); the processor and the archive read it back with `PlainFix` and `canonical_fix`, and
    the processor keeps the fields it needs as columns (`processor.core.columns.FIX_SCHEMA`); tests hold
    both to this field list."""

    vehicle_id: str
    seq: int
    ts_ms: int
    lat: float
    lon: float
    speed_kmh: float
    heading_deg: float | None = None
    accuracy_m: float | None = None
    received_ms: int | None = None

    def to_json(self) -> bytes:
        return _json_encoder.encode(self)

    @staticmethod
    def from_json(data: bytes) -> Telemetry:
        return _telemetry_decoder.decode(data)


# One encoder for `to_json` and the gateway's fast path, so both write the same bytes: a Struct's
# fields in their declared order.
_json_encoder = msgspec.json.Encoder()
_telemetry_decoder = msgspec.json.Decoder(Telemetry)


def _number(d: dict[str, Any], name: str, *, required: bool, lo: float, hi: float) -> float | None:
    v = d.get(name)
    if v is None:
        if required:
            raise ContractError(DlqReason.MISSING_FIELD, f"field {name!r} is required")
        return None
    if isinstance(v, bool) or not isinstance(v, int | float):
        raise ContractError(DlqReason.WRONG_TYPE, f"field {name!r} must be a number, got {type(v).__name__}")
    f = float(v)
    if not math.isfinite(f):
        raise ContractError(DlqReason.NOT_FINITE, f"field {name!r} must be finite, got {v!r}")
    if not lo <= f <= hi:
        raise ContractError(DlqReason.OUT_OF_RANGE, f"field {name!r}={v!r} outside [{lo}, {hi}]")
    return f


def parse_ts_ms(v: Any) -> int:
    """`ts` as epoch milliseconds (int) or an ISO-8601 string with a UTC offset -> epoch ms."""
    if isinstance(v, bool):
        raise ContractError(DlqReason.WRONG_TYPE, "field 'ts' must be epoch ms or ISO-8601, got a boolean")
    if isinstance(v, int):
        ms = v
    elif isinstance(v, float):
        if not math.isfinite(v):
            raise ContractError(DlqReason.NOT_FINITE, "field 'ts' must be finite")
        ms = int(v)
    elif isinstance(v, str):
        try:
            dt = datetime.fromisoformat(v.replace("Z", "+00:00") if v.endswith("Z") else v)
        except ValueError as exc:
            raise ContractError(DlqReason.BAD_TIMESTAMP, f"field 'ts' {v[:40]!r} is not ISO-8601") from exc
        if dt.tzinfo is None:
            raise ContractError(DlqReason.BAD_TIMESTAMP, "field 'ts' must carry a UTC offset (e.g. Z)")
        ms = int(dt.timestamp() * 1000)
    elif v is None:
        raise ContractError(DlqReason.MISSING_FIELD, "field 'ts' is required")
    else:
        raise ContractError(
            DlqReason.WRONG_TYPE, f"field 'ts' must be epoch ms or ISO-8601, got {type(v).__name__}"
        )
    if ms < MIN_TS_MS or ms > MAX_TS_MS:
        raise ContractError(DlqReason.BAD_TIMESTAMP, f"field 'ts'={v!r} is not a plausible time")
    return ms


def validate_telemetry(topic: str, payload: bytes, now_ms: int) -> Telemetry:
    """Validate one MQTT telemetry message; raise ContractError with a DlqReason otherwise."""
    if len(payload) > MAX_PAYLOAD_BYTES:
        raise ContractError(
            DlqReason.TOO_LARGE, f"payload of {len(payload)} bytes exceeds {MAX_PAYLOAD_BYTES}"
        )
    topic_vehicle = vehicle_from_topic(topic)
    try:
        d = orjson.loads(payload)
    except orjson.JSONDecodeError as exc:
        raise ContractError(DlqReason.NOT_JSON, f"payload is not JSON: {str(exc)[:80]}") from exc
    if not isinstance(d, dict):
        raise ContractError(DlqReason.NOT_OBJECT, f"payload must be a JSON object, got {type(d).__name__}")
    vid = d.get("vehicle_id")
    if vid is None:
        raise ContractError(DlqReason.MISSING_FIELD, "field 'vehicle_id' is required")
    if not isinstance(vid, str):
        raise ContractError(DlqReason.WRONG_TYPE, "field 'vehicle_id' must be a string")
    if vid != topic_vehicle:
        raise ContractError(DlqReason.VEHICLE_MISMATCH, f"vehicle_id {vid[:64]!r} differs from topic's")
    seq = d.get("seq")
    if seq is None:
        raise ContractError(DlqReason.MISSING_FIELD, "field 'seq' is required")
    if isinstance(seq, bool) or not isinstance(seq, int):
        raise ContractError(DlqReason.WRONG_TYPE, "field 'seq' must be an integer")
    if not 0 <= seq <= MAX_SEQ:
        raise ContractError(DlqReason.OUT_OF_RANGE, f"field 'seq'={seq} outside [0, 2^63-1]")
    ts_ms = parse_ts_ms(d.get("ts"))
    if ts_ms > now_ms + MAX_FUTURE_MS:
        raise ContractError(
            DlqReason.TS_IN_FUTURE, f"ts is {(ts_ms - now_ms) / 1000:.0f}s ahead of the gateway"
        )
    lat = _number(d, "lat", required=True, lo=-90.0, hi=90.0)
    lon = _number(d, "lon", required=True, lo=-180.0, hi=180.0)
    speed = _number(d, "speed_kmh", required=True, lo=0.0, hi=1000.0)
    heading = _number(d, "heading_deg", required=False, lo=0.0, hi=360.0)
    accuracy = _number(d, "accuracy_m", required=False, lo=0.0, hi=100_000.0)
    assert lat is not None
    assert lon is not None
    assert speed is not None
    return Telemetry(vid, seq, ts_ms, lat, lon, speed, heading, accuracy, now_ms)


# --------------------------------------------------------------------------- gateway fast path
#
# The gateway validates every message on its hot path, where the generic validator and the
# canonical re-encoding are a large share of its CPU. The common case (a well-formed fix with `ts`
# in epoch ms) is decoded and range-checked in C by msgspec and re-encoded by it. Anything the fast
# path does not accept goes through `validate_telemetry`, which decides and names the reason; so the
# fast path only ever *accepts*, never rejects, and a property test holds it to the validator's
# result (tests/gateway/test_gateway_core.py).

_Lat = Annotated[float, msgspec.Meta(ge=-90.0, le=90.0)]
_Lon = Annotated[float, msgspec.Meta(ge=-180.0, le=180.0)]


class _FastFix(msgspec.Struct, forbid_unknown_fields=True):
    """The message a vehicle publishes on MQTT, as msgspec decodes it: not the canonical record
    (`ts` in epoch ms only, no `received_ms`, no unknown fields), with the gateway's bounds, so
    that whatever it accepts `validate_telemetry` accepts with the same values."""

    vehicle_id: str
    seq: Annotated[int, msgspec.Meta(ge=0, le=MAX_SEQ)]
    ts: Annotated[int, msgspec.Meta(ge=MIN_TS_MS, le=MAX_TS_MS)]
    lat: _Lat
    lon: _Lon
    speed_kmh: Annotated[float, msgspec.Meta(ge=0.0, le=1000.0)]
    heading_deg: Annotated[float, msgspec.Meta(ge=0.0, le=360.0)] | None = None
    accuracy_m: Annotated[float, msgspec.Meta(ge=0.0, le=100_000.0)] | None = None


_fast_decoder = msgspec.json.Decoder(_FastFix)


def fast_canonical(topic: str, payload: bytes, now_ms: int) -> tuple[str, bytes] | None:
    """(vehicle_id, canonical JSON) when `payload` is a plainly valid fix, else None (ask
    `validate_telemetry`). Equal, value for value, to what `validate_telemetry` would produce."""
    # Left to the validator: oversize, non-ASCII bytes and escapes (orjson and msgspec could judge
    # invalid UTF-8 or lone surrogates differently; telemetry is plain ASCII anyway).
    if len(payload) > MAX_PAYLOAD_BYTES or not payload.isascii() or b"\\" in payload:
        return None
    try:
        vid = vehicle_from_topic(topic)
        f = _fast_decoder.decode(payload)
    except (ContractError, msgspec.DecodeError):
        return None
    if f.vehicle_id != vid or f.ts > now_ms + MAX_FUTURE_MS:
        return None
    t = Telemetry(vid, f.seq, f.ts, f.lat, f.lon, f.speed_kmh, f.heading_deg, f.accuracy_m, now_ms)
    return vid, _json_encoder.encode(t)


# --------------------------------------------------------------------------- a record already on Kafka
# The processor and the archive judge every `fleet.telemetry` record again (a producer other than
# the gateway may have written it): the gateway's verdict above, re-stated for a canonical record.


INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
_Int64 = Annotated[int, msgspec.Meta(ge=INT64_MIN, le=INT64_MAX)]


class PlainFix(msgspec.Struct):
    """A record of `fleet.telemetry` as the processor reads it: the `Telemetry` fields the engine
    uses, in their order (a test holds the two lists together), with the processor's bounds rather
    than the gateway's, because any producer may have written the record. msgspec decodes and checks
    it in C on the processor's fast path (`processor.spark.parse`); it accepts only what `canonical_fix`
    accepts, with the same values (a property test holds the two together), and whatever it rejects
    is judged by `canonical_fix`."""

    vehicle_id: Annotated[str, msgspec.Meta(min_length=1)]
    seq: _Int64
    ts_ms: Annotated[int, msgspec.Meta(ge=MIN_TS_MS, le=MAX_TS_MS)]
    lat: Annotated[float, msgspec.Meta(ge=-90.0, le=90.0)]
    lon: Annotated[float, msgspec.Meta(ge=-180.0, le=180.0)]
    speed_kmh: Annotated[float, msgspec.Meta(ge=0.0)]
    received_ms: _Int64 | None = None


decode_plain_fix = msgspec.json.Decoder(PlainFix).decode


def canonical_fix(d: Any) -> tuple[str, int, int, float, float, float]:
    """(vehicle_id, seq, ts_ms, lat, lon, speed_kmh) of a canonical telemetry record, or an error.

    The processor's definition of valid telemetry; the archive applies the very same check."""
    vid = d["vehicle_id"]
    seq, ts_ms = d["seq"], d["ts_ms"]
    lat, lon, speed = float(d["lat"]), float(d["lon"]), float(d["speed_kmh"])
    if not (
        isinstance(vid, str)
        and vid
        # int64 columns downstream: a bool or a larger number would fail the read task on every retry
        and type(seq) is int
        and type(ts_ms) is int
        and INT64_MIN <= seq <= INT64_MAX
        # the gateway's static bounds: an absurd event time would drag the watermark for everyone
        and MIN_TS_MS <= ts_ms <= MAX_TS_MS
        and -90 <= lat <= 90
        and -180 <= lon <= 180
        and speed >= 0
    ):
        raise ValueError("field out of contract")
    return vid, seq, ts_ms, lat, lon, speed


INVALID_ERRORS = (orjson.JSONDecodeError, KeyError, TypeError, ValueError)


def received_ms_of(d: Any) -> int:
    recv = d.get("received_ms")
    return recv if type(recv) is int and INT64_MIN <= recv <= INT64_MAX else 0


def bucket_of(vehicle_id: str, buckets: int) -> int:
    """A vehicle's state bucket (crc32 mod buckets): stable across processes and machines (unlike
    `hash`), so state never moves between buckets. Shared by the processor and the archive."""
    return zlib.crc32(vehicle_id.encode()) % buckets


def alert_id(vehicle_id: str, alert_type: str, seq: int, subject: str = "") -> str:
    """Deterministic alert id: the same vehicle, type, triggering seq (and zone) give the same id,
    so a replay after a crash produces identical ids that receivers de-duplicate on."""
    h = hashlib.blake2b(f"{vehicle_id}|{alert_type}|{seq}|{subject}".encode(), digest_size=12)
    return h.hexdigest()


def ms_to_iso(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


class _AlertRecordAlways(TypedDict):
    """The fields of every alert record (`AlertRecord`)."""

    alert_id: str
    type: AlertType
    vehicle_id: str
    route_id: str | None
    route_version: int
    seq: int
    ts_ms: int  # the triggering fix's event time, also for a late alert
    ts: str  # `ts_ms` as ISO 8601 UTC with milliseconds (`ms_to_iso`)
    lat: float
    lon: float
    details: dict[str, Any]  # per type; receivers deliver unknown shapes too
    trigger_received_ms: int  # when the gateway received the triggering fix (0: unknown)


class AlertRecord(_AlertRecordAlways, total=False):
    """An alert as it travels on `fleet.alerts` (docs/contracts.md): its one definition, its fields
    in the order they are written. The processor builds it with `alert_record`, the receivers read
    these names (`alerts.model.parse_alert`), and the admin API derives its response schema from it
    (`admin_api.schemas.Alert`). Receivers de-duplicate on `alert_id` and keep the record's bytes,
    so the order and the form of each value are part of the contract, not only the names. The keys
    below are absent unless they say something (a TypedDict of this Python reads `NotRequired` in a
    postponed annotation as required, hence the second class)."""

    zone_id: str  # on zone alerts only
    late: Literal[True]  # absent unless the triggering fix was behind the watermark


def alert_record(
    alert_type: AlertType,
    vehicle_id: str,
    seq: int,
    ts_ms: int,
    lat: float,
    lon: float,
    route_id: str | None,
    route_version: int,
    details: dict[str, Any],
    trigger_received_ms: int,
    zone_id: str = "",
    late: bool = False,
    subject: str = "",
) -> AlertRecord:
    """The record of one alert, with its deterministic `alert_id` and `ts` derived here so that no
    writer can derive them differently; `zone_id` and `late` appear only when they say something.
    The id's subject is the zone, or `subject` (what else the alert is about: a pair's other
    vehicle), so that two alerts of one type at one fix differ; never both."""
    if zone_id and subject:
        raise ValueError("an alert's id has one subject: a zone or another, not both")
    d: AlertRecord = {
        "alert_id": alert_id(vehicle_id, alert_type.value, seq, zone_id or subject),
        "type": alert_type,
        "vehicle_id": vehicle_id,
        "route_id": route_id,
        "route_version": route_version,
        "seq": seq,
        "ts_ms": ts_ms,
        "ts": ms_to_iso(ts_ms),
        "lat": lat,
        "lon": lon,
        "details": details,
        "trigger_received_ms": trigger_received_ms,
    }
    if zone_id:
        d["zone_id"] = zone_id
    if late:
        d["late"] = True
    return d


def alert_json(record: AlertRecord) -> bytes:
    """The record's value on `fleet.alerts`: compact JSON, keys in the record's order."""
    return orjson.dumps(record)


def utc_now_ms() -> int:
    return int(datetime.now(UTC).timestamp() * 1000)


class MasterEntity(StrEnum):
    ROUTE = "route"
    ZONE = "zone"
    VEHICLE = "vehicle"
    ASSIGNMENT = "assignment"


def master_key(entity: str, entity_id: str) -> bytes:
    """Key of a master change event on the compacted `fleet.master` topic."""
    return f"{entity}:{entity_id}".encode()
