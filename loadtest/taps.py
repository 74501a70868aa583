"""What the load test reads from Kafka while it runs: the committed alerts and the processor's
commit markers of this run (both from the topics' ends at the start, read_committed), and the
receivers' consumer-group lag. Incremental and non-blocking: the sampler calls `poll()` once a
second, so a long soak never re-reads a topic from its start.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

from fleetfence.kafka import committed_reader, watermarks
from processor.ops.markers import MarkerReader

logger = logging.getLogger(__name__)


def _consumer(bootstrap: str, group: str) -> Consumer:
    return committed_reader(bootstrap, group, **{"enable.partition.eof": False})


def _partitions(c: Consumer, topic: str) -> list[int]:
    md = c.list_topics(topic, timeout=10).topics.get(topic)
    if md is None or md.error is not None or not md.partitions:
        from loadtest.errors import LoadtestError

        raise LoadtestError(f"topic {topic} does not exist")
    return sorted(md.partitions)


class TopicTap:
    """Every committed record of `topic` produced after the tap was opened."""

    def __init__(self, bootstrap: str, topic: str, group: str) -> None:
        self.topic = topic
        self.c = _consumer(bootstrap, group)
        parts = _partitions(self.c, topic)
        starts = []
        for p in parts:
            _lo, hi = watermarks(self.c, topic, p)
            starts.append(TopicPartition(topic, p, hi))
        self.c.assign(starts)
        # Per partition, the offset after the newest data record read (control records of
        # transactions take offsets too, so the topic's end is not where the data ends).
        self.data_end: dict[int, int] = {tp.partition: tp.offset for tp in starts}
        self.start = dict(self.data_end)

    def poll(self, max_records: int = 100_000) -> list[tuple[bytes, int]]:
        """(value, record timestamp ms) of what arrived since the last call."""
        out: list[tuple[bytes, int]] = []
        while len(out) < max_records:
            msgs = self.c.consume(10_000, 0.05)
            if not msgs:
                break
            for m in msgs:
                err = m.error()
                if err is not None:
                    if err.code() != KafkaError._PARTITION_EOF:
                        logger.warning("loadtest tap error topic=%s error=%s", self.topic, err)
                    continue
                _kind, ts = m.timestamp()
                out.append((m.value() or b"", int(ts)))
                self.data_end[m.partition()] = m.offset() + 1
        return out

    def close(self) -> None:
        self.c.close()


@dataclass
class MarkerTotals:
    """The processor's committed batches of this run, summed (docs/contracts.md, commit markers)."""

    batches: int = 0
    received: int = 0
    invalid: int = 0
    accepted: int = 0
    duplicates: int = 0
    late: int = 0
    held: int = 0  # of the newest marker: fixes waiting for a missing seq
    alerts: int = 0
    # Per sink (the job's, the proximity query's): the newest commit and the intervals between
    # the last few, the batches' pace.
    last_committed_ms: dict[str, int] = field(default_factory=dict)
    recent_gaps_ms: dict[str, tuple[int, ...]] = field(default_factory=dict)
    seen: set[tuple[str, Any]] = field(default_factory=set, repr=False)

    @property
    def read(self) -> int:
        """Telemetry records the processor has read: every one is received or invalid."""
        return self.received + self.invalid

    def add(self, m: dict[str, Any]) -> None:
        # One marker per sink and batch: a marker the reader is handed again (a fetch repeated
        # after the markers topic's leader moved, in a two-of-three outage) counts once.
        key = (str(m.get("sink_id", "")), m.get("batch_id"))
        if key[1] is not None:
            if key in self.seen:
                return
            self.seen.add(key)
        self.batches += 1
        for k in ("received", "invalid", "accepted", "duplicates", "late", "alerts"):
            setattr(self, k, getattr(self, k) + int(m.get(k, 0)))
        self.held = int(m.get("held", 0))
        sink, at = str(m.get("sink_id", "")), int(m.get("committed_ms") or 0)
        if at and sink in self.last_committed_ms:
            gaps = self.recent_gaps_ms.get(sink, ())
            self.recent_gaps_ms[sink] = (*gaps[-2:], max(0, at - self.last_committed_ms[sink]))
        if at:
            self.last_committed_ms[sink] = at

    @property
    def batch_pace_s(self) -> float:
        """The longest of the last three intervals between committed batches: how long the
        processor takes now to come back with what follows a batch (a timer's alert comes one
        batch after the fix that armed it; after a failover a batch can take a minute)."""
        return max((g for gaps in self.recent_gaps_ms.values() for g in gaps), default=0) / 1000


class MarkerTap:
    """The processor's commit markers of this run, summed; read through the processor's own
    `MarkerReader` (from the topic's end when opened)."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        self.reader = MarkerReader(bootstrap, topic)
        self.totals = MarkerTotals()

    def poll(self) -> MarkerTotals:
        while markers := self.reader.poll(0.05):
            for m in markers:
                self.totals.add(m)
        return self.totals

    def close(self) -> None:
        self.reader.close()


class GroupLag:
    """Data records of a topic not yet committed by each consumer group (the alert receivers),
    measured against what a `TopicTap` of the same topic has read."""

    def __init__(self, bootstrap: str, tap: TopicTap, groups: list[str]) -> None:
        self.tap = tap
        self.consumers = {g: _consumer(bootstrap, g) for g in groups}
        self.parts = [TopicPartition(tap.topic, p) for p in sorted(tap.data_end)]
        self.last: dict[str, int] = {}

    def lag(self) -> int:
        """The largest lag over the groups (the slowest receiver). A group whose committed offsets
        cannot be read now (its coordinator moving to another broker: a broker lost) keeps its last
        reading: a measurement, not a reason to stop the run."""
        worst = 0
        for g, c in self.consumers.items():
            try:
                committed = c.committed(self.parts, timeout=5)
            except KafkaException as exc:
                logger.warning("loadtest committed offsets unreadable group=%s error=%s", g, exc)
                worst = max(worst, self.last.get(g, 0))
                continue
            total = 0
            for tp in committed:
                p = tp.partition
                # Not committed yet (a negative offset), or before this run: this run's start.
                done = max(tp.offset, self.tap.start[p])
                total += max(self.tap.data_end[p] - done, 0)
            self.last[g] = total
            worst = max(worst, total)
        return worst

    def close(self) -> None:
        for c in self.consumers.values():
            c.close()
