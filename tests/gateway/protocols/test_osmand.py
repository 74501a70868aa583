"""The OsmAnd / Traccar Client codec (gateway.protocols.osmand), without a network: requests as
Traccar documents them (https://www.traccar.org/osmand/), speed in knots as a Traccar server reads
it, the JSON body of Traccar Client 9, round trips of any valid fix, and each malformed request
refused with its reason."""

from __future__ import annotations

from collections.abc import Callable
from urllib.parse import urlencode

import orjson
import pytest
from hypothesis import given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from fleetfence.contracts import DlqReason, Telemetry
from gateway.errors import OsmAndRequestError
from gateway.protocols import osmand as o

T0 = 1_700_000_000  # 2023-11-14T22:13:20Z
T0_MS = T0 * 1000

# Traccar's JSON example (https://www.traccar.org/osmand/), its zeros replaced by a real fix.
JSON_BODY = {
    "location": {
        "timestamp": "2023-11-14T22:13:20.000Z",
        "coords": {
            "latitude": 52.52,
            "longitude": 13.405,
            "accuracy": 5,
            "speed": 10,
            "heading": 270,
            "altitude": 34,
        },
        "is_moving": True,
        "odometer": 1234.5,
        "event": "motionchange",
        "battery": {"level": 0.5, "is_charging": False},
        "activity": {"type": "in_vehicle"},
        "extras": {},
    },
    "device_id": "48241179",
}


def reason_of(call: Callable[[], object]) -> str:
    with pytest.raises(OsmAndRequestError) as err:
        call()
    return err.value.reason


def outcome(call: Callable[[], object]) -> str:
    """ "fix", or the reason it was refused for: nothing else may escape."""
    try:
        call()
    except OsmAndRequestError as exc:
        return exc.reason
    return "fix"


# --------------------------------------------------------------------------- conformance


def test_the_documented_query() -> None:
    # Traccar's template: ?id=123456&lat={0}&lon={1}&timestamp={2}&hdop={3}&altitude={4}&speed={5}
    fix = o.parse_query(f"id=123456&lat=52.52&lon=13.405&timestamp={T0}&hdop=1.2&altitude=34&speed=45")
    assert fix == o.OsmAndFix(
        device_id="123456",
        ts_ms=T0_MS,
        lat=52.52,
        lon=13.405,
        speed_kmh=45 * 1.852,  # knots
        altitude_m=34.0,
        attributes={"hdop": "1.2"},
    )


def test_speed_is_in_knots_as_a_traccar_server_reads_it() -> None:
    """45 in a request shows as 83.34 km/h on a Traccar server (its forum, "OsmAnd request, how to
    set speed in SI (km/h)"); a server-wide setting reads another unit."""
    query = f"id=1&lat=1&lon=2&timestamp={T0}&speed=45"
    assert o.parse_query(query).speed_kmh == pytest.approx(83.34)
    assert o.parse_query(query, speed_unit="kmh").speed_kmh == 45.0
    assert o.parse_query(query, speed_unit="mps").speed_kmh == pytest.approx(162.0)
    assert o.parse_query(query, speed_unit="mph").speed_kmh == pytest.approx(72.42048)
    with pytest.raises(ValueError, match="speed unit"):
        o.parse_query(query, speed_unit="furlongs")


@pytest.mark.parametrize(
    ("raw", "ms"),
    [
        (str(T0), T0_MS),  # epoch seconds
        (str(T0_MS + 123), T0_MS + 123),  # epoch milliseconds
        (f"{T0}.5", T0_MS + 500),
        ("2023-11-14T22:13:20Z", T0_MS),
        ("2023-11-14T22:13:20.123Z", T0_MS + 123),
        ("2023-11-15T00:13:20+02:00", T0_MS),
        ("2023-11-15T00:13:20 02:00", T0_MS),  # the "+" of an unescaped URL, read as a space
        ("2023-11-14 22:13:20", T0_MS),  # yyyy-MM-dd HH:mm:ss, UTC
        ("2023-11-14T22:13:20", T0_MS),
    ],
)
def test_timestamp_forms(raw: str, ms: int) -> None:
    assert o.parse_timestamp(raw) == ms
    assert o.parse_query(urlencode({"id": "1", "lat": "1", "lon": "2", "timestamp": raw})).ts_ms == ms


