"""OwnTracks' JSON messages, as its apps publish them over MQTT (`owntracks/<user>/<device>`) or
POST them in HTTP mode (the same JSON, with the topic in a `topic` element).

Written from OwnTracks' public JSON reference (https://owntracks.org/booklet/tech/json/): a message
names its kind in `_type`. A `location` carries `tst` (the fix's UNIX time in seconds, required),
`lat` and `lon` (degrees, required), `vel` (km/h), `cog` (course over ground, degrees), `acc`
(accuracy, metres), `alt` (metres), `batt` (percent), `tid` (the tracker's two-letter id) and `t`
(what triggered the report), and more (`bs`, `conn`, `inregions`, `created_at`...) kept as
attributes. "The `acc`, `alt`, `cog`, `vac`, `vel` elements are only added if they are not zero",
so a missing `vel` is a speed of 0. Every other `_type` (transition, waypoint, waypoints, lwt,
card, status, cmd, steps, beacon, configuration, request, encrypted...) carries no fix of the
device: it is returned as `OwnTracksIgnored`, to be counted. The apps publish those mostly on
sub-topics (`.../event`, `.../cmd`, `.../step`, `.../waypoint`...): a message there is returned as
`OwnTracksSubtopic` without being read.

HTTP mode (https://owntracks.org/booklet/tech/http/) POSTs the same JSON, authenticated with HTTP
Basic; the OwnTracks Recorder's convention names the user and device with `?u=...&d=...` or the
`X-Limit-U` / `X-Limit-D` headers, and newer apps add the `topic` element. The app expects a JSON
array in a 200 response (`[]` when there is nothing to tell it). Note for the adapter: the app takes
*any* HTTP status, even a 5xx, as "posted" and queues a message only when the endpoint is
unreachable, so a fix Kafka does not have yet must be answered by closing the connection without a
response, never by an error status.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import orjson

from fleetfence.contracts import MAX_PAYLOAD_BYTES, DlqReason, Telemetry
from gateway.errors import OwnTracksMessageError
from gateway.protocols import PhoneFix, fix_telemetry, json_number, json_required

LOCATION = "location"
TOPIC_PREFIX = "owntracks"
_FIELDS = frozenset({"_type", "tst", "lat", "lon", "vel", "cog", "acc", "alt", "batt", "tid", "t", "topic"})


@dataclass(frozen=True, slots=True)
class OwnTracksTopic:
    """`owntracks/<user>/<device>[/<subtopic>]`: `subtopic` None is the location topic."""

    user: str
    device: str
    subtopic: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class OwnTracksFix(PhoneFix):
    """One `_type: location` message (`PhoneFix`). `user` and `device` come from the topic (MQTT's,
    or the payload's `topic` in HTTP mode; None when neither says)."""

    tid: str | None = None
    trigger: str | None = None
    user: str | None = None
    device: str | None = None


@dataclass(frozen=True, slots=True)
class OwnTracksIgnored:
    """A well-formed message of another `_type` than location, to be counted by its type."""

    message_type: str


@dataclass(frozen=True, slots=True)
class OwnTracksSubtopic:
    """A message published below a device's topic (`/event`, `/cmd`, `/info`, `/waypoint`...):
    never a location, so its payload is not read."""

    topic: OwnTracksTopic


def parse_topic(topic: str) -> OwnTracksTopic:
    """`owntracks/<user>/<device>` and its sub-topics; anything else is `bad_topic`."""
    parts = topic.split("/")
    if len(parts) < 3 or parts[0] != TOPIC_PREFIX or not all(parts[1:]):
        detail = f"topic {topic[:80]!r} is not owntracks/<user>/<device>"
        raise OwnTracksMessageError(DlqReason.BAD_TOPIC, detail)
    return OwnTracksTopic(user=parts[1], device=parts[2], subtopic="/".join(parts[3:]) or None)


def _known(value: float | None) -> float | None:
    """A negative speed, course or accuracy is a platform's "unknown"."""
    return None if value is None or value < 0 else value


def _text(v: Any) -> str:
    return v if isinstance(v, str) else orjson.dumps(v).decode()


def _tst_ms(d: Mapping[str, Any]) -> int:
    tst = d.get("tst")
    if tst is None:
        raise OwnTracksMessageError(DlqReason.MISSING_FIELD, "field 'tst' is required")
    if isinstance(tst, bool) or not isinstance(tst, int | float):
        raise OwnTracksMessageError(DlqReason.WRONG_TYPE, "field 'tst' must be epoch seconds")
    if isinstance(tst, float):
        if not math.isfinite(tst):
            raise OwnTracksMessageError(DlqReason.NOT_FINITE, "field 'tst' is not finite")
        if abs(tst) >= 1e15:  # x 1000 would not be a time a millisecond count holds (or overflows)
            raise OwnTracksMessageError(DlqReason.BAD_TIMESTAMP, f"field 'tst' {tst!r} is not a time")
        return round(tst * 1000)
    return tst * 1000


def decode_payload(payload: bytes, *, topic: OwnTracksTopic | None = None) -> OwnTracksFix | OwnTracksIgnored:
    """A message's JSON -> its fix, or `OwnTracksIgnored` for another `_type`. `topic` names the
    device (the MQTT topic); without it, a payload's own `topic` element does (HTTP mode)."""
    if len(payload) > MAX_PAYLOAD_BYTES:
        detail = f"payload of {len(payload)} bytes over {MAX_PAYLOAD_BYTES}"
        raise OwnTracksMessageError(DlqReason.TOO_LARGE, detail)
    try:
        d = orjson.loads(payload)
    except orjson.JSONDecodeError as exc:
        raise OwnTracksMessageError(DlqReason.NOT_JSON, f"payload is not JSON: {str(exc)[:80]}") from exc
    if not isinstance(d, dict):
        raise OwnTracksMessageError(DlqReason.NOT_OBJECT, "payload must be a JSON object")
    kind = d.get("_type")
    if kind is None:
        raise OwnTracksMessageError(DlqReason.MISSING_FIELD, "field '_type' is required")
    if not isinstance(kind, str):
        raise OwnTracksMessageError(DlqReason.WRONG_TYPE, "field '_type' must be a string")
    if kind != LOCATION:
        return OwnTracksIgnored(message_type=kind[:40])
    lat, lon = json_required(d, "lat", OwnTracksMessageError), json_required(d, "lon", OwnTracksMessageError)
    if topic is None and isinstance(d.get("topic"), str):
        try:
            topic = parse_topic(d["topic"])
        except OwnTracksMessageError:
            topic = None  # only a hint in HTTP mode: the request's login names the device
    speed = _known(json_number(d, "vel", OwnTracksMessageError))
    tid, trigger = d.get("tid"), d.get("t")
    return OwnTracksFix(
        ts_ms=_tst_ms(d),
        lat=lat,
        lon=lon,
        speed_kmh=0.0 if speed is None else speed,
        heading_deg=_known(json_number(d, "cog", OwnTracksMessageError)),
        accuracy_m=_known(json_number(d, "acc", OwnTracksMessageError)),
        altitude_m=json_number(d, "alt", OwnTracksMessageError),
        battery=_known(json_number(d, "batt", OwnTracksMessageError)),
        tid=None if tid is None else _text(tid),
        trigger=None if trigger is None else _text(trigger),
        user=None if topic is None else topic.user,
        device=None if topic is None else topic.device,
        attributes={k: _text(v) for k, v in d.items() if k not in _FIELDS},
    )


def decode_mqtt(topic: str, payload: bytes) -> OwnTracksFix | OwnTracksIgnored | OwnTracksSubtopic:
    """A message as the broker delivered it: its topic decides first (a sub-topic is no location),
    then its JSON."""
    parsed = parse_topic(topic)
    if parsed.subtopic is not None:
        return OwnTracksSubtopic(topic=parsed)
    return decode_payload(payload, topic=parsed)


def decode_http(body: bytes) -> OwnTracksFix | OwnTracksIgnored:
    """An HTTP-mode POST body: the same JSON, its `topic` element (if any) read as a hint only: the
    edge (`gateway.http_edge`) names the vehicle by the request's login, never by the body."""
    return decode_payload(body)


def to_telemetry(fix: OwnTracksFix, *, vehicle_id: str, received_ms: int) -> Telemetry:
    """The fix as FleetFence's telemetry for the vehicle its device is registered to; `seq` is the
    fix's time (`gateway.protocols.telemetry_of`), so a message delivered twice is one fix. The
    contract's faults raise its `DlqReason`."""
    return fix_telemetry(fix, vehicle_id=vehicle_id, received_ms=received_ms, error=OwnTracksMessageError)
