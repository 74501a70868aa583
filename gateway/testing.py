"""Helpers shared by the gateway's tests and benchmark: publishing, reading Kafka back, waiting.

They talk to real servers only; waiting is always "poll a condition until a deadline".
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import orjson
import paho.mqtt.client as mqtt
from confluent_kafka import TopicPartition
from paho.mqtt.enums import CallbackAPIVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from fleetfence.kafka import admin_client, group_consumer
from fleetfence.mqtt import Account, account_env, login
from fleetfence.settings import Settings
from fleetfence.testing import mqtt_test_account, wait_for
from gateway.settings import GatewaySettings


def fix(vehicle_id: str, seq: int, ts_ms: int | None = None, **extra: object) -> dict[str, object]:
    """A valid telemetry payload (as a dict)."""
    d: dict[str, object] = {
        "vehicle_id": vehicle_id,
        "seq": seq,
        "ts": ts_ms if ts_ms is not None else int(time.time() * 1000),
        "lat": 52.52 + seq * 1e-5,
        "lon": 13.40,
        "speed_kmh": 42.5,
        "heading_deg": 90.0,
    }
    d.update(extra)
    return d


def acked(info: mqtt.MQTTMessageInfo) -> bool:
    """Whether the broker has acknowledged a QoS 1 message. paho keeps a message published while
    its connection is down and sends it after the reconnect, but marks its info NO_CONN, which
    `is_published` raises on; the PUBACK still marks it published (a private flag, paho pinned)."""
    if info.rc == mqtt.MQTT_ERR_NO_CONN:
        return bool(info._published)
    return info.is_published()


class Publisher:
    """A QoS 1 publisher that knows which messages Mosquitto has acknowledged."""

    def __init__(self, host: str, port: int, inflight: int = 500, account: Account | None = None) -> None:
        self.client = mqtt.Client(
            CallbackAPIVersion.VERSION2, client_id=f"pub-{uuid.uuid4().hex[:8]}", protocol=mqtt.MQTTv5
        )
        login(self.client, account)
        self.client.max_inflight_messages_set(inflight)
        self.client.max_queued_messages_set(0)
        self.client.connect(host, port, keepalive=30)
        self.client.loop_start()
        self._infos: list[mqtt.MQTTMessageInfo] = []

    def publish(self, topic: str, payload: bytes, qos: int = 1) -> None:
        self._infos.append(self.client.publish(topic, payload, qos=qos))

    def publish_many(self, items: Iterable[tuple[str, bytes]]) -> int:
        n = 0
        for topic, payload in items:
            self.publish(topic, payload)
            n += 1
        return n

    @property
    def acknowledged(self) -> int:
        return sum(1 for i in self._infos if acked(i))

    def acknowledged_keys(self, keys: list[tuple[str, int]]) -> list[tuple[str, int]]:
        """Of `keys` (one per `publish` call, in order), those Mosquitto has acknowledged."""
        return [k for k, i in zip(keys, self._infos, strict=True) if acked(i)]

    def wait_all(self, timeout_s: float = 30.0) -> None:
        wait_for(lambda: self.acknowledged == len(self._infos), timeout_s, "Mosquitto PUBACKs")

    def close(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()


def fleet_publisher(settings: Settings, inflight: int = 500) -> Publisher:
    """A Publisher on the settings' broker that may publish as any vehicle (the test account)."""
    return Publisher(*settings.mqtt_host_port, inflight=inflight, account=mqtt_test_account(settings))


def forget_session(host: str, port: int, client_id: str, account: Account | None = None) -> None:
    """Delete a persistent MQTT session (clean start, expiry 0) so Mosquitto stops queueing for it."""
    c = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=client_id, protocol=mqtt.MQTTv5)
    login(c, account)
    props = Properties(PacketTypes.CONNECT)  # type: ignore[no-untyped-call]
    props.SessionExpiryInterval = 0
    done = threading.Event()
    c.on_connect = lambda *_a: done.set()
    c.connect(host, port, clean_start=True, properties=props)
    c.loop_start()
    try:
        done.wait(10)
    finally:
        c.disconnect()
        c.loop_stop()


@dataclass(frozen=True)
class KafkaRecord:
    topic: str
    partition: int
    offset: int
    key: bytes
    value: bytes
    headers: dict[str, bytes]


