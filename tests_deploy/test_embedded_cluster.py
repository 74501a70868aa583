"""Faults on the embedded three-node Kafka cluster (`fleetfence infra up --kafka-brokers 3`), without
Docker: `python -m pytest tests_deploy -k embedded_cluster`.

The cluster is configured as docker-compose.yml's (three KRaft nodes, each a broker and a voter of
one controller quorum; topics with three replicas and min.insync.replicas=2). A thread writes keyed
records at a steady rate with the project's idempotent acks=all producer (`fleetfence.kafka`) while
nodes are SIGKILLed and restarted; afterwards a read_committed reader must find every record whose
delivery the producer confirmed, exactly once (by the unique id each record carries) and in its
key's order. With two of three nodes SIGKILLed, the processor's offset reads (issue #58 item 5)
wait, logging each ask, and answer the true offsets once the nodes are back. The deployment
suite's `deployment` fixture (Docker) is not used here.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
import uuid
from collections import Counter, defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
from confluent_kafka import KafkaError, KafkaException, Message, TopicPartition
from confluent_kafka.admin import ConfigResource, OffsetSpec, PartitionMetadata, ResourceType

from embedded import infra, kafka_node, processes
from fleetfence import probes
from fleetfence.errors import KafkaUnavailableError
from fleetfence.kafka import (
    TopicSpec,
    admin_client,
    ensure_topics,
    idempotent_producer,
    list_offsets,
    outage,
    plain_consumer,
    produce_waiting,
    topic_specs,
    watermarks,
)
from fleetfence.probes import kafka_ping
from fleetfence.settings import Settings
from fleetfence.testing import read_all, wait_for
from gateway.testing import TopicReader, telemetry_seqs
from processor.ops.markers import MarkerReader
from tests.gateway.helpers import EdgeProcess, Vehicle, gw_settings

pytestmark = pytest.mark.slow
# Issue #58's row runs this many times (`FLEETFENCE_DEPLOY_REPEAT`, as the compose rows).
REPEAT = range(1, int(os.environ.get("FLEETFENCE_DEPLOY_REPEAT", "1")) + 1)

NODES = 3
KEYS = 16
RATE_HZ = 200  # records per second, spread over the keys


class SteadyProducer:
    """Writes `k<i>` keyed records at RATE_HZ from a thread with the idempotent acks=all producer.
    Each value is `<key>:<seq>:<unique id>` (seq counts per key); `confirmed` lists, in the order the
    producer confirmed them, (partition, value) of the records whose delivery succeeded."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        self.topic = topic
        self.producer = idempotent_producer(bootstrap)
        self.confirmed: list[tuple[int, str]] = []
        self.failed: list[str] = []
        self.produced = 0
        self.unflushed = -1
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="steady-producer", daemon=True)

    def start(self) -> SteadyProducer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(180)
        assert not self._thread.is_alive(), "the producer did not finish flushing"

    def _delivered(self, err: KafkaError | None, msg: Message) -> None:
        # Runs in the producer thread (inside poll/flush): the lists have one writer.
        if err is not None:
            self.failed.append(f"{msg.value()!r}: {err}")
        else:
            value = msg.value()
            partition = msg.partition()
            assert value is not None
            assert partition is not None
            self.confirmed.append((partition, value.decode()))

    def _run(self) -> None:
        seqs: Counter[str] = Counter()
        due = time.monotonic()
        while not self._stop.is_set():
            key = f"k{self.produced % KEYS}"
            value = f"{key}:{seqs[key]}:{uuid.uuid4().hex[:12]}"
            seqs[key] += 1
            produce_waiting(
                self.producer, self.topic, key=key.encode(), value=value.encode(), on_delivery=self._delivered
            )
            self.produced += 1
            self.producer.poll(0)
            due += 1 / RATE_HZ
            self._stop.wait(max(0.0, due - time.monotonic()))  # pacing, not waiting for a condition
        self.unflushed = self.producer.flush(120)


def partitions(bootstrap: str, topic: str) -> dict[int, PartitionMetadata]:
    md = admin_client(bootstrap).list_topics(topic, timeout=5)
    found: dict[int, PartitionMetadata] = md.topics[topic].partitions
    return found


def node_name(node_id: int) -> str:
    return f"kafka-{node_id}"


def sigkill(s: Settings, node_id: int) -> int:
    rec = processes.read_pid(s, node_name(node_id))
    assert rec is not None, f"no pid file of {node_name(node_id)}"
    assert processes.alive(*rec), f"{node_name(node_id)} is not running"
    os.kill(rec[0], signal.SIGKILL)
    return rec[0]


