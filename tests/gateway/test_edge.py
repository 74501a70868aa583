"""The device edge (gateway.edge) with real paho clients, real Kafka and real Redis: a vehicle's PUBACK
is sent only once Kafka has its fix, logins are the vehicle master's, a device speaks only for
itself, and a breach of the protocol costs its own connection and nothing else."""

from __future__ import annotations

import ipaddress
import socket
import ssl
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import orjson
import paho.mqtt.client as mqtt
import pytest
import redis
from paho.mqtt.enums import CallbackAPIVersion
from paho.mqtt.reasoncodes import ReasonCode

from cli.status import collect
from fleetfence import heard
from fleetfence.contracts import telemetry_topic
from fleetfence.kafka import ensure_topics, topic_specs
from fleetfence.pki import CertPlan, bootstrap_certs
from fleetfence.readmodels import ReadKeys
from fleetfence.settings import Settings
from fleetfence.testing import wait_for
from gateway.edge import EdgeGateway
from gateway.settings import GatewaySettings
from gateway.testing import TopicReader, fix
from tests.gateway.helpers import gw_settings
from vehicle_master.credentials import VehicleCredentials

pytestmark = pytest.mark.services


class Device:
    """A vehicle's paho client on the edge: the answers to its logins, its PUBACKs by message id."""

    def __init__(
        self,
        port: int,
        user: str | None,
        secret: str | None,
        protocol: Any = mqtt.MQTTv5,
        *,
        host: str = "127.0.0.1",
        tls_ca: Path | None = None,
    ) -> None:
        self.logins: list[ReasonCode] = []
        self.disconnects: list[ReasonCode] = []
        self.pubacks: dict[int, ReasonCode | None] = {}
        self.acked_order: list[int] = []  # message ids in the order their PUBACKs came
        self.lock = threading.Lock()
        self.c = mqtt.Client(
            CallbackAPIVersion.VERSION2, client_id=f"dev-{uuid.uuid4().hex[:8]}", protocol=protocol
        )
        if tls_ca is not None:
            self.c.tls_set(ca_certs=str(tls_ca))
        if user is not None:
            self.c.username_pw_set(user, secret)
        self.c.reconnect_delay_set(min_delay=1, max_delay=1)
        self.c.on_connect = lambda _c, _u, _f, rc, _p: self._add(self.logins, rc)
        self.c.on_disconnect = lambda _c, _u, _f, rc, _p: self._add(self.disconnects, rc)
        self.c.on_publish = self._on_publish
        self.c.connect(host, port, keepalive=30)
        self.c.loop_start()
        wait_for(lambda: self.logins, 10, "the edge's answer to the login")

    def _add(self, into: list[ReasonCode], rc: ReasonCode) -> None:
        with self.lock:
            into.append(rc)

    def _on_publish(self, _c: Any, _u: Any, mid: int, rc: ReasonCode | None, _p: Any) -> None:
        with self.lock:
            self.pubacks[mid] = rc
            self.acked_order.append(mid)

    def publish(self, topic: str, payload: bytes, qos: int = 1) -> int:
        return self.c.publish(topic, payload, qos=qos).mid

    def puback(self, mid: int) -> ReasonCode | None:
        wait_for(lambda: mid in self.pubacks, 15, f"PUBACK of message {mid}")
        return self.pubacks[mid]

    def close(self) -> None:
        self.c.loop_stop()
        self.c.disconnect()


@pytest.fixture
def gs(settings: Settings) -> GatewaySettings:
    ensure_topics(settings.bootstrap_servers, topic_specs(settings))
    return gw_settings(settings, gateway_edge_port=0, gateway_edge_recheck_s=0.5)


