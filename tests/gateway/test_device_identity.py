"""Device identity (#25) on the real Mosquitto (dynamic-security plugin), the real gateway and Kafka:
each vehicle logs in with its own credentials and may publish only its own telemetry; anonymous
and forged clients are refused by the broker itself, so nothing they send reaches Kafka; a
disabled, revoked or rotated secret cuts a connected vehicle off at once."""

from __future__ import annotations

import threading
import uuid
from typing import Any

import orjson
import paho.mqtt.client as mqtt
import pytest
from paho.mqtt.enums import CallbackAPIVersion
from paho.mqtt.reasoncodes import ReasonCode

from fleetfence.contracts import telemetry_topic
from fleetfence.settings import Settings
from fleetfence.testing import wait_for
from gateway.service import Gateway
from gateway.settings import GatewaySettings
from gateway.testing import TopicReader, fix
from vehicle_master.credentials import CredentialStatus, VehicleCredentials
from vehicle_master.errors import CredentialsExistError, NoCredentialsError

pytestmark = pytest.mark.services


class Tracker:
    """A vehicle's MQTT 5 client: what the broker answered to its logins and publishes."""

    def __init__(self, s: Settings, username: str | None, password: str | None) -> None:
        self.logins: list[ReasonCode] = []
        self.disconnects: list[ReasonCode] = []
        self.pubacks: dict[int, ReasonCode] = {}
        self.lock = threading.Lock()
        self.c = mqtt.Client(
            CallbackAPIVersion.VERSION2, client_id=f"trk-{uuid.uuid4().hex[:8]}", protocol=mqtt.MQTTv5
        )
        if username is not None:
            self.c.username_pw_set(username, password)
        self.c.reconnect_delay_set(min_delay=1, max_delay=1)
        self.c.on_connect = lambda _c, _u, _f, rc, _p: self._add(self.logins, rc)
        self.c.on_disconnect = lambda _c, _u, _f, rc, _p: self._add(self.disconnects, rc)
        self.c.on_publish = self._on_publish
        self.c.connect(*s.mqtt_host_port, keepalive=30)
        self.c.loop_start()
        wait_for(lambda: self.logins, 10, "the broker's answer to the login")

    def _add(self, into: list[ReasonCode], rc: ReasonCode) -> None:
        with self.lock:
            into.append(rc)

    def _on_publish(self, _c: Any, _u: Any, mid: int, rc: ReasonCode, _p: Any) -> None:
        with self.lock:
            self.pubacks[mid] = rc

    @property
    def logged_in(self) -> bool:
        return (
            bool(self.logins) and not self.logins[-1].is_failure and len(self.disconnects) < len(self.logins)
        )

    def publish(self, vehicle_id: str, seq: int, topic_of: str | None = None) -> int:
        """Publish a fix of `vehicle_id` to `topic_of`'s telemetry topic (its own by default)."""
        topic = telemetry_topic(topic_of or vehicle_id)
        return self.c.publish(topic, orjson.dumps(fix(vehicle_id, seq)), qos=1).mid

    def puback(self, mid: int) -> ReasonCode:
        return wait_for(lambda: self.pubacks.get(mid), 10, f"PUBACK of message {mid}")

    def close(self) -> None:
        self.c.loop_stop()
        self.c.disconnect()


def read_telemetry(gs: GatewaySettings, until_key: str, until_seq: int) -> list[tuple[bytes, dict[str, Any]]]:
    """Every record of the telemetry topic and its dead letters, once `until_key`'s fix `until_seq`
    is there (a barrier: what was published before it on the same connection is there too)."""
    reader = TopicReader(gs.bootstrap_servers, [gs.topics.telemetry, gs.topics.telemetry_dlq])
    try:
        reader.read_until(
            lambda rs: any(
                r.key == until_key.encode() and orjson.loads(r.value).get("seq") == until_seq for r in rs
            ),
            30,
            f"{until_key}'s fix {until_seq}",
        )
        return [(r.key, orjson.loads(r.value)) for r in reader.records]
    finally:
        reader.close()


