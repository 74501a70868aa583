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

Offset, watermark and metadata reads go through one retry policy, `through_outage`: an unreachable
broker (a name that does not resolve, a refused connection, every broker down, a timeout) or a
moving leader is waited out with a back-off and a log line, up to the caller's deadline or, for a
caller that has nothing better to do, until the cluster answers.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

from confluent_kafka import OFFSET_INVALID, Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic, OffsetSpec

from fleetfence.errors import InfraError, KafkaDeliveryError, KafkaUnavailableError

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
# LEADER_NOT_AVAILABLE, NOT_LEADER_FOR_PARTITION, the leader epochs (FENCED_LEADER_EPOCH,
# UNKNOWN_LEADER_EPOCH), a leader just elected whose high watermark has not caught up yet
# (OFFSET_NOT_AVAILABLE); and what the client says itself when the metadata it was given lacks the
# partition or topic (_UNKNOWN_PARTITION, _UNKNOWN_TOPIC). Reads met OFFSET_NOT_AVAILABLE and
# _UNKNOWN_PARTITION as SIGKILLed nodes came back (tests_deploy/test_embedded_cluster.py).
# librdkafka raises them from an offset query without marking them retriable.
_LEADER_MOVING = frozenset(
    {
        KafkaError.UNKNOWN_TOPIC_OR_PART,
        KafkaError._UNKNOWN_PARTITION,
        KafkaError._UNKNOWN_TOPIC,
        KafkaError.LEADER_NOT_AVAILABLE,
        KafkaError.NOT_LEADER_FOR_PARTITION,
        KafkaError.FENCED_LEADER_EPOCH,
        KafkaError.UNKNOWN_LEADER_EPOCH,
        KafkaError.OFFSET_NOT_AVAILABLE,
    }
)

# What a client says when it cannot reach the brokers a request needs: a broker's host name that
# does not resolve (compose's DNS drops a stopped container's name: _RESOLVE), a connection refused
# or cut (_TRANSPORT), every broker it knows down (_ALL_BROKERS_DOWN), a request or a queued record
# not answered in time (_TIMED_OUT, REQUEST_TIMED_OUT, _MSG_TIMED_OUT), and a request dropped with
# the client's handle of a broker, torn down as nodes come and go (_DESTROY_BROKER: what reads
# waiting on SIGKILLed nodes got as those returned, tests_deploy/test_embedded_cluster.py) or as a
# broker's address changes (_NODE_UPDATE). librdkafka marks none of them retriable, yet each ends
# by itself when the brokers are back: an outage is a state of the cluster, which a reader waits
# out, not a failure of the reader.
_UNREACHABLE = frozenset(
    {
        KafkaError._RESOLVE,
        KafkaError._TRANSPORT,
        KafkaError._ALL_BROKERS_DOWN,
        KafkaError._TIMED_OUT,
        KafkaError.REQUEST_TIMED_OUT,
        KafkaError._MSG_TIMED_OUT,
        KafkaError._DESTROY_BROKER,
        KafkaError._NODE_UPDATE,
    }
)

# The back-off between two asks during an outage: from BACKOFF_FIRST_S, doubled each time up to
# BACKOFF_MAX_S (a leader move is over in a moment; a lost node takes tens of seconds to return).
BACKOFF_FIRST_S = 0.1
BACKOFF_MAX_S = 5.0
# The longest one ask waits for its answer: a reader without a deadline still notices a stop and
# logs how long it has waited at least this often.
ASK_MAX_S = 10.0

T = TypeVar("T")


def outage(error: Any) -> KafkaError | None:
    """The KafkaError of `error` (a KafkaException, or a KafkaError as a callback gets it) when it
    says the cluster is unreachable or a leader is moving, an outage that a later ask gets past;
    None for anything else (a refusal, a bad argument, a fatal error): asking again gets the same
    answer, so it is raised at once."""
    err = error.args[0] if isinstance(error, KafkaException) and error.args else error
    if not isinstance(err, KafkaError) or err.fatal():
        return None
    if err.retriable() or err.code() in _UNREACHABLE or err.code() in _LEADER_MOVING:
        return err
    return None


