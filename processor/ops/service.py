"""`fleetfence processor`: run the streaming job until SIGTERM/SIGINT, with metrics and logs.

The Spark query does the work; this loop only watches it: it hands the query's progress reports to
`processor.ops.progress` (Prometheus metrics), counts and logs every committed micro-batch from its
commit marker (`processor.ops.markers`: one structured line per batch, the marker's exact counts joined
with the batch's duration and watermark), and stops the query gracefully on a signal (the current
micro-batch finishes and commits; a SIGKILL is also safe, see docs/exactly-once.md). A standby
(`--standby`) starts Spark, the job and its Python workers first, then waits for the checkpoint's
lease (`processor.ops.lease`).
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import AbstractContextManager
from typing import Any

from prometheus_client import Counter, Gauge

from fleetfence.errors import ConfigError, KafkaUnavailableError
from fleetfence.registry import Presence, presence
from fleetfence.service import run_until_stopped, stop_on_signals
from processor.errors import LeaseLostError, ProcessorError, StalledError
from processor.ops.lease import CheckpointLease, checkpoint_lease
from processor.ops.markers import BatchLedger, MarkerReader
from processor.ops.progress import StallWatch, log_first_batch, observe, unseen_progress, untrack_state_rows
from processor.settings import PROCESSOR_METRICS_PORT, ProcessorSettings
from processor.spark.checkpoint_files import HadoopCheckpointFiles
from processor.spark.hot_sink import HotOptions
from processor.spark.job import (
    checkpoint_sink_id,
    proximity_sink_id,
    start_proximity_query,
    start_query,
    warm_up_query,
)
from processor.spark.rebucket import read_seed
from processor.spark.session import build_session, processor_partitions, row_tracking, spark_master_url

logger = logging.getLogger(__name__)

ROLE = Gauge(
    "fleetfence_processor_active", "1 while this driver holds the checkpoint and runs the query, 0 on standby"
)
TAKEOVERS = Counter(
    "fleetfence_processor_takeovers_total", "Times this driver took the checkpoint (lease acquired)"
)
# Whether a query started on a checkpoint that already held offsets: where it reads from is then
# fixed by the checkpoint, so every record published from now on will be read, even before the
# query's first batch (which, with nothing new to read, may not run for a long time; when it runs it
# still pays Spark's warm-up). A new checkpoint fixes its start in its first batch (at the topic's
# end, with `latest`). The proximity gauge stays 0 without a rule.
RESTORED = Gauge(
    "fleetfence_processor_checkpoint_restored", "1 when the job's query started on a checkpoint with offsets"
)
PROXIMITY_RESTORED = Gauge(
    "fleetfence_processor_proximity_checkpoint_restored",
    "1 when the proximity query started on a checkpoint with offsets",
)


def has_offsets(spark: Any, checkpoint: str) -> int:
    """1 when `checkpoint` holds Spark's offset log (a query on it resumes where it left off), else 0."""
    return int(HadoopCheckpointFiles(spark, checkpoint).has_entries("offsets"))


# The exit status of a driver whose query stalled (`StallWatch`), for its supervisor to restart it.
EXIT_STALLED = 3


def run_processor(s: ProcessorSettings, stop: threading.Event | None = None) -> None:
    """Start Spark and the query; block until `stop` is set, a signal arrives, or the query fails.
    A stalled query raises `StalledError` without stopping the query or Spark (either can hang
    with hung tasks); `serve` ends the process then."""
    with stop_on_signals(stop) as event:
        _run(s, event)