def wait_dead(pid: int) -> None:
    wait_for(lambda: processes.exited(pid), 30, f"pid {pid} to exit")
    processes.reap(pid)


def start_nodes(s: Settings, *node_ids: int) -> None:
    """Start the given nodes again on their data (the others keep running) and wait until each
    answers a metadata round trip."""
    names = [node_name(i) for i in node_ids]
    procs = kafka_node.start_kafka(s, names)
    for node in kafka_node.kafka_nodes(s):
        if node.name in names:
            proc = procs[node.name]

            def answers(node: kafka_node.KafkaNode = node, proc: Any = proc) -> str:
                assert proc is None or proc.poll() is None, f"{node.name} exited: {proc.returncode}"
                return kafka_ping(node.bootstrap)

            wait_for(answers, 180, f"{node.name} to answer", ignore=(KafkaException,), interval_s=0.5)


def full_isr(s: Settings, topic: str) -> bool:
    return all(len(p.isrs) == NODES for p in partitions(s.bootstrap_servers, topic).values())


def assert_confirmed_exactly_once_in_key_order(s: Settings, prod: SteadyProducer, n_partitions: int) -> int:
    """Read the topic read_committed to its end; every confirmed record there exactly once, each
    key's records in the order they were written. Returns how many records were read."""
    assert prod.unflushed == 0, f"{prod.unflushed} records still unconfirmed at the end"
    records = read_all(s, prod.topic, n_partitions, timeout_s=120)
    values = [m.value().decode() for m in records]
    counts = Counter(values)
    confirmed = [v for _, v in prod.confirmed]
    assert len(set(confirmed)) == len(confirmed), "a record confirmed twice"
    missing = [v for v in confirmed if counts[v] == 0]
    duplicated = [v for v in confirmed if counts[v] > 1]
    assert not missing, f"{len(missing)} of {len(confirmed)} confirmed records lost, e.g. {missing[:5]}"
    assert not duplicated, f"{len(duplicated)} confirmed records duplicated, e.g. {duplicated[:5]}"
    assert max(counts.values()) == 1, "a record written twice"
    per_key: dict[str, list[int]] = defaultdict(list)
    for v in values:  # one key, one partition: read in offset order
        key, seq, _ = v.split(":")
        per_key[key].append(int(seq))
    for key, seqs in per_key.items():
        assert seqs == sorted(seqs), f"{key}'s records out of order"
    return len(values)


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Settings]:
    """A private three-node cluster under tmp_path (Kafka only), stopped at the end even on failure."""
    s = Settings(
        **infra.private_fields(tmp_path / "state", kafka_brokers=NODES),
        startup_timeout_s=180,
        topic_prefix=f"c3{uuid.uuid4().hex[:6]}.",
    )
    try:
        t0 = time.monotonic()
        infra.up(s, create_topics=False, only=("kafka",))
        print(f"\nembedded cluster of {NODES} up in {time.monotonic() - t0:.1f} s: {s.bootstrap_servers}")
        yield s
    finally:
        infra.down(s)


