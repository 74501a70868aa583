"""`fleetfence status`: real services as processes (two gateway replicas, an `alerts run` receiver,
the admin API) on the session's private Kafka, Mosquitto and Redis, found through the service
registry, asked at their endpoints; a stopped one disappears, a killed one is reported as not
answering (exit code 1) until its key expires. The processor's and the archive's announcements
are checked through their presence blocks, without Spark."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
import redis

from cli.status import Report, collect
from fleetfence import probes
from fleetfence.contracts import alert_id, ms_to_iso
from fleetfence.kafka import ensure_topics, idempotent_producer, topic_specs
from fleetfence.service import stop_process_group
from fleetfence.settings import Settings
from fleetfence.testing import wait_for
from gateway.testing import fix, fleet_publisher

TTL_S = 3.0
RECEIVER_TTL_S = 15.0
FLEETFENCE = [sys.executable, "-m", "cli"]


@pytest.fixture
def ss(settings: Settings) -> Settings:
    """The test's settings with a registry of its own and a short TTL."""
    ensure_topics(settings.bootstrap_servers, topic_specs(settings))
    return settings.model_copy(
        update={"redis_prefix": f"{settings.topic_prefix}ff:", "registry_ttl_s": TTL_S}
    )


def service_env(s: Settings, **extra: str) -> dict[str, str]:
    """What makes a `fleetfence` process use the session's embedded servers and the test's names."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLEETFENCE_")}
    env.update(
        FLEETFENCE_STATE_DIR=str(s.state_dir),
        FLEETFENCE_HOST=s.host,
        FLEETFENCE_KAFKA_PORT=str(s.kafka_port),
        FLEETFENCE_MQTT_PORT=str(s.mqtt_port),
        FLEETFENCE_REDIS_PORT=str(s.redis_port),
        FLEETFENCE_TOPIC_PREFIX=s.topic_prefix,
        FLEETFENCE_REDIS_PREFIX=s.redis_prefix,
        FLEETFENCE_REGISTRY_TTL_S=str(s.registry_ttl_s),
        FLEETFENCE_STARTUP_TIMEOUT_S="60",
    )
    env.update(extra)  # the test's own, over the defaults above
    return env


class Services:
    """Service processes of one test, each in its own session, stopped at the end whatever happened."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.procs: dict[str, subprocess.Popen[bytes]] = {}

    def start(self, name: str, argv: list[str], env: dict[str, str]) -> subprocess.Popen[bytes]:
        with (self.tmp / f"{name}.log").open("wb") as log:
            p = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        self.procs[name] = p
        return p

    def logs(self) -> str:
        return "\n".join(f"--- {p.name}\n{p.read_text()[-1500:]}" for p in sorted(self.tmp.glob("*.log")))

    def stop_all(self) -> None:
        for p in self.procs.values():
            stop_process_group(p, timeout_s=30)


@pytest.fixture
def services(tmp_path: Path) -> Iterator[Services]:
    s = Services(tmp_path)
    yield s
    s.stop_all()


def by_instance(report: Report) -> dict[str, dict[str, Any]]:
    return {s["instance"]: s for s in report.services}


def status_cli(s: Settings, *args: str) -> tuple[int, str]:
    """`fleetfence status` as an operator runs it: exit code and standard output (standard error
    after it when the exit code is not 0 or 1)."""
    env = service_env(s, NO_COLOR="1", COLUMNS="250")
    p = subprocess.run([*FLEETFENCE, "status", *args], env=env, capture_output=True, timeout=60, check=False)
    out = p.stdout.decode()
    if p.returncode not in (0, 1) or "Traceback" in p.stderr.decode():
        out += f"\nstderr:\n{p.stderr.decode()[-3000:]}"
    return p.returncode, out


def publish_alert(s: Settings, vehicle: str) -> None:
    ts_ms = int(time.time() * 1000)
    alert = {
        "alert_id": alert_id(vehicle, "OVERSPEED", 1, ""),
        "type": "OVERSPEED",
        "vehicle_id": vehicle,
        "route_id": "r-1",
        "route_version": 1,
        "seq": 1,
        "ts_ms": ts_ms,
        "ts": ms_to_iso(ts_ms),
        "lat": 52.52,
        "lon": 13.40,
        "details": {"speed_kmh": 80.0},
    }
    p = idempotent_producer(s.bootstrap_servers)
    p.produce(s.topics.alerts, key=vehicle.encode(), value=orjson.dumps(alert))
    assert p.flush(15) == 0


