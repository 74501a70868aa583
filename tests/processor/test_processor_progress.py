"""The processor's metrics count every micro-batch from Spark's progress reports, exactly."""

from __future__ import annotations

import logging
from typing import Any

import orjson
import pytest

from processor.errors import StalledError
from processor.ops.progress import (
    STATE_ROWS,
    StallWatch,
    log_first_batch,
    telemetry_events,
    unseen_progress,
    untrack_state_rows,
)

TOPIC = "fleet.telemetry"


def report(batch: int, start: dict[str, int] | None, end: dict[str, int]) -> dict[str, Any]:
    """A progress report as Spark's Kafka sources write it: offsets as JSON text per source."""
    master = {"fleet.master": {"0": 3}}
    return {
        "batchId": batch,
        "sources": [
            {
                "startOffset": None if start is None else orjson.dumps({TOPIC: start}).decode(),
                "endOffset": orjson.dumps({TOPIC: end}).decode(),
            },
            {"startOffset": orjson.dumps(master).decode(), "endOffset": orjson.dumps(master).decode()},
        ],
    }


def test_every_batch_counted_once_across_polls() -> None:
    # Batches 0..6; the poller sees the window after batches 2 and 6 only (lastProgress alone
    # would have seen 2 and 6, missing 0, 1, 3, 4, 5).
    ends = [{"0": 10 * (b + 1), "1": 5 * (b + 1)} for b in range(7)]
    reports = [report(b, ends[b - 1] if b else None, ends[b]) for b in range(7)]
    seen: list[int] = []
    events = 0
    last = -1
    for window in (reports[:3], [*reports[:3], reports[2]], reports):
        for p in unseen_progress(window, last):
            last = p["batchId"]
            seen.append(last)
            events += telemetry_events(p, TOPIC)
    assert seen == list(range(7))
    assert events == 70 + 35, "every telemetry record once; the master source is not telemetry"


def test_first_batch_counts_from_offset_zero_and_ignores_other_topics() -> None:
    p = report(0, None, {"0": 4, "1": 6})
    assert telemetry_events(p, TOPIC) == 10
    assert telemetry_events(p, "other.topic") == 0


def test_a_seeded_checkpoints_first_batch_counts_from_the_seed_offsets() -> None:
    p = report(0, None, {"0": 105, "1": 70})
    assert telemetry_events(p, TOPIC, {"0": 100, "1": 60}) == 15
    assert telemetry_events(report(1, {"0": 105, "1": 70}, {"0": 110, "1": 70}), TOPIC, {"0": 100}) == 5


def test_the_first_batch_of_a_start_is_logged_phase_by_phase(caplog: pytest.LogCaptureFixture) -> None:
    p = {
        **report(7, {"0": 1}, {"0": 2}),
        "durationMs": {"addBatch": 6100, "queryPlanning": 300, "triggerExecution": 7000},
        "stateOperators": [
            {
                "numRowsTotal": 12,
                "memoryUsedBytes": 4096,
                "customMetrics": {"rocksdbCommitFileSyncLatencyMs": 9},
            }
        ],
    }
    with caplog.at_level(logging.INFO, logger="processor.ops.progress"):
        log_first_batch(p)
    line = caplog.records[-1].getMessage()
    assert line.startswith("first batch after start batch_id=7 ")
    for part in ("addBatch_ms=6100", "queryPlanning_ms=300", "triggerExecution_ms=7000", "state_rows=12"):
        assert part in line.split()
    assert "rocksdbCommitFileSyncLatencyMs=9" in line


def test_the_state_rows_gauge_leaves_the_export_when_rocksdb_does_not_count() -> None:
    """Row tracking off, Spark reports 0 rows: the gauge is then not exported at all, rather than
    reading as an empty store."""
    from prometheus_client import REGISTRY, generate_latest

    assert b"fleetfence_processor_state_rows" in generate_latest(REGISTRY)
    try:
        untrack_state_rows()
        untrack_state_rows()  # a second service start in the same process
        assert b"fleetfence_processor_state_rows" not in generate_latest(REGISTRY)
    finally:
        REGISTRY.register(STATE_ROWS)


def test_a_batch_running_past_the_timeout_is_a_stall() -> None:
    w = StallWatch(60)
    w.check(True, (4, "t4"), 1000.0)  # batch 4 reported, batch 5 started
    w.check(True, (4, "t4"), 1060.0)  # exactly the timeout: still patient
    with pytest.raises(StalledError, match="no micro-batch completed for 61 s"):
        w.check(True, (4, "t4"), 1061.0)


def test_the_first_batch_of_a_run_gets_more_time() -> None:
    w = StallWatch(60)
    w.check(True, None, 0.0)  # no report yet: restoring state, starting workers, a backlog
    w.check(True, None, 3 * 60.0)
    with pytest.raises(StalledError):
        w.check(True, None, 3 * 60.0 + 1)


def test_reports_or_an_idle_query_are_no_stall() -> None:
    w = StallWatch(60)
    for i in range(10):  # always a trigger running, a report within each timeout
        w.check(True, (i, f"t{i}"), 1000.0 + 50 * i)
    # An idle query whose triggers run back to back (a slow link to Kafka): the batch id stays,
    # Spark's periodic idle reports change the timestamp.
    for j in range(20):
        w.check(True, (10, f"idle{j}"), 2000.0 + 30 * j)
    for t in range(0, 1000, 100):  # no trigger running, however long
        w.check(False, (10, "idle19"), 3000.0 + t)
    w.check(True, (10, "idle19"), 5000.0)  # a trigger starts the clock afresh
    w.check(True, (10, "idle19"), 5059.0)
    with pytest.raises(StalledError):
        w.check(True, (10, "idle19"), 5061.0)


def test_a_zero_timeout_never_stalls() -> None:
    w = StallWatch(0)
    w.check(True, None, 0.0)
    w.check(True, None, 1e9)
