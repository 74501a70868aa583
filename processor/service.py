"""`fleetfence processor`: run the streaming job until SIGTERM/SIGINT, with metrics and logs.

The Spark query does the work; this loop only watches it: it exports the query's progress as
Prometheus metrics, counts and logs every committed micro-batch from its commit marker
(`processor.markers`: one structured line per batch, the marker's exact counts joined with the
batch's duration and watermark), and stops the query gracefully on a
signal (the current micro-batch finishes and commits; a SIGKILL is also safe, see
docs/exactly-once.md).
"""

from __future__ import annotations

import logging
import socket
import tempfile
import threading
from collections.abc import Iterator
from contextlib import AbstractContextManager
from datetime import UTC, datetime
from typing import Any

import orjson
import redis
from prometheus_client import Counter, Gauge

from fleetfence.errors import ConfigError
from fleetfence.registry import Presence, presence
from fleetfence.service import run_until_stopped, stop_on_signals
from processor.checkpoint_files import HadoopCheckpointFiles
from processor.errors import LeaseLostError, ProcessorError
from processor.job import checkpoint_sink_id, start_query, warm_up_query
from processor.layout import LAYOUT_FILE
from processor.lease import CheckpointLease, lease_key
from processor.markers import BatchLedger, MarkerReader
from processor.rebucket import (
    RETIRED_FILE,
    SEED_STATE,
    Seed,
    batch_end_offsets,
    last_committed_batch,
    read_bucket_states,
    read_seed,
    refuse_retired,
    split_buckets,
    state_bytes,
    write_seed,
)
from processor.settings import PROCESSOR_METRICS_PORT, ProcessorSettings
from processor.spark import build_session, spark_master_url

logger = logging.getLogger(__name__)

BATCHES = Counter("fleetfence_processor_batches_total", "Micro-batches completed")
INPUT_ROWS = Counter("fleetfence_processor_input_rows_total", "Telemetry records read from Kafka")
BATCH_MS = Gauge("fleetfence_processor_batch_duration_ms", "Duration of the last micro-batch")
INPUT_RATE = Gauge(
    "fleetfence_processor_input_rows_per_s", "Telemetry records per second in the last micro-batch"
)
STATE_ROWS = Gauge("fleetfence_processor_state_rows", "Rows in the state store (buckets x variables)")
ROLE = Gauge(
    "fleetfence_processor_active", "1 while this driver holds the checkpoint and runs the query, 0 on standby"
)
TAKEOVERS = Counter(
    "fleetfence_processor_takeovers_total", "Times this driver took the checkpoint (lease acquired)"
)


def _observe(progress: dict[str, Any], telemetry_topic: str, first_start: dict[str, int] | None) -> None:
    events = telemetry_events(progress, telemetry_topic, first_start)
    BATCHES.inc()
    INPUT_ROWS.inc(events)
    BATCH_MS.set(progress.get("durationMs", {}).get("triggerExecution", 0))
    duration_ms = progress.get("durationMs", {}).get("triggerExecution", 0) or 0
    INPUT_RATE.set(events * 1000.0 / duration_ms if duration_ms else 0.0)
    ops = progress.get("stateOperators") or [{}]
    STATE_ROWS.set(ops[0].get("numRowsTotal", 0))


def _log_first_batch(p: dict[str, Any]) -> None:
    """The first micro-batch of a start, phase by phase: after a crash or a takeover it restores
    the state and re-runs the unfinished batch, and is what holds alerts back (docs/benchmarks.md,
    "Failover"). One line, so an operator sees where a slow recovery spent its time."""
    phases = " ".join(f"{k}_ms={v}" for k, v in sorted((p.get("durationMs") or {}).items()))
    op = (p.get("stateOperators") or [{}])[0]
    custom = op.get("customMetrics") or {}
    state = " ".join(
        f"{k}={custom[k]}"
        for k in sorted(custom)
        if k.startswith(("rocksdbCommit", "rocksdbLoad", "rocksdbFilesCopied", "rocksdbSstFileSize"))
    )
    logger.info(
        "first batch after start batch_id=%s %s state_rows=%s state_memory_bytes=%s %s",
        p.get("batchId"),
        phases,
        op.get("numRowsTotal"),
        op.get("memoryUsedBytes"),
        state,
    )


