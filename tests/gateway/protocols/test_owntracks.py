"""The OwnTracks codec (gateway.protocols.owntracks), without a broker: messages as OwnTracks'
JSON reference spells them (https://owntracks.org/booklet/tech/json/), its topics, round trips of
any valid location, and each malformed message refused with its reason."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import orjson
import pytest
from hypothesis import given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from fleetfence.contracts import DlqReason, Telemetry
from gateway.errors import OwnTracksMessageError
from gateway.protocols import owntracks as w

# The location example of OwnTracks' Traccar page (https://owntracks.org/booklet/features/traccar/)
BOOKLET_MINIMAL = b'{"lon":2.29513,"lat":48.85833,"_type":"location","tst":1497476456, "tid":"JJ"}'
# A location with the elements the JSON reference lists, as an Android phone in a car sends them.
BOOKLET_FULL = {
    "_type": "location",
    "acc": 12,
    "alt": 35,
    "batt": 76,
    "bs": 1,
    "cog": 270,
    "conn": "m",
    "created_at": 1497476460,
    "inregions": ["Home"],
    "lat": 48.85833,
    "lon": 2.29513,
    "t": "t",
    "tid": "JJ",
    "tst": 1497476456,
    "vac": 4,
    "vel": 54,
}
TST_MS = 1_497_476_456_000


def reason_of(call: Callable[[], object]) -> str:
    with pytest.raises(OwnTracksMessageError) as err:
        call()
    return err.value.reason


def outcome(call: Callable[[], object]) -> str:
    """The kind of result, or the reason it was refused for: nothing else may escape."""
    try:
        result = call()
    except OwnTracksMessageError as exc:
        return exc.reason
    return type(result).__name__


# --------------------------------------------------------------------------- conformance


def test_the_minimal_location() -> None:
    fix = w.decode_mqtt("owntracks/jane/phone", BOOKLET_MINIMAL)
    assert fix == w.OwnTracksFix(
        ts_ms=TST_MS, lat=48.85833, lon=2.29513, tid="JJ", user="jane", device="phone"
    )
    # "the acc, alt, cog, vac, vel elements are only added if they are not zero"
    assert isinstance(fix, w.OwnTracksFix)
    assert fix.speed_kmh == 0.0


def test_a_location_with_every_element() -> None:
    fix = w.decode_mqtt("owntracks/jane/phone", orjson.dumps(BOOKLET_FULL))
    assert fix == w.OwnTracksFix(
        ts_ms=TST_MS,
        lat=48.85833,
        lon=2.29513,
        speed_kmh=54.0,  # vel is km/h
        heading_deg=270.0,
        accuracy_m=12.0,
        altitude_m=35.0,
        battery=76.0,
        tid="JJ",
        trigger="t",
        user="jane",
        device="phone",
        attributes={"bs": "1", "conn": "m", "created_at": "1497476460", "inregions": '["Home"]', "vac": "4"},
    )


@pytest.mark.parametrize(
    "kind",
    [
        "transition",
        "waypoint",
        "waypoints",
        "lwt",
        "card",
        "status",
        "cmd",
        "steps",
        "beacon",
        "configuration",
        "request",
        "encrypted",
        "something-new",
    ],
)
def test_other_types_are_counted_not_read(kind: str) -> None:
    payload = orjson.dumps({"_type": kind, "tst": 1497476456, "data": "x"})
    assert w.decode_mqtt("owntracks/jane/phone", payload) == w.OwnTracksIgnored(message_type=kind)
    assert w.decode_http(payload) == w.OwnTracksIgnored(message_type=kind)


def test_topics() -> None:
    assert w.parse_topic("owntracks/jane/phone") == w.OwnTracksTopic(user="jane", device="phone")
    assert w.parse_topic("owntracks/jane/phone/event") == w.OwnTracksTopic("jane", "phone", "event")
    for sub in ("event", "cmd", "info", "step", "beacon", "dump", "status", "waypoint", "waypoints"):
        topic = f"owntracks/jane/phone/{sub}"
        got = w.decode_mqtt(topic, BOOKLET_MINIMAL)  # a location's bytes, on a sub-topic: not read
        assert got == w.OwnTracksSubtopic(topic=w.OwnTracksTopic(user="jane", device="phone", subtopic=sub))


@pytest.mark.parametrize(
    "topic",
    [
        "owntracks/jane",
        "owntracks//phone",
        "owntracks/jane/",
        "fleet/jane/phone",
        "",
        "owntracks/jane/phone/",
    ],
)
def test_bad_topics(topic: str) -> None:
    assert reason_of(lambda: w.parse_topic(topic)) == DlqReason.BAD_TOPIC
    assert reason_of(lambda: w.decode_mqtt(topic, BOOKLET_MINIMAL)) == DlqReason.BAD_TOPIC


def test_http_mode_names_the_device_by_its_topic_element() -> None:
    body = orjson.dumps({**BOOKLET_FULL, "topic": "owntracks/jane/phone"})
    fix = w.decode_http(body)
    assert isinstance(fix, w.OwnTracksFix)
    assert (fix.user, fix.device) == ("jane", "phone")
    assert "topic" not in fix.attributes
    anonymous = w.decode_http(BOOKLET_MINIMAL)
    assert isinstance(anonymous, w.OwnTracksFix)
    assert (anonymous.user, anonymous.device) == (None, None)
    odd = w.decode_http(orjson.dumps({**BOOKLET_FULL, "topic": "elsewhere"}))
    assert isinstance(odd, w.OwnTracksFix)
    assert odd.user is None


def test_unknowns_and_fractional_time() -> None:
    payload = {"_type": "location", "lat": 1, "lon": 2, "tst": 1497476456.25, "vel": -1, "cog": -1, "acc": -1}
    fix = w.decode_http(orjson.dumps(payload))
    assert fix == w.OwnTracksFix(ts_ms=TST_MS + 250, lat=1.0, lon=2.0)


# --------------------------------------------------------------------------- malformed messages


@pytest.mark.parametrize(
    ("payload", "reason"),
    [
        (b"not json", DlqReason.NOT_JSON),
        (b"[]", DlqReason.NOT_OBJECT),
        (b'"location"', DlqReason.NOT_OBJECT),
        (b'{"lat": 1, "lon": 2, "tst": 1}', DlqReason.MISSING_FIELD),
        (b'{"_type": 5}', DlqReason.WRONG_TYPE),
        (b'{"_type": "location", "lon": 2, "tst": 1497476456}', DlqReason.MISSING_FIELD),
        (b'{"_type": "location", "lat": 1, "tst": 1497476456}', DlqReason.MISSING_FIELD),
        (b'{"_type": "location", "lat": "1", "lon": 2, "tst": 1497476456}', DlqReason.WRONG_TYPE),
        (b'{"_type": "location", "lat": true, "lon": 2, "tst": 1497476456}', DlqReason.WRONG_TYPE),
        (b'{"_type": "location", "lat": 1, "lon": 2}', DlqReason.MISSING_FIELD),
        (b'{"_type": "location", "lat": 1, "lon": 2, "tst": "1497476456"}', DlqReason.WRONG_TYPE),
        (b'{"_type": "location", "lat": 1, "lon": 2, "tst": false}', DlqReason.WRONG_TYPE),
        # a double that is no millisecond count: refused, not an OverflowError out of the edge
        (b'{"_type": "location", "lat": 1, "lon": 2, "tst": 1e308}', DlqReason.BAD_TIMESTAMP),
        (
            b'{"_type": "location", "lat": 1, "lon": 2, "tst": 1497476456, "vel": "fast"}',
            DlqReason.WRONG_TYPE,
        ),
        # JSON has no infinity: a number beyond a double is no JSON to the parser
        (b'{"_type": "location", "lat": 1e999, "lon": 2, "tst": 1497476456}', DlqReason.NOT_JSON),
        (b'{"_type": "location", "pad": "' + b"x" * 20_000 + b'"}', DlqReason.TOO_LARGE),
    ],
)
def test_malformed_messages(payload: bytes, reason: str) -> None:
    assert reason_of(lambda: w.decode_mqtt("owntracks/jane/phone", payload)) == reason


@hsettings(max_examples=100, deadline=None)
@given(st.binary(max_size=300), st.text(max_size=40))
def test_any_message_is_a_result_or_a_reason(payload: bytes, topic: str) -> None:
    assert outcome(lambda: w.decode_mqtt(topic, payload))
    assert outcome(lambda: w.decode_mqtt("owntracks/jane/phone", payload))
    assert outcome(lambda: w.decode_http(payload))


json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**63 - 1)
    | st.floats(allow_nan=False)
    | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=8,
)


@hsettings(max_examples=60, deadline=None)
@given(st.dictionaries(st.sampled_from([*sorted(BOOKLET_FULL), "topic", "x"]), json_values, max_size=12))
def test_any_location_shaped_message_is_a_result_or_a_reason(fields: dict[str, Any]) -> None:
    payload = orjson.dumps({**fields, "_type": "location"})
    assert outcome(lambda: w.decode_mqtt("owntracks/jane/phone", payload))


# --------------------------------------------------------------------------- round trip


@hsettings(max_examples=60, deadline=None)
@given(
    tst=st.integers(min_value=946_684_800, max_value=4_102_444_800),
    lat=st.floats(min_value=-90, max_value=90),
    lon=st.floats(min_value=-180, max_value=180),
    vel=st.integers(min_value=0, max_value=300),
    cog=st.integers(min_value=0, max_value=360),
    acc=st.integers(min_value=0, max_value=5000),
    alt=st.integers(min_value=-500, max_value=9000),
    batt=st.integers(min_value=0, max_value=100),
    tid=st.text(min_size=2, max_size=2),
)
def test_location_round_trip(
    tst: int, lat: float, lon: float, vel: int, cog: int, acc: int, alt: int, batt: int, tid: str
) -> None:
    message = {"_type": "location", "tst": tst, "lat": lat, "lon": lon, "vel": vel, "cog": cog}
    message |= {"acc": acc, "alt": alt, "batt": batt, "tid": tid}
    assert w.decode_mqtt("owntracks/u/d", orjson.dumps(message)) == w.OwnTracksFix(
        ts_ms=tst * 1000,
        lat=lat,
        lon=lon,
        speed_kmh=float(vel),
        heading_deg=float(cog),
        accuracy_m=float(acc),
        altitude_m=float(alt),
        battery=float(batt),
        tid=tid,
        user="u",
        device="d",
    )


# --------------------------------------------------------------------------- into FleetFence


def test_a_location_becomes_the_one_telemetry_record() -> None:
    fix = w.decode_mqtt("owntracks/jane/phone", orjson.dumps(BOOKLET_FULL))
    assert isinstance(fix, w.OwnTracksFix)
    assert w.to_telemetry(fix, vehicle_id="car-9", received_ms=TST_MS + 500) == Telemetry(
        vehicle_id="car-9",
        seq=TST_MS,
        ts_ms=TST_MS,
        lat=48.85833,
        lon=2.29513,
        speed_kmh=54.0,
        heading_deg=270.0,
        accuracy_m=12.0,
        received_ms=TST_MS + 500,
    )


@pytest.mark.parametrize(
    ("changes", "reason"),
    [
        ({"lat": 91}, DlqReason.OUT_OF_RANGE),
        ({"lon": -200}, DlqReason.OUT_OF_RANGE),
        ({"vel": 5000}, DlqReason.OUT_OF_RANGE),
        ({"cog": 361}, DlqReason.OUT_OF_RANGE),
        ({"acc": 200_000}, DlqReason.OUT_OF_RANGE),
        ({"tst": 1497476456 + 3600}, DlqReason.TS_IN_FUTURE),
        ({"tst": 0}, DlqReason.BAD_TIMESTAMP),
        ({"tst": 2**62}, DlqReason.BAD_TIMESTAMP),
    ],
)
def test_locations_the_contract_refuses(changes: dict[str, Any], reason: str) -> None:
    fix = w.decode_mqtt("owntracks/jane/phone", orjson.dumps({**BOOKLET_FULL, **changes}))
    assert isinstance(fix, w.OwnTracksFix)
    assert reason_of(lambda: w.to_telemetry(fix, vehicle_id="car-9", received_ms=TST_MS)) == reason
