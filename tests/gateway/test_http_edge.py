"""Phone trackers on the device edge (gateway.http_edge) over real HTTP, with real Kafka and Redis:
Traccar Client's OsmAnd requests admitted by their device id's binding, OwnTracks' HTTP mode by its
vehicle's login; each answered only once Kafka has the fix; an unusable fix of a known vehicle
dead-lettered with its reason and answered; an unknown sender refused with nothing stored; and no
answer at all while the sender cannot be checked."""

from __future__ import annotations

import socket
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime

import httpx
import orjson
import pytest

from fleetfence.devices import TrackerProtocol
from fleetfence.kafka import ensure_topics, topic_specs
from fleetfence.probes import free_port
from fleetfence.settings import Settings
from gateway.edge import EdgeGateway
from gateway.settings import GatewaySettings
from tests.gateway.helpers import gw_settings, records_of
from vehicle_master.credentials import VehicleCredentials
from vehicle_master.trackers import VehicleTrackers

pytestmark = pytest.mark.services

T0_S = int(time.time()) - 60  # a minute ago: inside the contract's time bounds


@pytest.fixture
def gs(settings: Settings) -> GatewaySettings:
    ensure_topics(settings.bootstrap_servers, topic_specs(settings))
    return gw_settings(settings, gateway_http_port=0, gateway_edge_recheck_s=0.5)


@pytest.fixture
def client(edge: EdgeGateway) -> Iterator[httpx.Client]:
    assert edge.http_port
    with httpx.Client(base_url=f"http://127.0.0.1:{edge.http_port}", timeout=15) as c:
        yield c


def test_traccar_client_is_answered_once_kafka_has_its_fix(
    gs: GatewaySettings,
    edge: EdgeGateway,
    trackers: VehicleTrackers,
    creds: VehicleCredentials,
    client: httpx.Client,
) -> None:
    vid, device = f"hv{uuid.uuid4().hex[:6]}", f"{uuid.uuid4().int % 10**8}"
    trackers.bind(vid, TrackerProtocol.OSMAND, device)
    _, secret = creds.issue(vid)
    url = f"/key/{secret}"  # the server URL as entered in the app; it appends its parameters
    query = {"id": device, "lat": "60.17", "lon": "24.94", "timestamp": str(T0_S), "speed": "10"}
    first = client.get(url, params=query)
    assert first.status_code == 200
    assert edge.in_flight == 0, "answered after Kafka confirmed the fix"
    # Traccar Client 9's JSON body (speed in m/s), and the first request sent again.
    body = {
        "device_id": device,
        "location": {
            "timestamp": datetime.fromtimestamp(T0_S + 30, UTC).isoformat().replace("+00:00", "Z"),
            "coords": {"latitude": 60.18, "longitude": 24.95, "speed": 5, "heading": 90, "accuracy": 8},
            "battery": {"level": 0.5},
        },
    }
    assert client.post(url, json=body).status_code == 200
    assert client.get("/", params=query, auth=("any", secret)).status_code == 200  # the secret by Basic
    # A bound device's unusable fix (no time) is its vehicle's dead letter, and answered.
    bad = client.post(url, data={"id": device, "lat": "60.17", "lon": "24.94"})
    assert bad.status_code == 200

    got = records_of(gs, vid, 4)
    fixes = [orjson.loads(r.value) for r in got if r.topic == gs.topics.telemetry]
    json_ms = (T0_S + 30) * 1000
    assert sorted(f["seq"] for f in fixes) == [T0_S * 1000, T0_S * 1000, json_ms]
    assert all(f["vehicle_id"] == vid for f in fixes)
    speeds = {f["seq"]: round(f["speed_kmh"], 2) for f in fixes}
    assert speeds == {T0_S * 1000: 18.52, json_ms: 18.0}  # 10 kn; 5 m/s
    (letter,) = [r for r in got if r.topic == gs.topics.telemetry_dlq]
    assert letter.headers["reason"] == b"missing_field"
    assert letter.headers["tracker"] == f"osmand:{device}".encode()
    s = edge.stats
    assert s.tracker_records == {
        ("osmand", "received"): 4,
        ("osmand", "forwarded"): 3,
        ("osmand", "dead_lettered"): 1,
    }
    assert s.received == s.forwarded + s.dead_lettered_total == 4