def test_embedded_cluster_leader_sigkill_loses_nothing_confirmed(cluster: Settings) -> None:
    s = cluster
    bs = s.bootstrap_servers
    assert (s.topic_replication_factor, s.topic_min_insync_replicas) == (3, 2)
    specs = topic_specs(s)
    created = ensure_topics(bs, specs, timeout_s=60)
    admin = admin_client(bs)
    for spec in specs:  # the project's topics, as `infra up --kafka-brokers 3` creates them
        assert all(len(p.replicas) == NODES for p in partitions(bs, spec.name).values()), spec.name
        cfg = admin.describe_configs([ConfigResource(ResourceType.TOPIC, spec.name)])
        entries: Any = next(iter(cfg.values())).result(30)
        assert entries["min.insync.replicas"].value == "2", spec.name
    broker: Any = next(iter(admin.describe_configs([ConfigResource(ResourceType.BROKER, "1")]).values()))
    internal = broker.result(30)
    for name, want in {
        "offsets.topic.replication.factor": "3",
        "transaction.state.log.replication.factor": "3",
        "transaction.state.log.min.isr": "2",
        "min.insync.replicas": "2",
    }.items():
        assert internal[name].value == want, name

    topic = s.topics.telemetry
    n_partitions = created[topic]
    prod = SteadyProducer(bs, topic).start()
    try:
        wait_for(lambda: len(prod.confirmed) >= 2 * RATE_HZ, 60, "records confirmed before the fault")
        leaders = Counter(p.leader for p in partitions(bs, topic).values())
        victim = leaders.most_common(1)[0][0]
        led = {p for p, md in partitions(bs, topic).items() if md.leader == victim}
        pid = sigkill(s, victim)
        t_kill = time.monotonic()
        wait_dead(pid)
        wait_for(
            lambda: all(p.leader not in (victim, -1) for p in partitions(bs, topic).values()),
            90,
            f"new leaders of the partitions node {victim} led",
            ignore=(KafkaException,),
            interval_s=0.2,
        )
        failover_s = time.monotonic() - t_kill
        mark = len(prod.confirmed)
        wait_for(
            lambda: led <= {p for p, _ in prod.confirmed[mark:]} and len(prod.confirmed) >= mark + RATE_HZ,
            60,
            "records confirmed on the partitions with new leaders",
        )
        start_nodes(s, victim)
        wait_for(
            lambda: full_isr(s, topic),
            180,
            f"node {victim} back in every ISR",
            ignore=(KafkaException,),
            interval_s=0.5,
        )
        rejoin_s = time.monotonic() - t_kill
    finally:
        prod.stop()
    assert prod.failed == [], prod.failed[:5]
    read = assert_confirmed_exactly_once_in_key_order(s, prod, n_partitions)
    print(
        f"\nleader SIGKILL: node {victim} led {sorted(led)}; new leaders after {failover_s:.1f} s, "
        f"full ISR after {rejoin_s:.1f} s; {len(prod.confirmed)} confirmed, {read} read"
    )


def test_embedded_cluster_two_of_three_down_stalls_then_resumes(cluster: Settings) -> None:
    s = cluster
    bs = s.bootstrap_servers
    topic = f"{s.topic_prefix}stall"
    n_partitions = 4
    ensure_topics(bs, [TopicSpec(topic, n_partitions, {"min.insync.replicas": "2"}, NODES)], timeout_s=60)
    prod = SteadyProducer(bs, topic).start()
    try:
        wait_for(lambda: len(prod.confirmed) >= 2 * RATE_HZ, 60, "records confirmed before the fault")
        pids = [sigkill(s, 1), sigkill(s, 2)]
        for pid in pids:
            wait_dead(pid)
        # What the brokers acknowledged before dying reaches the producer within a second (it keeps
        # producing meanwhile); after that nothing may be confirmed: the one node left cannot reach
        # min.insync.replicas, nor elect leaders (the quorum has one voter of three).
        settle = prod.produced + RATE_HZ
        wait_for(lambda: prod.produced >= settle, 30, "a second of producing after the kill")
        stalled_at = len(prod.confirmed)
        window = prod.produced + 4 * RATE_HZ
        wait_for(lambda: prod.produced >= window, 60, "four more seconds of producing")
        assert len(prod.confirmed) == stalled_at, "a write was confirmed with two of three nodes down"
        assert prod.failed == [], prod.failed[:5]
        t_restart = time.monotonic()
        start_nodes(s, 1)
        wait_for(
            lambda: len(prod.confirmed) >= stalled_at + 2 * RATE_HZ,
            180,
            "confirmations to resume with two of three nodes",
        )
        resumed_s = time.monotonic() - t_restart
        start_nodes(s, 2)
        wait_for(
            lambda: full_isr(s, topic),
            180,
            "both nodes back in every ISR",
            ignore=(KafkaException,),
            interval_s=0.5,
        )
    finally:
        prod.stop()
    assert prod.failed == [], prod.failed[:5]
    read = assert_confirmed_exactly_once_in_key_order(s, prod, n_partitions)
    print(
        f"\ntwo of three down: stalled at {stalled_at} confirmed; resumed {resumed_s:.1f} s after one "
        f"node's restart; {len(prod.confirmed)} confirmed, {read} read"
    )


