"""What device identity costs end to end: the same fixed-rate load test through the whole pipeline
(`fleetfence loadtest`: MQTT -> gateways -> Kafka -> Spark processor -> receivers), once with an
anonymous broker and the simulator on one connection (FLEETFENCE_MQTT_AUTH=false, the previous
default) and once with authentication (each vehicle's credentials issued, each vehicle on its own
connection logged in as itself, Mosquitto checking every publish against the vehicle's role).

    .venv/bin/python bench/identity.py                         # 2,000 vehicles at 1 Hz for 60 s
    .venv/bin/python bench/identity.py --vehicles 1000 --duration-s 45 --no-write

Both runs in one process, one after the other, each on fresh embedded servers on free ports; the
table compares them side by side (ratios: this machine is shared and noisy) and the section
"Device identity: the cost end to end" of docs/bench-log/identity.md is rewritten with the command
and date.
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import tempfile
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.common import BENCH_LOG, write_section  # noqa: E402
from embedded import infra  # noqa: E402
from fleetfence.settings import Settings  # noqa: E402
from loadtest.driver import LoadOptions  # noqa: E402
from loadtest.model import LoadRun  # noqa: E402
from loadtest.run import run_loadtest  # noqa: E402

HEADER = "## Device identity: the cost end to end"
LOG = BENCH_LOG / "identity.md"
MODES = (("anonymous, one connection", False), ("per-vehicle credentials", True))


def _mean(xs: list[float]) -> float | None:
    return statistics.fmean(xs) if xs else None


def _p(xs: list[float], q: float) -> float | None:
    if not xs:
        return None
    xs = sorted(xs)
    return xs[min(len(xs) - 1, round(q * (len(xs) - 1)))]


def figures(run: LoadRun) -> dict[str, Any]:
    """The figures compared, from one run's record."""
    (step,) = run.steps
    publishing = [s for s in run.samples if s.target_rate > 0]
    before = 0  # seconds of the step before its first fix: registration (+ credentials)
    for s in run.samples:
        if s.target_rate > 0:
            break
        before += 1

    def cpu(name: str) -> float | None:
        return _mean([s.procs[name].cpu_pct for s in publishing if name in s.procs])

    def rss(name: str) -> float | None:
        return max((s.procs[name].rss_mib for s in run.samples if name in s.procs), default=None)

    acc, rec = step.accuracy, step.reconciliation
    return {
        "setup_s": float(before),
        "achieved_rate": step.achieved_rate,
        "puback_p50_ms": statistics.median(
            [s.puback_p50_ms for s in publishing if s.puback_p50_ms is not None] or [float("nan")]
        ),
        "puback_p99_ms": _p([s.puback_p99_ms for s in publishing if s.puback_p99_ms is not None], 0.99),
        "alert_p50_ms": step.latency_event.p50_ms,
        "alert_p99_ms": step.latency_event.p99_ms,
        "loadtest_cpu_pct": cpu("loadtest"),
        "mosquitto_cpu_pct": cpu("mqtt"),
        "mosquitto_rss_mib": rss("mqtt"),
        "gateways_cpu_pct": sum(v for n in ("gateway-1", "gateway-2") if (v := cpu(n)) is not None),
        "precision": acc.precision,
        "recall": acc.recall,
        "duplicates": acc.duplicates,
        "reconciled": rec.reconciled,
        "fixes": rec.published,
    }


