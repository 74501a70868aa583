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
from typing import Annotated, Any

import msgspec
import numpy as np
import orjson
import pyarrow as pa
from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadLimit, ReadMaxRows

from fleetfence.contracts import MAX_TS_MS, MIN_TS_MS, bucket_of

logger = logging.getLogger(__name__)

SOURCE_NAME = "fleetfence_kafka"

SCHEMA_DDL = (
    "kind string, bucket int, ts timestamp, n long, payload binary, topic string, kafka_partition int, "
    "kafka_offset long, error string"
)
ARROW_SCHEMA = pa.schema(
    [
        ("kind", pa.string()),
        ("bucket", pa.int32()),
        ("ts", pa.timestamp("us", tz="UTC")),
        ("n", pa.int64()),
        ("payload", pa.binary()),
        ("topic", pa.string()),
        ("kafka_partition", pa.int32()),
        ("kafka_offset", pa.int64()),
        ("error", pa.string()),
    ]
)
# `bucket` is the Spark state key of the row's vehicle bucket (`processor.layout`), not the bucket
# number itself, so that the buckets spread evenly over the stateful tasks.
# One row of the stream carries a whole chunk of one bucket's fixes, as an Arrow IPC stream with
# this schema: the JVM moves a few large binary values per bucket instead of converting every fix
# row by row through the shuffle and into the stateful operator (measured: ~44 us per row there).
FIX_SCHEMA = pa.schema(
    [
        ("vehicle_id", pa.string()),
        ("seq", pa.int64()),
        ("ts_ms", pa.int64()),
        ("lat", pa.float64()),
        ("lon", pa.float64()),
        ("speed_kmh", pa.float64()),
        ("received_ms", pa.int64()),
    ]
)

KIND_TELEMETRY = "T"
KIND_MASTER = "M"
KIND_INVALID = "E"
KIND_RECORD = "R"  # record mode: one raw Kafka record (see `output=records`)
CHUNK_FIXES = 50_000
PARSE_SLICE = 10_000  # records parsed at a time, once a block is drained
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


class _Rows:
    """Output rows of one read task: master events, dead letters and per-bucket fix chunks."""

    def __init__(self, buckets: int, keys: list[int] | None = None) -> None:
        self.buckets = buckets
        # The Spark state key of each bucket (processor.layout): the `bucket` column carries the key.
        self.keys = keys if keys is not None else list(range(buckets))
        self.cols: dict[str, list[Any]] = {f.name: [] for f in ARROW_SCHEMA}
        # Fixes decoded so far, as column batches with each fix's bucket; cut into one Arrow IPC
        # chunk per bucket by `flush_fixes`.
        self._fix_batches: list[pa.RecordBatch] = []
        self._fix_buckets: list[np.ndarray] = []
        self.n_fixes = 0
        self._bucket_cache: dict[str, int] = {}

    def row(
        self,
        kind: str,
        bucket: int,
        ts_ms: int | None,
        n: int,
        payload: bytes | None,
        topic: str | None,
        part: int,
        off: int,
        error: str | None,
    ) -> None:
        c = self.cols
        c["kind"].append(kind)
        c["bucket"].append(self.keys[bucket])
        c["ts"].append(None if ts_ms is None else ts_ms * 1000)
        c["n"].append(n)
        c["payload"].append(payload)
        c["topic"].append(topic)
        c["kafka_partition"].append(part)
        c["kafka_offset"].append(off)
        c["error"].append(error)

    def fixes(self, cols: list[list[Any]]) -> None:
        """Append decoded fixes, given as the seven FIX_SCHEMA columns, in Kafka order."""
        vids = cols[0]
        if not vids:
            return
        cache = self._bucket_cache
        for vid in set(vids).difference(cache):
            cache[vid] = bucket_of(vid, self.buckets)
        self._fix_buckets.append(np.fromiter(map(cache.__getitem__, vids), np.int32, len(vids)))
        self._fix_batches.append(
            pa.RecordBatch.from_arrays(
                [pa.array(col, type=f.type) for col, f in zip(cols, FIX_SCHEMA, strict=True)],
                schema=FIX_SCHEMA,
            )
        )
        self.n_fixes += len(vids)

    def flush_fixes(self, part: int, off: int) -> None:
        """One Arrow IPC chunk per bucket; a vehicle's fixes keep their Kafka order (stable sort)."""
        if not self._fix_batches:
            return
        table = pa.Table.from_batches(self._fix_batches, FIX_SCHEMA).combine_chunks()
        bk = np.concatenate(self._fix_buckets)
        order = np.argsort(bk, kind="stable")
        sorted_bk = bk[order]
        cuts = np.flatnonzero(np.diff(sorted_bk)) + 1
        ts = table.column("ts_ms").to_numpy()
        for idx in np.split(order, cuts):
            chunk = table.take(pa.array(idx))
            sink = pa.BufferOutputStream()
            with pa.ipc.new_stream(sink, FIX_SCHEMA) as w:
                w.write_table(chunk)
            self.row(
                KIND_TELEMETRY,
                int(bk[idx[0]]),
                int(ts[idx].max()),
                len(idx),
                sink.getvalue().to_pybytes(),
                None,
                part,
                off,
                None,
            )
        self._fix_batches.clear()
        self._fix_buckets.clear()
        self.n_fixes = 0

    def __len__(self) -> int:
        return len(self.cols["kind"])

    def batch(self) -> pa.RecordBatch:
        out = pa.RecordBatch.from_pydict(self.cols, schema=ARROW_SCHEMA)
        self.cols = {f.name: [] for f in ARROW_SCHEMA}
        return out


INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
_Int64 = Annotated[int, msgspec.Meta(ge=INT64_MIN, le=INT64_MAX)]


class _PlainFix(msgspec.Struct):
    """The canonical fix as msgspec decodes it in C: the fast path of `parse_telemetry_batch`.
    Accepts only what `canonical_fix` accepts, with the same values (a property test holds the two
    together); whatever it rejects is judged by `canonical_fix`."""

    vehicle_id: Annotated[str, msgspec.Meta(min_length=1)]
    seq: _Int64
    ts_ms: Annotated[int, msgspec.Meta(ge=MIN_TS_MS, le=MAX_TS_MS)]
    lat: Annotated[float, msgspec.Meta(ge=-90.0, le=90.0)]
    lon: Annotated[float, msgspec.Meta(ge=-180.0, le=180.0)]
    speed_kmh: Annotated[float, msgspec.Meta(ge=0.0)]
    received_ms: _Int64 | None = None


_plain_fix = msgspec.json.Decoder(_PlainFix).decode


def canonical_fix(d: Any) -> tuple[str, int, int, float, float, float]:
    """(vehicle_id, seq, ts_ms, lat, lon, speed_kmh) of a canonical telemetry record, or an error.

    The processor's definition of valid telemetry; the archive applies the very same check."""
    vid = d["vehicle_id"]
    seq, ts_ms = d["seq"], d["ts_ms"]
    lat, lon, speed = float(d["lat"]), float(d["lon"]), float(d["speed_kmh"])
    if not (
        isinstance(vid, str)
        and vid
        # int64 columns downstream: a bool or a larger number would fail the read task on every retry
        and type(seq) is int
        and type(ts_ms) is int
        and INT64_MIN <= seq <= INT64_MAX
        # the gateway's static bounds: an absurd event time would drag the watermark for everyone
        and MIN_TS_MS <= ts_ms <= MAX_TS_MS
        and -90 <= lat <= 90
        and -180 <= lon <= 180
        and speed >= 0
    ):
        raise ValueError("field out of contract")
    return vid, seq, ts_ms, lat, lon, speed


INVALID_ERRORS = (orjson.JSONDecodeError, KeyError, TypeError, ValueError)


def _received_ms(d: Any) -> int:
    recv = d.get("received_ms")
    return recv if type(recv) is int and INT64_MIN <= recv <= INT64_MAX else 0


def parse_telemetry_batch(
    rows: _Rows, values: list[bytes | None], offsets: list[int], topic: str, part: int
) -> None:
    """Canonical telemetry (docs/contracts.md) -> the buckets' chunks; anything else -> an invalid
    row that the processor dead-letters, so the counts still reconcile.

    The common case costs ~0.5 us a record: msgspec decodes and range-checks each plain-ASCII record
    in C. A record it rejects (or one with escapes or non-ASCII bytes, where JSON decoders may judge
    differently) is judged by `canonical_fix`, the one definition of valid telemetry, so the fast
    path can only ever be faster, never more lenient. Each record is decoded on its own: joining
    them into one JSON array would let a crafted record swallow its neighbour."""
    try:
        if all(v is not None and v.isascii() and b"\\" not in v for v in values):
            fs = list(map(_plain_fix, values))  # type: ignore[arg-type]
            rows.fixes(
                [
                    [f.vehicle_id for f in fs],
                    [f.seq for f in fs],
                    [f.ts_ms for f in fs],
                    [f.lat for f in fs],
                    [f.lon for f in fs],
                    [f.speed_kmh for f in fs],
                    [f.received_ms or 0 for f in fs],
                ]
            )
            return
    except msgspec.DecodeError:
        pass  # at least one record needs a verdict of its own
    vid: list[str] = []
    seq: list[int] = []
    ts: list[int] = []
    lat: list[float] = []
    lon: list[float] = []
    speed: list[float] = []
    recv: list[int] = []
    for value, off in zip(values, offsets, strict=True):
        f: Any
        try:
            if value is None or not value.isascii() or b"\\" in value:
                raise ValueError
            f = _plain_fix(value)
            r = f.received_ms or 0
        except (msgspec.DecodeError, ValueError):
            try:
                d = orjson.loads(value or b"")
                f = _PlainFix(*canonical_fix(d))
                r = _received_ms(d)
            except INVALID_ERRORS as exc:
                key = f"{topic}:{part}:{off}"
                rows.row(
                    KIND_INVALID,
                    bucket_of(key, rows.buckets),
                    None,
                    1,
                    value,
                    topic,
                    part,
                    off,
                    f"not canonical telemetry: {type(exc).__name__}: {str(exc)[:120]}",
                )
                continue
        vid.append(f.vehicle_id)
        seq.append(f.seq)
        ts.append(f.ts_ms)
        lat.append(f.lat)
        lon.append(f.lon)
        speed.append(f.speed_kmh)
        recv.append(r)
    rows.fixes([vid, seq, ts, lat, lon, speed, recv])


def parse_master(rows: _Rows, value: bytes | None, topic: str, part: int, off: int) -> None:
    if value is None:  # a compaction tombstone carries nothing to apply
        return
    try:
        d = orjson.loads(value)
        entity, eid = d["entity"], str(d["id"])
    except (orjson.JSONDecodeError, KeyError, TypeError) as exc:
        logger.warning("master event skipped offset=%s error=%s", off, exc)
        return
    targets = range(rows.buckets) if entity in ("route", "zone") else [bucket_of(eid, rows.buckets)]
    for b in targets:
        rows.row(KIND_MASTER, b, None, 1, value, None, part, off, None)


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
        rows = _Rows(self.buckets, self.bucket_keys)
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