def test_embedded_cluster_two_of_three_down_offset_reads_wait_then_answer(
    cluster: Settings, caplog: pytest.LogCaptureFixture
) -> None:
    """Issue #58 item 5: the processor's offset reads during a two-of-three outage. Clients made
    after two nodes are SIGKILLed (as a driver that takes its lease then) get no answer for the
    partitions the dead nodes led (the one node left cannot elect new leaders): a read with a
    deadline raises KafkaUnavailableError, and the reads without one (`watermarks`, the service's
    marker tail) wait and log each ask instead of raising, then answer the true offsets once the
    nodes are back."""
    caplog.set_level(logging.INFO, logger="fleetfence.kafka")
    s = cluster
    bs = s.bootstrap_servers
    topic = f"{s.topic_prefix}offsets"
    n_partitions = 3
    ensure_topics(bs, [TopicSpec(topic, n_partitions, {"min.insync.replicas": "2"}, NODES)], timeout_s=60)
    # Known ends: partition p holds p + 2 records, each a marker the service's reader could parse.
    prod = idempotent_producer(bs)
    for p in range(n_partitions):
        for i in range(p + 2):
            prod.produce(topic, value=orjson.dumps({"sink_id": "before", "batch_id": i}), partition=p)
    assert prod.flush(60) == 0
    expected = {p: (0, p + 2) for p in range(n_partitions)}
    parts = [TopicPartition(topic, p) for p in range(n_partitions)]
    assert list_offsets(admin_client(bs), parts, OffsetSpec.latest()) == {
        (topic, p): hi for p, (_lo, hi) in expected.items()
    }
    leaders = {p: md.leader for p, md in partitions(bs, topic).items()}
    led = Counter(leaders.values())
    survivor = min(range(1, NODES + 1), key=lambda n: led[n])
    victims = [n for n in range(1, NODES + 1) if n != survivor]
    leaderless = sorted(p for p, leader in leaders.items() if leader in victims)
    assert leaderless, leaders

    for pid in [sigkill(s, n) for n in victims]:
        wait_dead(pid)
    stop = threading.Event()
    got: dict[str, Any] = {}
    raised: dict[str, BaseException] = {}

    def read_watermarks() -> None:
        c = plain_consumer(bs, f"outage-{uuid.uuid4().hex[:6]}", log_level=0)
        try:
            got["watermarks"] = {
                p: watermarks(c, topic, p, timeout_s=None, stop=stop) for p in range(n_partitions)
            }
        except BaseException as exc:
            raised["watermarks"] = exc
        finally:
            c.close()

    def open_markers() -> None:
        try:
            got["markers"] = MarkerReader(bs, topic, timeout_s=None, stop=stop)
        except BaseException as exc:
            raised["markers"] = exc

    threads = [
        threading.Thread(target=read_watermarks, name="outage-watermarks", daemon=True),
        threading.Thread(target=open_markers, name="outage-markers", daemon=True),
    ]
    try:
        # A read with a deadline ends with the project's error, naming the cause.
        c = plain_consumer(bs, f"outage-{uuid.uuid4().hex[:6]}", log_level=0)
        try:
            with pytest.raises(KafkaUnavailableError) as gave_up:
                watermarks(c, topic, leaderless[0], timeout_s=3.0)
        finally:
            c.close()
        assert not gave_up.value.stopped
        assert outage(gave_up.value.error) is gave_up.value.error
        with pytest.raises(KafkaUnavailableError):
            list_offsets(admin_client(bs), parts, OffsetSpec.latest(), timeout_s=3.0)

        for t in threads:
            t.start()

        def waiting(thread: str) -> list[str]:
            return [
                r.getMessage()
                for r in caplog.records
                if r.threadName == thread
                and r.getMessage().startswith(f"kafka read waiting what=watermarks topic={topic} ")
            ]

        for t in threads:
            # Two waits each: each read has been refused, has waited and asked again, and waits on.

            def waited_twice(name: str = t.name) -> bool:
                return len(waiting(name)) >= 2

            wait_for(waited_twice, 120, f"{t.name} to wait and log twice")
        assert raised == {}, raised
        assert all(t.is_alive() for t in threads), "a read without a deadline returned during the outage"
        assert got == {}
        causes = {line.split(" cause=")[1].split()[0] for t in threads for line in waiting(t.name)}
        assert causes <= {"unreachable", "leader_moving"}, causes

        t_restart = time.monotonic()
        start_nodes(s, *victims)
        for t in threads:
            t.join(180)
            assert not t.is_alive(), f"{t.name} still waiting after the nodes came back"
        answered_s = time.monotonic() - t_restart
        assert raised == {}, raised
        assert got["watermarks"] == expected
        assert list_offsets(admin_client(bs), parts, OffsetSpec.latest()) == {
            (topic, p): hi for p, (_lo, hi) in expected.items()
        }
        # The marker tail starts where the topic ended: only what is written after it is read.
        reader: MarkerReader = got["markers"]
        after = {"sink_id": "after", "batch_id": 0}
        prod.produce(topic, value=orjson.dumps(after), partition=leaderless[0])
        assert prod.flush(60) == 0
        seen: list[dict[str, Any]] = []

        def read_some(reader: MarkerReader = reader) -> list[dict[str, Any]]:
            seen.extend(reader.poll(0.2))
            return seen

        wait_for(read_some, 60, "the marker written after the outage")
        assert seen == [after]
    finally:
        stop.set()
        for t in threads:
            if t.ident is not None:
                t.join(30)
        if "markers" in got:
            got["markers"].close()
    print(
        f"\ntwo of three down (nodes {victims}, partitions {leaderless} leaderless): the reads waited "
        f"and answered {answered_s:.1f} s after the restart"
    )