ROWS = (
    ("setup before the first fix (s): registration + credentials", "setup_s", "{:,.0f}"),
    ("fixes/s acknowledged", "achieved_rate", "{:,.0f}"),
    ("PUBACK p50 (median of each second's, ms)", "puback_p50_ms", "{:,.1f}"),
    ("PUBACK p99 (p99 of each second's, ms)", "puback_p99_ms", "{:,.1f}"),
    ("event->alert p50 (ms)", "alert_p50_ms", "{:,.0f}"),
    ("event->alert p99 (ms)", "alert_p99_ms", "{:,.0f}"),
    ("load generator CPU (% of a core)", "loadtest_cpu_pct", "{:,.0f}"),
    ("Mosquitto CPU (% of a core)", "mosquitto_cpu_pct", "{:,.1f}"),
    ("Mosquitto RSS, max (MiB)", "mosquitto_rss_mib", "{:,.1f}"),
    ("gateways CPU, both (% of a core)", "gateways_cpu_pct", "{:,.0f}"),
    ("precision / recall / duplicates", None, ""),
    ("counts reconciled (fixes)", None, ""),
)


def cell(f: dict[str, Any], key: str | None, fmt: str, label: str) -> str:
    if key is None:
        if label.startswith("precision"):
            return f"{f['precision']} / {f['recall']} / {f['duplicates']}"
        return f"{'yes' if f['reconciled'] else 'NO'} ({f['fixes']:,})"
    v = f[key]
    return "-" if v is None or math.isnan(v) else fmt.format(v)


def ratio(a: dict[str, Any], b: dict[str, Any], key: str | None) -> str:
    if key is None or not a.get(key) or b.get(key) is None or math.isnan(b[key]):
        return ""
    return f"{b[key] / a[key]:.2f}x"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    ap.add_argument("--vehicles", type=int, default=2000)
    ap.add_argument("--duration-s", type=float, default=60.0)
    ap.add_argument("--no-write", action="store_true", help="Do not rewrite docs/bench-log/identity.md.")
    a = ap.parse_args()
    console = Console()
    results: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory(prefix="ff-bench-identity-") as tmp:
        for name, auth in MODES:
            console.rule(name)
            s = Settings(**infra.private_fields(Path(tmp) / str(auth)), mqtt_auth=auth, startup_timeout_s=60)
            opts = LoadOptions(
                mode="fixed",
                vehicles=a.vehicles,
                duration_s=a.duration_s,
                gateway_replicas=2,
                settle_s=90.0,
                report_dir=Path(tmp) / f"report-{auth}",
            )
            run, _folder = run_loadtest(s, opts, console)
            results[name] = figures(run)
    anon, ident = (results[n] for n, _ in MODES)
    table = Table(title=f"device identity, {a.vehicles:,} vehicles at 1 fix/s for {a.duration_s:.0f} s")
    table.add_column("figure")
    for name, _ in MODES:
        table.add_column(name, justify="right")
    table.add_column("ratio", justify="right")
    md = [f"| figure | {MODES[0][0]} | {MODES[1][0]} | ratio |", "|---|---:|---:|---:|"]
    for label, key, fmt in ROWS:
        cells = [cell(anon, key, fmt, label), cell(ident, key, fmt, label), ratio(anon, ident, key)]
        table.add_row(label, *cells)
        md.append(f"| {label} | " + " | ".join(cells) + " |")
    console.print(table)
    if a.no_write:
        return
    cmd = f".venv/bin/python bench/identity.py --vehicles {a.vehicles} --duration-s {a.duration_s:g}"
    when = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    write_section(
        HEADER,
        [
            HEADER,
            "",
            f"`{cmd}` ({when}, this 2-core machine; both runs in one process, one after the other, each",
            "on fresh embedded servers). The same fixed-rate `fleetfence loadtest` through the whole",
            "pipeline (two gateway replicas, the Spark processor, the receivers): first with an",
            "anonymous broker and the simulator on one MQTT connection (`FLEETFENCE_MQTT_AUTH=false`),",
            "then with device identity: each vehicle's credentials issued (a role per vehicle in",
            "Mosquitto's dynamic-security plugin) and each vehicle on its own connection, logged in as",
            "itself, every publish checked against its role. Ratio: identity / anonymous.",
            "",
            *md,
            "",
        ],
        LOG,
    )
    console.print(f"recorded in {LOG.relative_to(ROOT)} ({HEADER[3:]})")


if __name__ == "__main__":
    main()