def records_until(gs: GatewaySettings, done: Any, what: str) -> list[tuple[str, bytes, dict[str, Any]]]:
    """(topic, key, value) of the telemetry topic and its dead letters, once `done(records)`; a
    dead letter's value is its headers (its bytes are the original message's)."""
    reader = TopicReader(gs.bootstrap_servers, [gs.topics.telemetry, gs.topics.telemetry_dlq])
    try:
        reader.read_until(done, 30, what)
        return [
            (
                r.topic,
                r.key,
                {k: v.decode() for k, v in r.headers.items()}
                if r.topic == gs.topics.telemetry_dlq
                else orjson.loads(r.value),
            )
            for r in reader.records
        ]
    finally:
        reader.close()


@pytest.mark.parametrize("protocol", [mqtt.MQTTv5, mqtt.MQTTv311], ids=["mqtt5", "mqtt311"])
def test_fixes_reach_kafka_before_their_puback(
    gs: GatewaySettings, edge: EdgeGateway, creds: VehicleCredentials, protocol: Any
) -> None:
    vid = f"e{uuid.uuid4().hex[:6]}"
    _rec, secret = creds.issue(vid)
    d = Device(edge.port or 0, vid, secret, protocol)
    try:
        assert not d.logins[0].is_failure
        mids = [d.publish(telemetry_topic(vid), orjson.dumps(fix(vid, seq))) for seq in range(200)]
        qos0 = d.publish(telemetry_topic(vid), orjson.dumps(fix(vid, 200)), qos=0)
        qos2 = d.publish(telemetry_topic(vid), orjson.dumps(fix(vid, 201)), qos=2)
        for mid in [*mids, qos2]:
            rc = d.puback(mid)
            assert rc is None or not rc.is_failure
        del qos0
        got = records_until(
            gs,
            lambda rs: {orjson.loads(r.value)["seq"] for r in rs if r.key == vid.encode()} >= set(range(202)),
            "every fix of the device",
        )
        seqs = sorted(v["seq"] for t, k, v in got if t == gs.topics.telemetry and k == vid.encode())
        assert seqs == list(range(202))
        s = edge.stats
        wait_for(lambda: edge.in_flight == 0, 10, "nothing in flight")
        assert s.received == s.forwarded == 202
        assert s.acked == 201  # every QoS 1 and 2 message, not the QoS 0 one
        assert s.dead_lettered_total == 0
    finally:
        d.close()


def test_logins_are_the_vehicle_masters(
    gs: GatewaySettings, edge: EdgeGateway, creds: VehicleCredentials
) -> None:
    run = uuid.uuid4().hex[:6]
    a, b = f"la{run}", f"lb{run}"
    _r, secret_a = creds.issue(a)
    _r, secret_b = creds.issue(b)
    creds.disable(b)
    port = edge.port or 0
    cases = [
        (None, None, "Bad user name or password"),
        (a, "not-the-secret", "Bad user name or password"),
        (f"nobody{run}", "x", "Bad user name or password"),
        (b, secret_b, "Not authorized"),  # disabled
    ]
    for user, secret, answer in cases:
        d = Device(port, user, secret)
        try:
            assert d.logins[0].is_failure
            assert d.logins[0].getName() == answer
        finally:
            d.close()
    d311 = Device(port, a, "wrong", mqtt.MQTTv311)
    try:
        assert d311.logins[0].is_failure  # 3.1.1's return code 4
    finally:
        d311.close()
    refused = edge.stats.logins_refused
    assert refused == {"no_credentials_given": 1, "bad_secret": 2, "unknown_device": 1, "not_active": 1}

    # Logged in, then disabled: disconnected at the next re-check; rotated: the old secret is void.
    d = Device(port, a, secret_a)
    try:
        assert not d.logins[0].is_failure
        creds.rotate(a)
        wait_for(lambda: d.disconnects, 10, "the rotated device to be disconnected")
        wait_for(lambda: len(d.logins) >= 2, 10, "paho's reconnect with the old secret")
        assert d.logins[-1].getName() == "Bad user name or password"
    finally:
        d.close()


