"""Pure codecs for the trackers fleets already own, beside FleetFence's own MQTT JSON.

Each module turns one protocol's bytes into typed values and back, with no I/O: `teltonika`
(Codec 8, 8 Extended, 16 and 12 over TCP: the IMEI handshake, a stream splitter, AVL packets,
acknowledgements), `osmand` (the OsmAnd / Traccar Client HTTP protocol: query form and JSON body)
and `owntracks` (OwnTracks JSON over MQTT or HTTP). The adapters that hold sockets, answer the
device and produce to Kafka live elsewhere; keeping the codecs pure lets the tests drive every byte
sequence a device could send without a network, and lets the simulator use the same encoders.

Every decoded fix becomes the one telemetry record the MQTT path produces (`Telemetry`) through
`telemetry_of`, which judges it with `fleetfence.contracts.validate_telemetry` itself, so a fix
from a tracker passes or fails exactly as the same fix over MQTT would, with the same `DlqReason`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import orjson

from fleetfence.contracts import (
    MAX_TS_MS,
    MIN_TS_MS,
    DlqReason,
    Telemetry,
    telemetry_topic,
    validate_telemetry,
)
from fleetfence.errors import ContractError


def telemetry_of(
    *,
    vehicle_id: str,
    ts_ms: int,
    lat: float,
    lon: float,
    speed_kmh: float,
    heading_deg: float | None,
    accuracy_m: float | None,
    received_ms: int,
    error: type[ContractError] = ContractError,
) -> Telemetry:
    """The canonical record of one tracker fix for `vehicle_id` (the vehicle its device is
    registered to), received at `received_ms`, or a ContractError with a `DlqReason`.

    `seq` is the fix's own time, `ts_ms`: a tracker numbers nothing, and the processor drops a
    `seq` it has already seen for the vehicle, so a fix the device sends again (a Teltonika packet
    retransmitted because its acknowledgement was lost, an HTTP request retried, an MQTT message
    redelivered) is the same fix once, whichever replica received it; and since a tracker sends its
    fixes in time order, `seq` grows as the contract asks. Two distinct fixes in one millisecond are
    one fix downstream, which costs nothing a geofence could see.

    The fix is judged by `validate_telemetry` on the JSON the MQTT path would carry, so the ranges,
    the time bounds and the reasons are the contract's own, not a second spelling of them. Checked
    here first only what that JSON cannot express: a non-finite number (JSON has none; it would
    read as absent) and a time beyond 64 bits, and a vehicle id that would not fit in a topic.
    `error` is the protocol's own error class (`gateway.errors`), raised with the same reason."""
    if not vehicle_id or "/" in vehicle_id:
        raise error(DlqReason.BAD_VEHICLE_ID, f"vehicle id {vehicle_id[:64]!r} is not allowed")
    if not MIN_TS_MS <= ts_ms <= MAX_TS_MS:
        raise error(DlqReason.BAD_TIMESTAMP, f"fix time {ts_ms} ms is not a plausible time")
    numbers = {
        "lat": lat,
        "lon": lon,
        "speed_kmh": speed_kmh,
        "heading_deg": heading_deg,
        "accuracy_m": accuracy_m,
    }
    for name, value in numbers.items():
        if value is not None and not math.isfinite(value):
            raise error(DlqReason.NOT_FINITE, f"field {name!r} must be finite, got {value!r}")
    message = {"vehicle_id": vehicle_id, "seq": ts_ms, "ts": ts_ms, **numbers}
    try:
        return validate_telemetry(telemetry_topic(vehicle_id), orjson.dumps(message), received_ms)
    except ContractError as exc:
        if error is ContractError:
            raise
        raise error(exc.reason, str(exc)) from exc


def json_number(d: Mapping[str, Any], name: str, error: type[ContractError]) -> float | None:
    """A JSON number member as a float, None when absent; `error(reason, detail)` for a boolean, a
    non-number or a non-finite value: one check for every protocol's JSON, each with its own error
    class."""
    v = d.get(name)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int | float):
        raise error(DlqReason.WRONG_TYPE, f"field {name!r} is a {type(v).__name__}")
    f = float(v)
    if not math.isfinite(f):
        raise error(DlqReason.NOT_FINITE, f"field {name!r} is not finite")
    return f


def json_required(d: Mapping[str, Any], name: str, error: type[ContractError]) -> float:
    """`json_number`, and `error` with `missing_field` when it is absent."""
    v = json_number(d, name, error)
    if v is None:
        raise error(DlqReason.MISSING_FIELD, f"field {name!r} is required")
    return v


@dataclass(frozen=True, slots=True, kw_only=True)
class PhoneFix:
    """What a phone app's fix (OsmAnd, OwnTracks) carries, in FleetFence's units: the one spelling
    of the fields both protocols share, which `fix_telemetry` hands to the telemetry record.
    `speed_kmh` is 0.0 when the device sent none; `battery` is a percentage; `attributes` keeps
    every other parameter as text."""

    ts_ms: int
    lat: float
    lon: float
    speed_kmh: float = 0.0
    heading_deg: float | None = None
    accuracy_m: float | None = None
    altitude_m: float | None = None
    battery: float | None = None
    attributes: dict[str, str] = field(default_factory=dict)


def fix_telemetry(
    fix: PhoneFix, *, vehicle_id: str, received_ms: int, error: type[ContractError]
) -> Telemetry:
    """`telemetry_of` for a decoded fix: one spelling of the hand-over for every protocol."""
    return telemetry_of(
        vehicle_id=vehicle_id,
        ts_ms=fix.ts_ms,
        lat=fix.lat,
        lon=fix.lon,
        speed_kmh=fix.speed_kmh,
        heading_deg=fix.heading_deg,
        accuracy_m=fix.accuracy_m,
        received_ms=received_ms,
        error=error,
    )
