"""Kafka clients and topics for every component: the one place a Consumer or Producer is built,
topic specs, topic creation.

Every client comes from a preset named after what it guarantees: `idempotent_producer`,
`transactional_producer`, `group_consumer`, `committed_reader`, and `plain_producer` and
`plain_consumer` for librdkafka's defaults. A call site adds only its own settings, as explicit
overrides, so what a client promises is read in one place rather than in copies of a dict.

Only `bootstrap.servers` differs between the embedded Apache Kafka broker (`fleetfence infra up`)
and a production cluster. Topics are created explicitly with their partitions and configs
(compaction of `fleet.master`) instead of relying on auto-creation, which production clusters
usually disable. Consumer groups (`group_consumer`) rebalance cooperatively (`cooperative-sticky`,
classic protocol): a joining member takes over only the partitions that move, and static members
(`group.instance.id`) restarted after a crash take their partitions back at once (docs/alerts.md
says why not KIP-848).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from fleetfence.errors import InfraError, KafkaDeliveryError

if TYPE_CHECKING:
    # Annotations only: a Spark executor that builds a reader here (processor.spark.kafka_sink) loads no
    # settings (importing pydantic-settings would add to every task's start).
    from fleetfence.settings import Settings

logger = logging.getLogger(__name__)

DAY_MS = 24 * 3600 * 1000


@dataclass(frozen=True)
class TopicSpec:
    """A topic FleetFence owns, with its partition count and configs."""

    name: str
    partitions: int
    configs: dict[str, str] = field(default_factory=dict)
    replication_factor: int = 1


def topic_specs(settings: Settings) -> list[TopicSpec]:
    """The topics of one FleetFence installation.

    `fleet.master` has one partition so every consumer sees master changes in one total order
    (the processor relies on that for deterministic replays) and is compacted so the latest version
    of each entity is kept forever.

    Every topic gets `FLEETFENCE_TOPIC_REPLICATION_FACTOR` replicas and
    `FLEETFENCE_TOPIC_MIN_INSYNC_REPLICAS` (1 and 1 for the embedded single broker; 3 and 2 on a
    cluster): with the producers' acks=all, an acknowledged record is on that many brokers.
    """
    t = settings.topics
    if settings.topic_min_insync_replicas > settings.topic_replication_factor:
        raise InfraError(
            f"FLEETFENCE_TOPIC_MIN_INSYNC_REPLICAS={settings.topic_min_insync_replicas} exceeds "
            f"FLEETFENCE_TOPIC_REPLICATION_FACTOR={settings.topic_replication_factor}: no write could succeed"
        )
    rf = settings.topic_replication_factor
    isr = {"min.insync.replicas": str(settings.topic_min_insync_replicas)}
    return [
        TopicSpec(t.telemetry, settings.telemetry_partitions, {"retention.ms": str(7 * DAY_MS), **isr}, rf),
        TopicSpec(t.alerts, settings.alerts_partitions, {"retention.ms": str(30 * DAY_MS), **isr}, rf),
        TopicSpec(t.telemetry_dlq, 1, {"retention.ms": str(30 * DAY_MS), **isr}, rf),
        TopicSpec(t.alerts_dlq, 1, {"retention.ms": str(30 * DAY_MS), **isr}, rf),
        TopicSpec(t.master, 1, {"cleanup.policy": "compact", **isr}, rf),
        TopicSpec(t.processor_commits, 1, {"cleanup.policy": "compact", **isr}, rf),
        # A day: far beyond any hot-standby horizon (FLEETFENCE_PROCESSOR_HOT_HORIZON_S).
        TopicSpec(t.processor_shadow, 1, {"retention.ms": str(DAY_MS), **isr}, rf),
    ]


def admin_client(bootstrap: str) -> AdminClient:
    return AdminClient({"bootstrap.servers": bootstrap, "socket.timeout.ms": 5000})


def ensure_topics(bootstrap: str, specs: list[TopicSpec], timeout_s: float = 15.0) -> dict[str, int]:
    """Create the missing topics; return {name: partition count} as the broker reports it.

    Existing topics are left as they are (a second `infra up` must find its data again).
    """
    admin = admin_client(bootstrap)
    existing = admin.list_topics(timeout=timeout_s).topics
    missing = [s for s in specs if s.name not in existing]
    if missing:
        futures = admin.create_topics(
            [
                NewTopic(
                    s.name,
                    num_partitions=s.partitions,
                    replication_factor=s.replication_factor,
                    config=s.configs,
                )
                for s in missing
            ],
            operation_timeout=timeout_s,
        )
        for name, fut in futures.items():
            try:
                fut.result()
                logger.info("topic created topic=%s", name)
            except KafkaException as exc:
                if "TOPIC_ALREADY_EXISTS" not in str(exc):
                    raise InfraError(f"could not create topic {name}: {exc}") from exc
    return wait_for_topics(bootstrap, [s.name for s in specs], timeout_s)


def wait_for_topics(bootstrap: str, names: list[str], timeout_s: float = 15.0) -> dict[str, int]:
    """Wait until the broker's metadata lists every topic with its partitions."""
    admin = admin_client(bootstrap)
    deadline = time.monotonic() + timeout_s
    while True:
        md = admin.list_topics(timeout=timeout_s).topics
        found = {
            n: len(md[n].partitions) for n in names if n in md and md[n].partitions and md[n].error is None
        }
        if len(found) == len(names):
            return found
        if time.monotonic() > deadline:
            raise InfraError(f"topics not visible after {timeout_s}s: {sorted(set(names) - set(found))}")
        time.sleep(0.1)