def run_processor(s: ProcessorSettings, stop: threading.Event | None = None) -> None:
    """Start Spark and the query; block until `stop` is set, a signal arrives, or the query fails."""
    with stop_on_signals(stop) as event:
        _run(s, event)


def processor_presence(s: ProcessorSettings) -> AbstractContextManager[Presence]:
    """The driver's metrics endpoint and its announcement in the service registry (one driver per
    host: the host name is its instance id)."""
    return presence(
        s,
        "processor",
        socket.gethostname(),
        metrics_port=s.processor_metrics_port,
        default_port=PROCESSOR_METRICS_PORT,
    )


def _run(s: ProcessorSettings, stop: threading.Event) -> None:
    with processor_presence(s):
        _run_query(s, stop)


def _run_query(s: ProcessorSettings, stop: threading.Event) -> None:
    master = spark_master_url(s.processor_spark_master)
    spark = build_session(
        app_name="fleetfence-processor", master=master, shuffle_partitions=s.processor_shuffle_partitions
    )
    lease = checkpoint_lease(s)
    try:
        if s.processor_standby:
            warm_python_workers(spark)
            with tempfile.TemporaryDirectory(prefix="fleetfence-warm-up-") as scratch:
                warm_up_query(spark, s, scratch)
            logger.info(
                "standby ready: Spark, the job and its Python workers are up checkpoint=%s", s.checkpoint
            )
        if lease is not None:
            ROLE.set(0)
            if not lease.wait_acquire(stop):
                return
            lease.start_renewing()
        ROLE.set(1)
        TAKEOVERS.inc()
        _query_loop(spark, s, stop, lease)
    finally:
        if lease is not None:
            lease.release()
        spark.stop()


def _query_loop(
    spark: Any, s: ProcessorSettings, stop: threading.Event, lease: CheckpointLease | None
) -> None:
    # Open the marker tail before the query starts: every batch this run commits is counted.
    ledger = BatchLedger(checkpoint_sink_id(spark, s))
    seed = read_seed(HadoopCheckpointFiles(spark, s.checkpoint))
    first_start = seed.offsets.get(s.topics.telemetry) if seed else None
    reader = MarkerReader(s.bootstrap_servers, s.topics.processor_commits)
    q = start_query(spark, s)
    last_batch = -1

    def step() -> bool:
        nonlocal last_batch
        if lease is not None and lease.lost.is_set():
            raise LeaseLostError(f"the checkpoint's lease {lease.key} is no longer this driver's: stopping")
        done = bool(q.awaitTermination(0.5))
        latest = q.lastProgress
        if latest and latest["batchId"] > last_batch:
            # Usually one new batch; the whole recent list (up to 100 reports) only when more
            # than one completed since the last look, or after a restart.
            new = (
                [latest]
                if latest["batchId"] == last_batch + 1
                else unseen_progress(q.recentProgress, last_batch)
            )
            for p in new:
                if last_batch < 0:
                    _log_first_batch(p)
                last_batch = p["batchId"]
                _observe(p, s.topics.telemetry, first_start)
                ledger.progress(p)
        for m in reader.poll():
            ledger.marker(m)
        ledger.flush()
        return done

    try:
        run_until_stopped(step, stop)
        exc = q.exception()
        if exc is not None:
            raise ProcessorError(f"streaming query failed: {exc}")
    finally:
        if q.isActive:
            logger.info("stopping processor query=%s", q.id)
            q.stop()
        # The last batch committed before the stop: count and log it too.
        for m in reader.poll(1.0):
            ledger.marker(m)
        ledger.flush(now=float("inf"))
        reader.close()


