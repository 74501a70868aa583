"""Exactly-once Spark streaming sink for alerts, on the Python Data Source API.

Executors (`write`) produce nothing to Kafka: they write the live read model to Redis
(idempotent: a state only replaces an older one) and hand their alerts and dead letters back in
the commit message. (They read from it in one rare case: the original records of fixes beyond the
lateness bound, `original_records`.) The driver (`commit`) then writes all of the micro-batch's
alerts, its dead letters and a marker `{sink_id: batch_id}` in ONE Kafka transaction. Before
writing, it looks up the last committed marker of this sink; a batch at or below it was already
committed (Spark crashed after the Kafka commit but before its own commit log) and is skipped.
The protocol and the failure cases it covers are in docs/exactly-once.md.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import orjson
import pyarrow as pa
from pyspark.sql.datasource import DataSource, DataSourceStreamArrowWriter, WriterCommitMessage

from fleetfence.contracts import DlqReason, dead_letter
from fleetfence.readmodels import ReadKeys
from processor.errors import LateReadBackError
from processor.spark.hot_sink import HotOptions, HotSink, Outgoing, alert_id_of, dead_letter_id
from processor.spark.live_store import write_live
from processor.spark.rows import OUTPUT_DDL, OutputKind, OutputRow, output_rows, unpack_live
from processor.spark.sink_commits import read_last_marker, sink_producer

logger = logging.getLogger(__name__)

SINK_NAME = "fleetfence_alerts"


class DeadLetter(NamedTuple):
    """A record for fleet.telemetry.dlq (`fleetfence.contracts.dead_letter` wraps it)."""

    key: str
    original: bytes
    reason: DlqReason
    detail: str
    source: str  # where the record came from: `topic:partition:offset`, or the vehicle when unknown

    def record(self, received_ms: int) -> tuple[bytes, Any]:
        """The value and headers it is written with."""
        return dead_letter(
            self.original,
            reason=self.reason,
            detail=self.detail,
            origin=("source", self.source.encode()),
            received_ms=received_ms,
        )


@dataclass
class AlertCommitMessage(WriterCommitMessage):
    alerts: list[tuple[str, bytes]] = field(default_factory=list)  # (vehicle_id, record)
    dlq: list[DeadLetter] = field(default_factory=list)
    stats: dict[str, int] = field(default_factory=dict)
    live_written: int = 0


class _SinkState:
    """Per-process transactional producer and the last batch this sink committed."""

    def __init__(self, bootstrap: str, sink_id: str, markers_topic: str) -> None:
        self.sink_id = sink_id
        self.producer = sink_producer(bootstrap, f"fleetfence-processor-{sink_id}")
        # Fences any zombie with the same id and aborts its open transaction, so what we read next
        # is final.
        self.producer.init_transactions(30)
        self.last_committed = read_last_marker(bootstrap, markers_topic, sink_id)
        logger.info("sink ready sink_id=%s last_committed_batch=%s", sink_id, self.last_committed)


_SINKS: dict[tuple[str, str], _SinkState] = {}
_HOT_SINKS: dict[tuple[str, str], HotSink] = {}


READ_AHEAD = 5_000  # wanted offsets this close are read in one pass instead of one seek each


def original_records(
    bootstrap: str,
    topic: str,
    wanted: list[tuple[int, int]],
    timeout_s: float = 30.0,
    read_ahead: int = READ_AHEAD,
) -> dict[tuple[int, int], bytes]:
    """The values of the records at (partition, offset) on `topic`, read_committed. A record gone
    by retention (below the partition's log start) is absent from the answer; one that should be
    there and could not be read raises `LateReadBackError`, so Spark retries the task instead of
    the dead letter quietly holding the decoded fix. Offsets close together are read in one pass,
    others each from its own position."""
    from confluent_kafka import KafkaError, TopicPartition

    from fleetfence.kafka import committed_reader, watermarks

    found: dict[tuple[int, int], bytes] = {}
    if not wanted or not topic:
        return found
    c = committed_reader(
        bootstrap,
        "fleetfence-late-originals",
        **{"auto.offset.reset": "earliest", "enable.partition.eof": True},
    )
    try:
        deadline = time.monotonic() + timeout_s
        by_part: dict[int, list[int]] = {}
        for p, o in sorted(set(wanted)):
            by_part.setdefault(p, []).append(o)
        for p, offs in by_part.items():
            i = 0
            while i < len(offs) and time.monotonic() < deadline:
                # One pass from offs[i] over every wanted offset within read_ahead of the previous.
                j = i
                while j + 1 < len(offs) and offs[j + 1] - offs[j] <= read_ahead:
                    j += 1
                want, last = set(offs[i : j + 1]), offs[j]
                c.assign([TopicPartition(topic, p, offs[i])])
                done = False
                while not done and time.monotonic() < deadline:
                    for m in c.consume(min(1000, last - offs[i] + 1), 1.0):
                        err = m.error()
                        if err is not None:
                            done = done or err.code() == KafkaError._PARTITION_EOF
                            continue
                        if m.offset() in want:
                            found[(p, m.offset())] = bytes(m.value() or b"")
                        done = done or m.offset() >= last
                i = j + 1
        missing: dict[int, list[int]] = {}
        for p, o in set(wanted):
            if (p, o) not in found:
                missing.setdefault(p, []).append(o)
        for p, offs in missing.items():
            lo, _hi = watermarks(c, topic, p, max(1.0, deadline - time.monotonic()))
            unread = sorted(o for o in offs if o >= lo)
            if unread:
                raise LateReadBackError(
                    f"could not read back {len(unread)} record(s) of {topic} partition {p} "
                    f"(first offset {unread[0]}, log start {lo}) within {timeout_s:.0f} s"
                )
        return found
    finally:
        c.close()


def _fatal(exc: Exception) -> bool:
    """Whether the producer is done for (librdkafka's fatal errors): fenced by another producer of
    its transactional id, which a produce call in flight reports as `_FATAL` and the transaction's
    calls as `_FENCED`, or another error no call of this producer can recover from. Only a new
    producer can go on; its `init_transactions` and the markers decide what was committed."""
    from confluent_kafka import KafkaError, KafkaException

    err = exc.args[0] if isinstance(exc, KafkaException) and exc.args else None
    if not isinstance(err, KafkaError):
        return False
    # A produce call's error does not carry the fatal flag: its code says it.
    codes = (
        KafkaError._FATAL,
        KafkaError._FENCED,
        KafkaError.PRODUCER_FENCED,
        KafkaError.INVALID_PRODUCER_EPOCH,
    )
    return bool(err.fatal()) or err.code() in codes


class AlertStreamWriter(DataSourceStreamArrowWriter):
    def __init__(self, options: dict[str, str]) -> None:
        self.bootstrap = options["bootstrap"]
        self.alerts_topic = options["alertstopic"]
        self.dlq_topic = options["dlqtopic"]
        self.markers_topic = options["markerstopic"]
        self.telemetry_topic = options.get("telemetrytopic", "")
        self.sink_id = options["sinkid"]
        self.redis_url = options.get("redisurl") or None
        self.redis_prefix = options.get("redisprefix", "ff:")
        # A standby's warm-up query (processor.spark.job.warm_up_query): the sink's Python processes are
        # started and its modules loaded, and nothing is written anywhere.
        self.dry_run = options.get("dryrun", "") == "true"
        # A hot driver's sink (processor.spark.hot_sink): live or shadow by the job's lease.
        self.hot = HotOptions.from_options(options)

    # ---- executors

    def write(self, iterator: Iterator[pa.RecordBatch]) -> AlertCommitMessage:
        msg = AlertCommitMessage()
        if self.dry_run:
            for _batch in iterator:
                pass
            return msg
        live: list[tuple[str, int, int, bytes]] = []
        late: list[OutputRow] = []
        for batch in iterator:
            for row in output_rows(batch):
                if row.kind == OutputKind.ALERT:
                    msg.alerts.append((row.vehicle_id or "", row.value))
                elif row.kind == OutputKind.LIVE_STATES:
                    live.extend(unpack_live(row.value))
                elif row.kind == OutputKind.DEAD_LETTER:
                    source = f"{row.topic}:{row.kafka_partition}:{row.kafka_offset}"
                    reason, detail = DlqReason.NOT_CANONICAL, row.detail or "invalid"
                    msg.dlq.append(DeadLetter(source, row.value, reason, detail, source))
                elif row.kind == OutputKind.LATE_FIX:
                    late.append(row)
                elif row.kind == OutputKind.STATS:
                    for k, v in orjson.loads(row.value).items():
                        msg.stats[k] = msg.stats.get(k, 0) + int(v)
        if late:
            msg.dlq.extend(self._late_dead_letters(late))
        if live and self.redis_url:
            msg.live_written = self._write_live(live)
        return msg

    def _late_dead_letters(self, late: list[OutputRow]) -> list[DeadLetter]:
        """Dead letters for fixes beyond the lateness bound, with their records' original bytes read
        back from the telemetry topic (rare: only such fixes pay for the read). A record no longer
        there (retention) keeps the fix as the processor decoded it, and the detail says so."""
        wanted = [place for place in (row.place for row in late) if place is not None]
        found = original_records(self.bootstrap, self.telemetry_topic, wanted)
        out: list[DeadLetter] = []
        for row in late:
            vid, place = row.vehicle_id or "", row.place
            original = found.get(place) if place is not None else None
            note = (
                ""
                if original is not None
                else "; the original record is no longer on the topic: the fix as decoded"
            )
            source = f"{self.telemetry_topic}:{place[0]}:{place[1]}" if place is not None else vid
            value = original if original is not None else row.value
            out.append(DeadLetter(vid, value, DlqReason.LATE, (row.detail or "late") + note, source))
        return out

    def _write_live(self, live: list[tuple[str, int, int, bytes]]) -> int:
        return write_live(self.redis_url or "", ReadKeys(self.redis_prefix), live)

    # ---- driver

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        if self.dry_run:
            import fleetfence.kafka  # noqa: F401  (what a real commit imports first, confluent_kafka too)

            logger.info("dry-run batch not committed sink_id=%s batch_id=%s", self.sink_id, batchId)
            return
        msgs = [m for m in messages if isinstance(m, AlertCommitMessage)]
        alerts = [a for m in msgs for a in m.alerts]
        dlq = [x for m in msgs for x in m.dlq]
        stats: dict[str, int] = {}
        for m in msgs:
            for k, v in m.stats.items():
                stats[k] = stats.get(k, 0) + v
        stats["alerts"] = len(alerts)
        stats["dead_lettered"] = stats.get("invalid", 0) + stats.get("late", 0)
        if self.hot is not None:
            self._commit_hot(self.hot, batchId, alerts, dlq, stats)
            return
        # Spark may run a query's commits in more than one of the driver's Python workers (idle
        # workers are shared between the queries of one driver), and each keeps its own producer
        # for the sink: a worker that initialised the producer fences the one used before in
        # another. Fenced, a worker initialises its own again (which waits for or aborts the other's
        # transaction), reads the markers again, and retries the batch unless it was committed.
        for attempt in (1, 2):
            st = self._state()
            if batchId <= st.last_committed:
                logger.warning(
                    "batch already committed, skipped sink_id=%s batch_id=%s", self.sink_id, batchId
                )
                return
            try:
                self._transaction(st, batchId, alerts, dlq, stats)
                break
            except Exception as exc:
                if attempt == 2 or not _fatal(exc):
                    raise
                logger.warning(
                    "sink producer unusable (fenced by another worker of this sink?), batch retried with "
                    "a new one sink_id=%s batch_id=%s error=%s",
                    self.sink_id,
                    batchId,
                    exc,
                )
        st.last_committed = batchId
        logger.info(
            "batch committed sink_id=%s batch_id=%s alerts=%s dead_lettered=%s",
            self.sink_id,
            batchId,
            len(alerts),
            len(dlq),
        )

    def _state(self) -> _SinkState:
        key = (self.bootstrap, self.sink_id)
        st = _SINKS.get(key)
        if st is None:
            st = _SinkState(self.bootstrap, self.sink_id, self.markers_topic)
            _SINKS[key] = st
        return st

    def _transaction(
        self,
        st: _SinkState,
        batch_id: int,
        alerts: list[tuple[str, bytes]],
        dlq: list[DeadLetter],
        stats: dict[str, int],
    ) -> None:
        """The batch's records and its marker in one transaction; on failure the producer is
        dropped (the next commit initialises a new one) and the error raised."""
        # Imported at the first commit, which a standby's dry run makes in advance (see above).
        from fleetfence.kafka import produce_waiting

        p = st.producer
        try:
            p.begin_transaction()
            # More alerts than the producer's queue holds (a mass silence) wait for room.
            for vid, value in alerts:
                produce_waiting(p, self.alerts_topic, key=vid.encode(), value=value)
            now_ms = int(time.time() * 1000)
            for letter in dlq:
                value, headers = letter.record(now_ms)
                produce_waiting(p, self.dlq_topic, key=letter.key.encode(), value=value, headers=headers)
            marker = {
                "sink_id": self.sink_id,
                "batch_id": batch_id,
                "committed_ms": int(time.time() * 1000),
                **stats,
            }
            produce_waiting(p, self.markers_topic, key=self.sink_id.encode(), value=orjson.dumps(marker))
            p.commit_transaction(60)
        except Exception as failed:
            _SINKS.pop((self.bootstrap, self.sink_id), None)
            if _fatal(failed):
                raise  # nothing to abort with: the next producer's init_transactions aborts it
            try:
                p.abort_transaction(10)
            except Exception:  # fenced or broker gone: the next incarnation's init aborts it
                logger.exception("abort after failed commit also failed sink_id=%s", self.sink_id)
            raise

    def _commit_hot(
        self,
        hot: HotOptions,
        batch_id: int,
        alerts: list[tuple[str, bytes]],
        dlq: list[DeadLetter],
        stats: dict[str, int],
    ) -> None:
        key = (self.bootstrap, self.sink_id)
        sink = _HOT_SINKS.get(key)
        if sink is None:
            sink = _HOT_SINKS[key] = HotSink(
                self.bootstrap, self.sink_id, self.markers_topic, self.alerts_topic, self.dlq_topic, hot
            )
        records = [Outgoing(alert_id_of(v), self.alerts_topic, vid.encode(), v) for vid, v in alerts]
        now_ms = int(time.time() * 1000)
        for letter in dlq:
            value, headers = letter.record(now_ms)
            k = letter.key.encode()
            rid = dead_letter_id(letter.source, k, value) or letter.source
            records.append(Outgoing(rid, self.dlq_topic, k, value, list(headers)))
        try:
            sink.commit(batch_id, records, stats)
        except Exception:
            _HOT_SINKS.pop(key, None)
            sink.close()
            raise

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        logger.warning("batch aborted by Spark sink_id=%s batch_id=%s", self.sink_id, batchId)


class AlertSinkDataSource(DataSource):
    """`df.writeStream.format("fleetfence_alerts")`: options bootstrap, alertsTopic, dlqTopic,
    telemetryTopic (where late fixes' original records are read back), markersTopic, sinkId,
    redisUrl, redisPrefix."""

    @classmethod
    def name(cls) -> str:
        return SINK_NAME

    def schema(self) -> str:
        return OUTPUT_DDL

    def streamWriter(self, schema: Any, overwrite: bool) -> AlertStreamWriter:
        return AlertStreamWriter({k.lower(): v for k, v in self.options.items()})