def test_status_reports_running_services_and_those_that_stopped(
    ss: Settings, services: Services, tmp_path: Path
) -> None:
    run = uuid.uuid4().hex[:6]
    gw = [f"st-gw-{run}-{i}" for i in (1, 2)]
    receiver = f"st-al-{run}"
    api_port = probes.free_port()
    api_instance = f"{socket.gethostname()}:{api_port}"
    # Both replicas keep the default metrics port: one of them (or both, if something else holds
    # it) serves on an ephemeral port, and the registry announces the real one.

    def gateway_env_of(index: int) -> dict[str, str]:
        return service_env(
            ss,
            FLEETFENCE_GATEWAY_CLIENT_ID=gw[index],
            FLEETFENCE_GATEWAY_SHARD_INDEX=str(index),
            FLEETFENCE_GATEWAY_SHARD_COUNT=str(len(gw)),
            FLEETFENCE_GATEWAY_SESSION_EXPIRY_S="0",
        )

    for index, client_id in enumerate(gw):
        services.start(
            client_id,
            [sys.executable, "-m", "gateway"],
            gateway_env_of(index),
        )
    config = tmp_path / "receivers.toml"
    config.write_text('[[receivers]]\nname = "hist"\nkind = "history"\n')
    services.start(
        "alerts",
        [*FLEETFENCE, "alerts", "run", "--config", str(config)],
        # A longer TTL than the others: after its SIGKILL the test must see its key still there.
        service_env(
            ss, FLEETFENCE_ALERTS_INSTANCE_ID=receiver, FLEETFENCE_REGISTRY_TTL_S=str(RECEIVER_TTL_S)
        ),
    )
    services.start(
        "api",
        [*FLEETFENCE, "api", "--host", ss.host, "--port", str(api_port)],
        service_env(ss, FLEETFENCE_API_RUN_RELAY="false"),
    )
    everyone = {*gw, receiver, api_instance}

    def all_answer() -> Report | None:
        for name, p in services.procs.items():
            assert p.poll() is None, f"{name} exited:\n{services.logs()}"
        report = collect(ss)
        found = by_instance(report)
        return report if everyone <= found.keys() and report.ok else None

    wait_for(all_answer, 60, "every service registered and answering")

    # Traffic, so the counters have something to show: fixes through the gateways, an alert
    # through the receiver.
    vehicle = f"st{run}"
    pub = fleet_publisher(ss)
    try:
        for seq in range(1, 11):
            pub.publish(f"fleet/{vehicle}/telemetry", orjson.dumps(fix(vehicle, seq)))
        pub.publish(f"fleet/{vehicle}/telemetry", b"not json")
        pub.wait_all()
    finally:
        pub.close()
    publish_alert(ss, vehicle)

    def counted() -> Report | None:
        report = collect(ss)
        found = by_instance(report)
        gws = [found[g]["counters"] for g in gw if g in found]
        hist = found.get(receiver, {}).get("counters", {})
        done = (
            len(gws) == 2
            and sum(c.get("received", 0) for c in gws) == 11
            and sum(c.get("forwarded", 0) for c in gws) == 10
            and sum(c.get("dead_lettered", 0) for c in gws) == 1
            and hist.get("delivered") == {"hist": 1}
        )
        return report if done else None

    wait_for(counted, 30, "the gateways' and the receiver's counters")

    code, out = status_cli(ss, "--json")
    assert code == 0, out
    doc = orjson.loads(out)
    assert doc["ok"] is True
    assert {i["name"]: i["healthy"] for i in doc["infrastructure"]} == {
        "kafka": True,
        "mqtt": True,
        "redis": True,
    }
    assert doc["registry"]["keys"] == f"{ss.redis_prefix}services:*:*"
    found = {s["instance"]: s for s in doc["services"]}
    assert found.keys() == everyone
    for g in gw:
        entry = found[g]
        assert (entry["kind"], entry["pid"], entry["answered"]) == ("gateway", services.procs[g].pid, True)
        assert entry["metrics_url"].startswith(f"http://{ss.host}:")
        assert entry["health_url"] is None
        assert entry["uptime_s"] >= 0
        assert entry["counters"]["mqtt_connected"] == 1
    assert found[gw[0]]["metrics_url"] != found[gw[1]]["metrics_url"]
    assert found[receiver]["kind"] == "alerts"
    assert found[receiver]["counters"]["delivered"] == {"hist": 1}
    assert found[receiver]["counters"]["failed"] == {"hist": 0}
    api = found[api_instance]
    assert api["kind"] == "api"
    assert api["health_url"] == f"http://{ss.host}:{api_port}/healthz"
    assert api["answered"] is True
    assert [e["kind"] for e in doc["services"]] == ["api", "gateway", "gateway", "alerts"]
    assert doc["gateway_shards"] == {
        "served": {gw[0]: {"index": 0, "count": 2}, gw[1]: {"index": 1, "count": 2}},
        "problems": [],
    }

    code, out = status_cli(ss)
    assert code == 0, out
    assert "FleetFence infrastructure" in out
    assert "FleetFence services" in out
    for name in everyone:
        assert name in out

    # A clean stop deletes its key: gone at once, not after its TTL. Its shard has no gateway now,
    # which status reports and fails on (the other replica acknowledges that shard's fixes).
    stopped = services.procs[gw[1]]
    stopped.send_signal(signal.SIGTERM)
    assert stopped.wait(30) == 0, services.logs()
    assert gw[1] not in by_instance(collect(ss))
    code, out = status_cli(ss, "--json")
    assert code == 1, out
    assert orjson.loads(out)["gateway_shards"]["problems"] == [
        "shard 1 of 2 has no running gateway: its vehicles' fixes are lost"
    ]
    services.start(gw[1], [sys.executable, "-m", "gateway"], gateway_env_of(1))
    wait_for(lambda: collect(ss).shard_problems == [], 30, "shard 1 served again")

    # A killed receiver leaves its key until the TTL: reported as not answering, exit code 1.
    killed = services.procs["alerts"]
    os.killpg(killed.pid, signal.SIGKILL)
    killed.wait(10)
    # Its last heartbeat was at most a third of its TTL before the kill: the key outlives this.
    code, out = status_cli(ss, "--json")
    doc = orjson.loads(out)
    found = {s["instance"]: s for s in doc["services"]}
    assert receiver in found, out
    assert code == 1, out
    assert doc["ok"] is False
    assert found[receiver]["answered"] is False
    assert found[receiver]["detail"].startswith("metrics:")
    wait_for(
        lambda: receiver not in by_instance(collect(ss)),
        RECEIVER_TTL_S + 10,
        "the killed receiver's key to expire",
    )
    code, out = status_cli(ss)
    assert code == 0, out
    assert receiver not in out