def test_a_device_speaks_only_for_itself(
    gs: GatewaySettings, edge: EdgeGateway, creds: VehicleCredentials
) -> None:
    run = uuid.uuid4().hex[:6]
    a, b = f"sa{run}", f"sb{run}"
    _r, secret = creds.issue(a)
    d = Device(edge.port or 0, a, secret)
    try:
        forged = d.publish(telemetry_topic(b), orjson.dumps(fix(b, 1)))
        other = d.publish("fleet/commands", b"{}")
        bad = d.publish(telemetry_topic(a), b"not json")
        good = d.publish(telemetry_topic(a), orjson.dumps(fix(a, 2)))
        rc_forged, rc_other = d.puback(forged), d.puback(other)
        assert rc_forged is not None
        assert rc_forged.getName() == "Not authorized"
        assert rc_other is not None
        assert rc_other.getName() == "Not authorized"
        rc_bad, rc_good = d.puback(bad), d.puback(good)
        assert rc_bad is None or not rc_bad.is_failure  # dead-lettered: taken, with its reason
        assert rc_good is None or not rc_good.is_failure
        subacks: list[list[ReasonCode]] = []
        d.c.on_subscribe = lambda _c, _u, _m, rcs, _p: subacks.append(rcs)
        d.c.subscribe(f"fleet/{a}/alerts", qos=1)
        wait_for(lambda: subacks, 10, "the SUBACK")
        assert subacks[0][0].is_failure  # the edge publishes nothing to devices
        got = records_until(gs, lambda rs: len(rs) >= 4, "four records")
    finally:
        d.close()
    dlq = sorted((v.get("reason") or "", k.decode()) for t, k, v in got if t == gs.topics.telemetry_dlq)
    assert [r for r, _k in dlq] == ["forbidden_topic", "forbidden_topic", "not_json"]
    assert [v["seq"] for t, _k, v in got if t == gs.topics.telemetry] == [2]
    s = edge.stats
    assert s.received == s.forwarded + s.dead_lettered_total == 4
    assert s.dead_lettered == {"forbidden_topic": 2, "not_json": 1}


def test_protocol_breaches_cost_only_their_connection(
    gs: GatewaySettings, edge: EdgeGateway, creds: VehicleCredentials
) -> None:
    vid = f"p{uuid.uuid4().hex[:6]}"
    _r, secret = creds.issue(vid)
    port = edge.port or 0
    good = Device(port, vid, secret)
    try:
        breaches = [
            b"\x30\x05hello",  # PUBLISH before CONNECT
            b"\x10\xff\xff\xff\xff\x01",  # a length of five bytes
            b"\x10" + (10_000_000).to_bytes(4, "little")[:3] + b"\x05",  # a CONNECT of megabytes
            b"GET / HTTP/1.1\r\nHost: x\r\n\r\n",
        ]
        for raw in breaches:
            with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
                sock.sendall(raw)
                sock.settimeout(10)
                rest = b""
                while chunk := sock.recv(4096):  # the edge closes it: recv returns b"" (EOF)
                    rest += chunk
                assert len(rest) <= 8, rest  # at most a CONNACK refusal
        # An unsupported protocol level gets its CONNACK (3.1.1 code 1) before the close.
        with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
            sock.sendall(b"\x10\x0c\x00\x04MQTT\x09\x02\x00\x1e\x00\x00")
            assert sock.recv(16) == b"\x20\x02\x00\x01"
        mid = good.publish(telemetry_topic(vid), orjson.dumps(fix(vid, 1)))
        rc = good.puback(mid)
        assert rc is None or not rc.is_failure
        assert not good.disconnects
        assert sum(edge.stats.protocol_errors.values()) == len(breaches) + 1
    finally:
        good.close()


