"""The OsmAnd protocol as Traccar Client speaks it over HTTP: one fix per request, as query or form
parameters, or as the JSON body Traccar Client posts since its version 9.

Written from Traccar's public description of the protocol (https://www.traccar.org/osmand/):

- Parameters (GET query string, or a POST form body): `id` or `deviceid` (required); `lat` and
  `lon`, or `location=lat,lon`; `timestamp` as epoch seconds, epoch milliseconds, ISO 8601 or
  `yyyy-MM-dd HH:mm:ss`; `speed`; `bearing` or `heading` (degrees); `altitude` (metres);
  `accuracy` (metres); `hdop`; `batt` (battery, percent); `valid`; anything else is kept. `hdop`
  is a dilution of precision, a ratio, not metres: it is kept as an attribute, not as the accuracy.
- `speed` is in **knots**: a request with `speed=45` shows as 83.34 km/h on a Traccar server
  (45 x 1.852); another unit takes the server-wide `osmand.speed` setting, since "all GPS
  receivers report knots", says Traccar's author
  (https://www.traccar.org/forums/topic/osmand-request-how-to-set-speed-in-si-kmh; also "Speed
  units configurable, but default in knots", https://traccar.org/forums/topic/traccar-client-units).
  Hence `speed_unit`, "kn" by default, or "kmh", "mps", "mph" like that setting. A device whose
  URL template sends m/s (one third-party write-up says the OsmAnd app's own `{5}` is m/s:
  https://kbeigl.github.io/bm/bm-tracker/gps-osmand-tracker/src/asciidoc/OsmAndProtocolSpecification.html)
  needs `speed_unit="mps"`.
- The JSON body: `{"location": {"timestamp": ISO 8601, "coords": {"latitude", "longitude",
  "accuracy" (m), "speed" (m/s), "heading" (degrees), "altitude" (m)}, "is_moving", "odometer",
  "event", "battery": {"level" (0 to 1), "is_charging"}, "activity": {"type"}, "extras"},
  "device_id": "..."}`: the location SDK's own format, whose speed is in m/s whatever the server's
  unit. The SDK writes -1 for a heading it does not know
  (https://pub.dev/documentation/flutter_background_geolocation/latest/flt_background_geolocation/Coords-class.html),
  as iOS does for an unknown speed or course: a negative speed, heading or accuracy, in either form,
  is read as unknown.

The server answers 200 once the fix is kept (FleetFence: once Kafka has it), and a client sends a
request again until it gets one; the adapter does that, this module only reads the request.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import parse_qsl

import orjson

from fleetfence.contracts import MAX_PAYLOAD_BYTES, DlqReason, Telemetry
from gateway.errors import OsmAndRequestError
from gateway.protocols import PhoneFix, fix_telemetry, json_number, json_required

KMH_PER_UNIT = {"kn": 1.852, "kmh": 1.0, "mps": 3.6, "mph": 1.609344}
MAX_FIELDS = 64  # parameters in one request: a fix has about ten
MAX_DEVICE_ID = 128
# An epoch time at or above this is in milliseconds: in seconds it would be after the year 5000,
# in milliseconds it is any time after March 1973.
MS_THRESHOLD = 100_000_000_000

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_ONE_MS = timedelta(milliseconds=1)
_EPOCH_NUMBER = re.compile(r"([0-9]{1,20})(?:\.([0-9]{0,9}))?")
# The parameters read into an OsmAndFix; every other one is kept as an attribute.
_KNOWN = frozenset(
    {
        "id",
        "deviceid",
        "lat",
        "lon",
        "location",
        "timestamp",
        "speed",
        "bearing",
        "heading",
        "altitude",
        "accuracy",
        "batt",
    }
)


@dataclass(frozen=True, slots=True, kw_only=True)
class OsmAndFix(PhoneFix):
    """One fix as the device reported it (`PhoneFix`; a speed unknown or negative is 0.0).
    `valid` is False when the device said the position is not a fix (`valid=false`); `attributes`
    keeps Traccar Client's `charge`, `driverUniqueId`, the JSON form's `is_moving`, `odometer`,
    `event`, `activity`..."""

    device_id: str
    valid: bool = True


def parse_timestamp(raw: str) -> int:
    """Epoch milliseconds of a `timestamp` value: epoch seconds (fractions allowed), epoch
    milliseconds, or ISO 8601, where a time without an offset (`yyyy-MM-dd HH:mm:ss`) is UTC."""
    text = raw.strip()
    number = _EPOCH_NUMBER.fullmatch(text)
    if number is not None:
        whole, frac = int(number[1]), number[2] or ""
        if whole >= MS_THRESHOLD:
            return whole
        return whole * 1000 + int((frac + "000")[:3])
    if "T" in text and " " in text:
        text = text.replace(" ", "+")  # an offset's "+" left unescaped in a URL reads as a space
    try:
        dt = datetime.fromisoformat(text)
    except ValueError as exc:
        raise OsmAndRequestError(DlqReason.BAD_TIMESTAMP, f"timestamp {raw[:40]!r} is not a time") from exc
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=UTC)
    return (dt - _EPOCH) // _ONE_MS


def _number(params: Mapping[str, str], *names: str) -> float | None:
    """The first of `names` present with a value, as a finite float; a blank value is absent."""
    for name in names:
        raw = params.get(name, "").strip()
        if not raw:
            continue
        try:
            value = float(raw)
        except ValueError as exc:
            raise OsmAndRequestError(DlqReason.WRONG_TYPE, f"{name}={raw[:40]!r} is not a number") from exc
        if not math.isfinite(value):
            raise OsmAndRequestError(DlqReason.NOT_FINITE, f"{name}={raw[:40]!r} is not finite")
        return value
    return None


def _known(value: float | None) -> float | None:
    """A phone's "unknown" is a negative speed, heading or accuracy."""
    return None if value is None or value < 0 else value


