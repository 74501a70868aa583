"""The load test's report folder, its figures (percentiles, RSS growth) and the live view, from a
run built by hand: the report must say exactly what the record holds."""

from __future__ import annotations

import struct
from dataclasses import asdict
from pathlib import Path

import numpy as np
import orjson
import pytest
from rich.console import Console

from loadtest.model import (
    Accuracy,
    Latency,
    LoadRun,
    ProcSample,
    Reconciliation,
    Sample,
    StepResult,
)
from loadtest.report import live_table, percentiles, rss_growth, write_report

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
CHARTS = ("rate.png", "lag.png", "latency.png", "cpu.png", "memory.png")


def step(i: int, target: float, achieved: float, *, sustained: bool, reconciled: bool = True) -> StepResult:
    return StepResult(
        step=i,
        target_rate=target,
        vehicles=int(target),
        duration_s=20.0,
        achieved_rate=achieved,
        sustained=sustained,
        lag_start=10 * i,
        lag_end=10 * i + (5 if sustained else 4_321),
        latency_event=Latency(
            count=1_234 + i, p50_ms=120.0 + i, p95_ms=340.0, p99_ms=980.0 + 100 * i, max_ms=1_500.0
        ),
        latency_receipt=Latency(count=1_234 + i, p50_ms=80.0, p95_ms=210.0 + i, p99_ms=450.0, max_ms=900.0),
        accuracy=Accuracy(
            expected=50,
            observed=50 + i,
            matched=49,
            duplicates=i,
            precision=0.98,
            recall=0.999 - i / 100,
            per_type={"ROUTE_DEVIATION": {"expected": 30, "matched": 29}},
        ),
        reconciliation=Reconciliation(
            published=20_000,
            acked=20_000,
            sent_twice=0,
            in_kafka=19_990,
            sent_again=0,
            dead_lettered=10,
            telemetry_records=19_990,
            gateway_received=20_000,
            gateway_forwarded=19_990,
            gateway_dead_lettered=10,
            processor_read=19_990 if reconciled else 19_989,
            processor_accepted=19_900,
            processor_duplicates=0,
            processor_invalid=90,
            processor_late=0,
            reconciled=reconciled,
            detail="" if reconciled else "forwarded 19,990 | read 19,989",
        ),
        notes=[f"step {i} note"],
    )


def sample(t_s: float, step_i: int, target: float) -> Sample:
    return Sample(
        t_s=t_s,
        step=step_i,
        target_rate=target,
        publish_rate=target * 0.99,
        puback_p50_ms=3.0,
        puback_p99_ms=11.0,
        gateway_forwarded_rate=target * 0.98,
        gateway_dead_lettered=int(t_s),
        processor_rate=target * 0.97,
        processor_lag=int(5 * t_s),
        receivers_lag=int(t_s) % 3,
        alerts=int(2 * t_s),
        procs={
            "processor": ProcSample(cpu_pct=80.0 + step_i * 20, rss_mib=900.0 + t_s),
            "gateway": ProcSample(cpu_pct=15.0, rss_mib=120.0),
            "loadtest": ProcSample(cpu_pct=30.0, rss_mib=200.0),
        },
    )


