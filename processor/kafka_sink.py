"""Exactly-once Spark streaming sink for alerts, on the Python Data Source API.

Executors (`write`) do not touch Kafka: they write the live read model to Redis (idempotent: a
state only replaces an older one) and hand their alerts and dead letters back in the commit
message. The driver (`commit`) then writes all of the micro-batch's alerts, its dead letters and a
marker `{sink_id: batch_id}` in ONE Kafka transaction. Before writing, it looks up the last
committed marker of this sink; a batch at or below it was already committed (Spark crashed after
the Kafka commit but before its own commit log) and is skipped. The protocol and the failure cases
it covers are in docs/exactly-once.md.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import orjson
import pyarrow as pa
from pyspark.sql.datasource import DataSource, DataSourceStreamArrowWriter, WriterCommitMessage

from fleetfence.contracts import DlqReason, dead_letter
from fleetfence.readmodels import ReadKeys

logger = logging.getLogger(__name__)

SINK_NAME = "fleetfence_alerts"
OUTPUT_DDL = "kind string, key string, value binary, seq long, error string"
OUT_ALERT = "alert"
OUT_LIVE = "live"
OUT_DLQ = "dlq"
OUT_STATS = "stats"

LIVE_SCHEMA = pa.schema(
    [("vehicle_id", pa.string()), ("version", pa.int64()), ("ts_ms", pa.int64()), ("state", pa.binary())]
)


def pack_live(live: list[dict[str, Any]]) -> bytes:
    """A bucket's live states as one Arrow IPC blob: each state is JSON-encoded once, here, and
    written to Redis as these bytes. The version orders states of one vehicle: a newer seq wins;
    at the same seq, "silent" is the newer state."""
    batch = pa.RecordBatch.from_arrays(
        [
            pa.array([d["vehicle_id"] for d in live], pa.string()),
            pa.array([d["seq"] * 2 + (1 if d["silent"] else 0) for d in live], pa.int64()),
            pa.array([d["ts_ms"] for d in live], pa.int64()),
            pa.array([orjson.dumps(d) for d in live], pa.binary()),
        ],
        schema=LIVE_SCHEMA,
    )
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, LIVE_SCHEMA) as w:
        w.write_batch(batch)
    return bytes(sink.getvalue().to_pybytes())


def unpack_live(blob: bytes) -> list[tuple[str, int, int, bytes]]:
    """(vehicle_id, version, ts_ms, state JSON) for each state packed by `pack_live`."""
    t = pa.ipc.open_stream(blob).read_all()
    return list(zip(*(t.column(c).to_pylist() for c in LIVE_SCHEMA.names), strict=True))


# Replaces each live state only when (seq, silent) is newer: replays and retries write the same or
# an older state and change nothing. Many vehicles per call, versions in a hash beside the states,
# so Redis compares two numbers instead of decoding the stored JSON (a state written before the
# version hash existed is still judged by its JSON). KEYS: index, versions, then one state key per
# vehicle; ARGV: per vehicle (id, version, ts_ms, state).
LIVE_LUA = """
local written = 0
for i = 3, #KEYS do
  local a = (i - 3) * 4
  local vid, newv = ARGV[a + 1], tonumber(ARGV[a + 2])
  local curv = tonumber(redis.call('HGET', KEYS[2], vid))
  if not curv then
    local cur = redis.call('GET', KEYS[i])
    if cur then
      local ok, d = pcall(cjson.decode, cur)
      if ok and d['seq'] then
        curv = tonumber(d['seq']) * 2 + ((d['silent'] == true) and 1 or 0)
      end
    end
  end
  if not curv or curv < newv then
    redis.call('SET', KEYS[i], ARGV[a + 4])
    redis.call('HSET', KEYS[2], vid, newv)
    redis.call('ZADD', KEYS[1], ARGV[a + 3], vid)
    written = written + 1
  end
