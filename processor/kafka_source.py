"""Spark streaming source for Kafka on the Python Data Source API (no Maven, no JVM connector).

One Spark input partition per Kafka partition; offsets are plain dicts that Spark writes to its
checkpoint's offset log before a micro-batch runs, so a restart re-reads exactly the same records
for an unfinished batch and continues after the last committed one. Records are read with
confluent-kafka in `read_committed` mode and parsed inside the reading task into typed Arrow
columns, so the JVM never sees JSON.

The source reads the telemetry topic and, optionally, the master-data topic in the same
micro-batch: master changes travel through the same checkpointed offsets as telemetry, which makes a
replay see the same route versions. A route or zone change concerns every bucket and is emitted once
per bucket; an assignment or vehicle change goes to its vehicle's bucket.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadLimit, ReadMaxRows

from processor.parse import (
    CHUNK_FIXES,
    KIND_MASTER,
    KIND_TELEMETRY,
    PARSE_SLICE,
    SCHEMA_DDL,
    BucketRows,
    parse_master,
    parse_telemetry_batch,
)

logger = logging.getLogger(__name__)

SOURCE_NAME = "fleetfence_kafka"

KIND_RECORD = "R"  # record mode: one raw Kafka record (see `output=records`)
DRAIN_BLOCK = 250_000  # most records a read task holds unparsed (see `_drain`)


@dataclass
class KafkaInputPartition(InputPartition):
    topic: str
    partition: int
    start: int
    end: int
    kind: str

    def __init__(self, topic: str, partition: int, start: int, end: int, kind: str) -> None:
        super().__init__((topic, partition))
        self.topic, self.partition, self.start, self.end, self.kind = topic, partition, start, end, kind


# Consumers are expensive to create (connections, metadata); Spark reuses Python workers, so one
# consumer per worker process is kept and re-assigned for every partition it reads.
_CONSUMERS: dict[str, Any] = {}


def _consumer(bootstrap: str) -> Any:
    from confluent_kafka import Consumer

    c = _CONSUMERS.get(bootstrap)
    if c is None:
        c = Consumer(
            {
                "bootstrap.servers": bootstrap,
                "group.id": "fleetfence-processor-reader",  # never joins or commits: offsets live in Spark
                "enable.auto.commit": False,
                "isolation.level": "read_committed",
                "enable.partition.eof": True,
                # A read task needs a few MB; a deep prefetch queue made the broker serve (and
                # `unassign` throw away) far more than that, and librdkafka's default one-second
                # backoff before refilling a queue below its limits made the read wait. Small fetches
                # refilled at once: 257k vs 139k records/s with two readers, and less CPU in both the
                # reader and the broker (docs/architecture.md).
                "fetch.max.bytes": 4 * 1024 * 1024,
                "max.partition.fetch.bytes": 2 * 1024 * 1024,
                "queued.max.messages.kbytes": 4 * 1024,
                "fetch.queue.backoff.ms": 1,
            }
        )
        _CONSUMERS[bootstrap] = c
    return c


class FleetKafkaStreamReader(DataSourceStreamReader):
    def __init__(self, options: dict[str, str]) -> None:
        self.bootstrap = options["bootstrap"]
        self.telemetry_topic = options["telemetrytopic"]
        self.master_topic = options.get("mastertopic") or None
        self.buckets = int(options.get("buckets", "16"))
        keys = options.get("bucketkeys")
        self.bucket_keys = [int(k) for k in keys.split(",")] if keys else list(range(self.buckets))
        if len(self.bucket_keys) != self.buckets:
            raise ValueError(f"bucketKeys has {len(self.bucket_keys)} keys for {self.buckets} buckets")
        self.max_events = int(options.get("maxeventsperbatch", "0"))
        self.starting = options.get("startingoffsets", "earliest")
        self.read_timeout_s = float(options.get("readtimeouts", "60"))
        # Record mode (the archive): one row per Kafka record, raw value, Kafka timestamp in `ts`;
        # it may also read the alerts topic. The processor's bucket-chunk mode is the default.
        self.records = options.get("output", "chunks") == "records"
        self.alerts_topic = options.get("alertstopic") or None
        self._admin_consumer: Any = None

    # ---- driver side

    def _meta_consumer(self) -> Any:
        from confluent_kafka import Consumer

        if self._admin_consumer is None:
            self._admin_consumer = Consumer(
                {
                    "bootstrap.servers": self.bootstrap,
                    "group.id": "fleetfence-offsets",
                    "enable.auto.commit": False,
                    "isolation.level": "read_committed",
                }
            )
        return self._admin_consumer

    def _topics(self) -> dict[str, str]:
        t = {"t": self.telemetry_topic}
        if self.master_topic:
            t["m"] = self.master_topic
        if self.alerts_topic:
            t["a"] = self.alerts_topic
        return t

    def _watermarks(self) -> dict[str, dict[str, tuple[int, int]]]:
        from confluent_kafka import TopicPartition

        c = self._meta_consumer()
        out: dict[str, dict[str, tuple[int, int]]] = {}
        md = c.list_topics(timeout=10)
        for alias, topic in self._topics().items():
            tmd = md.topics.get(topic)
            if tmd is None or tmd.error is not None:
                raise RuntimeError(f"Kafka topic {topic!r} does not exist (create it: `fleetfence infra up`)")
            out[alias] = {}
            for p in sorted(tmd.partitions):
                lo, hi = c.get_watermark_offsets(TopicPartition(topic, p), timeout=10, cached=False)
                out[alias][str(p)] = (lo, hi)
        return out

    def initialOffset(self) -> dict[str, Any]:
        wm = self._watermarks()
        pick = 1 if self.starting == "latest" else 0
        # Master data always starts from the beginning: the processor needs every route it refers to.
        return {
            alias: {p: (v[0] if alias == "m" else v[pick]) for p, v in parts.items()}
            for alias, parts in wm.items()
        }

    def getDefaultReadLimit(self) -> ReadLimit:
        return ReadMaxRows(self.max_events) if self.max_events > 0 else ReadAllAvailable()

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:
        wm = self._watermarks()
        end: dict[str, Any] = {}
        for alias, parts in wm.items():
            end[alias] = {}
            for p, (lo, hi) in parts.items():
                s = max(int(start.get(alias, {}).get(p, lo)), lo)
                end[alias][p] = max(s, hi)
        if isinstance(limit, ReadMaxRows) and "t" in end:
            # Spread the cap over telemetry partitions in proportion to their backlog.
            starts = {p: max(int(start.get("t", {}).get(p, wm["t"][p][0])), wm["t"][p][0]) for p in end["t"]}
            backlog = {p: end["t"][p] - starts[p] for p in end["t"]}
            total = sum(backlog.values())
            if total > limit.max_rows:
                for p in end["t"]:
                    end["t"][p] = starts[p] + (backlog[p] * limit.max_rows) // total
        return end

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> list[KafkaInputPartition]:
        out = []
        topics = self._topics()
        for alias, parts in end.items():
            for p, e in parts.items():
                s = int(start.get(alias, {}).get(p, 0))
                if e > s:
                    out.append(
                        KafkaInputPartition(
                            topics[alias], int(p), s, int(e), KIND_MASTER if alias == "m" else KIND_TELEMETRY
                        )
                    )
        return out

    def commit(self, end: dict[str, Any]) -> None:
        """Offsets live in Spark's checkpoint; nothing to commit to Kafka."""

    def stop(self) -> None:
        if self._admin_consumer is not None:
            self._admin_consumer.close()
            self._admin_consumer = None

    # ---- executor side

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, KafkaInputPartition)
        rows = BucketRows(self.buckets, self.bucket_keys)
        topic, part = partition.topic, partition.partition
        last: int | None = None
        for offsets, values, stamps in self._drain(partition):
            for i in range(0, len(offsets), PARSE_SLICE):
                offs, vals = offsets[i : i + PARSE_SLICE], values[i : i + PARSE_SLICE]
                if self.records:
                    for off, value, ts_ms in zip(offs, vals, stamps[i : i + PARSE_SLICE], strict=True):
                        rows.row(KIND_RECORD, 0, ts_ms, 1, value, topic, part, off, None)
                elif partition.kind == KIND_MASTER:
                    for off, value in zip(offs, vals, strict=True):
                        parse_master(rows, value, topic, part, off)
                else:
                    parse_telemetry_batch(rows, vals, offs, topic, part)
                    if rows.n_fixes >= CHUNK_FIXES:
                        rows.flush_fixes(part, offs[-1])
                if len(rows) >= 1000:
                    yield rows.batch()
            last = offsets[-1]
        if last is not None:
            rows.flush_fixes(part, last)
        if len(rows):
            yield rows.batch()

    def _drain(
        self, partition: KafkaInputPartition
    ) -> Iterator[tuple[list[int], list[bytes | None], list[int | None]]]:
        """Offsets, values and (record mode) timestamps of the partition's range, in blocks of at
        most DRAIN_BLOCK records, each read whole before it is parsed and with the consumer released
        in between: a consumer left assigned at the end of its range keeps fetching while the task
        parses, and a broker that answers an empty fetch at once (noida-db 0.2.3) turns that into a
        busy loop (docs/benchmarks.md, "Idle consumers"). The block bounds a task's memory when a
        batch has no cap (`maxEventsPerBatch=0`) and a backlog is large."""
        from confluent_kafka import KafkaError, TopicPartition

        topic, part, end = partition.topic, partition.partition, partition.end
        c = _consumer(self.bootstrap)
        nxt = partition.start
        while nxt < end:
            stop = min(end, nxt + DRAIN_BLOCK)
            offsets: list[int] = []
            values: list[bytes | None] = []
            stamps: list[int | None] = []
            c.assign([TopicPartition(topic, part, nxt)])
            deadline = time.monotonic() + self.read_timeout_s
            done = False
            try:
                while not done:
                    # Ask for no more than is left, or consume() waits out its whole timeout at the end.
                    msgs = c.consume(num_messages=max(1, min(10000, stop - nxt)), timeout=0.2)
                    before = nxt
                    for m in msgs:
                        err = m.error()
                        if err is not None:
                            if err.code() == KafkaError._PARTITION_EOF:
                                if m.offset() >= stop:
                                    done = True
                                continue
                            raise RuntimeError(f"Kafka read error on {topic}/{part}: {err}")
                        off = m.offset()
                        if off >= stop:
                            done = True
                            break
                        offsets.append(off)
                        values.append(m.value())
                        if self.records:
                            ts_type, ts_ms = m.timestamp()
                            stamps.append(ts_ms if ts_type else None)
                        nxt = off + 1
                        if nxt >= stop:
                            done = True
                            break
                    if nxt > before:
                        deadline = time.monotonic() + self.read_timeout_s  # stalled, not slow
                    elif not done and not msgs:
                        # Transaction markers and compaction leave holes: the position tells where we are.
                        pos = c.position([TopicPartition(topic, part)])[0].offset
                        if pos >= stop:
                            done = True
                        elif time.monotonic() > deadline:
                            raise TimeoutError(
                                f"reading {topic}/{part} [{partition.start}, {end}) stalled at {pos}"
                            )
            finally:
                c.unassign()
            nxt = stop
            if offsets:
                yield offsets, values, stamps


class FleetKafkaDataSource(DataSource):
    """`spark.readStream.format("fleetfence_kafka")`: options bootstrap, telemetryTopic, masterTopic,
    buckets, bucketKeys (the state key of each bucket, comma-separated; default the bucket numbers),
    maxEventsPerBatch, startingOffsets (earliest|latest); for the archive also
    output=records (one row per record instead of per-bucket fix chunks) and alertsTopic."""

    @classmethod
    def name(cls) -> str:
        return SOURCE_NAME

    def schema(self) -> str:
        return SCHEMA_DDL

    def streamReader(self, schema: Any) -> FleetKafkaStreamReader:
        return FleetKafkaStreamReader({k.lower(): v for k, v in self.options.items()})
