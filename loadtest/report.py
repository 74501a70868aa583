"""What a load test leaves behind, and what it shows while it runs.

`write_report` turns a `LoadRun` into a folder a person would rather look at than a JSON file:
`report.json` (the whole record, for machines and for comparing runs), `summary.md` (what ran, a
table per step, the verdicts, the charts linked) and small PNG charts (900x400 px, so they can go
into docs/ as they are). `live_table` is the rich view the driver refreshes once a second.
`percentiles` and `rss_growth` are the two figures the driver computes with the report's own
definitions, so the run's record and its report cannot disagree on what "p99" or "growth" means.

Charts are drawn with matplotlib's object API on the Agg canvas (no pyplot, no display, no global
backend switched under the caller's feet), imported only when a report is written: the live view
and the CLI's start-up do not pay for it.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import orjson
from rich.table import Table

from fleetfence.console import compact_table
from loadtest.model import Latency, LoadRun, Sample, StepResult

if TYPE_CHECKING:
    from matplotlib.axes import Axes

logger = logging.getLogger(__name__)

CHART_SIZE_IN = (9.0, 4.0)
CHART_DPI = 100  # 900 x 400 px
# The charts in the order the summary shows them: file name, title.
CHARTS = (
    ("rate.png", "Rates"),
    ("lag.png", "Lag: records and alerts not yet read"),
    ("latency.png", "Event → alert latency per step: from event time and from gateway receipt"),
    ("cpu.png", "CPU per process"),
    ("memory.png", "Memory per process"),
)
DASH = "—"  # a figure that does not exist (no alert, no ground truth)
# The summary's one-row-per-step table, ahead of the table per step.
OVERVIEW_COLUMNS = (
    "step",
    "target",
    "achieved",
    "sustained",
    "lag start → end",
    "event → alert p99",
    "recall",
    "reconciled",
)
GROWTH_WINDOW = 0.1  # rss_growth compares the first and the last tenth after warm-up


# ---------------------------------------------------------------------- figures


def percentiles(values_ms: Sequence[float]) -> Latency:
    """p50/p95/p99 and max of latencies in ms (numpy's default, linear interpolation); every
    figure None for no values, so "no alert yet" never reads as "0 ms"."""
    if len(values_ms) == 0:
        return Latency(count=0, p50_ms=None, p95_ms=None, p99_ms=None, max_ms=None)
    arr = np.asarray(values_ms, dtype=np.float64)
    p50, p95, p99 = (float(v) for v in np.percentile(arr, [50, 95, 99]))
    return Latency(count=len(arr), p50_ms=p50, p95_ms=p95, p99_ms=p99, max_ms=float(arr.max()))


def rss_growth(samples: Sequence[Sample], warmup_s: float) -> dict[str, float]:
    """Per process, how much its RSS grew after warm-up, as a fraction: (mean RSS over the last
    tenth of its samples after warm-up - mean over the first tenth after warm-up) / the latter.

    Means over a tenth (at least one sample), not two single readings, so one garbage collection
    at either end does not make a leak or hide one. A process with no sample after warm-up, or
    none with memory, gets no entry (not NaN: the record stays valid JSON)."""
    series: dict[str, list[float]] = {}
    for s in samples:
        if s.t_s >= warmup_s:
            for name, p in s.procs.items():
                series.setdefault(name, []).append(p.rss_mib)
    out: dict[str, float] = {}
    for name, rss in series.items():
        n = max(1, int(len(rss) * GROWTH_WINDOW))
        start = float(np.mean(rss[:n]))
        if start > 0:
            out[name] = (float(np.mean(rss[-n:])) - start) / start
    return out


# ---------------------------------------------------------------------- formatting


def fmt_rate(per_s: float | None) -> str:
    return DASH if per_s is None else f"{per_s:,.1f}/s"


def fmt_count(n: int | None) -> str:
    return DASH if n is None else f"{n:,}"


def fmt_ms(ms: float | None) -> str:
    return DASH if ms is None else f"{ms:,.0f}"


def fmt_latency(lat: Latency) -> str:
    """'p50 / p95 / p99 ms (n alerts)', the form every latency cell of the summary takes."""
    if lat.count == 0:
        return f"{DASH} (no alert)"
    figures = " / ".join(fmt_ms(v) for v in (lat.p50_ms, lat.p95_ms, lat.p99_ms))
    return f"{figures} ms ({lat.count:,} alerts)"


def fmt_fraction(x: float | None) -> str:
    return DASH if x is None else f"{x:.4f}"


def fmt_growth(x: float) -> str:
    return f"{x:+.1%}"


def fmt_lag(start: int, end: int) -> str:
    return f"{start:,} → {end:,}"


def fmt_reconciliation(step: StepResult) -> str:
    r = step.reconciliation
    return "ok" if r.reconciled else f"**no**: {r.detail or 'no detail given'}"


def _cell(text: object) -> str:
    """A value safe inside a Markdown table cell: pipes escaped, one line."""
    return str(text).replace("|", "\\|").replace("\r", " ").replace("\n", " ")


def _table(header: Sequence[str], rows: Iterable[Sequence[object]]) -> list[str]:
    out = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    out += ["| " + " | ".join(_cell(c) for c in row) + " |" for row in rows]
    return out


def _duration(started_at: str, finished_at: str) -> str:
    try:
        seconds = (datetime.fromisoformat(finished_at) - datetime.fromisoformat(started_at)).total_seconds()
    except (TypeError, ValueError):
        return DASH
    minutes, secs = divmod(round(seconds), 60)
    return f"{minutes} min {secs:02d} s"


# ---------------------------------------------------------------------- summary.md


def summary_markdown(run: LoadRun, charts: Sequence[str]) -> str:
    """The report a person reads: what ran, the verdicts first, then a table per step."""
    md = [f"# FleetFence load test: {run.mode}", ""]
    if run.verdicts:
        md += ["**Failed**: thresholds missed:", ""] + [f"- {_cell(v)}" for v in run.verdicts]
    else:
        md.append("**Passed**: every threshold given was met.")
    md += [
        "",
        f"- started {run.started_at}, finished {run.finished_at} "
        f"({_duration(run.started_at, run.finished_at)})",
        f"- {len(run.steps)} step(s), {len(run.samples)} samples",
    ]
    if run.mode == "ramp" or run.highest_sustained_rate is not None:
        md.append(f"- highest sustained rate: {fmt_rate(run.highest_sustained_rate)}")
    md.append("")

    if run.steps:
        md += ["## Steps", ""]
        md += _table(
            OVERVIEW_COLUMNS,
            (
                [
                    st.step,
                    fmt_rate(st.target_rate),
                    fmt_rate(st.achieved_rate),
                    "yes" if st.sustained else "no",
                    fmt_lag(st.lag_start, st.lag_end),
                    f"{fmt_ms(st.latency_event.p99_ms)} ms",
                    fmt_fraction(st.accuracy.recall),
                    "ok" if st.reconciliation.reconciled else "no",
                ]
                for st in run.steps
            ),
        )
        md.append("")
        for st in run.steps:
            md += _step_section(st)

    if run.rss_growth:
        md += [f"## Memory growth after warm-up ({run.options.get('warmup_s', DASH)} s)", ""]
        md += _table(
            ["process", "RSS growth"], ((n, fmt_growth(g)) for n, g in sorted(run.rss_growth.items()))
        )
        md += ["", "Mean RSS of the last tenth of the samples against the first tenth after warm-up.", ""]

    md += ["## Charts", ""]
    if charts:
        titles = dict(CHARTS)
        for name in charts:
            md += [f"### {titles[name]}", "", f"![{titles[name]}]({name})", ""]
    else:
        md += ["No charts: they need matplotlib (`pip install 'fleetfence[charts]'`).", ""]

    md += ["## Machine", ""]
    md += _table(["", ""], ((k, _plain(v)) for k, v in run.machine.items()))
    md += ["", "## Options", ""]
    md += _table(["option", "value"], ((k, _plain(v)) for k, v in run.options.items()))
    md.append("")
    return "\n".join(md)


def _step_section(st: StepResult) -> list[str]:
    a, r = st.accuracy, st.reconciliation
    md = [f"### Step {st.step}: {fmt_rate(st.target_rate)} target", ""]
    md += _table(
        ["", ""],
        [
            ("vehicles", fmt_count(st.vehicles)),
            ("duration", f"{st.duration_s:,.1f} s"),
            ("target rate", fmt_rate(st.target_rate)),
            ("achieved rate", fmt_rate(st.achieved_rate)),
            ("sustained", "yes" if st.sustained else "no"),
            ("processor lag start → end", fmt_lag(st.lag_start, st.lag_end)),
            ("event time → alert p50 / p95 / p99", fmt_latency(st.latency_event)),
            ("gateway receipt → alert p50 / p95 / p99", fmt_latency(st.latency_receipt)),
            ("max event time → alert", f"{fmt_ms(st.latency_event.max_ms)} ms"),
            ("precision / recall", f"{fmt_fraction(a.precision)} / {fmt_fraction(a.recall)}"),
            (
                "alerts expected / observed / matched",
                f"{fmt_count(a.expected)} / {fmt_count(a.observed)} / {fmt_count(a.matched)}",
            ),
            ("duplicates", fmt_count(a.duplicates)),
            ("reconciliation", fmt_reconciliation(st)),
            (
                "published / acked",
                f"{fmt_count(r.published)} / {fmt_count(r.acked)}",
            ),
            (
                "in Kafka / sent again / dead-lettered",
                f"{fmt_count(r.in_kafka)} / {fmt_count(r.sent_again)} / {fmt_count(r.dead_lettered)}",
            ),
            (
                "gateway received / forwarded / dead-lettered (restarts)",
                f"{fmt_count(r.gateway_received)} / {fmt_count(r.gateway_forwarded)} / "
                f"{fmt_count(r.gateway_dead_lettered)} ({r.gateway_restarts})",
            ),
            (
                "processor read / accepted / duplicates / invalid / late",
                f"{fmt_count(r.processor_read)} / {fmt_count(r.processor_accepted)} / "
                f"{fmt_count(r.processor_duplicates)} / {fmt_count(r.processor_invalid)} / "
                f"{fmt_count(r.processor_late)}",
            ),
        ],
    )
    md.append("")
    if a.per_type:
        keys = sorted({k for figures in a.per_type.values() for k in figures})
        md += _table(
            ["alert type", *keys],
            ([t, *(_plain(figures.get(k, DASH)) for k in keys)] for t, figures in sorted(a.per_type.items())),
        )
        md.append("")
    if a.mismatch_count:
        more = a.mismatch_count - len(a.mismatches)
        md.append(
            f"**{a.mismatch_count} alerts disagree with the ground truth**"
            + (f" ({more} more than listed):" if more > 0 else ":")
        )
        md.append("")
        md += _table(
            ["kind", "vehicle", "type", "zone", "expected fix", "observed fix"],
            (
                [
                    m["kind"],
                    m["vehicle_id"],
                    m["type"],
                    m["zone_id"] or DASH,
                    _fix(m["expected"]),
                    _fix(m["observed"]),
                ]
                for m in a.mismatches
            ),
        )
        md.append("")
    if st.notes:
        md += [f"- {_cell(n)}" for n in st.notes] + [""]
    return md


def _fix(f: dict[str, Any] | None) -> str:
    """A mismatch's fix: seq, event time, place."""
    if f is None:
        return DASH
    where = f"{f['lat']:.5f}, {f['lon']:.5f}" if f.get("lat") is not None else DASH
    return f"seq {f['seq']} at {f['ts']} ({where})"


def _plain(v: Any) -> str:
    return DASH if v is None else str(v)


# ---------------------------------------------------------------------- charts


def _series(samples: Sequence[Sample], get: Callable[[Sample], float | None]) -> list[float]:
    return [math.nan if (v := get(s)) is None else float(v) for s in samples]


def _step_starts(samples: Sequence[Sample]) -> list[tuple[float, int, float]]:
    """(t_s, step, target rate) of each step's first sample: the boundaries the charts mark."""
    out: list[tuple[float, int, float]] = []
    for s in samples:
        if not out or s.step != out[-1][1]:
            out.append((s.t_s, s.step, s.target_rate))
    return out


def _mark_steps(ax: Axes, samples: Sequence[Sample]) -> None:
    starts = _step_starts(samples)
    if len(starts) < 2:
        return
    for t, step, _target in starts:
        ax.axvline(t, color="grey", linestyle=":", linewidth=0.8)
        ax.text(
            t, 1.0, f" step {step}", transform=ax.get_xaxis_transform(), va="top", fontsize=7, color="grey"
        )


def _process_names(samples: Sequence[Sample]) -> list[str]:
    return sorted({n for s in samples for n in s.procs})


def _smooth(values: list[float], window: int = 10) -> list[float]:
    """A trailing mean over `window` samples: the processor reads in micro-batches, so its rate a
    second swings between zero and several times the input; the mean shows whether it keeps up."""
    out = []
    for i in range(len(values)):
        part = [v for v in values[max(0, i - window + 1) : i + 1] if not math.isnan(v)]
        out.append(sum(part) / len(part) if part else math.nan)
    return out


def _draw_rate(ax: Axes, run: LoadRun) -> None:
    t = [s.t_s for s in run.samples]
    ax.plot(t, _series(run.samples, lambda s: s.target_rate), label="target", color="black", linestyle="--")
    ax.plot(t, _smooth(_series(run.samples, lambda s: s.publish_rate)), label="published (acked), 10 s mean")
    fwd = _smooth(_series(run.samples, lambda s: s.gateway_forwarded_rate))
    ax.plot(t, fwd, label="gateway forwarded, 10 s mean")
    ax.plot(t, _smooth(_series(run.samples, lambda s: s.processor_rate)), label="processor read, 10 s mean")
    _mark_steps(ax, run.samples)
    ax.set_ylabel("fixes/s")


def _draw_lag(ax: Axes, run: LoadRun) -> None:
    t = [s.t_s for s in run.samples]
    ax.plot(t, _series(run.samples, lambda s: s.processor_lag), label="processor (records)")
    ax.plot(t, _series(run.samples, lambda s: s.receivers_lag), label="receivers (alerts)")
    _mark_steps(ax, run.samples)
    ax.set_ylabel("not yet read")


def _draw_latency(ax: Axes, run: LoadRun) -> None:
    x = np.arange(len(run.steps), dtype=np.float64)
    width = 0.13
    bars = [
        (name, q, attr)
        for name, attr in (("event", "latency_event"), ("receipt", "latency_receipt"))
        for q in ("p50", "p95", "p99")
    ]
    colours = ["#9ecae1", "#4292c6", "#08519c", "#fdae6b", "#f16913", "#a63603"]
    for i, ((name, q, attr), colour) in enumerate(zip(bars, colours, strict=True)):
        heights = [getattr(getattr(st, attr), f"{q}_ms") for st in run.steps]
        ax.bar(
            x + (i - 2.5) * width,
            [math.nan if h is None else h for h in heights],
            width,
            label=f"{name} {q}",
            color=colour,
        )
    ax.set_xticks(x, [f"step {st.step}\n{st.target_rate:,.0f}/s" for st in run.steps], fontsize=8)
    ax.set_ylabel("ms")


def _draw_procs(ax: Axes, run: LoadRun, field: str, unit: str) -> None:
    t = [s.t_s for s in run.samples]
    for name in _process_names(run.samples):
        ax.plot(
            t,
            [math.nan if (p := s.procs.get(name)) is None else getattr(p, field) for s in run.samples],
            label=name,
        )
    _mark_steps(ax, run.samples)
    ax.set_ylabel(unit)


def write_charts(run: LoadRun, out_dir: Path) -> list[str]:
    """The PNG charts, by file name; none (and a warning) when matplotlib is not installed."""
    try:
        from matplotlib.figure import Figure
    except ImportError:
        logger.warning("loadtest report without charts: matplotlib is not installed")
        return []

    draw: dict[str, Callable[[Axes], None]] = {
        "rate.png": lambda ax: _draw_rate(ax, run),
        "lag.png": lambda ax: _draw_lag(ax, run),
        "latency.png": lambda ax: _draw_latency(ax, run),
        "cpu.png": lambda ax: _draw_procs(ax, run, "cpu_pct", "% of one core"),
        "memory.png": lambda ax: _draw_procs(ax, run, "rss_mib", "RSS, MiB"),
    }
    written = []
    for name, title in CHARTS:
        fig = Figure(figsize=CHART_SIZE_IN, dpi=CHART_DPI, layout="constrained")
        ax = fig.subplots()
        ax.set_title(title, fontsize=10)
        empty = not run.steps if name == "latency.png" else not run.samples
        if empty:
            ax.text(0.5, 0.5, "no data", ha="center", va="center", transform=ax.transAxes)
        else:
            draw[name](ax)
            if name != "latency.png":
                ax.set_xlabel("s since the start")
            ax.grid(alpha=0.3)
            if ax.get_legend_handles_labels()[0]:
                ax.legend(fontsize=7, loc="best")
        fig.savefig(out_dir / name, dpi=CHART_DPI, format="png")
        written.append(name)
    return written


# ---------------------------------------------------------------------- the folder


def write_report(run: LoadRun, out_dir: Path) -> Path:
    """Write report.json, the charts and summary.md into `out_dir` (created if need be) and
    return the folder. The charts come first so the summary links only those that exist."""
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "report.json").write_bytes(
        orjson.dumps(asdict(run), option=orjson.OPT_INDENT_2 | orjson.OPT_SERIALIZE_NUMPY, default=str)
    )
    charts = write_charts(run, out_dir)
    (out_dir / "summary.md").write_text(summary_markdown(run, charts), encoding="utf-8")
    logger.info("loadtest report written dir=%s charts=%d", out_dir, len(charts))
    return out_dir


