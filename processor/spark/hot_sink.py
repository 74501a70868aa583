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
  (keyed by sink id, with headers saying each record's id, topic and key) and a marker
  `{sink_id}:shadow` on the markers topic, so a replayed batch is skipped as ever. A matcher pairs
  what this driver shadowed with what was committed to `fleet.alerts` and the dead-letter topic
  (read at every commit, without waiting), by id.
- Going live (the first commit after this driver took the lease): a producer with the job's one
  live transactional id, whose `init_transactions` fences every other driver that ever committed
  live and aborts its open transaction; the lease checked before and after it (a driver that lost
  it meanwhile must not go on); then what was committed is read to the end (final now: nobody
  else can commit).
- Live commit: the shadow records nobody committed (this driver was ahead of the old live one:
  they go out once, in the first live transaction) and the batch's own alerts and dead letters
  that nobody committed (it was behind), with the marker `{sink_id}`, in one transaction of the
  live id.

A restarted driver rebuilds its matcher from its own last commit less the horizon
(`FLEETFENCE_PROCESSOR_HOT_HORIZON_S`), which must exceed how far one driver can run ahead of another.
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


def dead_letter_id(source: str | None, key: bytes, value: bytes) -> str | None:
    """The id two drivers agree on for a dead letter the processor wrote: where its record came
    from (`topic:partition:offset`, or the vehicle when its place is unknown) and a hash of its key
    and bytes (the original record read back from the topic, or the fix as decoded: the same for
    both), so that two late fixes of one vehicle without a place never share an id. None for a dead
    letter of the gateway (no `source`)."""
    if source is None:
        return None
    return f"{source}#{hashlib.blake2b(key + b'|' + value, digest_size=12).hexdigest()}"


def committed_id(m: Any, alerts_topic: str) -> str | None:
    """The id of a record some driver committed: an alert's id, or a processor dead letter's."""
    if m.topic() == alerts_topic:
        return alert_id_of(m.value()) if m.value() else None
    return dead_letter_id(header(m.headers(), "source"), m.key() or b"", m.value() or b"")


def shadow_record(m: Any) -> Outgoing | None:
    """A shadow record as it is to be written: to its own topic with its own key and headers."""
    headers = list(m.headers() or [])
    rid, topic, key = (header(headers, h) for h in (ID_HEADER, TOPIC_HEADER, KEY_HEADER))
    if rid is None or topic is None or key is None:
        return None
    kept = [(k, v) for k, v in headers if k not in SHADOW_HEADERS]
    return Outgoing(rid, topic, key.encode(), m.value() or b"", kept)


@dataclass
class Matcher:
    """Pairs what this driver shadowed with what was committed live, by id, so that only the
    unmatched remain: `pending`, shadowed here and committed by nobody (this driver is ahead of the
    live one), and `ahead`, committed and not yet shadowed here (the live driver is ahead). Both
    stay as small as the lag between the drivers, plus the rare alert the two decide differently
    (docs/exactly-once.md); nothing is dropped by age, which could lose a pending alert or let a
    late one through twice. Pure."""

    pending: dict[str, Outgoing] = field(default_factory=dict)
    ahead: set[str] = field(default_factory=set)

    def committed(self, rid: str) -> None:
        if self.pending.pop(rid, None) is None:
            self.ahead.add(rid)

    def shadowed(self, r: Outgoing) -> None:
        if r.id in self.ahead:
            self.ahead.discard(r.id)
        else:
            self.pending.setdefault(r.id, r)

    def release(self, batch: list[Outgoing]) -> tuple[list[Outgoing], int]:
        """What a live commit writes: the pending shadow records, then the batch's records nobody
        committed, each id once; and how many of the batch's were held back. The batch's records
        are matched against `ahead` (and leave it); `pending` is emptied."""
        out = list(self.pending.values())
        seen = set(self.pending)
        self.pending.clear()
        dropped = 0
        for r in batch:
            if r.id in self.ahead or r.id in seen:
                self.ahead.discard(r.id)
                dropped += 1
                continue
            seen.add(r.id)
            out.append(r)
        return out, dropped


# Longer than a transaction may stay open (the sink's `transaction.timeout.ms`, 60 s): a reader
# waiting for the end of a topic on which a dead producer left one open sees it aborted in time.
READ_TO_END_S = 90.0


class Tail:
    """A read_committed reader of topics from a moment on (None: from their beginning), drained a
    little at every commit so that the takeover only reads what was committed since the last one.

    Its partitions and offsets are read through an outage (`fleetfence.kafka.through_outage`) for
    up to `timeout_s` each: it runs inside a sink's commit, which must end (KafkaUnavailableError
    fails the commit) rather than hang the micro-batch."""

    def __init__(
        self, bootstrap: str, topics: list[str], since_ms: int | None, timeout_s: float = READ_TO_END_S
    ) -> None:
        from confluent_kafka import TopicPartition
        from confluent_kafka.admin import OffsetSpec

        from fleetfence.kafka import admin_client, committed_reader, partitions_of

        self.c = committed_reader(
            bootstrap, f"fleetfence-hot-{uuid.uuid4().hex[:8]}", **{"enable.partition.eof": True}
        )
        self.admin = admin_client(bootstrap)
        try:
            parts = [
                TopicPartition(t, p) for t in topics for p in partitions_of(self.c, t, timeout_s=timeout_s)
            ]
            # The ends first: a partition with nothing at or after the moment starts there, and a
            # record written after this look has a later time, so the second look finds it.
            ends = self._offsets(parts, OffsetSpec.latest(), timeout_s)
            at = OffsetSpec.earliest() if since_ms is None else OffsetSpec.for_timestamp(since_ms)
            starts = self._offsets(parts, at, timeout_s)
        except BaseException:
            self.c.close()
            raise
        self.next = {k: (starts[k] if starts[k] >= 0 else ends[k]) for k in ends}
        self.c.assign([TopicPartition(t, p, o) for (t, p), o in self.next.items()])

    def _offsets(self, parts: list[Any], spec: Any, timeout_s: float) -> dict[tuple[str, int], int]:
        """One admin request for every partition's offset by `spec` (asked partition by partition
        through the consumer, an empty partition costs ~0.5 s)."""
        from fleetfence.kafka import list_offsets

        return list_offsets(self.admin, parts, spec, timeout_s=timeout_s)

    def drain(self, to_end: bool, timeout_s: float = READ_TO_END_S) -> Iterator[Any]:
        """The records committed since the last drain: what is there now (`to_end=False`, a glance
        that never waits for an open transaction), or everything written up to now (`to_end`): a
        transaction still open on the topic is waited for until it is committed or aborted, so
        nothing written before this call is missed."""
        from confluent_kafka import KafkaError, TopicPartition
        from confluent_kafka.admin import OffsetSpec

        parts = [TopicPartition(t, p) for t, p in self.next]
        deadline = time.monotonic() + timeout_s
        ends = self._offsets(parts, OffsetSpec.latest(), timeout_s) if to_end else {}
        while True:
            got = self.c.consume(1000, 0.05 if to_end else 0)
            for m in got:
                err = m.error()
                key = (m.topic(), m.partition())
                if err is None:
                    self.next[key] = m.offset() + 1
                    yield m
                elif err.code() == KafkaError._PARTITION_EOF:
                    # The end, past any transaction markers (which move no record's offset).
                    self.next[key] = max(self.next[key], m.offset())
            if not to_end:
                if not got:
                    return
                continue
            if all(self.next[k] >= hi for k, hi in ends.items()):
                return
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"could not read the committed records to their end within {timeout_s:.0f} s"
                )

    def close(self) -> None:
        self.c.close()


