"""Alert receivers against the real broker, Mosquitto, Redis, a local HTTP webhook target and a local
SMTP server.

Alerts are produced the way the processor writes them: in Kafka transactions, some aborted, so
every test also proves that aborted alerts never reach a receiver.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request
import uuid
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar, cast

import orjson
import paho.mqtt.client as mqtt
import pytest
import redis
from confluent_kafka import TopicPartition
from paho.mqtt.enums import CallbackAPIVersion
from prometheus_client import CollectorRegistry

from alerts import runner
from alerts.config import AlertsSettings, parse_config
from alerts.history import HistorySink
from alerts.metrics import ReceiverMetrics, Snapshot
from alerts.model import SourceRecord, parse_alert
from alerts.service import AlertService, group_id
from alerts.sink import Context, Outcome
from fleetfence import probes
from fleetfence.contracts import alert_id, ms_to_iso
from fleetfence.kafka import ensure_topics, group_consumer, topic_specs, transactional_producer
from fleetfence.mqtt import DynSec, account_env, acl, login
from fleetfence.readmodels import ReadKeys
from fleetfence.settings import Settings
from fleetfence.testing import mqtt_test_account, wait_for
from tests.alerts.helpers import SECRET, SMTP_PASSWORD, SMTP_USER, SmtpServer, WebhookTarget

pytestmark = pytest.mark.services

T = TypeVar("T")


# --------------------------------------------------------------------------- helpers


def make_alert(
    vehicle: str, kind: str, seq: int, route: str | None = "r-1", zone: str = ""
) -> dict[str, Any]:
    ts_ms = 1_795_320_000_000 + seq * 1000
    d: dict[str, Any] = {
        "alert_id": alert_id(vehicle, kind, seq, zone),
        "type": kind,
        "vehicle_id": vehicle,
        "route_id": route,
        "route_version": 1,
        "seq": seq,
        "ts_ms": ts_ms,
        "ts": ms_to_iso(ts_ms),
        "lat": 52.52,
        "lon": 13.40,
        "details": {"zone_id": zone} if zone else {"distance_m": 150.0},
    }
    return d


class AlertWriter:
    """Writes alerts like the processor: one transaction per batch, keyed by vehicle_id."""

    def __init__(self, settings: Settings) -> None:
        self.topic = settings.topics.alerts
        self.p = transactional_producer(settings.bootstrap_servers, f"test-{uuid.uuid4().hex}")
        self.p.init_transactions(15)

    def batch(
        self,
        alerts: list[dict[str, Any]],
        *,
        commit: bool = True,
        raw: Sequence[bytes] = (),
        partition: Callable[[dict[str, Any]], int] | None = None,
    ) -> None:
        """`partition` pins each alert's partition (default: the key's, as the processor does)."""
        self.p.begin_transaction()
        for a in alerts:
            extra = {} if partition is None else {"partition": partition(a)}
            self.p.produce(self.topic, key=a["vehicle_id"].encode(), value=orjson.dumps(a), **extra)
        for r in raw:
            self.p.produce(self.topic, key=b"garbage", value=r)
        if commit:
            self.p.commit_transaction(15)
        else:
            self.p.flush(15)  # the records reach the log, then the transaction is aborted
            self.p.abort_transaction(15)


class MqttCollector:
    def __init__(self, settings: Settings, topic_filter: str) -> None:
        self.messages: list[tuple[str, bytes, bool]] = []
        self.lock = threading.Lock()
        subscribed = threading.Event()
        host, port = settings.mqtt_host_port
        self.c = mqtt.Client(CallbackAPIVersion.VERSION2, protocol=mqtt.MQTTv311)
        login(self.c, mqtt_test_account(settings))
        self.c.on_subscribe = lambda *_a: subscribed.set()
        self.c.on_message = self._on_message
        self.c.connect(host, port)
        self.c.loop_start()
        self.c.subscribe(topic_filter, qos=1)
        assert subscribed.wait(10), "MQTT subscribe not acknowledged"

    def _on_message(self, _c: object, _u: object, m: mqtt.MQTTMessage) -> None:
        with self.lock:
            self.messages.append((m.topic, bytes(m.payload), bool(m.retain)))

    def snapshot(self) -> list[tuple[str, bytes, bool]]:
        with self.lock:
            return list(self.messages)

    def close(self) -> None:
        self.c.loop_stop()
        self.c.disconnect()


def _s(x: bytes | str) -> str:
    return x.decode() if isinstance(x, bytes) else x


def alerts_settings(settings: Settings, **kw: Any) -> AlertsSettings:
    base = settings.model_dump(exclude={"topics"})
    base.update(redis_prefix=f"{settings.redis_prefix}{uuid.uuid4().hex[:8]}:", **kw)
    return AlertsSettings(**base)


def committed_offsets(settings: Settings, group: str) -> dict[int, int]:
    c = group_consumer(settings.bootstrap_servers, group)
    try:
        parts = [TopicPartition(settings.topics.alerts, p) for p in range(settings.alerts_partitions)]
        return {tp.partition: tp.offset for tp in c.committed(parts, timeout=10)}
    finally:
        c.close()


def high_watermarks(settings: Settings) -> dict[int, int]:
    c = group_consumer(settings.bootstrap_servers, f"wm-{uuid.uuid4().hex}")
    try:
        return {
            p: c.get_watermark_offsets(TopicPartition(settings.topics.alerts, p), timeout=10)[1]
            for p in range(settings.alerts_partitions)
        }
    finally:
        c.close()


def assert_fully_committed(settings: Settings, group: str) -> None:
    """Committed offsets equal the high watermarks (an empty partition has nothing to commit)."""
    hw = {p: h for p, h in high_watermarks(settings).items() if h > 0}
    assert committed_offsets(settings, group) == {
        p: hw.get(p, -1001) for p in range(settings.alerts_partitions)
    }


def read_dlq(settings: Settings, expected: int, timeout_s: float = 20) -> list[tuple[bytes, dict[str, str]]]:
    c = group_consumer(settings.bootstrap_servers, f"dlq-{uuid.uuid4().hex}")
    c.assign([TopicPartition(settings.topics.alerts_dlq, 0, 0)])
    out: list[tuple[bytes, dict[str, str]]] = []
    deadline = time.monotonic() + timeout_s
    try:
        while len(out) < expected and time.monotonic() < deadline:
            m = c.poll(0.2)
            if m is not None and m.error() is None:
                out.append((m.value(), {k: v.decode() for k, v in m.headers() or []}))
        # Nothing beyond what was expected: poll a little longer for unexpected extras.
        extra_deadline = time.monotonic() + 0.5
        while time.monotonic() < extra_deadline:
            m = c.poll(0.1)
            if m is not None and m.error() is None:
                out.append((m.value(), {k: v.decode() for k, v in m.headers() or []}))
    finally:
        c.close()
    return out


def allow_alert_topics(settings: Settings, root: str) -> None:
    """The alert fan-out's account publishes under the default alert topics only; this test's
    receivers publish under a root of its own, which an operator would grant the same way."""
    control = DynSec.from_settings(settings)
    try:
        role = settings.mqtt_alerts_username
        control.command(
            {"command": "addRoleACL", "rolename": role, **acl("publishClientSend", f"{root}/#")},
            tolerate=("ACL with this topic already exists",),
        )
    finally:
        control.close()


def receivers_toml(url: str, mqtt_root: str, hook_extra: str = "") -> str:
    return f"""