def run_rebucket(s: ProcessorSettings, target: str, buckets: int, spark: Any = None) -> Seed:
    """Move the checkpoint's vehicle state to `buckets` buckets in the new checkpoint `target`
    (the steps and why: processor.rebucket). The processor must be stopped: its lease is taken
    for the whole run, so none can start on the old checkpoint meanwhile. Runs on `spark` when
    given (left running), else on a session of its own."""
    lease = checkpoint_lease(s)
    if lease is not None:
        if not lease.try_acquire():
            raise ConfigError(
                f"a processor holds the checkpoint {s.checkpoint} (lease {lease.key}, {lease.holder()}): "
                "stop it before re-bucketing"
            )
        lease.start_renewing()
    own = None
    try:
        if spark is None:
            spark = own = build_session(
                app_name="fleetfence-rebucket",
                master=spark_master_url(s.processor_spark_master),
                shuffle_partitions=s.processor_shuffle_partitions,
            )
        return _rebucket(spark, s, target, buckets, lease)
    finally:
        if lease is not None:
            lease.release()
        if own is not None:
            own.stop()


def _rebucket(
    spark: Any, s: ProcessorSettings, target: str, buckets: int, lease: CheckpointLease | None
) -> Seed:
    """The steps of `run_rebucket` under the old checkpoint's lease. Run again with the same target
    after an interruption, it finishes what is left: a complete seed is kept if the old checkpoint
    has not moved on since, an incomplete one is cleared and written again."""
    old, new = HadoopCheckpointFiles(spark, s.checkpoint), HadoopCheckpointFiles(spark, target)
    done = read_seed(new)
    retired = old.read(RETIRED_FILE)
    if done is not None and retired is not None and orjson.loads(retired)["to"] == target:
        logger.info("rebucket: already done from=%s to=%s batch=%d", s.checkpoint, target, done.batch_id)
        return done
    refuse_retired(old)
    if not old.has_entries("offsets"):
        raise ConfigError(f"no processor checkpoint at {s.checkpoint}")
    if new.has_entries("offsets") or (done is not None and done.source != s.checkpoint):
        raise ConfigError(f"the new checkpoint {target} is not empty")
    if done is not None:
        # Cut short between the seed and the retirement: the seed holds if nothing ran since.
        if last_committed_batch(old)[0] != done.batch_id:
            raise ConfigError(
                f"the old checkpoint ran on after {target} was seeded from its batch {done.batch_id}: "
                f"delete {target} and run the command again"
            )
        _retire(old, target, buckets)
        return done
    new.delete(SEED_STATE)  # what a run cut short before its seed file left: nothing ran from it
    new.delete(LAYOUT_FILE)
    layout = old.read(LAYOUT_FILE)
    old_buckets = len(orjson.loads(layout)["keys"]) if layout else s.processor_buckets
    drain = s.model_copy(update={"processor_buckets": old_buckets})
    logger.info("rebucket: draining checkpoint=%s buckets=%d", s.checkpoint, old_buckets)
    q = start_query(spark, drain, "fleetfence-rebucket-drain", available_now=True)
    while not q.awaitTermination(0.5):
        if lease is not None and lease.lost.is_set():
            q.stop()
            raise LeaseLostError(f"the checkpoint's lease {lease.key} was lost while draining")
    if q.exception() is not None:
        raise ProcessorError(f"draining the checkpoint failed: {q.exception()}")
    batch, watermark_ms = last_committed_batch(old)
    state = read_bucket_states(spark, s.checkpoint, batch)
    vehicles, size = state_bytes(state.values())
    seed = Seed(
        source=s.checkpoint,
        batch_id=batch,
        buckets=buckets,
        watermark_ms=watermark_ms,
        offsets=batch_end_offsets(old, batch),
        vehicles=vehicles,
    )
    partitions = int(spark.conf.get("spark.sql.shuffle.partitions"))
    write_seed(spark, new, seed, split_buckets(list(state.values()), buckets), partitions)
    _retire(old, target, buckets)
    logger.info(
        "rebucket: done from=%s batch=%d buckets=%d->%d vehicles=%d state_bytes=%d to=%s",
        s.checkpoint,
        batch,
        old_buckets,
        buckets,
        vehicles,
        size,
        target,
    )
    return seed