def test_the_other_documented_parameters() -> None:
    fix = o.parse_query(
        f"deviceid=phone-7&location=52.52,13.405&timestamp={T0}&heading=90&accuracy=4.5&batt=81"
        "&altitude=-3&charge=true&driverUniqueId=d42&valid=true"
    )
    assert fix == o.OsmAndFix(
        device_id="phone-7",
        ts_ms=T0_MS,
        lat=52.52,
        lon=13.405,
        speed_kmh=0.0,
        heading_deg=90.0,
        accuracy_m=4.5,
        altitude_m=-3.0,
        battery=81.0,
        attributes={"charge": "true", "driverUniqueId": "d42", "valid": "true"},
    )
    assert o.parse_query(f"id=1&lat=1&lon=2&timestamp={T0}&bearing=12.5").heading_deg == 12.5


def test_unknown_values_and_blanks() -> None:
    fix = o.parse_query(f"id=1&lat=1&lon=2&timestamp={T0}&speed=-1&bearing=-1&accuracy=-1&altitude=&batt=")
    assert (fix.speed_kmh, fix.heading_deg, fix.accuracy_m, fix.altitude_m, fix.battery) == (
        0.0,
        None,
        None,
        None,
        None,
    )
    assert not o.parse_query(f"id=1&lat=1&lon=2&timestamp={T0}&valid=false").valid
    assert not o.parse_query(f"id=1&lat=1&lon=2&timestamp={T0}&valid=0").valid


def test_traccar_client_json_body() -> None:
    fix = o.parse_json(orjson.dumps(JSON_BODY))
    assert fix == o.OsmAndFix(
        device_id="48241179",
        ts_ms=T0_MS,
        lat=52.52,
        lon=13.405,
        speed_kmh=36.0,  # 10 m/s
        heading_deg=270.0,
        accuracy_m=5.0,
        altitude_m=34.0,
        battery=50.0,  # level 0.5
        attributes={
            "is_moving": "true",
            "odometer": "1234.5",
            "event": "motionchange",
            "activity": "in_vehicle",
            "charge": "false",
        },
    )


def test_json_unknowns_epoch_time_and_extras() -> None:
    body = {
        "location": {
            "timestamp": T0_MS,
            "coords": {"latitude": 1.5, "longitude": 2.5, "speed": -1, "heading": -1, "accuracy": -1},
            "battery": {"level": -1},
            "extras": {"trip": "42", "n": 3},
        },
        "device_id": 48241179,
    }
    fix = o.parse_json(orjson.dumps(body))
    assert (fix.device_id, fix.ts_ms, fix.speed_kmh, fix.heading_deg, fix.accuracy_m, fix.battery) == (
        "48241179",
        T0_MS,
        0.0,
        None,
        None,
        None,
    )
    assert fix.attributes == {"trip": "42", "n": "3"}


def test_one_request_whatever_its_form() -> None:
    get = o.parse_request(query=f"id=1&lat=1&lon=2&timestamp={T0}&speed=10")
    post = o.parse_request(
        query="id=1",
        body=f"lat=1&lon=2&timestamp={T0}&speed=10".encode(),
        content_type="application/x-www-form-urlencoded",
    )
    assert get == post
    overridden = o.parse_request(query=f"id=1&lat=1&lon=2&timestamp={T0}", body=b"lat=3")
    assert overridden.lat == 3.0
    json_fix = o.parse_request(body=orjson.dumps(JSON_BODY), content_type="application/json; charset=utf-8")
    assert json_fix == o.parse_json(orjson.dumps(JSON_BODY))
    assert o.parse_request(body=b" " + orjson.dumps(JSON_BODY)) == json_fix  # told by its first byte


