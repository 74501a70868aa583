"""The processor's metrics count every micro-batch from Spark's progress reports, exactly."""

from __future__ import annotations

from typing import Any

import orjson

from processor.service import telemetry_events, unseen_progress

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