def _device_id(raw: Any) -> str:
    if raw is None or raw == "":
        raise OsmAndRequestError(DlqReason.MISSING_FIELD, "the device id (id or deviceid) is required")
    if isinstance(raw, bool) or not isinstance(raw, str | int):
        raise OsmAndRequestError(DlqReason.WRONG_TYPE, f"the device id is a {type(raw).__name__}")
    text = str(raw).strip()
    if not text or len(text) > MAX_DEVICE_ID or not text.isprintable():
        raise OsmAndRequestError("bad_device_id", f"device id {text[:40]!r} is too long or unprintable")
    return text


def _query_device_id(params: Mapping[str, str]) -> Any:
    return params.get("id") or params.get("deviceid")


def _is_json(body: bytes, content_type: str) -> bool:
    """Traccar Client 9's JSON body (by its content type, or a body that starts as an object);
    otherwise the request is a query and a form body."""
    media_type = content_type.partition(";")[0].strip().lower()
    return media_type == "application/json" or body.lstrip()[:1] == b"{"


def device_id_of(*, query: str = "", body: bytes = b"", content_type: str = "") -> str | None:
    """The device id a request names, read as `parse_request` reads it, even when its fix is
    unusable (so the edge can admit the sender and dead-letter the fix as its vehicle's); None when
    it names none readably."""
    try:
        if _is_json(body, content_type):
            d = orjson.loads(body)
            return _device_id(d.get("device_id") if isinstance(d, dict) else None)
        return _device_id(_query_device_id(_form(query, body)))
    except (OsmAndRequestError, orjson.JSONDecodeError):
        return None


def _params(query: str | bytes) -> dict[str, str]:
    if len(query) > MAX_PAYLOAD_BYTES:
        raise OsmAndRequestError(DlqReason.TOO_LARGE, f"request: {len(query)} bytes over {MAX_PAYLOAD_BYTES}")
    text = query.decode("utf-8", "replace") if isinstance(query, bytes) else query
    try:
        return dict(parse_qsl(text.lstrip("?"), keep_blank_values=True, max_num_fields=MAX_FIELDS))
    except ValueError as exc:
        raise OsmAndRequestError(DlqReason.TOO_LARGE, f"more than {MAX_FIELDS} parameters") from exc


def parse_query(query: str | bytes | Mapping[str, str], *, speed_unit: str = "kn") -> OsmAndFix:
    """The fix in a query string or form body (or in its parameters, already parsed)."""
    params = _params(query) if isinstance(query, str | bytes) else dict(query)
    device_id = _device_id(_query_device_id(params))
    lat, lon = _number(params, "lat"), _number(params, "lon")
    if (lat is None or lon is None) and params.get("location"):
        parts = params["location"].split(",")
        if len(parts) != 2:
            raise OsmAndRequestError(DlqReason.WRONG_TYPE, "location must be 'lat,lon'")
        lat, lon = _number({"lat": parts[0]}, "lat"), _number({"lon": parts[1]}, "lon")
    if lat is None or lon is None:
        raise OsmAndRequestError(DlqReason.MISSING_FIELD, "lat and lon (or location) are required")
    raw_ts = params.get("timestamp", "").strip()
    if not raw_ts:
        # Traccar would take the server's clock; FleetFence needs the fix's own time, as its
        # sequence (a retried request is the same fix) and as its event time.
        raise OsmAndRequestError(DlqReason.MISSING_FIELD, "timestamp is required")
    speed = _known(_number(params, "speed"))
    attributes = {k: v for k, v in params.items() if k not in _KNOWN}
    return OsmAndFix(
        device_id=device_id,
        ts_ms=parse_timestamp(raw_ts),
        lat=lat,
        lon=lon,
        speed_kmh=0.0 if speed is None else speed * _kmh_per(speed_unit),
        heading_deg=_known(_number(params, "bearing", "heading")),
        accuracy_m=_known(_number(params, "accuracy")),
        altitude_m=_number(params, "altitude"),
        battery=_known(_number(params, "batt")),
        valid=params.get("valid", "true").strip().lower() not in {"false", "0"},
        attributes=attributes,
    )


