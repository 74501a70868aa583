"""The alert sink of hot drivers (`fleetfence processor --hot`): every driver of the job runs the
query on a checkpoint of its own, all the time; only the holder of the job's lease commits to
`fleet.alerts`, the others keep what they would have committed in a shadow topic.

Why this shape: a warm standby pays, at takeover, for the first batch on a checkpoint it has never
run (planning, RocksDB loading the state, the replay of the unfinished batch). A hot driver has
its state in its own RocksDB already, batch after batch; at takeover its next commit simply goes
to `fleet.alerts` instead of the shadow topic. The engine is deterministic in event time (an
alert's id is a hash of vehicle, type, fix and zone), so two drivers reading the same topics decide
the same alerts with the same ids, though at different moments and in batches that end at different
offsets. That is why the hand-over matches alerts by id and not by batch or offset: the two
queries' batches never line up, and a fix held in a reorder buffer or an alert fired by the
watermark belongs to no single input offset.

The protocol (docs/exactly-once.md, "Hot drivers", has its failure cases):
- Shadow commit (lease not held): one transaction of this driver's own transactional id
  (`fleetfence-processor-{sink_id}`) with the batch's alerts and dead letters on the shadow topic
  (keyed by sink id, each with a header `id`: the alert id, or the dead letter's `source`) and a
  marker `{sink_id}:shadow` on the markers topic, so a replayed batch is skipped as ever.
- Going live (the first commit after this driver took the lease): a producer with the job's one
  live transactional id, whose `init_transactions` fences every other driver that ever committed
  live and aborts its open transaction; then the lease is checked again (a driver that lost it
  meanwhile must not go on); then the ids committed to `fleet.alerts` and the sources committed to
  the dead-letter topic over the horizon are read (now final: nobody else can commit), and this
  driver's own shadow records over the horizon.
- Live commit: the shadow records nobody committed (this driver was ahead of the old active: they
  go out once, in the first live transaction) and the batch's own alerts and dead letters that
  nobody committed (it was behind), with the marker `{sink_id}`, in one transaction of the live id.

The horizon bounds what is compared: it must exceed how far a hot standby can lag behind the
active driver (`FLEETFENCE_PROCESSOR_HOT_HORIZON_S`).
"""

from __future__ import annotations

import hashlib
import logging
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import orjson

from processor.errors import LeaseLostError

logger = logging.getLogger(__name__)

# A shadow record carries where it would have gone: its id, its topic and its key there.
ID_HEADER = "ff_id"
TOPIC_HEADER = "ff_topic"
KEY_HEADER = "ff_key"
SHADOW_HEADERS = (ID_HEADER, TOPIC_HEADER, KEY_HEADER)
SHADOW_SUFFIX = ":shadow"


@dataclass(frozen=True)
class HotOptions:
    """What a hot driver's sink needs beyond the plain sink's options (passed as sink options)."""

    lease_key: str  # the job's lease in Redis (processor.ops.lease)
    owner: str  # this driver's token in it
    redis_url: str
    shadow_topic: str
    live_transactional_id: str  # shared by every driver of the job
    horizon_ms: int

    def options(self) -> dict[str, str]:
        return {
            "hotLeaseKey": self.lease_key,
            "hotOwner": self.owner,
            "hotRedisUrl": self.redis_url,
            "shadowTopic": self.shadow_topic,
            "hotTransactionalId": self.live_transactional_id,
            "hotHorizonMs": str(self.horizon_ms),
        }

    @classmethod
    def from_options(cls, o: dict[str, str]) -> HotOptions | None:
        """The options as the sink reads them (keys lower-cased by the data source), or None."""
        if not o.get("hotleasekey"):
            return None
        return cls(
            o["hotleasekey"],
            o["hotowner"],
            o["hotredisurl"],
            o["shadowtopic"],
            o["hottransactionalid"],
            int(o["hothorizonms"]),
        )


@dataclass(frozen=True)
class Outgoing:
    """One record a commit writes to `fleet.alerts` or the dead-letter topic, with the id two
    drivers agree on: the alert id, or the dead letter's place on its topic."""

    id: str
    topic: str
    key: bytes
    value: bytes
    headers: list[tuple[str, bytes]] = field(default_factory=list)


def alert_id_of(value: bytes) -> str:
    return str(orjson.loads(value)["alert_id"])


def header(headers: list[tuple[str, bytes]] | None, name: str) -> str | None:
    for k, v in headers or []:
        if k == name:
            return v.decode() if isinstance(v, bytes) else str(v)
    return None