[[receivers]]
name = "history"
kind = "history"

[[receivers]]
name = "mqtt"
kind = "mqtt"
vehicle_topic = "{mqtt_root}/{{vehicle_id}}/alerts"
all_topic = "{mqtt_root}/alerts"

[[receivers]]
name = "hook"
kind = "webhook"
url = "{url}"
secret = "{SECRET}"
backoff_initial_ms = 10
backoff_max_ms = 50
{hook_extra}

[[receivers]]
name = "dev-r1"
kind = "webhook"
url = "{url}"
secret = "{SECRET}"
[receivers.filter]
types = ["ROUTE_DEVIATION"]
routes = ["r-1"]
"""


# --------------------------------------------------------------------------- tests


def test_each_receiver_gets_each_committed_alert_once(settings: Settings, target: WebhookTarget) -> None:
    ensure_topics(settings.bootstrap_servers, topic_specs(settings))
    s = alerts_settings(settings, alerts_commit_interval_ms=100)
    run = uuid.uuid4().hex[:6]
    vehicles = [f"v{run}-{i}" for i in range(5)]
    kinds = ["ROUTE_DEVIATION", "OVERSPEED", "ROUTE_RETURN"]
    committed = [
        make_alert(v, kinds[seq % 3], seq, route="r-1" if i % 2 == 0 else "r-2")
        for seq in range(1, 7)
        for i, v in enumerate(vehicles)
    ]
    aborted = [make_alert(v, "VEHICLE_SILENT", 100 + i) for i, v in enumerate(vehicles)]
    writer = AlertWriter(s)
    writer.batch(committed[:10])
    writer.batch(aborted, commit=False)
    writer.batch(committed[10:], raw=[b"this is not an alert"])

    host, port = s.mqtt_host_port
    root = f"t{run}/fleet"
    allow_alert_topics(s, root)
    sub = MqttCollector(s, f"{root}/#")
    registry = CollectorRegistry()
    cfg = parse_config(receivers_toml(target.url, root))
    service = AlertService(s, cfg, registry).start()
    r = redis.Redis.from_url(s.redis_dsn)
    try:
        ids = {a["alert_id"] for a in committed}
        wanted_by_dev_r1 = {
            a["alert_id"] for a in committed if a["type"] == "ROUTE_DEVIATION" and a["route_id"] == "r-1"
        }
        # Both webhook receivers share the target; together they accept each id once or twice.
        wait_for(lambda: target.accepted_ids() >= ids, 30, "webhook deliveries")
        wait_for(lambda: len(sub.snapshot()) >= 2 * len(ids), 30, "MQTT fan-out")
        keys = ReadKeys(s.redis_prefix)
        wait_for(lambda: r.zcard(keys.alerts_by_ts) >= len(ids), 30, "history index")
        wait_for(
            lambda: all(
                snap.consumed == len(committed) + 1 and snap.reconciles
                for snap in service.snapshots().values()
            ),
            30,
            "every receiver to handle every committed record",
        )
        snaps = service.snapshots()
    finally:
        service.stop()
        sub.close()

    aborted_ids = {a["alert_id"] for a in aborted}
    # Webhooks: hook got every alert, dev-r1 only route deviations on r-1; once each; signed.
    expected = Counter(dict.fromkeys(ids, 1)) + Counter(dict.fromkeys(wanted_by_dev_r1, 1))
    assert target.accepted == expected
    assert target.bad_signatures == 0
    assert target.idempotency_mismatch == 0
    assert not aborted_ids & set(target.attempts)
    # MQTT: each alert once on the fleet topic and once on its vehicle topic, never an aborted one.
    msgs = sub.snapshot()
    fleet = Counter(orjson.loads(p)["alert_id"] for t, p, _ in msgs if t == f"{root}/alerts")
    per_vehicle = Counter((t, orjson.loads(p)["alert_id"]) for t, p, _ in msgs if t != f"{root}/alerts")
    assert fleet == Counter(dict.fromkeys(ids, 1))
    assert per_vehicle == Counter({(f"{root}/{a['vehicle_id']}/alerts", a["alert_id"]): 1 for a in committed})
    # Retained: a late subscriber gets each vehicle's last alert, byte-identical to the record.
    late = MqttCollector(s, f"{root}/+/alerts")
    try:
        retained = wait_for(
            lambda: {t: p for t, p, ret in late.snapshot() if ret} if len(late.snapshot()) >= 5 else None,
            10,
            "retained messages",
        )
    finally:
        late.close()
    last = {
        f"{root}/{v}/alerts": orjson.dumps(next(a for a in reversed(committed) if a["vehicle_id"] == v))
        for v in vehicles
    }
    assert retained == last
    # History: exactly the contract's keys.
    keys = ReadKeys(s.redis_prefix)
    for a in committed:
        assert r.get(keys.alert(a["alert_id"])) == orjson.dumps(a)
        assert r.zscore(keys.alerts_by_ts, a["alert_id"]) == a["ts_ms"]
        assert r.zscore(keys.alerts_vehicle(a["vehicle_id"]), a["alert_id"]) == a["ts_ms"]
        assert r.zscore(keys.alerts_type(a["type"]), a["alert_id"]) == a["ts_ms"]
    assert r.zcard(keys.alerts_by_ts) == len(ids)
    assert not any(r.exists(keys.alert(aid)) for aid in aborted_ids)
    for v in vehicles:
        opened = {
            a["type"]: a["alert_id"]
            for a in committed
            if a["vehicle_id"] == v and a["type"] != "ROUTE_RETURN"
        }
        last_dev = max(a["seq"] for a in committed if a["vehicle_id"] == v and a["type"] == "ROUTE_DEVIATION")
        last_ret = max(a["seq"] for a in committed if a["vehicle_id"] == v and a["type"] == "ROUTE_RETURN")
        hash_ = {_s(k): _s(x) for k, x in r.hgetall(keys.alerts_open(v)).items()}
        assert hash_.get("OVERSPEED") == opened["OVERSPEED"]
        assert ("ROUTE_DEVIATION" in hash_) == (last_dev > last_ret)
    # Metrics reconcile: consumed = delivered + dead-lettered + duplicates + filtered.
    for name, snap in snaps.items():
        assert snap.reconciles, (name, snap)
        assert snap.dead_lettered == 1, (name, snap)  # the garbage record
    assert snaps["hook"].delivered == len(ids)
    assert snaps["dev-r1"].delivered == len(wanted_by_dev_r1)
    assert snaps["dev-r1"].filtered == len(ids) - len(wanted_by_dev_r1)
    assert registry.get_sample_value(
        "fleetfence_alert_receiver_delivered_total", {"receiver": "mqtt"}
    ) == len(ids)
    dlq = read_dlq(s, expected=4)
    assert sorted(h["receiver"] for _, h in dlq) == ["dev-r1", "history", "hook", "mqtt"]
    assert all(v == b"this is not an alert" and h["reason"] == "invalid_alert" for v, h in dlq)
    # Offsets were committed after the side effects, past the transaction markers: no lag.
    for name in ("history", "mqtt", "hook", "dev-r1"):
        assert_fully_committed(s, group_id(s, name))

    # A replay from the start under new groups (as after an offset reset) performs nothing again.
    replay_cfg = parse_config(receivers_toml(target.url, root))
    for rc in replay_cfg.receivers:
        rc.group_id = f"{s.topic_prefix}replay-{rc.name}"
    sub2 = MqttCollector(s, f"{root}/alerts")
    replay = AlertService(s, replay_cfg, CollectorRegistry()).start()
    try:
        wait_for(
            lambda: all(
                snap.consumed == len(committed) + 1 and snap.reconciles
                for snap in replay.snapshots().values()
            ),
            30,
            "the replay to read everything",
        )
        replay_snaps = replay.snapshots()
    finally:
        replay.stop()
        sub2.close()
    assert target.accepted == expected
    assert sub2.snapshot() == []
    assert r.zcard(keys.alerts_by_ts) == len(ids)
    for name, snap in replay_snaps.items():
        assert snap.delivered == 0, (name, snap)
        assert snap.reconciles, (name, snap)
    assert len(read_dlq(s, expected=4)) == 4  # invalid records are not dead-lettered twice
    # Clean up the retained messages this test left on the private broker.
    cleaner = mqtt.Client(CallbackAPIVersion.VERSION2)
    login(cleaner, mqtt_test_account(s))
    cleaner.connect(host, port)
    cleaner.loop_start()
    for t in last:
        cleaner.publish(t, b"", qos=1, retain=True).wait_for_publish(5)
    cleaner.loop_stop()
    cleaner.disconnect()
    r.close()


def test_webhook_retries_then_delivers_once_and_dead_letters_after_n(
    settings: Settings, target: WebhookTarget
) -> None:
    ensure_topics(settings.bootstrap_servers, topic_specs(settings))
    s = alerts_settings(settings, alerts_commit_interval_ms=100)
    run = uuid.uuid4().hex[:6]
    flaky = make_alert(f"f{run}", "OVERSPEED", 1)
    broken = make_alert(f"b{run}", "OVERSPEED", 2)
    rejected = make_alert(f"r{run}", "OVERSPEED", 3)
    fine = [make_alert(f"ok{run}", "ROUTE_DEVIATION", n) for n in range(4, 10)]

    def respond(aid: str, attempt: int) -> int:
        if aid == flaky["alert_id"]:
            return 503 if attempt <= 3 else 200  # fails N=3 times, then recovers
        if aid == broken["alert_id"]:
            return 500
        if aid == rejected["alert_id"]:
            return 400
        return 204

    target.respond = respond
    AlertWriter(s).batch([flaky, broken, rejected, *fine])
    toml = f"""