def test_a_newer_connection_of_a_device_takes_over(
    gs: GatewaySettings, edge: EdgeGateway, creds: VehicleCredentials
) -> None:
    vid = f"t{uuid.uuid4().hex[:6]}"
    _r, secret = creds.issue(vid)
    first = Device(edge.port or 0, vid, secret)
    try:
        first.c.reconnect_delay_set(min_delay=60, max_delay=60)  # it stays away once taken over
        second = Device(edge.port or 0, vid, secret)
        try:
            wait_for(lambda: first.disconnects, 10, "the first connection closed")
            assert first.disconnects[0].getName() == "Session taken over"
            assert edge.devices_connected == 1
            assert edge.stats.sessions_taken_over == 1
            rc = second.puback(second.publish(telemetry_topic(vid), orjson.dumps(fix(vid, 1))))
            assert rc is None or not rc.is_failure
        finally:
            second.close()
    finally:
        first.close()


class _Quiet:
    """A bootstrap report nobody reads."""

    def step(self, verb: str, text: str) -> None:
        del verb, text

    def note(self, text: str) -> None:
        del text

    def warning(self, text: str) -> None:
        del text


def test_tls_listener_with_the_brokers_server_pair(
    gs: GatewaySettings, creds: VehicleCredentials, tmp_path: Path
) -> None:
    """The edge's TLS port serves the server pair `fleetfence mqtt bootstrap --certs-dir` makes; a
    vehicle that trusts the CA logs in and is acknowledged, one that does not is refused by TLS."""
    certs = tmp_path / "certs"
    plan = CertPlan(
        certs_dir=certs,
        ca_key=tmp_path / "ca.key",
        names=["localhost"],
        ips=[ipaddress.IPv4Address("127.0.0.1")],
        days=30,
        ca_days=365,
        owner=None,
    )
    bootstrap_certs(plan, _Quiet())
    edge = EdgeGateway(gs.model_copy(update={"gateway_edge_tls_port": 0, "mqtt_tls_dir": certs}))
    edge.start()
    vid = f"tls{uuid.uuid4().hex[:6]}"
    _r, secret = creds.issue(vid)
    try:
        assert edge.tls_port is not None
        d = Device(edge.tls_port, vid, secret, host="localhost", tls_ca=certs / "ca.crt")
        try:
            assert not d.logins[0].is_failure
            rc = d.puback(d.publish(telemetry_topic(vid), orjson.dumps(fix(vid, 1))))
            assert rc is None or not rc.is_failure
        finally:
            d.close()
        untrusting = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=f"{vid}-x", protocol=mqtt.MQTTv5)
        untrusting.tls_set()  # the system's CAs: the edge's CA is not among them
        with pytest.raises(ssl.SSLError):
            untrusting.connect("localhost", edge.tls_port, keepalive=30)
        assert edge.stats.forwarded == 1
    finally:
        edge.stop(drain_timeout_s=5)