def serve(s: ProcessorSettings) -> None:
    """The processor as a process (`python -m processor`, `fleetfence processor`): `run_processor`,
    and a stalled query ends the process at once with EXIT_STALLED, since a driver that never exits
    is never restarted. The lease is released and the metrics endpoint closed by then. Spark's JVM
    ends with this process: its gateway exits when our end of its pipe closes (its shutdown hooks
    run first; under compose's `init` the container's end stops them too)."""
    try:
        run_processor(s)
    except StalledError as exc:
        logger.error("processor stalled, exiting for a restart: %s", exc)
        logging.shutdown()
        os._exit(EXIT_STALLED)


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
    spark = build_session(
        app_name="fleetfence-processor",
        spark_master=spark_master_url(s.processor_spark_master),
        shuffle_partitions=processor_partitions(s.processor_shuffle_partitions),
        extra_conf={"spark.cores.max": str(s.processor_cores_max)} if s.processor_cores_max else None,
    )
    if not row_tracking(spark):
        untrack_state_rows()
    lease = checkpoint_lease(s)
    stalled = False
    try:
        if s.processor_hot:
            if lease is None:
                raise ConfigError("hot drivers need the lease: FLEETFENCE_PROCESSOR_LEASE_TTL_MS must be > 0")
            if s.proximity_rules():
                raise ConfigError(
                    "vehicle proximity runs on a driver that is not hot (two hot drivers' batches "
                    "differ, and a pair's alerts may depend on them: docs/architecture.md): unset "
                    "FLEETFENCE_PROCESSOR_PROXIMITY_ENTER_M and FLEETFENCE_PROCESSOR_PROXIMITY_RULES, "
                    "or FLEETFENCE_PROCESSOR_HOT"
                )
            _hot_loop(spark, s, stop, lease)
            return
        if s.processor_standby:
            warm_python_workers(spark)
            scratch = HadoopCheckpointFiles(spark, warm_up_checkpoint(s.checkpoint))
            scratch.remove()  # left by a standby killed during its warm-up
            try:
                warm_up_query(spark, s, scratch.location)
            finally:
                scratch.remove()
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
    except StalledError:
        stalled = True
        raise
    finally:
        if lease is not None:
            lease.release()
        if not stalled:  # stopping Spark with hung tasks may never return (run_processor)
            spark.stop()


def warm_up_checkpoint(checkpoint: str) -> str:
    """Where a standby's warm-up runs its scratch query: beside the job's checkpoint, on the same
    file system (the executors of a cluster write the scratch query's state there too, and see
    the checkpoint's volume or store where the driver does, not the driver's /tmp), one per host."""
    return f"{checkpoint.rstrip('/')}.warm-up-{socket.gethostname()}"


def _hot_loop(spark: Any, s: ProcessorSettings, stop: threading.Event, lease: CheckpointLease) -> None:
    """A hot driver (processor.spark.hot_sink): the query runs on this driver's own checkpoint from
    the start, and its sink commits to fleet.alerts from the first batch after this driver takes
    the job's lease (which a thread waits for beside the query)."""
    ROLE.set(0)
    hot = HotOptions(
        lease_key=lease.key,
        owner=lease.owner,
        redis_url=s.redis_dsn,
        shadow_topic=s.topics.processor_shadow,
        live_transactional_id=f"fleetfence-processor-hot-{lease.key.rsplit(':', 1)[-1]}",
        horizon_ms=s.processor_hot_horizon_s * 1000,
    )
    acquired = threading.Event()
    ended = threading.Event()  # the query loop returned (a stop, or the query failed)

    def take_over() -> None:
        if lease.wait_acquire(ended):
            lease.start_renewing()
            ROLE.set(1)
            TAKEOVERS.inc()
            acquired.set()
            logger.info("hot driver is live checkpoint=%s", s.driver_checkpoint)

    logger.info("hot driver started checkpoint=%s lease=%s", s.driver_checkpoint, lease.key)
    thread = threading.Thread(target=take_over, name="processor-take-over", daemon=True)
    thread.start()
    try:
        _query_loop(spark, s, stop, lease, hot=hot, live=acquired)
    finally:
        ended.set()
        thread.join(5)


def open_marker_reader(s: ProcessorSettings, stop: threading.Event) -> MarkerReader | None:
    """The tail of this run's commit markers, opened however long Kafka stays unreachable; None
    when the service is asked to stop meanwhile.

    It is the driver's first Kafka read after it took the lease, and during an outage (two of three
    brokers down, their names gone from compose's DNS) it once crashed the driver on `_RESOLVE`.
    Crashing gains nothing: the restarted driver meets the same outage, and the query it would
    start next reads the same cluster. So the driver waits, holding its lease, with a log line per
    ask (`fleetfence.kafka.through_outage`), and starts the query once the cluster answers."""
    try:
        return MarkerReader(s.bootstrap_servers, s.topics.processor_commits, timeout_s=None, stop=stop)
    except KafkaUnavailableError as exc:
        if not exc.stopped:
            raise
        logger.info("processor stopped while waiting for Kafka: %s", exc)
        return None