# --------------------------------------------------------------------------- clients
# Overrides are librdkafka property names (`**{"linger.ms": 0}`) and win over a preset's values.


def producer_config(bootstrap: str, **overrides: Any) -> dict[str, Any]:
    """The config of `idempotent_producer`: idempotent, acks=all, tuned for throughput (batching,
    lz4), keeping per-key order."""
    cfg: dict[str, Any] = {
        "bootstrap.servers": bootstrap,
        "enable.idempotence": True,
        "acks": "all",
        "linger.ms": 5,
        "batch.num.messages": 10000,
        "compression.type": "lz4",
        "queue.buffering.max.messages": 500000,
        "partitioner": "murmur2_random",
    }
    cfg.update(overrides)
    return cfg


def consumer_config(bootstrap: str, group_id: str, **overrides: Any) -> dict[str, Any]:
    """The config of `group_consumer`: read_committed, manual commits, cooperative rebalancing.

    With `cooperative-sticky` a rebalance revokes only the partitions that move (the callbacks
    get the delta, and librdkafka assigns incrementally when they do not assign themselves);
    a consumer that assigns partitions itself (`assign()`) is unaffected."""
    cfg: dict[str, Any] = {
        "bootstrap.servers": bootstrap,
        "group.id": group_id,
        "isolation.level": "read_committed",
        "enable.auto.commit": False,
        "auto.offset.reset": "earliest",
        "partition.assignment.strategy": "cooperative-sticky",
        "session.timeout.ms": 6000,
        # A member learns of a rebalance from a heartbeat response, and a cooperative rebalance
        # takes two rounds: a joining member waits about two heartbeat intervals to be balanced, so
        # a third of the default 3 s makes it a third as long (docs/alerts.md).
        "heartbeat.interval.ms": 1000,
    }
    cfg.update(overrides)
    return cfg


def idempotent_producer(bootstrap: str, **overrides: Any) -> Producer:
    """A producer whose retries neither duplicate nor reorder a partition's records (idempotence)
    and whose acknowledgement means every in-sync replica has the record (acks=all); batched and
    lz4-compressed for throughput (`producer_config`)."""
    return Producer(producer_config(bootstrap, **overrides))


def transactional_producer(bootstrap: str, transactional_id: str, **overrides: Any) -> Producer:
    """The idempotent producer with a `transactional.id`: what it writes in one transaction is seen
    by read_committed readers all at once or not at all, and `init_transactions()` fences an older
    producer with the same id (a zombie) and aborts its open transaction. The caller calls
    `init_transactions()` itself, with the timeout it can afford."""
    return Producer(producer_config(bootstrap, **{"transactional.id": transactional_id, **overrides}))


def plain_producer(bootstrap: str, **overrides: Any) -> Producer:
    """librdkafka's defaults plus `overrides`, nothing promised: for the benchmarks' naive
    contenders, which measure what a first attempt without FleetFence's tuning gets."""
    return Producer({"bootstrap.servers": bootstrap, **overrides})