def test_owntracks_over_mqtt_speaks_for_its_login_and_ignores_what_is_not_a_fix(
    gs: GatewaySettings, edge: EdgeGateway, creds: VehicleCredentials
) -> None:
    """The OwnTracks app pointed at the edge (MQTT 3.1.1, its username the vehicle id, its password
    the vehicle's secret) publishes on `owntracks/<user>/<device>`: a location becomes the vehicle's
    telemetry before its PUBACK; a malformed one a dead letter with its reason; its other messages
    (an lwt, a transition on a sub-topic) are acknowledged and counted as ignored; another user's
    topic is refused like another vehicle's."""
    run = uuid.uuid4().hex[:6]
    vid, other = f"ot{run}", f"ou{run}"
    _r, secret = creds.issue(vid)
    now_s = int(time.time())
    loc = {"_type": "location", "tst": now_s, "lat": 52.52, "lon": 13.405, "vel": 36, "cog": 90, "acc": 12}
    d = Device(edge.port or 0, vid, secret, mqtt.MQTTv311)
    try:
        mids = [
            d.publish(f"owntracks/{vid}/phone", orjson.dumps({**loc, "tid": "ph", "batt": 80})),
            d.publish(f"owntracks/{vid}/phone", orjson.dumps({"_type": "lwt", "tst": now_s})),
            d.publish(f"owntracks/{vid}/phone/event", orjson.dumps({"_type": "transition", "tst": now_s})),
            d.publish(f"owntracks/{other}/phone", orjson.dumps(loc)),
            d.publish(
                f"owntracks/{vid}/phone", orjson.dumps({"_type": "location", "tst": now_s, "lon": 13.4})
            ),
            d.publish(f"owntracks/{vid}/phone", orjson.dumps({**loc, "tst": now_s + 1, "lat": 52.53})),
        ]
        for mid in mids:
            d.puback(mid)
        # In receive order (MQTT 5 section 4.6): the ignored messages' PUBACKs waited for the fix
        # before them to be in Kafka.
        assert d.acked_order == mids
        got = records_until(gs, lambda rs: len(rs) >= 4, "four records")
    finally:
        d.close()
    fixes = [(k.decode(), v) for t, k, v in got if t == gs.topics.telemetry]
    assert [k for k, _v in fixes] == [vid, vid]
    first, second = (v for _k, v in fixes)
    assert (first["vehicle_id"], first["ts_ms"], first["lat"], first["speed_kmh"]) == (
        vid,
        now_s * 1000,
        52.52,
        36,
    )
    assert first["heading_deg"] == 90
    assert first["accuracy_m"] == 12
    assert second["ts_ms"] == (now_s + 1) * 1000
    assert second["seq"] > first["seq"]  # the fix's time orders a phone's fixes
    dlq = sorted(v["reason"] for t, _k, v in got if t == gs.topics.telemetry_dlq)
    assert dlq == ["forbidden_topic", "missing_field"]
    s = edge.stats
    assert s.received == s.forwarded + s.dead_lettered_total == 4
    counts = {outcome: n for (protocol, outcome), n in s.tracker_records.items() if protocol == "owntracks"}
    assert counts == {"received": 4, "forwarded": 2, "dead_lettered": 2, "ignored": 2}


def test_the_edge_notes_which_protocol_each_vehicle_last_spoke(
    gs: GatewaySettings, edge: EdgeGateway, creds: VehicleCredentials
) -> None:
    """A vehicle heard over FleetFence's MQTT, then through its OwnTracks app: the read model says
    `owntracks` as soon as the protocol changes (without waiting for the 30 s rewrite), and
    `fleetfence status` counts it under that protocol only."""
    vid = f"hd{uuid.uuid4().hex[:6]}"
    _r, secret = creds.issue(vid)
    keys = ReadKeys(gs.redis_prefix)
    r = redis.Redis.from_url(gs.redis_dsn)
    d = Device(edge.port or 0, vid, secret, mqtt.MQTTv311)
    try:
        d.puback(d.publish(telemetry_topic(vid), orjson.dumps(fix(vid, 1))))
        wait_for(lambda: heard.heard_of(r, keys, vid) is not None, 10, "the vehicle heard over MQTT")
        first = heard.heard_of(r, keys, vid)
        assert first is not None
        assert (first.protocol, first.replica) == ("mqtt", edge.client_id)
        loc = {"_type": "location", "tst": int(time.time()), "lat": 52.52, "lon": 13.405}
        d.puback(d.publish(f"owntracks/{vid}/phone", orjson.dumps(loc)))

        def spoke_owntracks() -> bool:
            h = heard.heard_of(r, keys, vid)
            return h is not None and h.protocol == "owntracks"

        wait_for(spoke_owntracks, 10, "the vehicle heard through OwnTracks")
        counts = collect(gs).heard
        assert counts is not None
        assert counts["owntracks"] >= 1
        assert r.zscore(keys.heard_by("owntracks"), vid) is not None
        assert r.zscore(keys.heard_by("mqtt"), vid) is None  # one protocol per vehicle: its last
    finally:
        d.close()
        r.close()