[[receivers]]
name = "hook"
kind = "webhook"
url = "{target.url}"
secret = "{SECRET}"
max_attempts = 5
backoff_initial_ms = 20
backoff_max_ms = 80
"""
    service = AlertService(s, parse_config(toml), CollectorRegistry()).start()
    try:

        def all_handled() -> Snapshot | None:
            x = service.snapshots()["hook"]
            return x if x.consumed == 9 and x.reconciles else None

        snap = wait_for(all_handled, 30, "all nine alerts handled")
    finally:
        service.stop()
    assert target.accepted == Counter({flaky["alert_id"]: 1, **{a["alert_id"]: 1 for a in fine}})
    assert target.attempts[flaky["alert_id"]] == 4
    assert target.attempts[broken["alert_id"]] == 5  # max_attempts in total, no more
    assert target.attempts[rejected["alert_id"]] == 1  # a 400 is not retried
    assert (snap.delivered, snap.dead_lettered, snap.retried) == (7, 2, 3 + 4)
    dlq = read_dlq(s, expected=2)
    by_id = {h["alert_id"]: (v, h) for v, h in dlq}
    assert set(by_id) == {broken["alert_id"], rejected["alert_id"]}
    v, h = by_id[broken["alert_id"]]
    assert v == orjson.dumps(broken)
    assert (h["reason"], h["attempts"], h["http_status"], h["receiver"]) == (
        "retries_exhausted",
        "5",
        "500",
        "hook",
    )
    assert h["source_topic"] == s.topics.alerts
    _, h = by_id[rejected["alert_id"]]
    assert (h["reason"], h["attempts"], h["http_status"]) == ("rejected", "1", "400")


def test_history_open_conditions_and_publish(settings: Settings) -> None:
    s = alerts_settings(settings)
    r = redis.Redis.from_url(s.redis_dsn)
    keys = ReadKeys(s.redis_prefix)
    pubsub = r.pubsub()  # type: ignore[no-untyped-call]
    pubsub.subscribe(keys.alerts_channel)
    wait_for(lambda: pubsub.get_message(timeout=0.1), 5, "subscribe confirmation")
    sink = HistorySink(redis.Redis.from_url(s.redis_dsn), s.redis_prefix)
    ctx = Context(
        SourceRecord("t", 0, 0, None), ReceiverMetrics("h", CollectorRegistry()), None, threading.Event()
    )
    v = f"h{uuid.uuid4().hex[:6]}"

    def deliver(d: dict[str, Any]) -> Outcome:
        return sink.deliver(parse_alert(orjson.dumps(d)), ctx)

    def open_() -> dict[str, str]:
        return {_s(k): _s(x) for k, x in r.hgetall(keys.alerts_open(v)).items()}

    dev = make_alert(v, "ROUTE_DEVIATION", 10)
    assert deliver(dev) is Outcome.DELIVERED
    assert deliver(dev) is Outcome.DUPLICATE
    enter = make_alert(v, "ZONE_ENTER", 11, zone="depot-1")
    deliver(enter)
    assert open_() == {"ROUTE_DEVIATION": dev["alert_id"], "ZONE:depot-1": enter["alert_id"]}
    # A stale return (older seq than the open deviation) must not close it.
    deliver(make_alert(v, "ROUTE_RETURN", 5))
    assert "ROUTE_DEVIATION" in open_()
    deliver(make_alert(v, "ROUTE_RETURN", 12))
    deliver(make_alert(v, "ZONE_EXIT", 13, zone="depot-1"))
    assert open_() == {}
    silent = make_alert(v, "VEHICLE_SILENT", 14)
    deliver(silent)
    assert open_() == {"VEHICLE_SILENT": silent["alert_id"]}
    speed = make_alert(v, "OVERSPEED", 15)
    deliver(speed)
    assert open_() == {"OVERSPEED": speed["alert_id"]}  # a newer alert proves the vehicle spoke again
    published: list[str] = []
    deadline = time.monotonic() + 5
    while len(published) < 7 and time.monotonic() < deadline:
        m = pubsub.get_message(timeout=0.2)
        if m and m["type"] == "message":
            published.append(orjson.loads(m["data"])["alert_id"])
    assert len(published) == len(set(published)) == 7  # each new alert once, the duplicate never
    assert dev["alert_id"] in published
    pubsub.close()
    sink.close()
    r.close()


def _env(s: AlertsSettings, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLEETFENCE_")}
    env.update(
        FLEETFENCE_KAFKA_BOOTSTRAP=s.bootstrap_servers,
        FLEETFENCE_MQTT_URL=f"mqtt://{s.mqtt_host_port[0]}:{s.mqtt_host_port[1]}",
        FLEETFENCE_REDIS_URL=s.redis_dsn,
        FLEETFENCE_TOPIC_PREFIX=s.topic_prefix,
        FLEETFENCE_REDIS_PREFIX=s.redis_prefix,
        FLEETFENCE_STATE_DIR=str(s.state_dir),
        **account_env(s),
        **extra,
    )
    return env


FLEETFENCE = [sys.executable, "-c", "from cli.app import app; app()"]


@pytest.mark.slow
def test_sigkilled_receiver_restarts_without_repeating_a_side_effect(
    settings: Settings, target: WebhookTarget, tmp_path: Path
) -> None:
    ensure_topics(settings.bootstrap_servers, topic_specs(settings))
    s = alerts_settings(settings)
    run = uuid.uuid4().hex[:6]
    committed = [make_alert(f"k{run}-{i % 7}", "OVERSPEED", i) for i in range(60)]
    aborted = [make_alert(f"k{run}-x", "ZONE_ENTER", i, zone="z") for i in range(10)]
    writer = AlertWriter(s)
    # Committed alerts in partitions 0-2, the aborted transaction alone in partition 3: a partition
    # holding nothing a read_committed consumer ever sees must still get its offset committed.
    for n in range(0, 60, 10):
        writer.batch(committed[n : n + 10], partition=lambda a: a["seq"] % 3)
        if n == 20:
            writer.batch(aborted, commit=False, partition=lambda _a: 3)

    gate_open = threading.Event()

    def respond(aid: str, attempt: int) -> int:
        # After 25 accepted alerts the target fails every new one until the test opens the gate,
        # so the receiver is mid-stream, retrying, when it is killed.
        if not gate_open.is_set() and len(target.accepted) >= 25 and aid not in target.accepted:
            return 503
        return 200

    target.respond = respond
    config = tmp_path / "receivers.toml"
    config.write_text(
        f'[[receivers]]\nname = "hook"\nkind = "webhook"\nurl = "{target.url}"\nsecret_env = "HOOK_SECRET"\n'
        "max_attempts = 20\nbackoff_initial_ms = 20\nbackoff_max_ms = 100\ntimeout_s = 2\n"
    )
    metrics_port = probes.free_port()
    # Commits only every 10 minutes: the restart replays everything, so only de-duplication by
    # alert_id stands between the replay and a second POST.
    env = _env(
        s,
        HOOK_SECRET=SECRET,
        FLEETFENCE_ALERTS_COMMIT_INTERVAL_MS="600000",
        FLEETFENCE_ALERTS_METRICS_PORT=str(metrics_port),
    )
    argv = [*FLEETFENCE, "alerts", "run", "--config", str(config)]
    log = (tmp_path / "receiver.log").open("wb")
    proc = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        wait_for(
            lambda: len(target.accepted) >= 25 and sum(target.attempts.values()) >= 28,
            60,
            "the receiver to be stuck retrying mid-stream",
        )
        proc.send_signal(signal.SIGKILL)
        assert proc.wait(10) == -signal.SIGKILL
        killed_at = set(target.accepted_ids())
        assert 25 <= len(killed_at) < 60
        nothing_committed = dict.fromkeys(range(4), -1001)
        assert committed_offsets(s, group_id(s, "hook")) == nothing_committed
        gate_open.set()
        proc = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT)
        ids = {a["alert_id"] for a in committed}
        wait_for(lambda: target.accepted_ids() >= ids, 60, "every alert after the restart")

        def scrape() -> str:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=2) as resp:
                    return str(resp.read().decode())
            except OSError:
                return ""

        def sample(text: str, name: str) -> float:
            line = next(x for x in text.splitlines() if x.startswith(f'{name}{{receiver="hook"}}'))
            return float(line.split()[-1])

        def consumed_all() -> str | None:
            t = scrape()
            if not t:
                return None
            done = sample(t, "fleetfence_alert_receiver_delivered_total") + sample(
                t, "fleetfence_alert_receiver_duplicates_total"
            )
            return t if sample(t, "fleetfence_alert_receiver_consumed_total") == 60 == done else None

        text = wait_for(consumed_all, 30, "the restarted receiver to have consumed all 60 committed alerts")
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
        log.close()
    assert target.accepted == Counter(dict.fromkeys(ids, 1)), (tmp_path / "receiver.log").read_text()[-3000:]
    assert not {a["alert_id"] for a in aborted} & set(target.attempts)
    assert sample(text, "fleetfence_alert_receiver_duplicates_total") == len(killed_at)
    assert sample(text, "fleetfence_alert_receiver_delivered_total") == 60 - len(killed_at)
    # The graceful stop committed every offset, past the transaction markers.
    assert_fully_committed(s, group_id(s, "hook"))


def test_tail_json_filters_and_exits_after_limit(settings: Settings, tmp_path: Path) -> None:
    ensure_topics(settings.bootstrap_servers, topic_specs(settings))
    s = alerts_settings(settings)
    run = uuid.uuid4().hex[:6]
    mine = [make_alert(f"tail{run}", "ROUTE_DEVIATION", n) for n in range(1, 5)]
    other = [make_alert(f"other{run}", "ROUTE_DEVIATION", n) for n in range(1, 5)]
    writer = AlertWriter(s)
    writer.batch([make_alert(f"tail{run}", "ROUTE_DEVIATION", 99)], commit=False)
    writer.batch([*other[:2], *mine[:2]])
    writer.batch([*other[2:], *mine[2:]], raw=[b"{broken"])
    argv = [*FLEETFENCE, "alerts", "tail", "--json", "--from-beginning", "--vehicle", f"tail{run}", "-n", "4"]
    out = subprocess.run(argv, env=_env(s), capture_output=True, timeout=60, check=False)
    assert out.returncode == 0, out.stderr.decode()[-2000:]
    lines = out.stdout.decode().splitlines()
    assert lines == [orjson.dumps(a).decode() for a in mine]  # one vehicle: its partition's order
    human = subprocess.run(
        [*FLEETFENCE, "alerts", "tail", "--from-beginning", "-t", "route_deviation", "-r", "r-1", "-n", "8"],
        env=_env(s, COLUMNS="200"),
        capture_output=True,
        timeout=60,
        check=False,
    )
    assert human.returncode == 0, human.stderr.decode()[-2000:]
    shown = human.stdout.decode().splitlines()
    assert len(shown) == 8
    assert all(" ROUTE_DEVIATION " in line and "route=r-1" in line for line in shown)
    bad = subprocess.run(
        [*FLEETFENCE, "alerts", "tail", "--type", "SPEEDING"],
        env=_env(s),
        capture_output=True,
        timeout=30,
        check=False,
    )
    assert bad.returncode == 2
    assert "alert types are" in bad.stderr.decode()


def test_a_second_receiver_takes_partitions_over_without_duplicates_or_losses(
    settings: Settings, target: WebhookTarget, caplog: pytest.LogCaptureFixture
) -> None:
    """Two processes run the same receiver (one consumer group, static members `a` and `b`). The
    second joins while the first is delivering a steady stream: the group rebalances cooperatively,
    the first keeps half of the partitions and keeps delivering, the second takes the other half
    over from the offsets the first committed when it gave them up. Every committed alert is
    POSTed exactly once, none is read twice, none is lost, and aborted ones never show."""
    caplog.set_level(logging.INFO, logger="alerts.runner")
    ensure_topics(settings.bootstrap_servers, topic_specs(settings))
    s = alerts_settings(settings, alerts_commit_interval_ms=200)
    run = uuid.uuid4().hex[:6]
    vehicles = [f"g{run}-{i}" for i in range(40)]  # keys spread over every partition
    writer = AlertWriter(s)
    written: list[dict[str, Any]] = []
    aborted: list[dict[str, Any]] = []
    seqs = iter(range(1, 1_000_000))

    def write(n: int, *, commit: bool = True) -> None:
        batch = [make_alert(vehicles[i % len(vehicles)], "OVERSPEED", next(seqs)) for i in range(n)]
        writer.batch(batch, commit=commit)
        (written if commit else aborted).extend(batch)

    write(100)
    write(20, commit=False)
    toml = f'[[receivers]]\nname = "hook"\nkind = "webhook"\nurl = "{target.url}"\nsecret = "{SECRET}"\n'
    first = AlertService(
        s.model_copy(update={"alerts_instance_id": f"a{run}"}), parse_config(toml), CollectorRegistry()
    )
    second: AlertService | None = None
    stop_writing = threading.Event()

    def keep_writing() -> None:  # a steady stream of alerts while the group rebalances
        while not stop_writing.wait(0.05):
            write(5)
            write(1, commit=False)

    streamer = threading.Thread(target=keep_writing, daemon=True)
    try:
        first.start()
        a = first.runners["hook"]
        wait_for(lambda: target.accepted_ids() >= {x["alert_id"] for x in written}, 30, "the first 100")
        assert len(a.partitions) == s.alerts_partitions
        streamer.start()
        second = AlertService(
            s.model_copy(update={"alerts_instance_id": f"b{run}"}), parse_config(toml), CollectorRegistry()
        ).start()
        b = second.runners["hook"]
        delivered_at_join = first.snapshots()["hook"].delivered
        smallest_share: list[int] = []

        def balanced() -> bool:
            smallest_share.append(len(a.partitions))
            return len(a.partitions) == len(b.partitions) == s.alerts_partitions // 2

        wait_for(balanced, 60, "the group to balance over both receivers")
        assert not a.partitions & b.partitions
        # Cooperative: the first gave up exactly the partitions that moved, kept the others and
        # delivered throughout the join.
        revoked = [
            r.getMessage()
            for r in caplog.records
            if r.getMessage().startswith(f"partitions revoked receiver=hook instance=a{run}.hook ")
        ]
        moved = sorted(p for _, p in b.partitions)
        assert revoked == [
            f"partitions revoked receiver=hook instance=a{run}.hook removed={moved} owned="
            f"{sorted(p for _, p in a.partitions)}"
        ], revoked
        assert min(smallest_share) >= s.alerts_partitions // 2
        assert first.snapshots()["hook"].delivered > delivered_at_join
        wait_for(
            lambda: second.snapshots()["hook"].delivered > 0 if second else False, 30, "the second to deliver"
        )
        stop_writing.set()
        streamer.join(10)
        write(100)  # after the rebalance: both members deliver their share
        ids = {x["alert_id"] for x in written}
        wait_for(lambda: target.accepted_ids() >= ids, 60, "every committed alert")

        def consumed() -> int:
            assert second is not None
            return first.snapshots()["hook"].consumed + second.snapshots()["hook"].consumed

        wait_for(lambda: consumed() >= len(written), 30, "both receivers to handle every committed alert")
    finally:
        stop_writing.set()
        if streamer.is_alive():
            streamer.join(10)
        first.stop()
        if second is not None:
            second.stop()
    assert second is not None
    snaps = [first.snapshots()["hook"], second.snapshots()["hook"]]
    assert target.accepted == Counter(dict.fromkeys(ids, 1))  # each once
    assert target.attempts == Counter(dict.fromkeys(ids, 1))  # not even a repeated attempt
    assert not {x["alert_id"] for x in aborted} & set(target.attempts)
    # No record read twice: the partitions moved exactly at the offsets committed when revoked.
    assert sum(x.consumed for x in snaps) == len(written), snaps
    assert sum(x.delivered for x in snaps) == len(written), snaps
    assert all(x.duplicates == 0 and x.reconciles for x in snaps), snaps
    assert all(x.delivered > 0 for x in snaps), snaps
    assert_fully_committed(s, group_id(s, "hook"))


def email_receivers_toml(server: SmtpServer, interval_s: float, *, bad: bool = True) -> str:
    """`mail` logs in right and mails two recipients; `mail-bad` has a wrong password."""
    common = f"""kind = "email"
