"""The embedded infrastructure is real and answers on loopback."""

from __future__ import annotations

import subprocess
import sys
import threading
import uuid
from typing import Any

import paho.mqtt.client as mqtt
import pytest
import redis
from confluent_kafka import TopicPartition
from paho.mqtt.enums import CallbackAPIVersion
from pydantic import SecretStr

from embedded import infra, processes
from fleetfence import probes
from fleetfence.errors import InfraError
from fleetfence.kafka import ensure_topics, group_consumer, idempotent_producer, topic_specs
from fleetfence.mqtt import embedded_accounts, login
from fleetfence.settings import Settings
from fleetfence.testing import mqtt_test_account

pytestmark = pytest.mark.services


def test_status_reports_three_healthy_services(infra_settings: Settings) -> None:
    statuses = {s.name: s for s in infra.status(infra_settings)}
    assert set(statuses) == {"kafka", "mqtt", "redis"}
    for s in statuses.values():
        assert s.healthy, s
        assert s.managed
        assert s.pid is not None
        assert "127.0.0.1" in s.address


def test_topics_created_with_partitions_and_compaction(settings: Settings) -> None:
    created = ensure_topics(settings.bootstrap_servers, topic_specs(settings))
    t = settings.topics
    assert created == {
        t.telemetry: 4,
        t.alerts: 4,
        t.telemetry_dlq: 1,
        t.alerts_dlq: 1,
        t.master: 1,
        t.processor_commits: 1,
        t.processor_shadow: 1,
    }
    # Second call finds them and changes nothing.
    assert ensure_topics(settings.bootstrap_servers, topic_specs(settings)) == created


def test_kafka_produce_consume_round_trip(settings: Settings) -> None:
    ensure_topics(settings.bootstrap_servers, topic_specs(settings))
    p = idempotent_producer(settings.bootstrap_servers)
    for i in range(20):
        p.produce(settings.topics.telemetry, key=f"v{i % 3}".encode(), value=f"m{i}".encode())
    assert p.flush(10) == 0
    c = group_consumer(settings.bootstrap_servers, f"g-{uuid.uuid4().hex}")
    c.assign([TopicPartition(settings.topics.telemetry, p_, 0) for p_ in range(4)])
    got: list[bytes] = []
    import time

    deadline = time.monotonic() + 15
    while len(got) < 20 and time.monotonic() < deadline:
        m = c.poll(0.5)
        if m is not None and m.error() is None:
            got.append(m.value())
    c.close()
    assert sorted(got) == sorted(f"m{i}".encode() for i in range(20))


def test_mosquitto_pub_and_redis_cli_connect(infra_settings: Settings) -> None:
    host, port = infra_settings.mqtt_host_port
    account = mqtt_test_account(infra_settings)
    assert account is not None
    received = threading.Event()
    client = mqtt.Client(CallbackAPIVersion.VERSION2, protocol=mqtt.MQTTv5)
    login(client, account)
    subscribed = threading.Event()
    client.on_subscribe = lambda *_a: subscribed.set()
    client.on_message = lambda _c, _u, m: received.set() if m.payload == b"hello" else None
    client.connect(host, port)
    client.loop_start()
    client.subscribe("fleet/cli-test/telemetry", qos=1)
    assert subscribed.wait(5)
    pub = ["mosquitto_pub", "-h", host, "-p", str(port), "-t", "fleet/cli-test/telemetry", "-m", "hello"]
    # The embedded broker refuses anonymous clients; with an account it takes the message.
    anonymous = subprocess.run([*pub, "-q", "1"], capture_output=True, text=True, timeout=10, check=False)
    assert anonymous.returncode != 0
    assert "not authori" in (anonymous.stdout + anonymous.stderr).lower()
    subprocess.run(
        [*pub, "-q", "1", "-u", account.username, "-P", account.password],
        check=True,
        timeout=10,
    )
    assert received.wait(5)
    client.loop_stop()
    client.disconnect()
    out = subprocess.run(
        ["redis-cli", "-h", host, "-p", str(infra_settings.redis_port), "PING"],
        capture_output=True,
        text=True,
        check=True,
        timeout=10,
    )
    assert out.stdout.strip() == "PONG"