def test_the_device_id_is_read_as_the_fix_is_even_when_the_fix_is_unusable() -> None:
    """The edge admits a sender by the id before it reads the fix; the two reads must agree."""
    query, form = "id=1", f"lat=1&lon=2&timestamp={T0}".encode()
    assert o.device_id_of(query=query, body=form) == o.parse_request(query=query, body=form).device_id == "1"
    body = orjson.dumps(JSON_BODY)
    assert o.device_id_of(body=body) == o.parse_request(body=body).device_id
    assert o.device_id_of(query="deviceid=truck.42&lat=north") == "truck.42"  # no fix: still its id
    assert o.device_id_of(query="id=7", body=b"id=8&lat=1") == "8"  # the body's wins, as for the fix
    assert o.device_id_of(body=b'{"device_id": 5, "location": 1}') == "5"
    for q in ("lat=1", "id=%01"):
        assert o.device_id_of(query=q) is None
    for b in (b"{not json", b"[1]"):
        assert o.device_id_of(body=b) is None


# --------------------------------------------------------------------------- malformed requests


@pytest.mark.parametrize(
    ("query", "reason"),
    [
        (f"lat=1&lon=2&timestamp={T0}", DlqReason.MISSING_FIELD),
        (f"id=&lat=1&lon=2&timestamp={T0}", DlqReason.MISSING_FIELD),
        (f"id=1&lon=2&timestamp={T0}", DlqReason.MISSING_FIELD),
        ("id=1&lat=1&lon=2", DlqReason.MISSING_FIELD),
        (f"id=1&lat=north&lon=2&timestamp={T0}", DlqReason.WRONG_TYPE),
        (f"id=1&lat=nan&lon=2&timestamp={T0}", DlqReason.NOT_FINITE),
        (f"id=1&lat=1&lon=inf&timestamp={T0}", DlqReason.NOT_FINITE),
        (f"id=1&location=1;2&timestamp={T0}", DlqReason.WRONG_TYPE),
        (f"id=1&location=1,x&timestamp={T0}", DlqReason.WRONG_TYPE),
        (f"id=1&lat=1&lon=2&timestamp={T0}&speed=fast", DlqReason.WRONG_TYPE),
        ("id=1&lat=1&lon=2&timestamp=yesterday", DlqReason.BAD_TIMESTAMP),
        ("id=1&lat=1&lon=2&timestamp=-5", DlqReason.BAD_TIMESTAMP),
        (f"id=%01&lat=1&lon=2&timestamp={T0}", "bad_device_id"),
        (f"id={'x' * 200}&lat=1&lon=2&timestamp={T0}", "bad_device_id"),
        ("id=1&" + "&".join(f"k{i}=v" for i in range(100)), DlqReason.TOO_LARGE),
        ("id=1&lat=1&lon=2&pad=" + "x" * 20_000, DlqReason.TOO_LARGE),
    ],
)
def test_malformed_queries(query: str, reason: str) -> None:
    assert reason_of(lambda: o.parse_query(query)) == reason


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        (b"{not json", DlqReason.NOT_JSON),
        (b"[1, 2]", DlqReason.NOT_OBJECT),
        (b'{"location": {}}', DlqReason.MISSING_FIELD),
        (b'{"device_id": "1"}', DlqReason.MISSING_FIELD),
        (b'{"device_id": "1", "location": []}', DlqReason.WRONG_TYPE),
        (b'{"device_id": "1", "location": {"timestamp": "2023-11-14T22:13:20Z"}}', DlqReason.MISSING_FIELD),
        (b'{"device_id": true, "location": {}}', DlqReason.WRONG_TYPE),
        (
            b'{"device_id": "1", "location": {"coords": {"latitude": 1, "longitude": 2}}}',
            DlqReason.MISSING_FIELD,
        ),
        (
            b'{"device_id": "1", "location": {"timestamp": true, "coords": {"latitude": 1, "longitude": 2}}}',
            DlqReason.WRONG_TYPE,
        ),
        (
            b'{"device_id": "1", "location": {"timestamp": "2023-11-14T22:13:20Z", '
            b'"coords": {"latitude": "1", "longitude": 2}}}',
            DlqReason.WRONG_TYPE,
        ),
        (b'{"pad": "' + b"x" * 20_000 + b'"}', DlqReason.TOO_LARGE),
    ],
)
def test_malformed_json(body: bytes, reason: str) -> None:
    assert reason_of(lambda: o.parse_json(body)) == reason