@pytest.mark.parametrize("run", REPEAT)
def test_embedded_cluster_edge_sigkilled_while_two_of_three_down_loses_no_acknowledged_fix(
    cluster: Settings, tmp_path: Path, run: int
) -> None:
    """Issue #58 item 3 on the embedded cluster: ten vehicles publish QoS 1 to the device edge
    (`python -m gateway` with an edge port); two of the three nodes are SIGKILLed (no write can reach
    min.insync.replicas), the vehicles go on publishing into the outage, the edge is SIGKILLed
    holding their unacknowledged fixes and started again, then the nodes. Every fix a vehicle
    published is acknowledged and in `fleet.telemetry`; the edge acknowledged none in the outage.
    Logins are off here (the fault is Kafka's; `tests/gateway/test_edge.py` holds the logins)."""
    s = cluster.model_copy(update={"mqtt_auth": False})
    infra.up(s, create_topics=False, only=("redis",))  # the service registry; stopped with the cluster
    ensure_topics(s.bootstrap_servers, topic_specs(s), timeout_s=60)
    gs = gw_settings(s, gateway_edge_port=probes.free_port())
    edge_port = gs.gateway_edge_port
    assert edge_port is not None
    tag = uuid.uuid4().hex[:6]
    per_vehicle = 150
    vehicles: list[Vehicle] = []
    edges = [EdgeProcess(gs, tmp_path / "edge1.log")]
    try:
        vehicles = [Vehicle(f"c{tag}-{i}", None, edge_port) for i in range(10)]
        published = 0

        def publish_some(n: int) -> None:
            nonlocal published
            for _ in range(n):
                seq, i = divmod(published, len(vehicles))
                vehicles[i].publish(seq)
                published += 1
                time.sleep(0.002)  # a fleet's pace, not synchronisation

        def acked() -> int:
            return sum(len(v.acked) for v in vehicles)

        publish_some(400)
        wait_for(lambda: acked() >= 300, 60, "acknowledgements before the outage")
        for pid in [sigkill(s, 1), sigkill(s, 2)]:
            wait_dead(pid)
        acked_at_outage = acked()
        publish_some(500)
        wait_for(
            lambda: edges[0].metrics().get("fleetfence_gateway_in_flight", 0) > 0,
            30,
            "fixes held by the edge in the outage",
        )
        edges[0].kill()
        acked_at_kill = acked()
        edges.append(EdgeProcess(gs, tmp_path / "edge2.log"))
        publish_some(per_vehicle * len(vehicles) - published)
        start_nodes(s, 1, 2)
        wait_for(lambda: acked() == published, 180, "every fix acknowledged with the nodes back")
        want = {(v.vid, q) for v in vehicles for q in range(per_vehicle)}
        reader = TopicReader(s.bootstrap_servers, [s.topics.telemetry])
        try:
            reader.read_until(lambda rs: want <= set(telemetry_seqs(rs, f"c{tag}-")), 120, "every fix")
            got = telemetry_seqs(reader.records, f"c{tag}-")
        finally:
            reader.close()
        print(
            f"\nedge SIGKILLed, two of three down: published={published} acked_at_outage={acked_at_outage} "
            f"acked_at_kill={acked_at_kill} records={len(got)} duplicates={len(got) - len(set(got))}"
        )
        assert set(got) == want
        # Whatever the brokers confirmed just before dying, nothing more: an acknowledgement in
        # the outage would be one Kafka never gave.
        assert acked_at_kill - acked_at_outage <= 20 * len(vehicles)
    finally:
        for v in vehicles:
            v.close()
        for e in edges:
            e.kill()