def group_consumer(bootstrap: str, group_id: str, **overrides: Any) -> Consumer:
    """A consumer that reads committed records only (read_committed) and never commits an offset by
    itself, tuned to share a group's partitions: cooperative rebalancing, a 1 s heartbeat, and from
    the earliest record when the group has no offset (`consumer_config`)."""
    return Consumer(consumer_config(bootstrap, group_id, **overrides))


def committed_reader(bootstrap: str, group_id: str, **overrides: Any) -> Consumer:
    """A consumer that reads committed records only (read_committed) and never commits an offset by
    itself, with librdkafka's defaults otherwise (its assignor and session timeout, from the
    latest record unless `auto.offset.reset` says otherwise): for a reader that assigns its
    partitions itself, or is alone in a group of its own, and so needs none of a group's tuning."""
    cfg: dict[str, Any] = {
        "bootstrap.servers": bootstrap,
        "group.id": group_id,
        "isolation.level": "read_committed",
        "enable.auto.commit": False,
    }
    cfg.update(overrides)
    return Consumer(cfg)


def plain_consumer(bootstrap: str, group_id: str, **overrides: Any) -> Consumer:
    """librdkafka's defaults plus `overrides`: for a probe that only asks for metadata and watermark
    offsets (it reads no record, so there is nothing to choose), and for the benchmarks' naive
    contenders."""
    return Consumer({"bootstrap.servers": bootstrap, "group.id": group_id, **overrides})


def produce_waiting(
    producer: Any,
    topic: str,
    *,
    key: bytes | None = None,
    value: bytes | None = None,
    headers: Any = None,
    on_delivery: Any = None,
    timeout_s: float = 60.0,
) -> None:
    """`producer.produce`, waiting for room when the client's local queue is full.

    librdkafka holds at most `queue.buffering.max.messages` records not yet acknowledged and refuses
    the next with BufferError: a writer that can produce more than that in one go (a batch of
    alerts, a relay's backlog) serves delivery reports until there is room again, and gives up with
    KafkaDeliveryError only if no report at all (acknowledgement or failure) comes for `timeout_s`.
    A broker that is gone fails the queued records after `message.timeout.ms`, which makes room."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            producer.produce(topic, key=key, value=value, headers=headers, on_delivery=on_delivery)
            return
        except BufferError:
            if producer.poll(0.05):  # acknowledgements came: room is coming
                deadline = time.monotonic() + timeout_s
            elif time.monotonic() > deadline:
                raise KafkaDeliveryError(
                    f"the producer's queue stayed full for {timeout_s:.0f} s writing to {topic}"
                ) from None


# What a broker answers about a partition whose leader is moving or not known to it yet (a topic
# just created, a broker restarted, a preferred leader elected back): UNKNOWN_TOPIC_OR_PART,
# LEADER_NOT_AVAILABLE, NOT_LEADER_FOR_PARTITION, and the leader epochs (FENCED_LEADER_EPOCH,
# UNKNOWN_LEADER_EPOCH). librdkafka raises them from an offset query without marking them retriable.
_LEADER_MOVING = frozenset(
    {
        KafkaError.UNKNOWN_TOPIC_OR_PART,
        KafkaError.LEADER_NOT_AVAILABLE,
        KafkaError.NOT_LEADER_FOR_PARTITION,
        KafkaError.FENCED_LEADER_EPOCH,
        KafkaError.UNKNOWN_LEADER_EPOCH,
    }
)


def watermarks(consumer: Consumer, topic: str, partition: int, timeout_s: float = 30.0) -> tuple[int, int]:
    """A partition's (low, high) watermark from its leader, asked again while the leader moves.

    A replicated cluster moves leaders on its own (a restarted broker gets its partitions back by the
    preferred-leader election minutes later), and the answer in between is an error that a retry a
    moment later does not get; only an error that is not one of those, or `timeout_s`, raises."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            left_s = max(0.1, min(10.0, deadline - time.monotonic()))
            lo, hi = consumer.get_watermark_offsets(
                TopicPartition(topic, partition), timeout=left_s, cached=False
            )
            return int(lo), int(hi)
        except KafkaException as exc:
            err = exc.args[0] if exc.args else None
            moving = isinstance(err, KafkaError) and (err.retriable() or err.code() in _LEADER_MOVING)
            if not moving or time.monotonic() >= deadline:
                raise
            logger.info("watermarks asked again topic=%s partition=%s error=%s", topic, partition, err)
            time.sleep(0.2)
