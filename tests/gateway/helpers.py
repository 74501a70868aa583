"""Shared by the gateway's tests and their fixtures (conftest.py), and by the deployment suite's
embedded-cluster faults: a vehicle on the device edge, and the edge as a process of its own."""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import uuid
from pathlib import Path
from typing import Any

import orjson
import paho.mqtt.client as mqtt
from paho.mqtt.enums import CallbackAPIVersion

from fleetfence import probes
from fleetfence.contracts import telemetry_topic
from fleetfence.mqtt import account_fields
from fleetfence.settings import Settings
from fleetfence.testing import wait_for
from gateway.settings import GatewaySettings
from gateway.testing import KafkaRecord, TopicReader, fix, gateway_env, scrape


def gw_settings(settings: Settings, **over: Any) -> GatewaySettings:
    """Gateway settings on the test's services, with a client id of their own (one shard of one)."""
    base = GatewaySettings(**settings.model_dump(exclude={"topics"}))
    tag = uuid.uuid4().hex[:8]
    upd: dict[str, Any] = {
        "gateway_client_id": f"gw-test-{tag}",
        "gateway_metrics_port": 0,
        "gateway_kafka_linger_ms": 2,
    }
    upd.update(over)
    return base.model_copy(update=upd)


def own_kafka(settings: Settings, tmp_path: Path) -> Settings:
    """Settings for a Kafka broker of the test's own (killed or stopped by it), beside the
    session's Mosquitto and Redis. Its port is below the ephemeral range, so a restart finds it free
    (`fleetfence.probes.service_ports`)."""
    host, port = settings.mqtt_host_port
    return Settings(
        state_dir=tmp_path / "own-broker",
        kafka_port=probes.service_ports(),
        kafka_bootstrap=None,
        mqtt_url=f"mqtt://{host}:{port}",
        redis_url=settings.redis_dsn,
        topic_prefix=settings.topic_prefix,
        startup_timeout_s=60,
        **account_fields(settings),
    )


class Vehicle:
    """One tracker: publishes its fixes at QoS 1 and remembers which the edge acknowledged."""

    def __init__(self, vid: str, secret: str | None, port: int) -> None:
        self.vid = vid
        self.mids: dict[int, int] = {}  # message id -> seq
        self.acked_mids: set[int] = set()
        # Guards the two above only, never held while calling paho: paho calls `on_publish` with
        # its own message lock held, so holding ours around `publish` (which takes paho's) would
        # deadlock against a PUBACK arriving meanwhile (it did, in deployment run 23).
        self.lock = threading.Lock()
        self.c = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=vid, protocol=mqtt.MQTTv5)
        if secret is not None:
            self.c.username_pw_set(vid, secret)
        self.c.reconnect_delay_set(min_delay=1, max_delay=1)
        self.c.max_queued_messages_set(0)
        self.c.on_publish = self._on_publish
        self.c.connect("127.0.0.1", port, keepalive=10, clean_start=False)
        self.c.loop_start()

    def _on_publish(self, _c: object, _u: object, mid: int, rc: object, _p: object) -> None:
        with self.lock:
            self.acked_mids.add(mid)

    def publish(self, seq: int) -> None:
        info = self.c.publish(telemetry_topic(self.vid), orjson.dumps(fix(self.vid, seq)), qos=1)
        with self.lock:
            self.mids[info.mid] = seq

    @property
    def acked(self) -> set[int]:
        """The seqs the edge acknowledged (a PUBACK may come before `publish` has noted its mid)."""
        with self.lock:
            return {self.mids[m] for m in self.acked_mids if m in self.mids}

    def close(self) -> None:
        self.c.loop_stop()
        self.c.disconnect()


class EdgeProcess:
    """`python -m gateway` as the device edge, its /metrics scraped."""

    def __init__(self, gs: GatewaySettings, log: Path) -> None:
        self.metrics_port = probes.free_port()
        self.log = log
        env = gateway_env(gs, metrics_port=self.metrics_port)
        env["FLEETFENCE_MQTT_AUTH"] = "true" if gs.mqtt_auth else "false"
        with log.open("ab") as f:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "gateway"],
                env=env,
                stdout=f,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
            )
        wait_for(self.ready, 30, f"edge subprocess ready (log {log})")

    def ready(self) -> bool:
        if self.proc.poll() is not None:
            raise AssertionError(f"edge exited {self.proc.returncode}:\n{self.log.read_text()[-3000:]}")
        return scrape(self.metrics_port).get("fleetfence_gateway_mqtt_connected") == 1.0

    def metrics(self) -> dict[str, float]:
        return scrape(self.metrics_port)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)


def records_of(gs: GatewaySettings, vid: str, n: int) -> list[KafkaRecord]:
    """The first `n` records keyed by `vid` on the telemetry topic and its dead letters (a
    tracker's fixes and letters land on both)."""
    reader = TopicReader(gs.bootstrap_servers, [gs.topics.telemetry, gs.topics.telemetry_dlq])
    try:
        reader.read_until(lambda rs: sum(r.key == vid.encode() for r in rs) >= n, 30, f"{n} records of {vid}")
        return [r for r in reader.records if r.key == vid.encode()]
    finally:
        reader.close()