end
return written
"""
LIVE_PER_CALL = 500  # vehicles per script call: one call keeps Redis busy for about a millisecond


@dataclass
class AlertCommitMessage(WriterCommitMessage):
    alerts: list[tuple[str, bytes]] = field(default_factory=list)
    dlq: list[tuple[str, bytes, str]] = field(default_factory=list)
    stats: dict[str, int] = field(default_factory=dict)
    live_written: int = 0


class _SinkState:
    """Per-process transactional producer and the last batch this sink committed."""

    def __init__(self, bootstrap: str, sink_id: str, markers_topic: str) -> None:
        from confluent_kafka import Producer

        self.sink_id = sink_id
        self.producer = Producer(
            {
                "bootstrap.servers": bootstrap,
                "transactional.id": f"fleetfence-processor-{sink_id}",
                "enable.idempotence": True,
                "acks": "all",
                "linger.ms": 2,
                "compression.type": "lz4",
                "transaction.timeout.ms": 60000,
                "partitioner": "murmur2_random",
            }
        )
        # Fences any zombie with the same id and aborts its open transaction, so what we read next
        # is final.
        self.producer.init_transactions(30)
        self.last_committed = read_last_marker(bootstrap, markers_topic, sink_id)
        logger.info("sink ready sink_id=%s last_committed_batch=%s", sink_id, self.last_committed)


_SINKS: dict[tuple[str, str], _SinkState] = {}


def read_last_marker(bootstrap: str, topic: str, sink_id: str, timeout_s: float = 30.0) -> int:
    """The highest batch id committed by `sink_id` (-1 if none), read_committed, to the end."""
    from confluent_kafka import Consumer, KafkaError, TopicPartition

    c = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"fleetfence-marker-{sink_id}",
            "enable.auto.commit": False,
            "isolation.level": "read_committed",
            "enable.partition.eof": True,
        }
    )
    try:
        lo, hi = c.get_watermark_offsets(TopicPartition(topic, 0), timeout=10, cached=False)
        if hi <= lo:
            return -1
        c.assign([TopicPartition(topic, 0, lo)])
        last = -1
        deadline = time.monotonic() + timeout_s
        key = sink_id.encode()
        while time.monotonic() < deadline:
            for m in c.consume(1000, 0.5):
                if m.error() is not None:
                    if m.error().code() == KafkaError._PARTITION_EOF and m.offset() >= hi:
                        return last
                    continue
                if m.key() == key and m.value():
                    last = max(last, int(orjson.loads(m.value())["batch_id"]))
            pos = c.position([TopicPartition(topic, 0)])[0].offset
            if pos >= hi:
                return last
        raise TimeoutError(f"could not read commit markers of {sink_id} from {topic}")
    finally:
        c.close()


class AlertStreamWriter(DataSourceStreamArrowWriter):
    def __init__(self, options: dict[str, str]) -> None:
        self.bootstrap = options["bootstrap"]
        self.alerts_topic = options["alertstopic"]
        self.dlq_topic = options["dlqtopic"]
        self.markers_topic = options["markerstopic"]
        self.sink_id = options["sinkid"]
        self.redis_url = options.get("redisurl") or None
        self.redis_prefix = options.get("redisprefix", "ff:")

    # ---- executors

    def write(self, iterator: Iterator[pa.RecordBatch]) -> AlertCommitMessage:
        msg = AlertCommitMessage()
        live: list[tuple[str, int, int, bytes]] = []
        for batch in iterator:
            cols = batch.to_pydict()
            for kind, key, value, error in zip(
                cols["kind"], cols["key"], cols["value"], cols["error"], strict=True
            ):
                if kind == OUT_ALERT:
                    msg.alerts.append((key, value))
                elif kind == OUT_LIVE:
                    live.extend(unpack_live(value))
                elif kind == OUT_DLQ:
                    msg.dlq.append((key, value, error or "invalid"))
                elif kind == OUT_STATS:
                    for k, v in orjson.loads(value).items():
                        msg.stats[k] = msg.stats.get(k, 0) + int(v)
        if live and self.redis_url:
            msg.live_written = self._write_live(live)
        return msg

    def _write_live(self, live: list[tuple[str, int, int, bytes]]) -> int:
        import redis

        r = redis.Redis.from_url(self.redis_url or "")
        try:
            script = r.register_script(LIVE_LUA)
            pipe = r.pipeline(transaction=False)
            rk = ReadKeys(self.redis_prefix)
            head = [rk.live_index, rk.live_version]
            for i in range(0, len(live), LIVE_PER_CALL):
                part = live[i : i + LIVE_PER_CALL]
                script(
                    keys=head + [rk.live(vid) for vid, *_ in part],
                    args=[x for item in part for x in item],
                    client=pipe,
                )
            written = sum(int(x) for x in pipe.execute())
            # One message per task and batch, not per vehicle: the live map redraws in batches.
            r.publish(rk.positions_channel, b"[" + b",".join(v for *_, v in live) + b"]")
            return written
        finally:
            r.close()

    # ---- driver

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        key = (self.bootstrap, self.sink_id)
        st = _SINKS.get(key)
        if st is None:
            st = _SinkState(self.bootstrap, self.sink_id, self.markers_topic)
            _SINKS[key] = st
        if batchId <= st.last_committed:
            logger.warning("batch already committed, skipped sink_id=%s batch_id=%s", self.sink_id, batchId)
            return
        msgs = [m for m in messages if isinstance(m, AlertCommitMessage)]
        alerts = [a for m in msgs for a in m.alerts]
        dlq = [x for m in msgs for x in m.dlq]
        stats: dict[str, int] = {}
        for m in msgs:
            if m is not None:
                for k, v in m.stats.items():
                    stats[k] = stats.get(k, 0) + v
        stats["alerts"] = len(alerts)
        stats["dead_lettered"] = stats.get("invalid", 0)
        p = st.producer
        try:
            p.begin_transaction()
            for vid, value in alerts:
                p.produce(self.alerts_topic, key=vid.encode(), value=value)
            now_ms = int(time.time() * 1000)
            for src, original, detail in dlq:
                value, headers = dead_letter(
                    original,
                    reason=DlqReason.NOT_CANONICAL,
                    detail=detail,
                    origin=("source", src.encode()),
                    received_ms=now_ms,
                )
                p.produce(self.dlq_topic, key=src.encode(), value=value, headers=headers)
            marker = {
                "sink_id": self.sink_id,
                "batch_id": batchId,
                "committed_ms": int(time.time() * 1000),
                **stats,
            }
            p.produce(self.markers_topic, key=self.sink_id.encode(), value=orjson.dumps(marker))
            p.commit_transaction(60)
        except Exception:
            _SINKS.pop(key, None)
            try:
                p.abort_transaction(10)
            except Exception:  # fenced or broker gone: the next incarnation's init aborts it
                logger.exception("abort after failed commit also failed sink_id=%s", self.sink_id)
            raise
        st.last_committed = batchId
        logger.info(
            "batch committed sink_id=%s batch_id=%s alerts=%s dead_lettered=%s",
            self.sink_id,
            batchId,
            len(alerts),
            len(dlq),
        )

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        logger.warning("batch aborted by Spark sink_id=%s batch_id=%s", self.sink_id, batchId)


class AlertSinkDataSource(DataSource):
    """`df.writeStream.format("fleetfence_alerts")`: options bootstrap, alertsTopic, dlqTopic,
    markersTopic, sinkId, redisUrl, redisPrefix."""

    @classmethod
    def name(cls) -> str:
        return SINK_NAME

    def schema(self) -> str:
        return OUTPUT_DDL

    def streamWriter(self, schema: Any, overwrite: bool) -> AlertStreamWriter:
        return AlertStreamWriter({k.lower(): v for k, v in self.options.items()})