def now_ms() -> int:
    return int(time.time() * 1000)


class HotSink:
    """One hot driver's sink, per Python process of the driver's commit runner. After a failed
    commit the caller drops it and builds a new one, which rebuilds its matcher from the topics."""

    def __init__(
        self,
        bootstrap: str,
        sink_id: str,
        markers_topic: str,
        alerts_topic: str,
        dlq_topic: str,
        hot: HotOptions,
    ) -> None:
        import redis

        from processor.spark.sink_commits import last_marker

        self.bootstrap = bootstrap
        self.sink_id = sink_id
        self.markers_topic = markers_topic
        self.alerts_topic = alerts_topic
        self.dlq_topic = dlq_topic
        self.hot = hot
        self.redis = redis.Redis.from_url(hot.redis_url, socket_timeout=2.0)
        self.live: Any = None
        self.went_live_ms: int | None = None  # how long going live took, told in the first live marker
        # This driver's own transactional id: fences its previous incarnation (and aborts its open
        # shadow transaction) before its shadow records and markers are read back.
        self.shadow = self._producer(f"fleetfence-processor-{sink_id}")
        # A batch is committed once, shadow or live: a replay after a crash is skipped either way.
        mine = [
            m
            for key in (sink_id, sink_id + SHADOW_SUFFIX)
            if (m := last_marker(bootstrap, markers_topic, key, READ_TO_END_S)) is not None
        ]
        self.last_committed = max((int(m["batch_id"]) for m in mine), default=-1)
        # What this driver reads next is what it had read by its last commit; what the live
        # driver committed of it, it committed at most the horizon before that moment (as far as it
        # can run ahead). A driver that never committed reads everything from the beginning.
        last_ms = max((int(m["committed_ms"]) for m in mine), default=None)
        since = None if last_ms is None else last_ms - hot.horizon_ms
        self.matcher = Matcher()
        shadow = Tail(bootstrap, [hot.shadow_topic], since)
        key = sink_id.encode()
        try:
            for m in shadow.drain(to_end=True):
                r = shadow_record(m) if m.key() == key else None
                if r is not None:
                    self.matcher.shadowed(r)
        finally:
            shadow.close()
        self.tail = Tail(bootstrap, [alerts_topic, dlq_topic], since)
        logger.info(
            "hot sink ready sink_id=%s last_committed_batch=%s shadow_pending=%d",
            sink_id,
            self.last_committed,
            len(self.matcher.pending),
        )

    def holds_lease(self) -> bool | None:
        """Whether this driver holds the job's lease now; None when Redis cannot say. A shadow
        commit is always safe; a live driver goes on committing through a Redis hiccup (its
        producer is fenced if another takes over, and its service stops the query once the lease
        has not been renewed for half its ttl); a standby never goes live without an answer."""
        import redis

        try:
            v = self.redis.get(self.hot.lease_key)
        except redis.RedisError as exc:
            logger.warning("lease read failed sink_id=%s error=%s", self.sink_id, exc)
            return None
        return (v.decode() if isinstance(v, bytes) else v) == self.hot.owner

    def _producer(self, transactional_id: str) -> Any:
        from processor.spark.sink_commits import SINK_QUEUE_MESSAGES, sink_producer

        p = sink_producer(self.bootstrap, transactional_id, SINK_QUEUE_MESSAGES)
        p.init_transactions(30)
        return p

    def _read_committed(self, to_end: bool) -> None:
        for m in self.tail.drain(to_end):
            rid = committed_id(m, self.alerts_topic)
            if rid is not None:
                self.matcher.committed(rid)

    def go_live(self) -> None:
        """Fence every other driver's live producer, make sure the lease is still ours, then read
        what was committed up to the end, final now."""
        started = time.monotonic()
        # Checked right before the fencing too: a driver that froze after its last look at the
        # lease would otherwise fence the live driver (which then restarts) before it notices.
        if not self.holds_lease():
            raise LeaseLostError(f"lease {self.hot.lease_key} lost before going live: not committing")
        live = self._producer(self.hot.live_transactional_id)
        if not self.holds_lease():
            raise LeaseLostError(f"lease {self.hot.lease_key} lost while going live: not committing")
        self._read_committed(to_end=True)
        # Nobody else can commit now: the tail has nothing more to say.
        self.tail.close()
        self.live = live
        self.went_live_ms = round((time.monotonic() - started) * 1000)
        logger.info(
            "hot sink live sink_id=%s shadow_pending=%d committed_ahead=%d took_ms=%d",
            self.sink_id,
            len(self.matcher.pending),
            len(self.matcher.ahead),
            self.went_live_ms,
        )

    def commit(self, batch_id: int, records: list[Outgoing], stats: dict[str, int]) -> None:
        from fleetfence.kafka import produce_waiting

        held = self.holds_lease()
        if self.live is not None and held is False:
            raise LeaseLostError(f"lease {self.hot.lease_key} no longer this driver's: not committing")
        live = bool(held)
        if batch_id <= self.last_committed:
            logger.warning("batch already committed, skipped sink_id=%s batch_id=%s", self.sink_id, batch_id)
            return
        if self.live is None:
            self._read_committed(to_end=False)
        if live and self.live is None:
            self.go_live()
        now = now_ms()
        if self.live is not None:
            pending = len(self.matcher.pending)
            out, dropped = self.matcher.release(records)
            p = self.live
            marker_key = self.sink_id
            marker = {
                "sink_id": self.sink_id,
                "batch_id": batch_id,
                "committed_ms": now,
                **stats,
                "alerts": sum(1 for r in out if r.topic == self.alerts_topic),
                "dead_lettered": sum(1 for r in out if r.topic == self.dlq_topic),
                "hot_released": pending,
                "hot_deduplicated": dropped,
                **({"hot_went_live_ms": self.went_live_ms} if self.went_live_ms is not None else {}),
            }
            writes = [(r.topic, r.key, r.value, r.headers) for r in out]
        else:
            p = self.shadow
            marker_key = self.sink_id + SHADOW_SUFFIX
            # The counts nested: a sum over every marker on the topic counts the live ones only,
            # while each driver's own live and shadow markers together count every record once.
            marker = {"sink_id": marker_key, "batch_id": batch_id, "committed_ms": now, "shadow": stats}
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
            try:
                p.abort_transaction(10)
            except Exception:
                logger.exception("abort after failed commit also failed sink_id=%s", self.sink_id)
            raise
        if self.live is None:
            for r in records:
                self.matcher.shadowed(r)
        self.went_live_ms = None
        self.last_committed = batch_id
        logger.info(
            "batch committed sink_id=%s batch_id=%s role=%s records=%d",
            self.sink_id,
            batch_id,
            "live" if self.live is not None else "shadow",
            len(writes),
        )

    def close(self) -> None:
        if self.live is None:
            self.tail.close()