@pytest.fixture
def run() -> LoadRun:
    targets = (1_000.0, 1_500.0, 2_250.0)
    return LoadRun(
        mode="ramp",
        started_at="2026-11-25T14:00:00+00:00",
        finished_at="2026-11-25T14:01:30+00:00",
        machine={"cores": 2, "memory_gib": 23.5, "python": "3.11.9"},
        options={"mode": "ramp", "vehicles": 1000, "warmup_s": 10.0, "max_p99_ms": 1_000.0},
        steps=[
            step(0, targets[0], 998.5, sustained=True),
            step(1, targets[1], 1_497.25, sustained=True),
            step(2, targets[2], 1_800.0, sustained=False, reconciled=False),
        ],
        samples=[sample(float(t), t // 20, targets[t // 20]) for t in range(60)],
        highest_sustained_rate=1_500.0,
        rss_growth={"processor": 0.05, "gateway": 0.0},
        verdicts=["event->alert p99 1,180 ms > 1,000 ms"],
    )


def png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == PNG_SIGNATURE, f"{path.name} is not a PNG"
    assert data[12:16] == b"IHDR"
    width, height = struct.unpack(">II", data[16:24])
    return width, height


def test_the_report_folder_holds_the_record_the_summary_and_the_charts(run: LoadRun, tmp_path: Path) -> None:
    folder = write_report(run, tmp_path / "report")

    assert folder == tmp_path / "report"
    assert orjson.loads((folder / "report.json").read_bytes()) == asdict(run)
    for chart in CHARTS:
        assert png_size(folder / chart) == (900, 400), chart

    md = (folder / "summary.md").read_text()
    assert md.startswith("# FleetFence load test: ramp")
    assert "**Failed**" in md
    assert "- event->alert p99 1,180 ms > 1,000 ms" in md
    assert "highest sustained rate: 1,500.0/s" in md
    for figures in (
        ("1,000.0/s", "998.5/s", "| sustained | yes |", "0 → 5", "120 / 340 / 980 ms (1,234 alerts)"),
        ("1,500.0/s", "1,497.2/s", "10 → 15", "121 / 340 / 1,080 ms (1,235 alerts)", "80 / 211 / 450 ms"),
        ("2,250.0/s", "1,800.0/s", "| sustained | no |", "20 → 4,341", "122 / 340 / 1,180 ms (1,236 alerts)"),
    ):
        for f in figures:
            assert f in md, f
    assert "| precision / recall | 0.9800 / 0.9990 |" in md
    assert "| precision / recall | 0.9800 / 0.9790 |" in md
    assert "| duplicates | 2 |" in md
    assert md.count("| reconciliation | ok |") == 2
    assert "| reconciliation | **no**: forwarded 19,990 \\| read 19,989 |" in md
    assert "| processor | +5.0% |" in md
    assert "| gateway | +0.0% |" in md
    assert "- step 2 note" in md
    for chart in CHARTS:
        assert f"]({chart})" in md


def test_a_run_that_passed_and_recorded_nothing_still_reports(tmp_path: Path) -> None:
    empty = LoadRun(mode="fixed", started_at="", finished_at="", machine={}, options={})
    folder = write_report(empty, tmp_path)
    assert "**Passed**" in (folder / "summary.md").read_text()
    assert "highest sustained" not in (folder / "summary.md").read_text()
    for chart in CHARTS:
        assert png_size(folder / chart) == (900, 400)


def test_rss_growth_compares_the_last_tenth_with_the_first_after_warm_up() -> None:
    # 30 samples a second; warm-up 10 s leaves 20, so each tenth is 2 samples.
    def rss(t: int) -> dict[str, ProcSample]:
        steady = {0: 999.0, 10: 200.0, 11: 210.0, 28: 246.0, 29: 246.0}.get(t, 1_000.0)
        leaking = {10: 100.0, 11: 100.0, 28: 150.0, 29: 150.0}.get(t, 7.0)
        procs = {"a": ProcSample(1.0, leaking), "c": ProcSample(1.0, steady)}
        if t < 10:
            procs["gone-before-warm-up"] = ProcSample(1.0, 50.0)
        return procs

    samples = [
        Sample(float(t), 0, 1.0, 1.0, None, None, 1.0, 0, 1.0, 0, 0, 0, procs=rss(t)) for t in range(30)
    ]
    growth = rss_growth(samples, warmup_s=10)
    assert growth == {"a": 0.5, "c": 0.2}
    assert rss_growth(samples, warmup_s=100) == {}


def test_percentiles_are_numpys() -> None:
    values = [5.0, 1.0, 3.0, 100.0, 7.5, 2.0, 42.0, 9.0, 11.0, 13.0, 0.5]
    lat = percentiles(values)
    p50, p95, p99 = np.percentile(values, [50, 95, 99])
    assert lat == Latency(count=11, p50_ms=p50, p95_ms=p95, p99_ms=p99, max_ms=100.0)
    assert percentiles([]) == Latency(count=0, p50_ms=None, p95_ms=None, p99_ms=None, max_ms=None)


def test_the_live_table_shows_every_stage_and_process(run: LoadRun) -> None:
    console = Console(record=True, width=160)
    console.print(live_table(run.samples[25], 1, latency_event=run.steps[1].latency_event))
    text = console.export_text()
    assert "step 1 · target 1,500.0/s" in text
    for row in (
        "publisher: PUBACK",
        "gateways (25 dead-lettered)",
        "processor",
        "alerts (50 committed): event -> alert",
        "loadtest",
    ):
        assert row in text, row
    assert "1,485.0/s" in text  # published
    assert "121 / 1,080" in text  # event -> alert so far, p50 / p99
    assert "925" in text  # the processor's RSS


def test_a_failing_steps_summary_lists_its_mismatched_alerts(run: LoadRun, tmp_path: Path) -> None:
    """A user whose verify failed reads which alerts disagree, and at which fix, in summary.md
    (and report.json), without reading the topics by hand."""
    moved = {
        "kind": "moved",
        "vehicle_id": "lt-000666",
        "type": "ROUTE_COMPLETED",
        "zone_id": None,
        "expected": {"seq": 741, "ts": "2026-11-26T10:00:01.000Z", "ts_ms": 1, "lat": 52.51, "lon": 13.4},
        "observed": {"seq": 746, "ts": "2026-11-26T10:00:06.000Z", "ts_ms": 6, "lat": 52.5101, "lon": 13.4},
    }
    extra = {**moved, "kind": "extra", "type": "WRONG_DIRECTION", "expected": None}
    run.steps[1].accuracy.mismatch_count = 3
    run.steps[1].accuracy.mismatches = [moved, extra]
    write_report(run, tmp_path)
    md = (tmp_path / "summary.md").read_text()
    assert "3 alerts disagree with the ground truth** (1 more than listed)" in md
    assert (
        "| moved | lt-000666 | ROUTE_COMPLETED | — "
        "| seq 741 at 2026-11-26T10:00:01.000Z (52.51000, 13.40000) |" in md
    )
    assert "| extra | lt-000666 | WRONG_DIRECTION | — | — | seq 746" in md
    report = orjson.loads((tmp_path / "report.json").read_bytes())
    assert report["steps"][1]["accuracy"]["mismatches"][0]["expected"]["seq"] == 741
    assert "disagree" not in md.split("### Step 1")[0]  # the other steps agree
