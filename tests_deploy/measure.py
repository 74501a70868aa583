"""What a user sees during a run, from the load test's report (`report.json`): the rows of the
table docs/deploy.md records ("Faults, measured"), collected over the session and printed at its end."""

from __future__ import annotations

from typing import Any

ROWS: list[dict[str, Any]] = []
# What a fault's own steps measured (seconds from the fault), added to its row.
MEASURED: dict[str, float] = {}


def assert_exact(report: dict[str, Any]) -> dict[str, Any]:
    """precision = recall = 1.0, no duplicate, every count reconciled; returns the step's figures."""
    steps: list[dict[str, Any]] = report["steps"]
    assert len(steps) == 1, steps
    step = steps[0]
    acc, rec = step["accuracy"], step["reconciliation"]
    assert acc["expected"] > 0, f"the scenario expected no alert: {acc}"
    assert acc["precision"] == 1.0, acc
    assert acc["recall"] == 1.0, acc
    assert acc["duplicates"] == 0, acc
    assert rec["reconciled"], rec
    assert rec["published"] == rec["acked"] > 0, rec
    assert rec["in_kafka"] + rec["dead_lettered"] == rec["acked"] - rec["sent_twice"], rec
    assert not report["verdicts"], report["verdicts"]
    return step


def lost(rec: dict[str, Any]) -> str:
    """The table's "lost" cell of an exact run, with the fixes a device sent again after a lost
    PUBACK (in Kafka twice, dropped by seq downstream) when there were any."""
    again = rec["sent_again"] - rec["sent_twice"]  # beyond the scenario's own duplicates
    return f"nothing ({again:,} sent again, dropped by seq)" if again > 0 else "nothing"


def stall_s(samples: list[dict[str, Any]], rate: str) -> float:
    """The longest run of one-second samples in which the fleet published (target > 0) but `rate`
    was zero: `publish_rate` (no PUBACK reached the vehicles), `gateway_forwarded_rate` (nothing
    reached Kafka)."""
    worst = run_s = 0.0
    prev_t = None
    for s in samples:
        dt = s["t_s"] - prev_t if prev_t is not None else 1.0
        prev_t = s["t_s"]
        if s["target_rate"] > 0 and s[rate] == 0:
            run_s += dt
            worst = max(worst, run_s)
        else:
            run_s = 0.0
    return worst


def settle(samples: list[dict[str, Any]]) -> dict[str, Any]:
    """After the fleet's last fix: how long the load test waited for the stages to drain, and what
    was still pending at its end (the settle runs out at `--settle-s` when something never drains:
    a suite that takes twice its usual time shows it here first)."""
    publishing = [s["t_s"] for s in samples if s["target_rate"] > 0]
    last = samples[-1]
    alerts_at_end = last["alerts"]
    quiet_from = next((s["t_s"] for s in samples if s["alerts"] == alerts_at_end), last["t_s"])
    return {
        "settle_s": round(last["t_s"] - (publishing[-1] if publishing else samples[0]["t_s"]), 1),
        "settle_end": f"processor lag {last['processor_lag']}, receivers lag {last['receivers_lag']}, "
        f"last alert {last['t_s'] - quiet_from:.0f} s before the end",
    }


def record(name: str, report: dict[str, Any]) -> dict[str, Any]:
    """Check the run exact and add its row (with what MEASURED holds) to the table."""
    step = assert_exact(report)
    samples = report["samples"]
    row: dict[str, Any] = {
        "fault": name,
        "stall_s": stall_s(samples, "publish_rate"),
        "forward_stall_s": stall_s(samples, "gateway_forwarded_rate"),
        "max_processor_lag": max(s["processor_lag"] for s in samples),
        "puback_p99_max_ms": max((s["puback_p99_ms"] or 0.0) for s in samples),
        "alert_p99_ms": step["latency_event"]["p99_ms"] or 0.0,
        # From the triggering fix's receipt by the gateway: the pipeline's own delay.
        "receipt_alert_p99_ms": step["latency_receipt"]["p99_ms"] or 0.0,
        "receipt_alert_p50_ms": step["latency_receipt"]["p50_ms"] or 0.0,
        "fixes": step["reconciliation"]["acked"],
        "alerts": step["accuracy"]["expected"],
        "lost": lost(step["reconciliation"]),
        **settle(samples),
    }
    row.update({k: round(v, 1) for k, v in MEASURED.items()})
    MEASURED.clear()
    ROWS.append(row)
    print(f"\n{name}: {row}")
    return row


def table() -> str:
    lines = [
        "| run | vehicles' PUBACKs stalled | worst PUBACK p99 of a second | nothing reached Kafka "
        "| processor lag, max | receipt->alert p50 / p99 | fixes | alerts | lost | measured by the test |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    fixed = {
        "fault",
        "stall_s",
        "forward_stall_s",
        "max_processor_lag",
        "puback_p99_max_ms",
        "alert_p99_ms",
        "receipt_alert_p99_ms",
        "receipt_alert_p50_ms",
        "fixes",
        "alerts",
        "lost",
        "settle_end",
    }
    for f in ROWS:
        extra = "; ".join(f"{k} {v} s" for k, v in f.items() if k not in fixed)
        extra += f" ({f['settle_end']})"
        lines.append(
            f"| {f['fault']} | {f['stall_s']:.0f} s | {f['puback_p99_max_ms']:,.0f} ms | "
            f"{f['forward_stall_s']:.0f} s | {f['max_processor_lag']:,} | "
            f"{f['receipt_alert_p50_ms'] / 1000:,.1f} s / {f['receipt_alert_p99_ms'] / 1000:,.1f} s | "
            f"{f['fixes']:,} | {f['alerts']} | {f['lost']} | {extra} |"
        )
    return "\n".join(lines)