def test_a_vehicle_speaks_only_for_itself(
    gs: GatewaySettings, gateway: Gateway, creds: VehicleCredentials
) -> None:
    run = uuid.uuid4().hex[:6]
    a, b = f"ida{run}", f"idb{run}"
    _rec, secret_a = creds.issue(a)
    creds.issue(b)
    with pytest.raises(CredentialsExistError):
        creds.issue(a)  # active credentials are rotated, not issued twice

    # Anonymous clients and wrong secrets are refused at CONNECT.
    for username, password in ((None, None), (a, "not-the-secret"), (f"nobody{run}", "x")):
        t = Tracker(gs, username, password)
        try:
            assert t.logins[0].is_failure
            assert t.logins[0].getName() == "Not authorized"
        finally:
            t.close()

    tracker = Tracker(gs, a, secret_a)
    try:
        assert tracker.logged_in
        assert not tracker.puback(tracker.publish(a, 1)).is_failure
        # A may read its own alerts, not B's.
        subacks: list[list[ReasonCode]] = []
        tracker.c.on_subscribe = lambda _c, _u, _m, rcs, _p: subacks.append(rcs)
        tracker.c.subscribe(f"fleet/{b}/alerts", qos=1)
        tracker.c.subscribe(f"fleet/{a}/alerts", qos=1)
        wait_for(lambda: len(subacks) == 2, 10, "two SUBACKs")
        assert subacks[0][0].getName() == "Not authorized"
        assert not subacks[1][0].is_failure
        # A's credentials on B's topic, claiming to be B: the broker refuses it (MQTT 5 PUBACK
        # reason "Not authorized") and routes it nowhere. (Mosquitto 2.0.11 then drops the
        # connection; the tracker logs in again.)
        forged = tracker.puback(tracker.publish(b, 1, topic_of=b))
        assert forged.getName() == "Not authorized"
        # A barrier: A's second fix, after the refusal.
        assert not tracker.puback(tracker.publish(a, 2)).is_failure
    finally:
        tracker.close()
    records = read_telemetry(gs, a, 2)
    assert [(k, d["seq"]) for k, d in records if k in (a.encode(), b.encode())] == [
        (a.encode(), 1),
        (a.encode(), 2),
    ]
    assert gateway.stats.dead_lettered_total == 0


def test_disable_revoke_and_rotate_cut_a_connected_vehicle_off(
    gs: GatewaySettings, gateway: Gateway, creds: VehicleCredentials
) -> None:
    run = uuid.uuid4().hex[:6]
    v, w = f"idv{run}", f"idw{run}"
    _rec, secret = creds.issue(v)
    _rec, secret_w = creds.issue(w)
    witness = Tracker(gs, w, secret_w)
    tracker = Tracker(gs, v, secret)
    try:
        assert not tracker.puback(tracker.publish(v, 1)).is_failure

        # Disabled: the connected vehicle is disconnected at once and cannot log in again; what
        # it publishes meanwhile stays in its own queue and never reaches Kafka.
        assert creds.disable(v).status is CredentialStatus.DISABLED
        wait_for(lambda: tracker.disconnects, 10, "the disabled vehicle to be disconnected")
        tracker.publish(v, 2)
        tracker.publish(v, 3)
        wait_for(lambda: len(tracker.logins) >= 2, 10, "a refused reconnection")
        assert tracker.logins[-1].getName() == "Not authorized"
        assert not witness.puback(witness.publish(w, 1)).is_failure
        assert creds.enable(v).status is CredentialStatus.ACTIVE
        tracker.close()

        # Rotated: the old secret stops working at once, the new one works.
        tracker = Tracker(gs, v, secret)
        assert tracker.logged_in
        rec, new_secret = creds.rotate(v)
        assert rec.rotated_ms is not None
        assert new_secret != secret
        wait_for(lambda: tracker.disconnects, 10, "the old secret's connection to be dropped")
        tracker.close()
        old = Tracker(gs, v, secret)
        assert old.logins[0].getName() == "Not authorized"
        old.close()
        tracker = Tracker(gs, v, new_secret)
        assert tracker.logged_in
        assert not tracker.puback(tracker.publish(v, 4)).is_failure

        # Revoked: cut off at once, the account is gone; issuing again gives a new secret.
        assert creds.revoke(v) is not None
        wait_for(lambda: tracker.disconnects, 10, "the revoked vehicle to be disconnected")
        tracker.publish(v, 5)
        wait_for(lambda: len(tracker.logins) >= 2, 10, "a refused reconnection")
        assert tracker.logins[-1].getName() == "Not authorized"
        with pytest.raises(NoCredentialsError):
            creds.rotate(v)
        got = creds.get(v)
        assert got is not None
        assert got.status is CredentialStatus.REVOKED
        assert not witness.puback(witness.publish(w, 2)).is_failure
    finally:
        tracker.close()
        witness.close()
    records = read_telemetry(gs, w, 2)
    assert sorted(d["seq"] for k, d in records if k == v.encode()) == [1, 4]