def test_redis_is_private_and_writable(infra_settings: Settings) -> None:
    r = redis.Redis.from_url(infra_settings.redis_dsn)
    key = f"test:{uuid.uuid4().hex}"
    r.set(key, "1")
    assert r.get(key) == b"1"
    assert r.config_get("port")["port"] == str(infra_settings.redis_port)


def test_up_down_up_keeps_data_and_stops_its_processes(tmp_path: object) -> None:
    from pathlib import Path

    s = Settings(
        **infra.private_fields(Path(str(tmp_path))),
        startup_timeout_s=60,
    )
    try:
        infra.up(s)
        pids = {st.name: st.pid for st in infra.status(s)}
        # What each pid file records: the binary and, for the JVM, its config file (every JVM is
        # `java`, so the command line tells ours from any other on a recycled pid).
        recorded = {name: processes.read_pid(s, name) for name in infra.SERVICES}
        kafka_rec = recorded["kafka"]
        assert kafka_rec is not None
        assert Path(kafka_rec[1]).name == "java"
        assert kafka_rec[2] == str((s.kafka_dir / "server.properties").resolve())
        assert processes.alive(*kafka_rec)
        assert not processes.alive(kafka_rec[0], kafka_rec[1], "/elsewhere/server.properties")
        r = redis.Redis.from_url(s.redis_dsn)
        r.set("kept", "yes")
        r.close()
        p = idempotent_producer(s.bootstrap_servers)
        p.produce(s.topics.master, key=b"route:r1", value=b"{}")
        assert p.flush(10) == 0
        assert sorted(infra.down(s)) == ["kafka", "mqtt", "redis"]
        for name, pid in pids.items():
            rec = recorded[name]
            assert rec is not None
            assert pid == rec[0]
            assert not processes.alive(pid, rec[1]), f"{name} still running"  # no such binary at that pid
        assert all(st.pid is None and not st.healthy for st in infra.status(s))
        infra.up(s)
        r = redis.Redis.from_url(s.redis_dsn)
        assert r.get("kept") == b"yes"
        r.close()
        c = group_consumer(s.bootstrap_servers, "g-restart")
        lo, hi = c.get_watermark_offsets(TopicPartition(s.topics.master, 0), timeout=10)
        c.close()
        assert hi - lo == 1
    finally:
        infra.down(s)


def test_port_taken_gives_clear_error(tmp_path: object, infra_settings: Settings) -> None:
    from pathlib import Path

    s = Settings(
        state_dir=Path(str(tmp_path)),
        kafka_port=probes.free_port(),
        mqtt_port=infra_settings.mqtt_port,
        redis_port=probes.free_port(),
        kafka_bootstrap=None,
        mqtt_url=None,
        redis_url=None,
    )
    with pytest.raises(InfraError, match=r"mqtt port .* is taken"):
        infra.up(s)
    assert all(st.pid is None for st in infra.status(s))


def test_external_endpoints_start_nothing(tmp_path: object, infra_settings: Settings) -> None:
    from pathlib import Path

    # An external broker's accounts come from the settings (as in production).
    secrets: dict[str, Any] = {
        f"mqtt_{kind}_password": SecretStr(a.password)
        for kind, a in embedded_accounts(infra_settings).items()
    }
    s = Settings(
        state_dir=Path(str(tmp_path)),
        kafka_bootstrap=infra_settings.bootstrap_servers,
        mqtt_url=f"mqtt://127.0.0.1:{infra_settings.mqtt_port}",
        redis_url=infra_settings.redis_dsn,
        topic_prefix=f"ext{uuid.uuid4().hex[:6]}.",
        **secrets,
    )
    statuses = infra.up(s)
    assert all(st.healthy and not st.managed and st.pid is None for st in statuses)
    assert not (Path(str(tmp_path)) / "run").exists() or not any((Path(str(tmp_path)) / "run").iterdir())
    assert infra.down(s) == []