def records_since(bootstrap: str, topic: str, since_ms: int, timeout_s: float = 60.0) -> Iterator[Any]:
    """Every committed record of `topic` appended at or after `since_ms` (by the records' time), to
    the partitions' ends as they are now; read_committed, so it is final once every producer that
    could still write has been fenced."""
    from confluent_kafka import KafkaError, TopicPartition

    from fleetfence.kafka import committed_reader

    c = committed_reader(
        bootstrap, f"fleetfence-hot-{uuid.uuid4().hex[:8]}", **{"enable.partition.eof": True}
    )
    try:
        parts = sorted(c.list_topics(topic, timeout=10).topics[topic].partitions)
        starts = c.offsets_for_times([TopicPartition(topic, p, since_ms) for p in parts], timeout=10)
        ends = {
            p: c.get_watermark_offsets(TopicPartition(topic, p), timeout=10, cached=False)[1] for p in parts
        }
        assign = [tp for tp in starts if tp.offset >= 0 and tp.offset < ends[tp.partition]]
        if not assign:
            return
        c.assign(assign)
        todo = {tp.partition for tp in assign}
        deadline = time.monotonic() + timeout_s
        while todo:
            if time.monotonic() > deadline:
                raise TimeoutError(f"could not read {topic} to its end within {timeout_s:.0f} s")
            for m in c.consume(1000, 0.1):
                err = m.error()
                if err is not None:
                    if err.code() == KafkaError._PARTITION_EOF and m.offset() >= ends[m.partition()]:
                        todo.discard(m.partition())
                    continue
                if m.offset() < ends[m.partition()]:
                    yield m
                if m.offset() + 1 >= ends[m.partition()]:
                    todo.discard(m.partition())
    finally:
        c.close()


def dead_letter_id(source: str | None, key: bytes, value: bytes) -> str | None:
    """The id two drivers agree on for a dead letter the processor wrote: its record's place
    (`topic:partition:offset`), or, for a fix whose place is unknown (the source is then its
    vehicle), the vehicle and a hash of the bytes. None for a dead letter of the gateway."""
    if source is None:
        return None
    if source.count(":") >= 2:
        return source
    return f"{source}:{hashlib.blake2b(key + b'|' + value, digest_size=12).hexdigest()}"


def committed_ids(bootstrap: str, alerts_topic: str, dlq_topic: str, since_ms: int) -> set[str]:
    """The alert ids on `fleet.alerts` and the processor's dead letters on the dead-letter topic
    since `since_ms`: what some driver already committed."""
    ids = {alert_id_of(m.value()) for m in records_since(bootstrap, alerts_topic, since_ms) if m.value()}
    for m in records_since(bootstrap, dlq_topic, since_ms):
        rid = dead_letter_id(header(m.headers(), "source"), m.key() or b"", m.value() or b"")
        if rid is not None:
            ids.add(rid)
    return ids


def shadow_records(bootstrap: str, shadow_topic: str, sink_id: str, since_ms: int) -> list[Outgoing]:
    """This driver's shadow records since `since_ms`, in the order it committed them, as they are
    to be written: each to its own topic with its own key and headers."""
    out: list[Outgoing] = []
    mine = sink_id.encode()
    for m in records_since(bootstrap, shadow_topic, since_ms):
        if m.key() != mine:
            continue
        headers = list(m.headers() or [])
        rid, topic, key = (header(headers, h) for h in (ID_HEADER, TOPIC_HEADER, KEY_HEADER))
        if rid is None or topic is None or key is None:
            continue
        kept = [(k, v) for k, v in headers if k not in SHADOW_HEADERS]
        out.append(Outgoing(rid, topic, key.encode(), m.value() or b"", kept))
    return out


def to_release(
    pending: list[Outgoing], batch: list[Outgoing], committed: set[str]
) -> tuple[list[Outgoing], int]:
    """What a live commit writes: the shadow records and the batch's records nobody committed yet,
    each id once, in order; and how many were held back as already committed."""
    out: list[Outgoing] = []
    seen = set(committed)
    dropped = 0
    for r in [*pending, *batch]:
        if r.id in seen:
            dropped += 1
            continue
        seen.add(r.id)
        out.append(r)
    return out, dropped