class TopicReader:
    """Reads topics from the beginning (plain assignment, no group) and keeps every record."""

    def __init__(self, bootstrap: str, topics: list[str]) -> None:
        md = admin_client(bootstrap).list_topics(timeout=10).topics
        self.consumer = group_consumer(bootstrap, f"reader-{uuid.uuid4().hex}", **{"fetch.wait.max.ms": 50})
        self.consumer.assign([TopicPartition(t, p, 0) for t in topics for p in sorted(md[t].partitions)])
        self.records: list[KafkaRecord] = []

    def poll(self, max_s: float = 0.2) -> None:
        for m in self.consumer.consume(10000, max_s):
            if m.error() is not None:
                continue
            hdrs = {k: (v or b"") for k, v in (m.headers() or [])}
            self.records.append(
                KafkaRecord(m.topic(), m.partition(), m.offset(), m.key() or b"", m.value() or b"", hdrs)
            )

    def read_until(self, cond: Callable[[list[KafkaRecord]], bool], timeout_s: float, what: str) -> None:
        def step() -> bool:
            self.poll()
            return cond(self.records)

        wait_for(step, timeout_s, what, interval_s=0.0)

    def close(self) -> None:
        self.consumer.close()


def telemetry_seqs(records: Iterable[KafkaRecord], prefix: str) -> list[tuple[str, int]]:
    """(vehicle_id, seq) of every telemetry record whose vehicle starts with `prefix`."""
    out = []
    for r in records:
        if r.key.startswith(prefix.encode()):
            d = orjson.loads(r.value)
            out.append((d["vehicle_id"], d["seq"]))
    return out


def rss_bytes(pid: int | None = None) -> int:
    """Resident set size from /proc (Linux)."""
    import os

    with open(f"/proc/{pid or 'self'}/statm") as f:
        pages = int(f.read().split()[1])
    return pages * os.sysconf("SC_PAGE_SIZE")


def gateway_env(
    settings: GatewaySettings, *, metrics_port: int, base: dict[str, str] | None = None
) -> dict[str, str]:
    """Environment that makes `python -m gateway` use exactly these settings."""
    import os

    host, port = settings.mqtt_host_port
    env = dict(base if base is not None else os.environ)
    env.update(
        {
            "FLEETFENCE_STATE_DIR": str(settings.state_dir),
            "FLEETFENCE_KAFKA_BOOTSTRAP": settings.bootstrap_servers,
            "FLEETFENCE_MQTT_URL": f"mqtt://{host}:{port}",
            # The replica announces itself in the service registry of the test's own Redis.
            "FLEETFENCE_REDIS_URL": settings.redis_dsn,
            "FLEETFENCE_REDIS_PREFIX": settings.redis_prefix,
            "FLEETFENCE_REGISTRY_TTL_S": str(settings.registry_ttl_s),
            "FLEETFENCE_TOPIC_PREFIX": settings.topic_prefix,
            "FLEETFENCE_GATEWAY_CLIENT_ID": settings.gateway_client_id_effective,
            "FLEETFENCE_GATEWAY_SHARD_INDEX": str(settings.gateway_shard_index),
            "FLEETFENCE_GATEWAY_SHARD_COUNT": str(settings.gateway_shard_count),
            "FLEETFENCE_GATEWAY_RECEIVE_MAXIMUM": str(settings.gateway_receive_maximum),
            "FLEETFENCE_GATEWAY_METRICS_PORT": str(metrics_port),
            "FLEETFENCE_GATEWAY_KAFKA_LINGER_MS": str(settings.gateway_kafka_linger_ms),
            # The broker's service accounts, whether it is the embedded one or reached as an endpoint.
            **account_env(settings),
        }
    )
    listeners = {
        "FLEETFENCE_GATEWAY_EDGE_PORT": settings.gateway_edge_port,
        "FLEETFENCE_GATEWAY_TELTONIKA_PORT": settings.gateway_teltonika_port,
        "FLEETFENCE_GATEWAY_HTTP_PORT": settings.gateway_http_port,
    }
    env.update({k: str(v) for k, v in listeners.items() if v is not None})
    return env


def scrape(port: int, host: str = "127.0.0.1") -> dict[str, float]:
    """The gateway's /metrics as {sample name with labels: value}; empty when not answering."""
    import urllib.request

    from prometheus_client.parser import text_string_to_metric_families

    try:
        with urllib.request.urlopen(f"http://{host}:{port}/metrics", timeout=2) as resp:
            text = resp.read().decode()
    except OSError:
        return {}
    out: dict[str, float] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            label = ",".join(f"{k}={v}" for k, v in sorted(s.labels.items()))
            out[f"{s.name}{{{label}}}" if label else s.name] = s.value
    return out