host = "127.0.0.1"
port = {server.port}
tls = "starttls"
ca_file = "{server.tls_files.ca}"
username = "{SMTP_USER}"
sender = "FleetFence <alerts@fleet.example>"
interval_s = {interval_s}
backoff_initial_ms = 10
backoff_max_ms = 20
timeout_s = 5
"""
    good = f"""
[[receivers]]
name = "mail"
password_env = "FF_TEST_SMTP_PASSWORD"
recipients = ["ops@fleet.example", "dispatch@fleet.example"]
{common}
"""
    wrong = f"""
[[receivers]]
name = "mail-bad"
password_env = "FF_TEST_SMTP_WRONG"
recipients = ["ops@fleet.example"]
{common}
"""
    return good + (wrong if bad else "")


@pytest.mark.filterwarnings("ignore:Requiring AUTH while not requiring TLS:UserWarning")
def test_email_holds_a_storm_uncommitted_then_mails_it_once_per_recipient_across_restarts(
    settings: Settings, smtp_server: SmtpServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first run holds the storm in its window and is stopped before the window closes: nothing
    is mailed and no offset passes a held alert. The second run mails the storm, one message per
    recipient listing all of it, and dead-letters it for the receiver whose login the server refuses.
    A replay under new groups mails nothing again."""
    monkeypatch.setenv("FF_TEST_SMTP_PASSWORD", SMTP_PASSWORD)
    monkeypatch.setenv("FF_TEST_SMTP_WRONG", "not-the-password")
    ensure_topics(settings.bootstrap_servers, topic_specs(settings))
    s = alerts_settings(settings, alerts_commit_interval_ms=100)
    run = uuid.uuid4().hex[:6]
    storm = [make_alert(f"m{run}-{i % 4}", "OVERSPEED", i) for i in range(12)]
    aborted = [make_alert(f"m{run}-{i % 4}", "ZONE_ENTER", 100 + i, zone="z") for i in range(4)]
    writer = AlertWriter(s)
    writer.batch(storm, partition=lambda a: a["seq"] % 4)
    writer.batch(aborted, commit=False, partition=lambda a: a["seq"] % 4)
    ids = [a["alert_id"] for a in storm]

    held = AlertService(s, parse_config(email_receivers_toml(smtp_server, 3600)), CollectorRegistry()).start()
    try:
        wait_for(
            lambda: all(x.consumed == 12 and x.held == 12 for x in held.snapshots().values()),
            30,
            "both receivers to hold the whole storm",
        )
    finally:
        held.stop()
    # Stopped holding the storm: released unsent, and the counts still reconcile.
    assert all(x.released == 12 and x.delivered == 0 and x.reconciles for x in held.snapshots().values())
    assert smtp_server.data_attempts == 0
    assert smtp_server.auth_failures == 0
    for name in ("mail", "mail-bad"):  # each partition's first record is held: nothing past it
        assert set(committed_offsets(s, group_id(s, name)).values()) <= {-1001, 0}

    registry = CollectorRegistry()
    service = AlertService(s, parse_config(email_receivers_toml(smtp_server, 0.5)), registry).start()
    try:

        def settled() -> dict[str, Snapshot] | None:
            snaps = service.snapshots()
            done = all(x.consumed == 12 and x.held == 0 and x.reconciles for x in snaps.values())
            return snaps if done else None

        snaps = wait_for(settled, 30, "both receivers to settle the storm")
    finally:
        service.stop()
    got = smtp_server.snapshot()
    assert sorted(r.rcpt_tos[0] for r in got) == ["dispatch@fleet.example", "ops@fleet.example"]
    for r in got:
        assert r.tls
        assert r.message["Subject"] == "[FleetFence] 12 alerts: 12 OVERSPEED"
        # Partitions interleave in the read; each partition's alerts keep their order.
        assert sorted(r.message["X-FleetFence-Alert-Ids"].split(", ")) == sorted(ids)
    assert smtp_server.auth_failures >= 1
    assert (snaps["mail"].delivered, snaps["mail"].messages, snaps["mail"].dead_lettered) == (12, 2, 0)
    assert (snaps["mail-bad"].delivered, snaps["mail-bad"].messages, snaps["mail-bad"].dead_lettered) == (
        0,
        0,
        12,
    )
    assert (
        registry.get_sample_value("fleetfence_alert_receiver_messages_sent_total", {"receiver": "mail"}) == 2
    )
    dlq = read_dlq(s, expected=12)
    assert sorted(h["alert_id"] for _, h in dlq) == sorted(ids)
    for v, h in dlq:
        assert (h["receiver"], h["reason"], h["smtp_code"], h["recipient"]) == (
            "mail-bad",
            "rejected",
            "535",
            "ops@fleet.example",
        )
        assert v == orjson.dumps(storm[ids.index(h["alert_id"])])
    for name in ("mail", "mail-bad"):
        assert_fully_committed(s, group_id(s, name))

    # A replay from the start under new groups (as after an offset reset) mails nothing again.
    replay_cfg = parse_config(email_receivers_toml(smtp_server, 0.5))
    for rc in replay_cfg.receivers:
        rc.group_id = f"{s.topic_prefix}replay-{rc.name}"
    replay = AlertService(s, replay_cfg, CollectorRegistry()).start()
    try:
        wait_for(
            lambda: all(x.consumed == 12 and x.reconciles for x in replay.snapshots().values()),
            30,
            "the replay to read everything",
        )
        replay_snaps = replay.snapshots()
    finally:
        replay.stop()
    assert all((x.delivered, x.duplicates, x.messages) == (0, 12, 0) for x in replay_snaps.values())
    assert len(smtp_server.snapshot()) == 2
    assert len(read_dlq(s, expected=12)) == 12


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore:Requiring AUTH while not requiring TLS:UserWarning")
def test_email_alerts_held_on_partitions_that_move_are_mailed_once_by_their_new_owner(
    settings: Settings, smtp_server: SmtpServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Member `a` holds every alert in a long window. Member `b` joins: `a` gives up half of the
    partitions, committed only up to what it holds there, and forgets those alerts; `b` reads them
    again and mails them. Then `a` stops, still holding the rest, and comes back with a short
    window: it mails the rest. Each recipient gets each alert exactly once."""
    monkeypatch.setenv("FF_TEST_SMTP_PASSWORD", SMTP_PASSWORD)
    ensure_topics(settings.bootstrap_servers, topic_specs(settings))
    s = alerts_settings(settings, alerts_commit_interval_ms=100)
    run = uuid.uuid4().hex[:6]
    storm = [make_alert(f"q{run}-{i % 4}", "ROUTE_DEVIATION", i) for i in range(12)]
    AlertWriter(s).batch(storm, partition=lambda a: a["seq"] % 4)
    by_partition = {p: {a["alert_id"] for a in storm if a["seq"] % 4 == p} for p in range(4)}

    def member(instance: str, interval_s: float) -> AlertService:
        return AlertService(
            s.model_copy(update={"alerts_instance_id": f"{instance}{run}"}),
            parse_config(email_receivers_toml(smtp_server, interval_s, bad=False)),
            CollectorRegistry(),
        ).start()

    def mailed() -> Counter[tuple[str, str]]:
        return Counter(
            (r.rcpt_tos[0], aid)
            for r in smtp_server.snapshot()
            for aid in r.message["X-FleetFence-Alert-Ids"].split(", ")
        )

    a = member("a", 3600)
    b: AlertService | None = None
    again: AlertService | None = None
    try:
        wait_for(lambda: a.snapshots()["mail"].held == 12, 30, "a to hold the storm")
        b = member("b", 0.5)
        ra, rb = a.runners["mail"], b.runners["mail"]
        wait_for(lambda: len(ra.partitions) == len(rb.partitions) == 2, 60, "the group to balance")
        moved = {p for _, p in rb.partitions}
        moved_ids = set().union(*(by_partition[p] for p in moved))
        wait_for(lambda: b.snapshots()["mail"].delivered == 6 if b else None, 30, "b to mail what moved")
        assert a.snapshots()["mail"].held == 6
        assert a.snapshots()["mail"].released == 6  # what moved, dropped unsent
        assert {aid for _, aid in mailed()} == moved_ids  # b's mails; a mailed nothing
        a.stop()
        first = a.snapshots()["mail"]
        assert (first.consumed, first.released, first.delivered, first.reconciles) == (12, 12, 0, True)
        again = member("a", 0.5)  # the same static member: its partitions back, no rebalance
        wait_for(
            lambda: again.snapshots()["mail"].delivered == 6 if again else None, 30, "a to mail the rest"
        )
    finally:
        for m in (a, b, again):
            if m is not None:
                m.stop()
    recipients = ["ops@fleet.example", "dispatch@fleet.example"]
    assert mailed() == Counter({(r, x["alert_id"]): 1 for r in recipients for x in storm})
    assert b is not None
    assert again is not None
    assert all(m.snapshots()["mail"].reconciles for m in (b, again))
    assert_fully_committed(s, group_id(s, "mail"))


def test_history_retention_takes_old_alerts_out_and_keeps_open_conditions(settings: Settings) -> None:
    """With a retention, the history read model stays bounded: alerts older than it leave every
    index and their documents go, except the alert of a condition still open (the API shows it
    with the vehicle's live state); newer alerts stay."""
    s = alerts_settings(settings)
    r = redis.Redis.from_url(s.redis_dsn)
    keys = ReadKeys(s.redis_prefix)
    hour_ms = 3_600_000
    sink = HistorySink(redis.Redis.from_url(s.redis_dsn), s.redis_prefix, hour_ms, trim_interval_s=1e9)
    ctx = Context(
        SourceRecord("t", 0, 0, None), ReceiverMetrics("h", CollectorRegistry()), None, threading.Event()
    )
    v = f"h{uuid.uuid4().hex[:6]}"

    def index(key: str) -> list[str]:
        return [_s(x) for x in cast(list[bytes], r.zrange(key, 0, -1))]

    def stored(a: dict[str, Any]) -> bool:
        return r.get(keys.alert(a["alert_id"])) is not None

    # A deviation and its return (closed), a zone entered (open), an overspeed (open, recent).
    closed = [make_alert(v, "ROUTE_DEVIATION", 1), make_alert(v, "ROUTE_RETURN", 2)]
    entered = make_alert(v, "ZONE_ENTER", 3, zone="depot-1")
    recent = make_alert(v, "OVERSPEED", 20)
    for a in [*closed, entered, recent]:
        assert sink.deliver(parse_alert(orjson.dumps(a)), ctx) is Outcome.DELIVERED
    assert index(keys.alerts_vehicle(v)) == [a["alert_id"] for a in [*closed, entered, recent]]

    # Now = an hour after seq 10's event time: seqs 1-3 are older than the retention.
    now_ms = make_alert(v, "OVERSPEED", 10)["ts_ms"] + hour_ms
    assert sink.trim(now_ms) == (3, 2)
    assert index(keys.alerts_vehicle(v)) == [recent["alert_id"]]
    assert closed[0]["alert_id"] not in index(keys.alerts_type("ROUTE_DEVIATION"))
    assert entered["alert_id"] not in index(keys.alerts_by_ts)
    assert recent["alert_id"] in index(keys.alerts_type("OVERSPEED"))
    assert [stored(a) for a in [*closed, entered, recent]] == [False, False, True, True]
    assert r.hget(keys.alerts_open(v), "ZONE:depot-1") == entered["alert_id"].encode()
    assert sink.trim(now_ms) == (0, 0)  # nothing left before the cutoff

    # Delivering trims by the wall clock, at most once per interval: these alerts are days old.
    auto = HistorySink(redis.Redis.from_url(s.redis_dsn), s.redis_prefix, hour_ms, trim_interval_s=0)
    back = make_alert(v, "ROUTE_RETURN", 30)
    assert auto.deliver(parse_alert(orjson.dumps(back)), ctx) is Outcome.DELIVERED
    assert index(keys.alerts_vehicle(v)) == []
    assert not stored(back)
    assert stored(recent)  # the overspeed is still open
    sink.close()
    auto.close()
    r.close()


def test_a_fenced_receiver_replaces_its_consumer_and_delivers_every_alert_once(
    settings: Settings, target: WebhookTarget
) -> None:
    """A static member fenced by another with the same group.instance.id has a dead consumer
    (librdkafka's fatal error). A coordinator's move can do that with no second process; here a
    plain consumer joining with the same id, then closed, does it for real. The receiver must
    replace its consumer in the same process (a restarted receivers service is one an attached load
    test can no longer account for) and POST every committed alert, before and after, exactly once."""
    ensure_topics(settings.bootstrap_servers, topic_specs(settings))
    s = alerts_settings(settings, alerts_commit_interval_ms=200)
    run = uuid.uuid4().hex[:6]
    same = s.model_copy(update={"alerts_instance_id": f"same{run}"})
    toml = f'[[receivers]]\nname = "hook"\nkind = "webhook"\nurl = "{target.url}"\nsecret = "{SECRET}"\n'
    writer = AlertWriter(s)
    vehicles = [f"f{run}-{i}" for i in range(20)]
    before = [make_alert(vehicles[i % 20], "OVERSPEED", i + 1) for i in range(60)]
    after = [make_alert(vehicles[i % 20], "OVERSPEED", i + 100) for i in range(60)]
    service = AlertService(same, parse_config(toml), CollectorRegistry()).start()
    intruder = None
    try:
        a = service.runners["hook"]
        writer.batch(before)
        wait_for(lambda: target.accepted_ids() >= {x["alert_id"] for x in before}, 60, "the first 60")
        join = intruder = group_consumer(
            s.bootstrap_servers, a.options.group_id, **{"group.instance.id": a.options.instance_id}
        )
        join.subscribe([s.topics.alerts])

        def replaced() -> bool:
            join.poll(0.2)  # joins the group; what it reads or is told (fenced in turn) is moot
            return a.metrics.snapshot().consumers_replaced >= 1

        wait_for(replaced, 90, "the receiver fenced and its consumer replaced")
        intruder.close()
        intruder = None
        writer.batch(after)
        wait_for(lambda: target.accepted_ids() >= {x["alert_id"] for x in after}, 90, "the 60 after")
        assert a.running
        assert a.error is None
        assert a.metrics.snapshot().consumers_replaced == 1
        ids = {x["alert_id"] for x in before + after}
        assert {k: n for k, n in target.accepted.items() if k in ids and n != 1} == {}
    finally:
        if intruder is not None:
            intruder.close()
        service.stop()


def test_a_receiver_fenced_again_and_again_ends(settings: Settings) -> None:
    """Two processes really running with one group.instance.id fence each other for ever, each
    replacing its consumer in turn. Past its budget one of them ends (its service exits non-zero for
    a supervisor or an operator to see), and the other keeps the partitions."""
    ensure_topics(settings.bootstrap_servers, topic_specs(settings))
    s = alerts_settings(settings)
    same = s.model_copy(update={"alerts_instance_id": f"same{uuid.uuid4().hex[:6]}"})
    toml = '[[receivers]]\nname = "history"\nkind = "history"\n'
    first = AlertService(same, parse_config(toml), CollectorRegistry()).start()
    second: AlertService | None = None
    try:
        a = first.runners["history"]
        assert a.wait_assigned(60), "the first receiver was never assigned its partitions"
        second = AlertService(same, parse_config(toml), CollectorRegistry()).start()
        b = second.runners["history"]
        wait_for(lambda: not (a.running and b.running), 240, "one of the two receivers ending")
        ended, kept = (a, b) if not a.running else (b, a)
        assert "does another process use the same group.instance.id" in str(ended.error), ended.error
        assert ended.metrics.snapshot().consumers_replaced == runner.FENCED_LIMIT
        assert kept.running
        assert kept.error is None
        assert kept.wait_assigned(60), "the remaining member never got the partitions"
    finally:
        first.stop()
        if second is not None:
            second.stop()