def test_infra_jars_fetches_once_and_says_where() -> None:
    from pathlib import Path

    from fleetfence import jars

    cli = Path(sys.executable).parent / "fleetfence"
    out = subprocess.run(
        [str(cli), "infra", "jars"], capture_output=True, text=True, timeout=900, check=False
    )
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert len(lines) == len(jars.BUNDLES), out.stdout
    for bundle, line in zip(jars.BUNDLES, lines, strict=True):
        libs = jars.bundle_dir(bundle) / "libs"
        assert (libs.parent / jars.COMPLETE).is_file()
        n = len(list(libs.glob("*.jar")))
        version = jars.pom_property(bundle, f"{bundle}.version")
        assert line == f"{bundle} {version}: {n} jars in {libs}"
    kafka_version = jars.pom_property("kafka", "kafka.version")
    spark_version = jars.pom_property("spark", "spark.version")
    assert (jars.bundle_dir("kafka") / "libs" / f"kafka_2.13-{kafka_version}.jar").is_file()
    assert (jars.bundle_dir("spark") / "libs" / f"spark-sql-kafka-0-10_2.13-{spark_version}.jar").is_file()
    bad = subprocess.run(
        [str(cli), "infra", "jars", "hadoop"], capture_output=True, text=True, timeout=60, check=False
    )
    assert bad.returncode == 2
    assert "unknown jar bundle 'hadoop'" in bad.stderr


def test_a_cluster_id_never_starts_with_a_dash(monkeypatch: pytest.MonkeyPatch) -> None:
    """The storage tool reads an id starting with "-" as an option and refuses to format: one
    broker start in 64 failed so. The id is drawn again instead."""
    import uuid

    from embedded import kafka_node

    draws = iter([uuid.UUID(bytes=b"\xf8" + bytes(15)), uuid.UUID(bytes=b"\x10" + bytes(15))])
    monkeypatch.setattr(uuid, "uuid4", lambda: next(draws))
    cid = kafka_node.new_cluster_id()
    assert cid == "EAAAAAAAAAAAAAAAAAAAAA"
    assert len(cid) == 22
    monkeypatch.undo()
    assert not any(kafka_node.new_cluster_id().startswith("-") for _ in range(2000))


def test_mqtt_auth_off_runs_an_anonymous_broker(tmp_path: object) -> None:
    """FLEETFENCE_MQTT_AUTH=false, for a broker without the dynamic-security plugin: the embedded
    Mosquitto loads no plugin and takes anonymous clients; no account file is written."""
    from pathlib import Path

    s = Settings(**infra.private_fields(Path(str(tmp_path))), mqtt_auth=False)
    proc = infra.start_mqtt(s)
    try:
        host, port = s.mqtt_host_port
        probes.wait_until(
            lambda: probes.mqtt_ping(host, port), 30, "Mosquitto", proc, s.mqtt_dir / "mosquitto.log"
        )
        conf = (s.mqtt_dir / "mosquitto.conf").read_text()
        assert "allow_anonymous true" in conf
        assert "plugin" not in conf
        assert not (s.mqtt_dir / "accounts.json").exists()
    finally:
        processes.stop_one(s, "mqtt")


def test_infra_up_takes_a_kafka_cluster_of_an_odd_size_only(tmp_path: object) -> None:
    """`--kafka-brokers 2` is refused before anything starts: two voters survive no more failures
    than one."""
    from pathlib import Path

    from typer.testing import CliRunner

    from cli.app import app

    res = CliRunner().invoke(
        app,
        ["infra", "up", "--kafka-brokers", "2"],
        env={"FLEETFENCE_STATE_DIR": str(tmp_path), "COLUMNS": "200"},
    )
    assert res.exit_code == 2, res.output
    assert "1, or 3 or 5" in res.output
    assert not (Path(str(tmp_path)) / "run").exists()