def test_unknown_senders_are_refused_and_nothing_is_stored(
    gs: GatewaySettings,
    edge: EdgeGateway,
    trackers: VehicleTrackers,
    creds: VehicleCredentials,
    client: httpx.Client,
) -> None:
    fix = {"lat": "60.17", "lon": "24.94", "timestamp": str(T0_S)}
    assert client.get("/", params=fix).status_code == 400  # no device id
    assert client.get("/", params={**fix, "id": "nobody-bound"}).status_code == 403
    assert client.put("/", params={**fix, "id": "x"}).status_code == 405

    vid, device = f"hd{uuid.uuid4().hex[:6]}", f"{uuid.uuid4().int % 10**8}"
    trackers.bind(vid, TrackerProtocol.OSMAND, device)
    _, secret = creds.issue(vid)
    _, another = creds.issue(f"hx{uuid.uuid4().hex[:6]}")
    # Knowing a bound device id is not enough: its vehicle's secret comes with it.
    assert client.get("/", params={**fix, "id": device}).status_code == 401
    assert client.get(f"/key/{another}", params={**fix, "id": device}).status_code == 401
    creds.disable(vid)
    assert client.get(f"/key/{secret}", params={**fix, "id": device}).status_code == 403, "disabled"

    location = {"_type": "location", "tst": T0_S, "lat": 60.17, "lon": 24.94}
    assert client.post("/owntracks", json=location).status_code == 401  # no login
    other = f"ho{uuid.uuid4().hex[:6]}"
    _, secret = creds.issue(other)
    wrong = client.post("/owntracks", json=location, auth=(other, secret + "x"))
    assert wrong.status_code == 401
    assert "www-authenticate" in wrong.headers
    assert edge.stats.received == 0
    assert edge.stats.logins_refused == {
        "osmand:unknown_device": 1,
        "osmand:no_credentials_given": 1,
        "osmand:bad_secret": 1,
        "osmand:not_active": 1,
        "owntracks:no_credentials_given": 1,
        "owntracks:bad_secret": 1,
    }


def test_owntracks_logs_in_as_its_vehicle_and_is_cut_off_when_revoked(
    gs: GatewaySettings, edge: EdgeGateway, creds: VehicleCredentials, client: httpx.Client
) -> None:
    vid = f"hw{uuid.uuid4().hex[:6]}"
    _, secret = creds.issue(vid)
    location = {"_type": "location", "tst": T0_S, "lat": 60.17, "lon": 24.94, "vel": 36, "tid": "ab"}
    ok = client.post("/owntracks", json=location, auth=(vid, secret))
    assert (ok.status_code, ok.json()) == (200, [])
    # A message that carries no fix is answered and produces nothing (`/pub/`: the Recorder's path,
    # a trailing slash or not).
    card = client.post("/pub/", json={"_type": "card", "name": "van"}, auth=(vid, secret))
    assert (card.status_code, card.json()) == (200, [])
    (fix,) = [orjson.loads(r.value) for r in records_of(gs, vid, 1)]
    assert (fix["vehicle_id"], fix["seq"], fix["speed_kmh"]) == (vid, T0_S * 1000, 36.0)

    creds.disable(vid)
    # The login is read again after `gateway_edge_recheck_s` (0.5 s): from then on, refused.
    deadline = time.monotonic() + 10
    while (code := client.post("/owntracks", json=location, auth=(vid, secret)).status_code) == 200:
        assert time.monotonic() < deadline, "a disabled vehicle still posts after 10 s"
    assert code == 401
    assert edge.stats.tracker_records[("owntracks", "ignored")] == 1


