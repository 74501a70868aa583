"""Proximity on Spark (processor.spark.proximity): the two chained stateful stages, in event time,
their state checkpointed. Two pairs meet; one parts (an exit by distance), the other's second vehicle
goes silent (an exit by the lost deadline, which only an event-time timer can fire); a third vehicle
is never near anyone. The input arrives in two runs of the query on one checkpoint, cut in the middle
of both meetings: each alert exactly once, at the fix the pure stages say."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import orjson
import pytest

from processor.core.proximity import ProximityRule
from processor.spark.proximity import FIXES_DDL, proximity_events

pytestmark = pytest.mark.spark

RULE = ProximityRule(
    "convoy", enter_m=50, exit_m=80, min_duration_ms=10_000, tolerance_ms=5_000, lost_after_ms=60_000
)
LATENESS_MS = 10_000
T0 = 1_795_320_000_000
LAT0, LON0 = 52.52, 13.405


def at(x_m: float, y_m: float) -> tuple[float, float]:
    return LAT0 + y_m / 111_320, LON0 + x_m / 67_770


def fix(v: str, ts_ms: int, x_m: float, y_m: float) -> dict[str, Any]:
    lat, lon = at(x_m, y_m)
    return {"vehicle_id": v, "ts_ms": ts_ms, "lat": lat, "lon": lon}


def fleet() -> list[dict[str, Any]]:
    out = []
    for i in range(61):
        t = T0 + 2000 * i
        if i <= 40:  # a drives east; b beside it 30 m north, then away north from i = 20
            out.append(fix("a", t, 10 * i, 0))
            out.append(fix("b", t + 500, 10 * i, 30 if i < 20 else 30 + 15 * (i - 19)))
            out.append(fix("c", t + 100, 2000 + 5 * i, 0))  # c and d: a pair 20 m apart ...
        if i <= 15:
            out.append(fix("d", t + 900, 2000 + 5 * i, 20))  # ... until d goes silent
        out.append(fix("e", t + 300, 9000, 5000))  # far from everyone; its clock moves time on
    return out


def run(spark: Any, inbox: Path, out: Path, checkpoint: Path) -> None:
    fixes = spark.readStream.schema(FIXES_DDL).option("maxFilesPerTrigger", 1).json(str(inbox))
    q = (
        proximity_events(fixes, RULE, LATENESS_MS)
        .writeStream.format("json")
        .option("path", str(out))
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    q.awaitTermination(600)
    assert q.exception() is None, q.exception()


def write_files(inbox: Path, fixes: list[dict[str, Any]], first: int, n: int) -> None:
    """`fixes` as `n` files of consecutive event time, named from `first`: one file a batch, read
    in the order of their modification times (set apart, as a clock's granularity may not)."""
    span = -(-len(fixes) // n)
    ordered = sorted(fixes, key=lambda f: f["ts_ms"])
    for k in range(n):
        chunk = ordered[k * span : (k + 1) * span]
        path = inbox / f"{first + k:03d}.json"
        path.write_bytes(b"\n".join(orjson.dumps(f) for f in chunk))
        mtime = 1_700_000_000 + 10 * (first + k)
        os.utime(path, (mtime, mtime))


def events(spark: Any, out: Path) -> list[tuple[str, str, str, int, str]]:
    rows = spark.read.schema("kind string, a string, b string, ts_ms long, reason string").json(str(out))
    return sorted((r.kind, r.a, r.b, r.ts_ms - T0, r.reason) for r in rows.collect())


def test_pairs_meet_and_part_exactly_once_across_a_restart(spark: Any, tmp_path: Path) -> None:
    inbox, out, checkpoint = tmp_path / "in", tmp_path / "out", tmp_path / "checkpoint"
    inbox.mkdir()
    fixes = fleet()
    cut = T0 + 24_000  # both pairs entered, neither parted: their open meetings cross the restart
    write_files(inbox, [f for f in fixes if f["ts_ms"] < cut], 0, 2)
    run(spark, inbox, out, checkpoint)
    first = events(spark, out)
    assert first == [("PROXIMITY_ENTER", "a", "b", 10_500, ""), ("PROXIMITY_ENTER", "c", "d", 10_900, "")]
    write_files(inbox, [f for f in fixes if f["ts_ms"] >= cut], 10, 3)
    run(spark, inbox, out, checkpoint)
    # b leaves: apart once 90 m from a (its fix at i = 23); d's last meeting is c's fix 3.2 s after
    # d's last (within the tolerance) at 34.1 s, so the pair is lost 60 s later, at 94.1 s.
    assert events(spark, out) == [
        ("PROXIMITY_ENTER", "a", "b", 10_500, ""),
        ("PROXIMITY_ENTER", "c", "d", 10_900, ""),
        ("PROXIMITY_EXIT", "a", "b", 46_500, "apart"),
        ("PROXIMITY_EXIT", "c", "d", 94_100, "lost"),
    ]
    run(spark, inbox, out, checkpoint)  # nothing new to read: nothing written again
    assert len(events(spark, out)) == 4