def _query_loop(
    spark: Any,
    s: ProcessorSettings,
    stop: threading.Event,
    lease: CheckpointLease | None,
    *,
    hot: HotOptions | None = None,
    live: threading.Event | None = None,
) -> None:
    """Run the query until `stop`; the lease is watched once this driver holds it (from the start,
    or from when `live` is set for a hot driver)."""
    # Open the marker tail before the query starts: every batch this run commits is counted.
    ledger = BatchLedger(checkpoint_sink_id(spark, s))
    seed = read_seed(HadoopCheckpointFiles(spark, s.driver_checkpoint))
    first_start = seed.offsets.get(s.topics.telemetry) if seed else None
    reader = open_marker_reader(s, stop)
    if reader is None:
        return
    if lease is not None and live is None and lease.lost.is_set():
        # Lost while Kafka was unreachable: another driver may be on the checkpoint by now.
        reader.close()
        raise LeaseLostError(f"the checkpoint's lease {lease.key} was lost while waiting for Kafka: stopping")
    restored = has_offsets(spark, s.driver_checkpoint)
    q = start_query(spark, s, hot=hot)
    RESTORED.set(restored)  # once started: a checkpoint refused at the start is no reader
    rules = s.proximity_rules()
    pq: Any = None  # the proximity query: beside the job, same lease, never hot (_run_query)
    p_ledger: BatchLedger | None = None
    p_last_batch = -1
    last_batch = -1
    stall = StallWatch(s.processor_stall_timeout_s)
    proximity_stall = StallWatch(s.processor_stall_timeout_s)

    def step() -> bool:
        nonlocal last_batch, p_last_batch
        holding = live is None or live.is_set()
        if lease is not None and holding and lease.lost.is_set():
            raise LeaseLostError(f"the checkpoint's lease {lease.key} is no longer this driver's: stopping")
        done = bool(q.awaitTermination(0.5))
        if pq is not None:
            if not pq.isActive:
                raise ProcessorError(f"the proximity query ended: {pq.exception()}")
            latest_p = pq.lastProgress
            report_p = (latest_p["batchId"], latest_p["timestamp"]) if latest_p else None
            proximity_stall.check(bool(pq.status["isTriggerActive"]), report_p, time.monotonic())
            if p_ledger is not None and latest_p and latest_p["batchId"] > p_last_batch:
                for p in unseen_progress(pq.recentProgress, p_last_batch):
                    p_last_batch = p["batchId"]
                    p_ledger.progress(p)
        latest = q.lastProgress
        report = (latest["batchId"], latest["timestamp"]) if latest else None
        if not done:
            stall.check(bool(q.status["isTriggerActive"]), report, time.monotonic())
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
                    log_first_batch(p)
                last_batch = p["batchId"]
                observe(p, s.topics.telemetry, first_start)
                ledger.progress(p)
        for m in reader.poll():
            if not ledger.marker(m) and p_ledger is not None:
                p_ledger.marker(m)
        ledger.flush()
        if p_ledger is not None:
            p_ledger.flush()
        return done

    stalled = False
    try:
        if rules and hot is None:
            restored_p = has_offsets(spark, s.proximity_checkpoint)
            pq = start_proximity_query(spark, s, rules)
            PROXIMITY_RESTORED.set(restored_p)
            p_ledger = BatchLedger(proximity_sink_id(spark, s), proximity=True)
        run_until_stopped(step, stop)
        exc = q.exception()
        if exc is not None:
            raise ProcessorError(f"streaming query failed: {exc}")
        if pq is not None and pq.exception() is not None:
            raise ProcessorError(f"the proximity query failed: {pq.exception()}")
    except StalledError:
        stalled = True  # its hung tasks could hang the query's stop as well: the process ends instead
        raise
    finally:
        if q.isActive and not stalled:
            logger.info("stopping processor query=%s", q.id)
            q.stop()
        if pq is not None and pq.isActive and not stalled:
            logger.info("stopping proximity query=%s", pq.id)
            pq.stop()
        # The last batch committed before the stop: count and log it too.
        for m in reader.poll(1.0):
            if not ledger.marker(m) and p_ledger is not None:
                p_ledger.marker(m)
        ledger.flush(now=float("inf"))
        if p_ledger is not None:
            p_ledger.flush(now=float("inf"))
        reader.close()


def warm_python_workers(spark: Any) -> None:
    """Start Spark's Python workers and import the engine in them, so a takeover pays neither (the
    workers are reused: `spark.python.worker.reuse`)."""

    def load(batches: Iterator[Any]) -> Iterator[Any]:
        import processor.spark.stateful  # noqa: F401  (the operator's imports: numpy, pandas, shapely, h3)

        yield from batches

    parts = max(int(spark.sparkContext.defaultParallelism), 1)
    spark.range(parts, numPartitions=parts).mapInPandas(load, "id long").collect()