def _retire(old: HadoopCheckpointFiles, target: str, buckets: int) -> None:
    at = datetime.now(UTC).isoformat()
    old.create(RETIRED_FILE, orjson.dumps({"to": target, "at": at, "buckets": buckets}).decode())


def checkpoint_lease(s: ProcessorSettings) -> CheckpointLease | None:
    """The checkpoint's lease in Redis, or None when leasing is off (FLEETFENCE_PROCESSOR_LEASE_TTL_MS=0)."""
    if s.processor_lease_ttl_ms <= 0:
        return None
    client = redis.Redis.from_url(s.redis_dsn, socket_timeout=max(s.processor_lease_ttl_ms / 4000, 0.2))
    return CheckpointLease(client, lease_key(s.redis_prefix, s.checkpoint), s.processor_lease_ttl_ms)


def warm_python_workers(spark: Any) -> None:
    """Start Spark's Python workers and import the engine in them, so a takeover pays neither (the
    workers are reused: `spark.python.worker.reuse`)."""

    def load(batches: Iterator[Any]) -> Iterator[Any]:
        import processor.stateful  # noqa: F401  (the operator's imports: numpy, pandas, shapely, h3)

        yield from batches

    parts = max(int(spark.sparkContext.defaultParallelism), 1)
    spark.range(parts, numPartitions=parts).mapInPandas(load, "id long").collect()


def unseen_progress(recent: list[dict[str, Any]], last_batch: int) -> list[dict[str, Any]]:
    """The progress reports of batches after `last_batch`, oldest first, one per batch.

    Every completed batch is counted: sampling only `lastProgress` every half second missed the
    batches that completed in between (the counters said 2,303 records in 428 batches where the
    commit markers said 3,832 in 529). Spark keeps the last 100 reports
    (`spark.sql.streaming.numRecentProgressUpdates`), far more than complete in half a second."""
    out: dict[int, dict[str, Any]] = {}
    for p in recent:
        if p["batchId"] > last_batch:
            out[p["batchId"]] = p  # a batch reported twice: its latest report
    return [out[b] for b in sorted(out)]


def source_offsets(src: Any, key: str) -> Any:
    """A progress report's source offsets (`key`: startOffset, endOffset), as Spark's Kafka source
    wrote them: {topic: {partition: offset}}, or None before a checkpoint's first batch. Read from
    the source's own JSON where the report has one: pyspark 4.0 hands them over as Python's str()
    of the parsed JSON (4.1 gives JSON text again); a plain dict (a test's) holds them directly."""
    raw = orjson.loads(src.json)[key] if hasattr(src, "json") else src[key]
    return orjson.loads(raw) if isinstance(raw, str) else raw


def telemetry_events(progress: Any, telemetry_topic: str, first_start: dict[str, int] | None = None) -> int:
    """Telemetry records a micro-batch read, from its Kafka offsets (a stream row is a whole chunk).

    Spark's Kafka source reports offsets as {topic: {partition: offset}}. The first batch of a
    new checkpoint has no start offset; it is counted from `first_start` (a re-bucketed
    checkpoint's seed offsets) or else from offset 0, which is exact unless retention already
    removed the topic's first records (transaction markers count as records too).
    """
    total = 0
    for src in progress["sources"] or []:
        start, end = source_offsets(src, "startOffset"), source_offsets(src, "endOffset")
        if not isinstance(end, dict):
            continue
        begin = start.get(telemetry_topic, {}) if isinstance(start, dict) else (first_start or {})
        for p, e in end.get(telemetry_topic, {}).items():
            total += int(e) - int(begin.get(p, 0))
    return total