# ---------------------------------------------------------------------- live view


def live_table(
    sample: Sample,
    step: int | None = None,
    *,
    latency_event: Latency | None = None,
    latency_receipt: Latency | None = None,
) -> Table:
    """What the driver shows while it runs: a row per stage (rate, lag, latency so far), then a
    row per process (CPU, RSS). `step` defaults to the sample's; the event -> alert latencies
    are the step's so far when the driver has them."""
    step = sample.step if step is None else step
    table = compact_table(f"step {step} · target {fmt_rate(sample.target_rate)} · {sample.t_s:,.0f} s")
    table.add_column("stage / process")
    table.add_column("rate", justify="right", no_wrap=True)
    table.add_column("lag", justify="right", no_wrap=True)
    table.add_column("p50 / p99 ms", justify="right", no_wrap=True)
    table.add_column("CPU %", justify="right", no_wrap=True)
    table.add_column("RSS MiB", justify="right", no_wrap=True)

    def lat(x: Latency | None) -> str:
        if x is None or x.count == 0:
            return DASH
        return f"{fmt_ms(x.p50_ms)} / {fmt_ms(x.p99_ms)}"

    puback = f"{fmt_ms(sample.puback_p50_ms)} / {fmt_ms(sample.puback_p99_ms)}"
    table.add_row("publisher: PUBACK", fmt_rate(sample.publish_rate), DASH, puback, "", "")
    table.add_row(
        f"gateways ({sample.gateway_dead_lettered:,} dead-lettered)",
        fmt_rate(sample.gateway_forwarded_rate),
        DASH,
        "",
        "",
        "",
    )
    table.add_row("processor", fmt_rate(sample.processor_rate), f"{sample.processor_lag:,}", "", "", "")
    table.add_row(
        f"alerts ({sample.alerts:,} committed): event -> alert",
        DASH,
        f"{sample.receivers_lag:,}",
        lat(latency_event),
        "",
        "",
    )
    if latency_receipt is not None:
        table.add_row("alerts: gateway receipt -> alert", "", "", lat(latency_receipt), "", "")
    if sample.procs:
        table.add_section()
        for name, p in sorted(sample.procs.items()):
            table.add_row(name, "", "", "", f"{p.cpu_pct:,.0f}", f"{p.rss_mib:,.0f}")
    return table