def test_processor_and_archive_announce_their_metrics(ss: Settings) -> None:
    """The processor's and the archive's run loops announce themselves through these blocks; their
    counters are the ones status shows (the Spark queries themselves are not needed for it)."""
    from history.archive import archive_presence
    from history.settings import HistorySettings
    from processor.ops.service import processor_presence
    from processor.settings import ProcessorSettings

    ps = ProcessorSettings.from_base(ss)
    hs = HistorySettings.from_base(ss)
    assert (ps.processor_metrics_port, hs.history_metrics_port) == (9465, 9467)
    with processor_presence(ps) as proc, archive_presence(hs) as arch:
        assert proc.metrics is not None
        assert arch.metrics is not None
        report = wait_for(lambda: (r := collect(ss)) and len(r.services) == 2 and r, 10, "both announcements")
        assert report.ok
        processor, archive = report.services
        assert (processor["kind"], processor["answered"]) == ("processor", True)
        assert processor["metrics_url"] == proc.metrics.url
        assert {"committed_batches", "records", "alerts", "held_fixes"} <= processor["counters"].keys()
        assert (archive["kind"], archive["answered"]) == ("archive", True)
        assert archive["metrics_url"] == arch.metrics.url
        assert {"batches", "rows"} <= archive["counters"].keys()
    assert collect(ss).services == []


def test_status_shows_redis_memory_against_its_limit(ss: Settings) -> None:
    """Redis holds the read models: status shows what it uses against `maxmemory`, says when there
    is no limit, and warns near the limit (issue #64)."""
    r = redis.Redis.from_url(ss.redis_dsn)
    before = str(r.config_get("maxmemory")["maxmemory"])
    try:

        def redis_row() -> str:
            return next(s.detail for s in collect(ss).infrastructure if s.name == "redis")

        r.config_set("maxmemory", 0)
        assert "no maxmemory" in redis_row()
        used = int(r.info("memory")["used_memory"])
        r.config_set("maxmemory", used * 20)
        roomy = redis_row()
        assert f"of {used * 20 / 2**20:.1f} MiB" in roomy, roomy
        assert "NEAR ITS LIMIT" not in roomy
        r.config_set("maxmemory", int(used * 1.05))  # no write of this test follows until restored
        assert "NEAR ITS LIMIT" in redis_row()
    finally:
        r.config_set("maxmemory", before)
        r.close()