def _kmh_per(unit: str) -> float:
    try:
        return KMH_PER_UNIT[unit]
    except KeyError:
        raise ValueError(f"speed unit {unit!r} is not one of {sorted(KMH_PER_UNIT)}") from None


def _object(d: Mapping[str, Any], name: str) -> Mapping[str, Any]:
    v = d.get(name)
    if v is None:
        raise OsmAndRequestError(DlqReason.MISSING_FIELD, f"field {name!r} is required")
    if not isinstance(v, dict):
        raise OsmAndRequestError(DlqReason.WRONG_TYPE, f"field {name!r} must be an object")
    return v


def _text(v: Any) -> str:
    if isinstance(v, str):
        return v
    if isinstance(v, bool):
        return "true" if v else "false"
    return orjson.dumps(v).decode()


def parse_json(body: bytes) -> OsmAndFix:
    """The fix in the JSON body of Traccar Client 9 and later (speed in m/s, battery 0 to 1)."""
    if len(body) > MAX_PAYLOAD_BYTES:
        raise OsmAndRequestError(DlqReason.TOO_LARGE, f"body of {len(body)} bytes over {MAX_PAYLOAD_BYTES}")
    try:
        d = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise OsmAndRequestError(DlqReason.NOT_JSON, f"body is not JSON: {str(exc)[:80]}") from exc
    if not isinstance(d, dict):
        raise OsmAndRequestError(DlqReason.NOT_OBJECT, "body must be a JSON object")
    device_id = _device_id(d.get("device_id"))
    location = _object(d, "location")
    coords = _object(location, "coords")
    lat, lon = (
        json_required(coords, "latitude", OsmAndRequestError),
        json_required(coords, "longitude", OsmAndRequestError),
    )
    ts = location.get("timestamp")
    if ts is None:
        raise OsmAndRequestError(DlqReason.MISSING_FIELD, "field 'timestamp' is required")
    if isinstance(ts, bool) or not isinstance(ts, str | int):
        raise OsmAndRequestError(DlqReason.WRONG_TYPE, "field 'timestamp' must be ISO 8601 or epoch ms")
    speed = _known(json_number(coords, "speed", OsmAndRequestError))
    battery = location.get("battery")
    battery = battery if isinstance(battery, dict) else {}
    level = _known(json_number(battery, "level", OsmAndRequestError))
    attributes = {k: _text(v) for k, v in location.items() if k in {"is_moving", "odometer", "event"}}
    activity = location.get("activity")
    if isinstance(activity, dict) and "type" in activity:
        attributes["activity"] = _text(activity["type"])
    if "is_charging" in battery:
        attributes["charge"] = _text(battery["is_charging"])
    extras = location.get("extras")
    if isinstance(extras, dict):
        attributes.update((str(k), _text(v)) for k, v in extras.items())
    return OsmAndFix(
        device_id=device_id,
        ts_ms=parse_timestamp(str(ts)),
        lat=lat,
        lon=lon,
        speed_kmh=0.0 if speed is None else speed * KMH_PER_UNIT["mps"],
        heading_deg=_known(json_number(coords, "heading", OsmAndRequestError)),
        accuracy_m=_known(json_number(coords, "accuracy", OsmAndRequestError)),
        altitude_m=json_number(coords, "altitude", OsmAndRequestError),
        battery=None if level is None else level * 100.0,
        attributes=attributes,
    )


def parse_request(
    *, query: str = "", body: bytes = b"", content_type: str = "", speed_unit: str = "kn"
) -> OsmAndFix:
    """The fix in one HTTP request, whatever its form: a JSON body (by its content type, or a body
    that starts as an object), else the query's parameters and a form body's, the body's winning."""
    if len(query) + len(body) > MAX_PAYLOAD_BYTES:
        raise OsmAndRequestError(DlqReason.TOO_LARGE, f"request of {len(query) + len(body)} bytes")
    if _is_json(body, content_type):
        return parse_json(body)
    return parse_query(_form(query, body), speed_unit=speed_unit)


def _form(query: str, body: bytes) -> dict[str, str]:
    """The query's parameters and a form body's, the body's winning."""
    params = _params(query)
    if body:
        params.update(_params(body))
    return params


def to_telemetry(fix: OsmAndFix, *, vehicle_id: str, received_ms: int) -> Telemetry:
    """The fix as FleetFence's telemetry for the vehicle its device is registered to; `seq` is the
    fix's time (`gateway.protocols.telemetry_of`), so a retried request is the same fix. A fix the
    device marked `valid=false` raises `no_fix`; the contract's faults raise its `DlqReason`."""
    if not fix.valid:
        raise OsmAndRequestError("no_fix", f"device {fix.device_id[:40]!r} marked its position invalid")
    return fix_telemetry(fix, vehicle_id=vehicle_id, received_ms=received_ms, error=OsmAndRequestError)