class HotSink:
    """One hot driver's sink, per Python process of the driver's commit runner."""

    def __init__(self, bootstrap: str, sink_id: str, markers_topic: str, hot: HotOptions) -> None:
        import redis

        from processor.spark.kafka_sink import read_last_marker

        self.bootstrap = bootstrap
        self.sink_id = sink_id
        self.markers_topic = markers_topic
        self.hot = hot
        self.redis = redis.Redis.from_url(hot.redis_url, socket_timeout=2.0)
        self.shadow: Any = None
        self.live: Any = None
        self.committed: set[str] = set()
        self.pending: list[Outgoing] = []
        # A batch is committed once, shadow or live: a replay after a crash is skipped either way.
        self.last_committed = max(
            read_last_marker(bootstrap, markers_topic, sink_id),
            read_last_marker(bootstrap, markers_topic, sink_id + SHADOW_SUFFIX),
        )
        logger.info("hot sink ready sink_id=%s last_committed_batch=%s", sink_id, self.last_committed)

    def holds_lease(self) -> bool:
        """Whether this driver holds the job's lease now. Redis unreachable counts as no: a shadow
        commit is always safe, a live one never without the lease."""
        import redis

        try:
            v = self.redis.get(self.hot.lease_key)
        except redis.RedisError as exc:
            logger.warning("lease read failed sink_id=%s error=%s: committing as shadow", self.sink_id, exc)
            return False
        return (v.decode() if isinstance(v, bytes) else v) == self.hot.owner

    def _producer(self, transactional_id: str) -> Any:
        from processor.spark.kafka_sink import SINK_QUEUE_MESSAGES, sink_producer

        p = sink_producer(self.bootstrap, transactional_id, SINK_QUEUE_MESSAGES)
        p.init_transactions(30)
        return p

    def go_live(self, alerts_topic: str, dlq_topic: str, shadow_topic: str) -> None:
        """Fence every other driver's live producer, make sure the lease is still ours, then learn
        what was committed and what of ours was not."""
        started = time.monotonic()
        self.live = self._producer(self.hot.live_transactional_id)
        if not self.holds_lease():
            self.live = None
            raise LeaseLostError(f"lease {self.hot.lease_key} lost while going live: not committing")
        since = int(time.time() * 1000) - self.hot.horizon_ms
        self.committed = committed_ids(self.bootstrap, alerts_topic, dlq_topic, since)
        self.pending = shadow_records(self.bootstrap, shadow_topic, self.sink_id, since)
        logger.info(
            "hot sink live sink_id=%s committed_by_others=%d shadow_records=%d took_ms=%.0f",
            self.sink_id,
            len(self.committed),
            len(self.pending),
            (time.monotonic() - started) * 1000,
        )

    def commit(
        self,
        batch_id: int,
        records: list[Outgoing],
        stats: dict[str, int],
        *,
        alerts_topic: str,
        dlq_topic: str,
    ) -> None:
        from fleetfence.kafka import produce_waiting

        live = self.holds_lease()
        if self.live is not None and not live:
            raise LeaseLostError(f"lease {self.hot.lease_key} no longer this driver's: not committing")
        if batch_id <= self.last_committed:
            logger.warning("batch already committed, skipped sink_id=%s batch_id=%s", self.sink_id, batch_id)
            return
        if live and self.live is None:
            self.go_live(alerts_topic, dlq_topic, self.hot.shadow_topic)
        now_ms = int(time.time() * 1000)
        if self.live is not None:
            out, dropped = to_release(self.pending, records, self.committed)
            pending_ids = {r.id for r in self.pending}
            released = sum(1 for r in out if r.id in pending_ids)
            p = self.live
            marker_key = self.sink_id
            marker = {
                "sink_id": self.sink_id,
                "batch_id": batch_id,
                "committed_ms": now_ms,
                **stats,
                "alerts": sum(1 for r in out if r.topic == alerts_topic),
                "hot_released": released,
                "hot_deduplicated": dropped,
            }
            writes = [(r.topic, r.key, r.value, r.headers) for r in out]
        else:
            p = self.shadow = self.shadow or self._producer(f"fleetfence-processor-{self.sink_id}")
            marker_key = self.sink_id + SHADOW_SUFFIX
            # The counts nested: a sum over every marker on the topic counts the live ones only,
            # while each driver's own live and shadow markers together count every record once.
            marker = {"sink_id": marker_key, "batch_id": batch_id, "committed_ms": now_ms, "shadow": stats}
            key = self.sink_id.encode()
            writes = [
                (
                    self.hot.shadow_topic,
                    key,
                    r.value,
                    [
                        *r.headers,
                        (ID_HEADER, r.id.encode()),
                        (TOPIC_HEADER, r.topic.encode()),
                        (KEY_HEADER, r.key),
                    ],
                )
                for r in records
            ]
        try:
            p.begin_transaction()
            for topic, k, v, h in writes:
                produce_waiting(p, topic, key=k, value=v, headers=h or None)
            produce_waiting(p, self.markers_topic, key=marker_key.encode(), value=orjson.dumps(marker))
            p.commit_transaction(60)
        except Exception:
            self.live = self.shadow = None
            try:
                p.abort_transaction(10)
            except Exception:
                logger.exception("abort after failed commit also failed sink_id=%s", self.sink_id)
            raise
        self.last_committed = batch_id
        if self.live is not None:
            self.pending = []
        logger.info(
            "batch committed sink_id=%s batch_id=%s role=%s records=%d",
            self.sink_id,
            batch_id,
            "live" if self.live is not None else "shadow",
            len(writes),
        )
