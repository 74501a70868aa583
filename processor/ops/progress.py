"""The streaming query's progress reports, read: Prometheus metrics per micro-batch, the first
batch of a start logged phase by phase, and the telemetry records a batch read from its Kafka
offsets.

The run loop (`processor.ops.service`) hands every report here once, oldest first (`unseen_progress`);
the exact per-batch counts come from the commit markers (`processor.ops.markers`), these are the
Spark side of the same batches (duration, input rate, state size).
"""

from __future__ import annotations

import contextlib
import logging
from typing import Any

import orjson
from prometheus_client import REGISTRY, Counter, Gauge

from processor.errors import StalledError

logger = logging.getLogger(__name__)

BATCHES = Counter("fleetfence_processor_batches_total", "Micro-batches completed")
INPUT_ROWS = Counter("fleetfence_processor_input_rows_total", "Telemetry records read from Kafka")
BATCH_MS = Gauge("fleetfence_processor_batch_duration_ms", "Duration of the last micro-batch")
INPUT_RATE = Gauge(
    "fleetfence_processor_input_rows_per_s", "Telemetry records per second in the last micro-batch"
)
STATE_ROWS = Gauge(
    "fleetfence_processor_state_rows",
    "Rows in the state store (buckets x variables); exported only while RocksDB counts them "
    "(spark.sql.streaming.stateStore.rocksdb.trackTotalNumberOfRows=true, off by default)",
)


def untrack_state_rows() -> None:
    """Stop exporting the state-rows gauge: with row tracking off Spark reports 0 rows, which would
    read as an empty store."""
    with contextlib.suppress(KeyError):  # already unregistered by an earlier start
        REGISTRY.unregister(STATE_ROWS)


def observe(progress: dict[str, Any], telemetry_topic: str, first_start: dict[str, int] | None) -> None:
    """One micro-batch's progress report into the metrics."""
    events = telemetry_events(progress, telemetry_topic, first_start)
    BATCHES.inc()
    INPUT_ROWS.inc(events)
    BATCH_MS.set(progress.get("durationMs", {}).get("triggerExecution", 0))
    duration_ms = progress.get("durationMs", {}).get("triggerExecution", 0) or 0
    INPUT_RATE.set(events * 1000.0 / duration_ms if duration_ms else 0.0)
    ops = progress.get("stateOperators") or [{}]
    STATE_ROWS.set(ops[0].get("numRowsTotal", 0))


def log_first_batch(p: dict[str, Any]) -> None:
    """The first micro-batch of a start, phase by phase: after a crash or a takeover it restores
    the state and re-runs the unfinished batch, and is what holds alerts back. One line, so an
    operator sees where a slow recovery spent its time."""
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


def unseen_progress(recent: list[dict[str, Any]], last_batch: int) -> list[dict[str, Any]]:
    """The progress reports of batches after `last_batch`, oldest first, one per batch.

    Every completed batch is counted: `lastProgress` alone, sampled every half second, misses the
    batches that complete in between. Spark keeps the last 100 reports
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


# The first batch of a run may restore state, start Python workers and read a backlog: it gets
# this many stall timeouts before it counts as stuck.
FIRST_BATCH_ALLOWANCE = 3


class StallWatch:
    """Tells a stuck query from a slow one: a trigger that is still running `timeout_s` after the
    last progress report (a completed batch, or Spark's periodic report of an idle query) raises
    `StalledError`; the first batch of a run gets FIRST_BATCH_ALLOWANCE times that.

    Spark does not give up on a batch whose tasks wait for executors that never come (a cluster
    manager that lost track of the application) or for workers that never answer: the query stays
    active, reads nothing, and the alerts stop with no error anywhere. Raising ends the driver
    without waiting for its query to stop; its supervisor (a restart policy, systemd, a standby)
    starts a driver on the checkpoint, which replans the batch: a delay, nothing lost or doubled.
    The price: a batch that really needs longer than the timeout is cut and replanned the same way
    on every restart, so the timeout must be well above the longest batch (they are bounded by
    FLEETFENCE_PROCESSOR_MAX_EVENTS_PER_BATCH); and a Kafka outage longer than it restarts the
    driver, which waits for Kafka again."""

    def __init__(self, timeout_s: float) -> None:
        self.timeout_s = timeout_s
        self._busy_since_s: float | None = None
        self._report: object = None
        self._reports = 0

    def check(self, trigger_active: bool, report: object, now_s: float) -> None:
        """`report`: what identifies Spark's last progress report (its batch id and timestamp), or
        None before the first one."""
        if self.timeout_s <= 0:
            return
        if report != self._report:
            self._reports += report is not None
            self._report = report
            self._busy_since_s = now_s if trigger_active else None
        elif not trigger_active:
            self._busy_since_s = None
        elif self._busy_since_s is None:
            self._busy_since_s = now_s  # a trigger started
        limit_s = self.timeout_s * (FIRST_BATCH_ALLOWANCE if self._reports == 0 else 1)
        if self._busy_since_s is not None and now_s - self._busy_since_s > limit_s:
            raise StalledError(
                f"no micro-batch completed for {now_s - self._busy_since_s:.0f} s while one was running "
                f"(FLEETFENCE_PROCESSOR_STALL_TIMEOUT_S={self.timeout_s:g}): ending this driver, for a "
                "restart on the checkpoint"
            )