def test_pipelined_requests_are_answered_in_order(
    gs: GatewaySettings, edge: EdgeGateway, trackers: VehicleTrackers, creds: VehicleCredentials
) -> None:
    vid, device = f"hp{uuid.uuid4().hex[:6]}", f"{uuid.uuid4().int % 10**8}"
    trackers.bind(vid, TrackerProtocol.OSMAND, device)
    _, secret = creds.issue(vid)
    target = f"/key/{secret}?id={device}&lon=24.9"
    requests = b"".join(
        f"GET {target}&lat=60.1{i}&timestamp={T0_S + i} HTTP/1.1\r\nHost: e\r\n\r\n".encode()
        for i in range(3)
    )
    assert edge.http_port
    with socket.create_connection(("127.0.0.1", edge.http_port), timeout=15) as sock:
        sock.sendall(requests + b"GET /?lat=1 HTTP/1.1\r\nHost: e\r\nConnection: close\r\n\r\n")
        answers = b""
        while chunk := sock.recv(65536):
            answers += chunk
    statuses = [line.split()[1] for line in answers.split(b"\r\n") if line.startswith(b"HTTP/1.1 ")]
    assert statuses == [b"200", b"200", b"200", b"400"]
    got = records_of(gs, vid, 3)
    assert [orjson.loads(r.value)["seq"] for r in got] == [(T0_S + i) * 1000 for i in range(3)]

    # Behind a held request, a target no URL parser takes: that connection is closed with its own
    # answer given, and the edge goes on answering everybody else.
    with socket.create_connection(("127.0.0.1", edge.http_port), timeout=15) as sock:
        sock.sendall(
            f"GET {target}&lat=60.2&timestamp={T0_S + 9} HTTP/1.1\r\nHost: e\r\n\r\n".encode()
            + b"GET //[x HTTP/1.1\r\nHost: e\r\n\r\n"
        )
        answers = b""
        while chunk := sock.recv(65536):
            answers += chunk
    assert answers.startswith(b"HTTP/1.1 200 "), answers
    again = f"GET {target}&lat=60.3&timestamp={T0_S + 10} HTTP/1.1\r\nHost: e\r\nConnection: close\r\n\r\n"
    with socket.create_connection(("127.0.0.1", edge.http_port), timeout=15) as sock:
        sock.sendall(again.encode())
        assert sock.recv(65536).startswith(b"HTTP/1.1 200 ")

    # A body over the contract's bound is refused by its announced length, before it is read.
    with socket.create_connection(("127.0.0.1", edge.http_port), timeout=15) as sock:
        sock.sendall(f"POST {target} HTTP/1.1\r\nHost: e\r\nContent-Length: 100000\r\n\r\n".encode())
        assert sock.recv(65536).startswith(b"HTTP/1.1 413 ")
    assert edge.stats.protocol_errors["http:too_large"] == 1


def test_no_answer_while_the_sender_cannot_be_checked(settings: Settings) -> None:
    """The vehicle master unreachable: the request is not answered (a phone sends it again; an
    error status would make OwnTracks drop the fix), and nothing is stored."""
    ensure_topics(settings.bootstrap_servers, topic_specs(settings))
    gs = gw_settings(
        settings, gateway_http_port=0, redis_url=f"redis://127.0.0.1:{free_port()}/0", mqtt_auth=True
    )
    edge = EdgeGateway(gs)
    edge.start()
    try:
        assert edge.http_port
        with (
            httpx.Client(base_url=f"http://127.0.0.1:{edge.http_port}", timeout=15) as c,
            pytest.raises(httpx.RemoteProtocolError),
        ):
            c.get("/", params={"id": "d1", "lat": "60", "lon": "24", "timestamp": str(T0_S)})
    finally:
        edge.stop(drain_timeout_s=5)
    assert edge.stats.logins_refused == {"osmand:unavailable": 1}
    assert edge.stats.received == 0
