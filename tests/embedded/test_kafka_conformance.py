"""What the pipeline relies on from Kafka, checked on the embedded Apache Kafka broker.

Durability of acknowledged records across a SIGKILL and a SIGTERM of the broker (the gateway's
PUBACK-after-Kafka promise and the processor's exactly-once both rest on it), transactions with
producer fencing (a zombie processor must not commit), read_committed hiding aborted and open
transactions (receivers and the processor read that way), compaction of `fleet.master` (the latest
version of each entity is kept, older ones go), cooperative rebalancing of a consumer group, and
`kcat -L` against the broker. The kill/restart tests run a private broker; the rest share the
session's.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from collections import Counter
from pathlib import Path

import pytest
from confluent_kafka import (
    OFFSET_BEGINNING,
    Consumer,
    KafkaError,
    KafkaException,
    Message,
    Producer,
    TopicPartition,
)
from confluent_kafka.admin import (
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    NewTopic,
)

from embedded import infra, processes
from fleetfence import probes
from fleetfence.kafka import (
    ensure_topics,
    group_consumer,
    idempotent_producer,
    topic_specs,
    transactional_producer,
)
from fleetfence.mqtt import account_env, account_fields
from fleetfence.settings import Settings
from fleetfence.testing import wait_for

pytestmark = pytest.mark.services

Record = tuple[int, bytes | None, bytes | None]  # partition, key, value


# --------------------------------------------------------------------------- helpers


def create_topic(bootstrap: str, name: str, partitions: int, **configs: str) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})  # alive until the result is in
    futures = admin.create_topics(
        [NewTopic(name, num_partitions=partitions, replication_factor=1, config=configs)],
        operation_timeout=30,
    )
    futures[name].result(30)


def read_all(
    bootstrap: str, topic: str, partitions: int, *, isolation: str = "read_committed", timeout_s: float = 60
) -> tuple[list[Record], dict[int, int]]:
    """Every record of every partition from the start to its end (the high watermark, or for
    read_committed the last stable offset), and per partition the offset after the last record read."""
    c = group_consumer(
        bootstrap, f"read-{uuid.uuid4().hex}", **{"isolation.level": isolation, "enable.partition.eof": True}
    )
    records: list[Record] = []
    after_last: dict[int, int] = {}
    at_end: set[int] = set()
    try:
        c.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(partitions)])
        deadline = time.monotonic() + timeout_s
        while len(at_end) < partitions:
            if time.monotonic() > deadline:
                pytest.fail(f"{topic}: partitions {set(range(partitions)) - at_end} not read to the end")
            for m in c.consume(10_000, 0.5):
                err = m.error()
                if err is None:
                    records.append((m.partition(), m.key(), m.value()))
                    after_last[m.partition()] = m.offset() + 1
                    at_end.discard(m.partition())
                elif err.code() == KafkaError._PARTITION_EOF:
                    at_end.add(m.partition())
                else:
                    pytest.fail(f"consumer error reading {topic}: {err}")
    finally:
        c.close()
    return records, after_last


def high_watermarks(bootstrap: str, topic: str, partitions: int) -> dict[int, int]:
    c = group_consumer(bootstrap, f"hw-{uuid.uuid4().hex}")
    try:
        return {
            p: c.get_watermark_offsets(TopicPartition(topic, p), timeout=10, cached=False)[1]
            for p in range(partitions)
        }
    finally:
        c.close()


def produce_acknowledged(bootstrap: str, topic: str, n: int, tag: str) -> set[tuple[bytes, bytes]]:
    """Produce `n` records with acks=all (idempotent) and return them once every delivery report
    came back without an error."""
    p = idempotent_producer(bootstrap)
    errors: list[KafkaError] = []
    acked = 0

    def on_delivery(err: KafkaError | None, _m: Message) -> None:
        nonlocal acked
        if err is not None:
            errors.append(err)
        else:
            acked += 1

    sent = {(f"{tag}-k{i % 500}".encode(), f"{tag}-v{i}".encode()) for i in range(n)}
    for key, value in sent:
        while True:
            try:
                p.produce(topic, key=key, value=value, on_delivery=on_delivery)
                break
            except BufferError:  # the local queue is full: serve delivery reports, then retry
                p.poll(0.1)
    assert p.flush(60) == 0
    assert not errors, errors[:5]
    assert acked == n
    return sent


def kafka_pid(s: Settings) -> tuple[int, str, str]:
    rec = processes.read_pid(s, "kafka")
    assert rec is not None, "no pid file of the private broker"
    assert processes.alive(*rec), "the private broker is not running"
    return rec


def assert_all_there(bootstrap: str, topic: str, partitions: int, sent: set[tuple[bytes, bytes]]) -> None:
    records, after_last = read_all(bootstrap, topic, partitions)
    assert after_last == high_watermarks(bootstrap, topic, partitions)  # read to the end
    pairs = [(k, v) for _, k, v in records]
    assert len(pairs) == len(sent), f"{topic}: {len(pairs)} records, {len(sent)} acknowledged"
    assert set(pairs) == sent


# --------------------------------------------------------------------------- durability


# A broker SIGKILLed: in the fault suite, with the other kills (the default suite's budget).
@pytest.mark.fault
@pytest.mark.slow
def test_acknowledged_records_survive_sigkill_and_sigterm_of_the_broker(own_kafka: Settings) -> None:
    s = own_kafka
    bs = s.bootstrap_servers
    create_topic(bs, f"{s.topic_prefix}durable", 4)
    create_topic(bs, f"{s.topic_prefix}durable2", 4)

    # SIGKILL right after the last acknowledgement: nothing the broker acknowledged may be lost.
    sent = produce_acknowledged(bs, f"{s.topic_prefix}durable", 20_000, "kill")
    pid, exe, marker = kafka_pid(s)
    os.kill(pid, signal.SIGKILL)
    wait_for(lambda: processes.exited(pid), 30, "the broker to die")  # its port free again
    processes.reap(pid)
    assert not processes.alive(pid, exe, marker)
    assert probes.port_free(s.host, s.kafka_port)
    infra.up(s, create_topics=False)
    assert kafka_pid(s)[0] != pid
    assert_all_there(bs, f"{s.topic_prefix}durable", 4, sent)

    # SIGTERM through the console script `fleetfence infra restart kafka`, right after the last
    # acknowledgement of a second batch: both batches are there afterwards.
    sent2 = produce_acknowledged(bs, f"{s.topic_prefix}durable2", 20_000, "term")
    pid2 = kafka_pid(s)[0]
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLEETFENCE_")}
    env.update(
        FLEETFENCE_STATE_DIR=str(s.state_dir),
        FLEETFENCE_KAFKA_PORT=str(s.kafka_port),
        FLEETFENCE_MQTT_URL=str(s.mqtt_url),
        **account_env(s),
        FLEETFENCE_REDIS_URL=str(s.redis_url),
        FLEETFENCE_STARTUP_TIMEOUT_S="90",
        COLUMNS="200",
    )
    cli = Path(sys.executable).parent / "fleetfence"
    out = subprocess.run(
        [str(cli), "infra", "restart", "kafka"],
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert "DOWN" not in out.stdout, out.stdout
    assert out.stdout.count("healthy") == 3, out.stdout
    new_pid = kafka_pid(s)[0]
    assert new_pid != pid2
    assert f" {new_pid} " in out.stdout  # the status table shows the new process
    assert not processes.alive(pid2, "java")
    assert_all_there(bs, f"{s.topic_prefix}durable", 4, sent)
    assert_all_there(bs, f"{s.topic_prefix}durable2", 4, sent2)


def test_restart_refuses_unknown_and_external_services(tmp_path: Path, infra_settings: Settings) -> None:
    from fleetfence.errors import InfraError

    s = Settings(
        **{
            **infra.private_fields(tmp_path),
            "mqtt_url": f"mqtt://127.0.0.1:{infra_settings.mqtt_port}",
            **account_fields(infra_settings),
        }
    )
    with pytest.raises(InfraError, match="unknown service 'zookeeper'"):
        infra.restart(s, "zookeeper")
    with pytest.raises(InfraError, match="mqtt is an external endpoint"):
        infra.restart(s, "mqtt")
    assert infra.down(s) == []  # nothing was started


# --------------------------------------------------------------------------- transactions


def txn_producer(bootstrap: str, transactional_id: str) -> Producer:
    p = transactional_producer(bootstrap, transactional_id)
    p.init_transactions(30)
    return p


def test_a_second_producer_with_the_same_transactional_id_fences_the_first(settings: Settings) -> None:
    bs = settings.bootstrap_servers
    topic = f"{settings.topic_prefix}fencing"
    create_topic(bs, topic, 2)
    tid = f"fence-{uuid.uuid4().hex}"
    first = txn_producer(bs, tid)
    first.begin_transaction()
    first.produce(topic, key=b"k", value=b"first-committed")
    first.commit_transaction(30)
    first.begin_transaction()
    first.produce(topic, key=b"k", value=b"first-zombie")
    assert first.flush(30) == 0  # in the log, not committed

    second = txn_producer(bs, tid)  # bumps the epoch and aborts the first's open transaction
    with pytest.raises(KafkaException) as fenced:
        first.commit_transaction(30)
    err = fenced.value.args[0]
    assert err.fatal(), err
    assert err.code() == KafkaError._FENCED, err
    # A fenced producer stays fenced: it can start nothing new.
    with pytest.raises(KafkaException):
        first.begin_transaction()

    second.begin_transaction()
    second.produce(topic, key=b"k", value=b"second-committed")
    second.commit_transaction(30)

    committed, _ = read_all(bs, topic, 2)
    assert [v for _, _, v in committed] == [b"first-committed", b"second-committed"]
    everything, _ = read_all(bs, topic, 2, isolation="read_uncommitted")
    assert [v for _, _, v in everything] == [b"first-committed", b"first-zombie", b"second-committed"]


def test_read_committed_hides_aborted_and_open_transactions(settings: Settings) -> None:
    bs = settings.bootstrap_servers
    ensure_topics(bs, topic_specs(settings))
    topic, parts = settings.topics.alerts, settings.alerts_partitions
    p = txn_producer(bs, f"rc-{uuid.uuid4().hex}")

    def txn(tag: str, n: int, *, commit: bool) -> set[bytes]:
        p.begin_transaction()
        values = {f"{tag}{i}".encode() for i in range(n)}
        for v in values:
            p.produce(topic, key=v, value=v)
        if commit:
            p.commit_transaction(30)
        else:
            assert p.flush(30) == 0  # the records reach the log before the abort
            p.abort_transaction(30)
        return values

    c1 = txn("committed-a-", 40, commit=True)
    aborted = txn("aborted-", 40, commit=False)
    c2 = txn("committed-b-", 40, commit=True)

    def values(isolation: str) -> Counter[bytes | None]:
        return Counter(v for _, _, v in read_all(bs, topic, parts, isolation=isolation)[0])

    assert values("read_committed") == Counter(c1 | c2)
    assert values("read_uncommitted") == Counter(c1 | aborted | c2)

    # An open transaction: invisible to read_committed (the last stable offset stops before it),
    # visible once committed.
    p.begin_transaction()
    opened = {f"open-{i}".encode() for i in range(8)}
    for v in opened:
        p.produce(topic, key=v, value=v)
    assert p.flush(30) == 0
    assert values("read_committed") == Counter(c1 | c2)
    assert opened <= set(values("read_uncommitted"))
    p.commit_transaction(30)
    assert values("read_committed") == Counter(c1 | c2 | opened)


# --------------------------------------------------------------------------- compaction


def test_fleet_master_is_compacted_to_the_latest_value_per_key(settings: Settings) -> None:
    bs = settings.bootstrap_servers
    ensure_topics(bs, topic_specs(settings))
    topic = settings.topics.master
    admin = AdminClient({"bootstrap.servers": bs})
    resource = ConfigResource(ConfigResource.Type.TOPIC, topic)
    described = admin.describe_configs([resource])[resource].result(30)
    assert described["cleanup.policy"].value == "compact"
    # Make the cleaner's work observable within seconds: short segments, any dirt is enough.
    tuned = ConfigResource(
        ConfigResource.Type.TOPIC,
        topic,
        incremental_configs=[
            ConfigEntry("segment.ms", "100", incremental_operation=AlterConfigOpType.SET),
            ConfigEntry("min.cleanable.dirty.ratio", "0.01", incremental_operation=AlterConfigOpType.SET),
        ],
    )
    admin.incremental_alter_configs([tuned])[tuned].result(30)

    p = idempotent_producer(bs)
    keys = [f"vehicle:v{i}".encode() for i in range(20)]
    for version in range(1, 6):
        for k in keys:
            p.produce(topic, key=k, value=b"%s@%d" % (k, version))
    p.produce(topic, key=b"vehicle:gone", value=b"vehicle:gone@1")
    p.produce(topic, key=b"vehicle:gone", value=None)  # deleted: its tombstone stays a while
    assert p.flush(30) == 0
    latest = {k: b"%s@5" % k for k in keys} | {b"vehicle:gone": None}
    written = 5 * len(keys) + 2

    ticks = 0
    records: list[Record] = []

    def compacted() -> bool:
        # The active segment is never cleaned: a record written after segment.ms rolls it, so
        # each poll writes one (under its own key, compacted away like the rest).
        nonlocal ticks, records
        ticks += 1
        p.produce(topic, key=b"tick", value=str(ticks).encode())
        assert p.flush(10) == 0
        records = [r for r in read_all(bs, topic, 1)[0] if r[1] != b"tick"]
        return len(records) == len(latest)

    wait_for(compacted, 90, "the log cleaner to compact fleet.master", interval_s=0.3)
    assert {k: v for _, k, v in records} == latest
    assert len(records) < written


# --------------------------------------------------------------------------- consumer groups


def test_a_joining_member_takes_partitions_over_incrementally(settings: Settings) -> None:
    """Cooperative rebalancing (group_consumer's assignor): when a second member joins, the first
    gives up only the partitions that move and keeps consuming the others throughout."""
    bs = settings.bootstrap_servers
    ensure_topics(bs, topic_specs(settings))
    topic, parts = settings.topics.alerts, settings.alerts_partitions
    group = f"{settings.topic_prefix}coop"
    events: list[tuple[str, str, frozenset[int]]] = []

    def member(name: str) -> Consumer:
        c = group_consumer(bs, group, **{"client.id": name})

        def on_assign(_c: Consumer, tps: list[TopicPartition]) -> None:
            events.append((name, "assign", frozenset(tp.partition for tp in tps)))

        def on_revoke(_c: Consumer, tps: list[TopicPartition]) -> None:
            events.append((name, "revoke", frozenset(tp.partition for tp in tps)))

        c.subscribe([topic], on_assign=on_assign, on_revoke=on_revoke)
        return c

    def owned(c: Consumer) -> set[int]:
        return {tp.partition for tp in c.assignment()}

    first = member("first")
    second: Consumer | None = None
    try:
        wait_for(lambda: first.poll(0.1) is None and len(owned(first)) == parts, 30, "the first member")
        second = member("second")

        def balanced() -> bool:
            assert second is not None
            first.poll(0.05)
            second.poll(0.05)
            a, b = owned(first), owned(second)
            return len(a) == len(b) == parts // 2 and not a & b

        wait_for(balanced, 60, "the group to balance")
        moved = frozenset(owned(second))
    finally:
        first.close()
        if second is not None:
            second.close()
    revokes = [e for e in events if e[0] == "first" and e[1] == "revoke"]
    assert revokes[0][2] == moved, events  # exactly what moved, not everything (no eager revoke)
    assert next(e for e in events if e[0] == "first" and e[1] == "assign")[2] == frozenset(range(parts))
    assert ("second", "assign", moved) in events


# --------------------------------------------------------------------------- kcat


def test_kcat_lists_the_brokers_topics(settings: Settings) -> None:
    kcat = shutil.which("kcat")
    assert kcat, "kcat is not installed: run `sudo apt-get install -y kcat` (scripts/dev.sh does)"
    ensure_topics(settings.bootstrap_servers, topic_specs(settings))
    out = subprocess.run(
        [kcat, "-L", "-b", settings.bootstrap_servers, "-m", "10"],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    ).stdout
    assert "1 brokers:" in out, out
    assert f"broker 1 at {settings.bootstrap_servers} (controller)" in out, out
    t = settings.topics
    assert f'topic "{t.telemetry}" with {settings.telemetry_partitions} partitions:' in out, out
    assert f'topic "{t.master}" with 1 partitions:' in out, out