@hsettings(max_examples=100, deadline=None)
@given(st.text(max_size=300))
def test_any_query_is_a_fix_or_a_reason(query: str) -> None:
    assert outcome(lambda: o.parse_query(query))


@hsettings(max_examples=100, deadline=None)
@given(st.binary(max_size=300))
def test_any_body_is_a_fix_or_a_reason(body: bytes) -> None:
    assert outcome(lambda: o.parse_request(body=body))
    assert outcome(lambda: o.parse_json(body))


# --------------------------------------------------------------------------- round trip

ids = st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789-_.:", min_size=1, max_size=32)
finite = st.floats(allow_nan=False, allow_infinity=False)


@hsettings(max_examples=60, deadline=None)
@given(
    device_id=ids,
    ts=st.integers(min_value=946_684_800, max_value=4_102_444_800),
    lat=st.floats(min_value=-90, max_value=90),
    lon=st.floats(min_value=-180, max_value=180),
    speed=st.floats(min_value=0, max_value=500),
    bearing=st.floats(min_value=0, max_value=360),
    altitude=finite,
)
def test_query_round_trip(
    device_id: str, ts: int, lat: float, lon: float, speed: float, bearing: float, altitude: float
) -> None:
    query = urlencode(
        {
            "id": device_id,
            "lat": repr(lat),
            "lon": repr(lon),
            "timestamp": ts,
            "speed": repr(speed),
            "bearing": repr(bearing),
            "altitude": repr(altitude),
        }
    )
    assert o.parse_query(query) == o.OsmAndFix(
        device_id=device_id,
        ts_ms=ts * 1000,
        lat=lat,
        lon=lon,
        speed_kmh=speed * 1.852,
        heading_deg=bearing,
        altitude_m=altitude,
    )


# --------------------------------------------------------------------------- into FleetFence


def test_a_fix_becomes_the_one_telemetry_record() -> None:
    fix = o.parse_query(f"id=123456&lat=52.52&lon=13.405&timestamp={T0}&speed=10&bearing=90&accuracy=4")
    assert o.to_telemetry(fix, vehicle_id="van-3", received_ms=T0_MS + 2000) == Telemetry(
        vehicle_id="van-3",
        seq=T0_MS,
        ts_ms=T0_MS,
        lat=52.52,
        lon=13.405,
        speed_kmh=10 * 1.852,
        heading_deg=90.0,
        accuracy_m=4.0,
        received_ms=T0_MS + 2000,
    )


@pytest.mark.parametrize(
    ("query", "reason"),
    [
        (f"id=1&lat=52&lon=13&timestamp={T0}&valid=false", "no_fix"),
        (f"id=1&lat=95&lon=13&timestamp={T0}", DlqReason.OUT_OF_RANGE),
        (f"id=1&lat=52&lon=-181&timestamp={T0}", DlqReason.OUT_OF_RANGE),
        (f"id=1&lat=52&lon=13&timestamp={T0}&speed=900", DlqReason.OUT_OF_RANGE),  # 1667 km/h
        (f"id=1&lat=52&lon=13&timestamp={T0}&bearing=400", DlqReason.OUT_OF_RANGE),
        (f"id=1&lat=52&lon=13&timestamp={T0 + 3600}", DlqReason.TS_IN_FUTURE),
        ("id=1&lat=52&lon=13&timestamp=0", DlqReason.BAD_TIMESTAMP),
        ("id=1&lat=52&lon=13&timestamp=99999999999999999999", DlqReason.BAD_TIMESTAMP),
    ],
)
def test_fixes_the_contract_refuses(query: str, reason: str) -> None:
    fix = o.parse_query(query)
    assert reason_of(lambda: o.to_telemetry(fix, vehicle_id="van-3", received_ms=T0_MS)) == reason