def through_outage(
    ask: Callable[[float], T],
    what: str,
    *,
    timeout_s: float | None,
    stop: threading.Event | None = None,
) -> T:
    """`ask(wait_s)`'s answer, asked again while its KafkaException is an outage (`outage`): the
    one retry policy of every offset, watermark and metadata read (`watermarks`, `partitions_of`,
    `list_offsets`). Between asks a back-off (BACKOFF_FIRST_S doubling to BACKOFF_MAX_S) and one
    structured log line, `kafka read waiting what=... error=... attempt=... waited_s=...`, so an
    outage shows in the log as a state with its cause rather than as a traceback. Any other error is
    raised at once.

    `timeout_s` bounds the whole wait for a caller that must answer in time (a sink's commit runs
    inside a micro-batch): when it passes, KafkaUnavailableError with the last error. None waits as
    long as the outage lasts, for a caller with nothing better to do (a service starting: crashing
    only gets it restarted into the same outage). `stop`, when set, ends the wait between asks
    (KafkaUnavailableError with `stopped`). `ask` is given how long it may wait for its answer
    (ASK_MAX_S, or less when the deadline is nearer)."""
    started = time.monotonic()
    deadline = None if timeout_s is None else started + timeout_s
    backoff = BACKOFF_FIRST_S
    attempt = 0
    while True:
        attempt += 1
        left = ASK_MAX_S if deadline is None else deadline - time.monotonic()
        try:
            return ask(max(0.1, min(ASK_MAX_S, left)))
        except KafkaException as exc:
            err = outage(exc)
            if err is None:
                raise
            last = exc
        now = time.monotonic()
        waited = now - started
        cause = f"{err.name()}: {err.str()}"
        if stop is not None and stop.is_set():
            raise _stopped(what, started, err) from last
        if deadline is not None and deadline - now < BACKOFF_FIRST_S:  # no time for another ask
            raise KafkaUnavailableError(
                f"Kafka gave no answer to {what} within {timeout_s:.1f} s ({attempt} asks; {cause})", err
            ) from last
        pause = backoff if deadline is None else min(backoff, deadline - now)
        moving = err.code() in _LEADER_MOVING
        logger.log(
            logging.INFO if moving else logging.WARNING,
            "kafka read waiting %s error=%s attempt=%d waited_s=%.1f retry_in_s=%.1f cause=%s detail=%r",
            what,
            err.name(),
            attempt,
            waited,
            pause,
            "leader_moving" if moving else "unreachable" if err.code() in _UNREACHABLE else "retriable",
            err.str(),
        )
        if stop is None:
            time.sleep(pause)
        elif stop.wait(pause):
            raise _stopped(what, started, err) from last
        backoff = min(backoff * 2, BACKOFF_MAX_S)


def _stopped(what: str, started: float, err: KafkaError) -> KafkaUnavailableError:
    return KafkaUnavailableError(
        f"stopped waiting for Kafka's answer to {what} after {time.monotonic() - started:.1f} s "
        f"({err.name()}: {err.str()})",
        err,
        stopped=True,
    )


def watermarks(
    consumer: Consumer,
    topic: str,
    partition: int,
    timeout_s: float | None = 30.0,
    stop: threading.Event | None = None,
) -> tuple[int, int]:
    """A partition's (low, high) watermark from its leader, asked again through an outage
    (`through_outage`: `timeout_s` None waits until the cluster answers or `stop` is set).

    A replicated cluster moves leaders on its own (a restarted broker gets its partitions back by
    the preferred-leader election minutes later) and loses nodes: the answer in between is an
    error that a later ask does not get. A driver that took its lease during a two-of-three outage
    once crashed here on `_RESOLVE` (its leader's container name gone from compose's DNS)."""

    def ask(wait_s: float) -> tuple[int, int]:
        lo, hi = consumer.get_watermark_offsets(
            TopicPartition(topic, partition), timeout=wait_s, cached=False
        )
        return int(lo), int(hi)

    return through_outage(
        ask, f"what=watermarks topic={topic} partition={partition}", timeout_s=timeout_s, stop=stop
    )


def partitions_of(
    client: Consumer | AdminClient,
    topic: str,
    *,
    timeout_s: float | None = 30.0,
    stop: threading.Event | None = None,
) -> list[int]:
    """`topic`'s partition ids from the cluster's metadata, asked again through an outage
    (`through_outage`). A topic the metadata does not list (it does not exist) has none."""
    md = through_outage(
        lambda wait_s: client.list_topics(topic, timeout=wait_s),
        f"what=metadata topic={topic}",
        timeout_s=timeout_s,
        stop=stop,
    )
    found = md.topics.get(topic)
    return sorted(found.partitions) if found is not None else []


def list_offsets(
    admin: AdminClient,
    partitions: list[TopicPartition],
    spec: OffsetSpec,
    *,
    timeout_s: float | None = 30.0,
    stop: threading.Event | None = None,
) -> dict[tuple[str, int], int]:
    """Every partition's offset by `spec` (OffsetSpec.latest(), earliest(), for_timestamp(ms)) in
    one admin request, by (topic, partition); -1 where no record matches a timestamp. Asked again
    whole through an outage (`through_outage`): one partition's leader being unreachable fails the
    answer.

    librdkafka's admin client answers a partition whose leader (dead, but still the leader in the
    metadata: two of three nodes down, no quorum to elect another) did not answer in time with
    OFFSET_INVALID (-1001) and no error at all; taken as an offset it would start a reader at the
    reset position and end a read "to the end" at once. It is the request timing out, and is
    waited out as one (_TIMED_OUT)."""

    def ask(wait_s: float) -> dict[tuple[str, int], int]:
        futures = admin.list_offsets(dict.fromkeys(partitions, spec), request_timeout=wait_s)
        found = {(tp.topic, tp.partition): int(f.result().offset) for tp, f in futures.items()}
        unanswered = sorted(f"{t}:{p}" for (t, p), o in found.items() if o == OFFSET_INVALID)
        if unanswered:
            raise KafkaException(
                KafkaError(
                    KafkaError._TIMED_OUT,
                    f"no offset from the leader of {', '.join(unanswered)} within {wait_s:.1f} s",
                )
            )
        return found

    topics = ",".join(sorted({tp.topic for tp in partitions}))
    return through_outage(
        ask, f"what=list_offsets topics={topics} partitions={len(partitions)}", timeout_s=timeout_s, stop=stop
    )
