"""The command line's tables in an 80-column terminal: nothing cut to an ellipsis, no line past
the width, and every alert type's name readable whole (two rows never read the same)."""

from __future__ import annotations

from rich.console import Console

from fleetfence.console import two_lines
from fleetfence.contracts import AlertType
from loadtest.model import Latency, ProcSample, Sample
from loadtest.report import live_table
from simulator.truth import TruthAlert
from simulator.verify import ObservedAlert, compare, mismatch_table, result_table

T0 = 1_795_000_000_000


def render(table: object) -> list[str]:
    console = Console(width=80, record=True, color_system=None)
    console.print(table)
    lines = console.export_text().splitlines()
    assert all(len(line) <= 80 for line in lines), max(lines, key=len)
    assert not any("…" in line for line in lines), [line for line in lines if "…" in line]
    return lines


def first_column_names(lines: list[str]) -> list[str]:
    """The first column's words, a name broken after an underscore joined with its next line."""
    words = [line.split()[0] if line.strip() else "" for line in lines]
    names, i = [], 0
    while i < len(words):
        w = words[i]
        if w.endswith("_") and i + 1 < len(words):
            w, i = w + words[i + 1], i + 1
        names.append(w)
        i += 1
    return names


def test_two_lines_breaks_long_names_at_an_underscore_only() -> None:
    for t in AlertType:
        parts = two_lines(t.value).split("\n")
        assert "".join(parts) == t.value
        assert len(parts) == 1 or parts[0].endswith("_")
    assert two_lines("ARRIVAL_BACK_ON_TIME") == "ARRIVAL_\nBACK_ON_TIME"
    assert two_lines("OVERSPEED") == "OVERSPEED"


def test_the_verify_table_shows_every_type_whole_at_80_columns() -> None:
    truth = [
        TruthAlert(f"sim-{v:06d}", t.value, 1_795_000_000 + i, T0 + i, None, -1, T0 + 500_000)
        for i, t in enumerate(AlertType)
        for v in range(2_000)
    ]
    observed = [
        ObservedAlert(a.alert_id, a.vehicle_id, a.type, None, a.seq, a.ts_ms, T0 + 512_345)
        for a in truth[2_000:]
    ]
    lines = render(result_table(compare(truth, observed + observed[:500])))
    names = first_column_names(lines)
    for t in AlertType:
        assert names.count(t.value) == 1, (t, names)
    assert "ALL" in names


def test_the_mismatch_table_fits_80_columns() -> None:
    truth = [
        TruthAlert("lt-ed6dad-000666", t.value, 741, T0, "z-depot-0001", -1, None, 52.51, 13.4)
        for t in AlertType
    ]
    observed = [
        ObservedAlert("x", "lt-ed6dad-000666", t.value, "z-depot-0001", 746, T0 + 5000, None, 52.51, 13.4)
        for t in AlertType
    ]
    table = mismatch_table(compare(truth, observed))
    assert table is not None
    text = "\n".join(render(table))
    assert text.count("moved") == len(AlertType)


def test_the_load_tests_live_table_fits_80_columns() -> None:
    sample = Sample(
        t_s=1234.0,
        step=3,
        target_rate=100_000.0,
        publish_rate=99_876.5,
        puback_p50_ms=12.3,
        puback_p99_ms=1_045.6,
        gateway_forwarded_rate=99_870.1,
        gateway_dead_lettered=123_456,
        processor_rate=99_000.2,
        processor_lag=12_345_678,
        receivers_lag=789_000,
        alerts=4_567_890,
        procs={
            "gateway-1": ProcSample(87.0, 123.0),
            "processor": ProcSample(180.0, 12_345.0),
            "kafka": ProcSample(55.0, 1_024.0),
        },
    )
    lat = Latency(100, 12_345.0, 23_456.0, 34_567.0, 50_000.0)
    text = "\n".join(render(live_table(sample, latency_event=lat, latency_receipt=lat)))
    for row in ("publisher:", "PUBACK", "processor", "kafka", "12,345 / 34,567", "99,876.5/s"):
        assert row in text, row
