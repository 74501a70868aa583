"""Event→alert latency of the Spark job, configuration variants side by side (issue #23).

    .venv/bin/python bench/latency.py --rate 2000 --seconds 40 --repeats 2 \\
        --variant base --variant trigger0:trigger_ms=0 \\
        --variant fmt2:conf.spark.sql.streaming.stateStore.checkpointFormatVersion=2 [--record]

A micro-batch of the stateful job costs ~0.9 s with no data at all (docs/bench-log/latency.md, "The
latency floor"), and that fixed cost, not the work per fix, is what event→alert latency is made of at a
low rate. Each knob that might cut it is measured here against the defaults in the same run: every
run is a child process with a fresh JVM, checkpoint and topics, the variants alternate (forward on
even repeats, backward on odd ones) so a noisy neighbour spreads over all of them, and the table
gives each variant's median p50/p99 over its repeats, its ratio to the first variant, and the
per-repeat p99 ratios (a knob only wins if it wins in every alternation).

A variant is `name[:key=value,key=value...]`; keys: `trigger_ms`, `buckets`, `shuffle_partitions`,
`live` (0/1: live state to Redis), `max_events` (the batch cap), `vehicles` (live vehicles, default
one per event/s), `state_api` (transformWithState, the job's; applyInPandasWithState; or floor,
Spark's own floor for the job's query shape: bench/state_api.py), `conf.<spark key>` (any Spark
setting), `tree` and `python` (run the child from another checkout with its own interpreter, say a
virtualenv with another pyspark: the same bench, side by side, across Spark versions; the child is
given the variant without these two). A value may hold commas: a segment without `=` belongs to the
previous value. The live machinery is bench/processor.py's `live_latency`.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from rich.console import Console
from rich.table import Table

from bench.common import BENCH_LOG, find_heading, log_text, settle_load
from bench.processor import LiveConfig, live_latency
from bench.state_api import STATE_APIS
from embedded import infra
from fleetfence.settings import Settings
from processor.spark.layout import default_buckets
from processor.spark.session import default_shuffle_partitions

logger = logging.getLogger(__name__)
console = Console()

PARTITIONS = 4
HEADING = "### Latency: the micro-batch's fixed cost, knob by knob"
LOG = BENCH_LOG / "latency.md"
PHASES = ("triggerExecution", "addBatch", "walCommit", "commitOffsets", "queryPlanning", "latestOffset")


@dataclass(frozen=True)
class Variant:
    """One configuration of the job: a name for the table and the settings it changes."""

    name: str
    settings: dict[str, str] = field(default_factory=dict)

    def describe(self) -> str:
        return ", ".join(f"{k}={v}" for k, v in self.settings.items()) or "defaults"


KEYS = ("trigger_ms", "buckets", "shuffle_partitions", "live", "max_events", "vehicles", "state_api")
# Where a child runs, not what it runs: kept out of the spec the child parses.
PLACE_KEYS = ("tree", "python")


def parse_variant(spec: str) -> Variant:
    """`name[:key=value,...]`; a comma-separated segment without `=` continues the previous value."""
    name, _, rest = spec.partition(":")
    if not name:
        raise argparse.ArgumentTypeError(f"variant without a name: {spec!r}")
    settings: dict[str, str] = {}
    last = ""
    for seg in rest.split(",") if rest else []:
        if "=" in seg:
            k, v = seg.split("=", 1)
            if k not in KEYS and k not in PLACE_KEYS and not k.startswith("conf."):
                raise argparse.ArgumentTypeError(
                    f"unknown key {k!r} in {spec!r}: {', '.join(KEYS + PLACE_KEYS)}, conf.*"
                )
            settings[k] = v
            last = k
        elif last:
            settings[last] += "," + seg
        else:
            raise argparse.ArgumentTypeError(f"bad variant {spec!r}")
    return Variant(name, settings)


def child_spec(v: Variant) -> str:
    """The spec a child parses: the variant without where it runs (`PLACE_KEYS`)."""
    kept = [f"{k}={val}" for k, val in v.settings.items() if k not in PLACE_KEYS]
    return v.name + (":" + ",".join(kept) if kept else "")


def live_config(base: LiveConfig, v: Variant) -> LiveConfig:
    """The bench's common settings with the variant's changes on top."""
    conf = dict(base.spark_conf)
    changes: dict[str, Any] = {}
    for k, val in v.settings.items():
        if k in PLACE_KEYS:
            continue
        if k.startswith("conf."):
            conf[k[5:]] = val
        elif k == "live":
            changes["live"] = val.lower() in ("1", "true", "on", "yes")
        elif k == "max_events":
            changes["max_events_per_batch"] = int(val)
        elif k == "state_api":
            if val not in STATE_APIS:
                raise argparse.ArgumentTypeError(f"state_api={val!r}: one of {', '.join(STATE_APIS)}")
            changes["state_api"] = val
        else:
            changes[k] = int(val)
    return replace(base, spark_conf=conf, **changes)


def run_child(args: argparse.Namespace) -> None:
    """One run of one variant in this process (a fresh JVM); prints one RESULT line."""
    s = Settings(kafka_bootstrap=args.bootstrap, redis_url=args.redis, topic_prefix=args.prefix)
    scratch = Path(tempfile.mkdtemp(prefix="ff-lat-"))
    try:
        cfg = live_config(
            LiveConfig(
                routes=args.routes,
                seed=args.seed,
                cores=args.cores,
                buckets=args.buckets or None,
                max_events_per_batch=args.max_events,
                warmup_s=args.warmup_s,
                checkpoint=str(scratch / "cp"),
                local_dir=scratch,
            ),
            parse_variant(args.child),
        )
        load0 = os.getloadavg()[0]
        res = live_latency(s, args.rate, args.seconds, cfg)
        res["load"] = [round(load0, 2), round(os.getloadavg()[0], 2)]
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    print("RESULT " + json.dumps(res), flush=True)


def run_variant(
    args: argparse.Namespace, s: Settings, v: Variant, spec: str, rate: float, tag: str
) -> dict[str, Any]:
    """One child run on the shared broker, under its own topic prefix (fresh topics); from the
    variant's `tree` with its `python` when it names them."""
    tree = Path(v.settings["tree"]).resolve() if "tree" in v.settings else None
    python = v.settings.get("python", sys.executable)
    cmd = [
        python,
        str(tree / "bench" / "latency.py" if tree else Path(__file__).resolve()),
        "--child",
        child_spec(v),
        "--bootstrap",
        s.bootstrap_servers,
        "--redis",
        s.redis_dsn,
        "--prefix",
        f"{tag}.",
        "--rate",
        str(rate),
        "--seconds",
        str(args.seconds),
        "--routes",
        str(args.routes),
        "--seed",
        str(args.seed),
        "--cores",
        str(args.cores),
        "--buckets",
        str(args.buckets),
        "--max-events",
        str(args.max_events),
        "--warmup-s",
        str(args.warmup_s),
    ]
    env = {**os.environ, "PYSPARK_PYTHON": python, "PYSPARK_DRIVER_PYTHON": python}
    if tree is not None:
        env["PYTHONPATH"] = str(tree)
    load0 = settle_load(args.quiet_load)
    with console.status(f"{v.name} at {rate:,.0f} ev/s ({tag})…"):
        out = subprocess.run(cmd, check=False, capture_output=True, text=True, timeout=900, env=env, cwd=tree)
    line = next((ln for ln in out.stdout.splitlines() if ln.startswith("RESULT ")), None)
    if line is None:
        console.print(out.stdout[-3000:], out.stderr[-3000:])
        return {"error": (out.stderr.strip().splitlines() or ["no output"])[-1][:200]}
    res: dict[str, Any] = json.loads(line[7:])
    # Before the child started (its JVM's start is load of its own), and at the live load's end.
    res["load"] = [load0, res.get("load", [None, None])[-1]]
    return res


def median_of(results: list[dict[str, Any]], key: str) -> float | None:
    vals = [float(r[key]) for r in results if r.get(key) is not None]
    return statistics.median(vals) if vals else None


def phase_of(results: list[dict[str, Any]], key: str) -> float | None:
    vals = [float(r["phases"][key]) for r in results if key in r.get("phases", {})]
    return statistics.median(vals) if vals else None


def table_rows(
    variants: list[Variant], runs: dict[str, list[dict[str, Any]]]
) -> tuple[list[str], list[list[str]]]:
    """Header and one row per variant: medians over its repeats, ratios to the first variant, and
    the p99 ratio of each repeat against the first variant's run in the same repeat."""
    head = [
        "variant",
        "changes",
        "p50 ms",
        "p99 ms",
        "p50 ratio",
        "p99 ratio",
        "p99 ratio per repeat",
        "p99 per repeat",
        *(f"{p} ms" for p in PHASES),
        "rows/batch",
        "drain s",
        "alerts",
        "load",
    ]
    base = runs[variants[0].name]
    b50, b99 = median_of(base, "p50_ms"), median_of(base, "p99_ms")
    rows = []

    def fmt(x: float | None, spec: str = ",.0f") -> str:
        return "-" if x is None else format(x, spec)

    for v in variants:
        rs = runs[v.name]
        p50, p99 = median_of(rs, "p50_ms"), median_of(rs, "p99_ms")
        per = [
            f"{r['p99_ms'] / b['p99_ms']:.2f}" if r.get("p99_ms") and b.get("p99_ms") else "-"
            for r, b in zip(rs, base, strict=False)
        ]
        loads = [x for r in rs for x in r.get("load", [])]
        rows.append(
            [
                v.name,
                v.describe(),
                fmt(p50),
                fmt(p99),
                fmt(p50 / b50 if p50 and b50 else None, ".2f"),
                fmt(p99 / b99 if p99 and b99 else None, ".2f"),
                " ".join(per),
                " ".join(str(r.get("p99_ms", r.get("error", "-"))) for r in rs),
                *(fmt(phase_of(rs, p)) for p in PHASES),
                fmt(phase_of(rs, "rows")),
                fmt(median_of(rs, "drain_s"), ".1f"),
                fmt(median_of(rs, "alerts")),
                f"{min(loads):.1f}-{max(loads):.1f}" if loads else "-",
            ]
        )
    return head, rows


def console_table(rate: float, head: list[str], rows: list[list[str]]) -> Table:
    t = Table(title=f"event→alert latency at {rate:,.0f} ev/s (medians over repeats)")
    for h in head:
        t.add_column(h)
    for r in rows:
        t.add_row(*r)
    return t


def record(args: argparse.Namespace, tables: list[tuple[float, list[str], list[list[str]]]]) -> None:
    """Add this run to the log under the knob-by-knob heading (created at the end when missing),
    newest run first below the heading's text."""
    cmd = " ".join(a if " " not in a else f"'{a}'" for a in sys.argv[1:])
    lines = [
        f"#### Latency run {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}",
        "",
        f"`.venv/bin/python bench/latency.py {cmd}`: local[{args.cores}], {args.seconds:.0f} s of live load "
        f"per run, alerts of the first {args.warmup_s:.0f} s not counted, {args.repeats} repeats alternating "
        f"the order; load average {os.getloadavg()[0]:.1f} at the end (the table's `load`: 1-min load "
        "average before each run's child started and at the end of its live load). Phases: Spark's "
        "`durationMs`, median over the batches "
        "that read telemetry, then over the repeats.",
        "",
    ]
    for rate, head, rows in tables:
        lines += [f"At {rate:,.0f} ev/s:", "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        lines += ["| " + " | ".join(r) + " |" for r in rows]
        lines.append("")
    text = log_text(LOG)
    block = "\n".join(lines) + "\n"
    at = find_heading(text, HEADING)
    if at < 0:
        LOG.write_text(text.rstrip("\n") + "\n\n" + HEADING + "\n\n" + block)
        return
    sub = find_heading(text, "#### Latency run", at)
    nxt = text.find("\n### ", at + len(HEADING))
    pos = sub if sub >= 0 and (nxt < 0 or sub < nxt) else (nxt + 1 if nxt >= 0 else len(text))
    LOG.write_text(text[:pos] + block + "\n" + text[pos:])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--variant", action="append", default=[], help="name[:key=value,...] (repeatable)")
    ap.add_argument("--rate", action="append", type=float, default=[], help="events/s (repeatable)")
    ap.add_argument("--seconds", type=float, default=40.0, help="live load per run")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument(
        "--warmup-s", type=float, default=5.0, help="alerts of fixes sent earlier are not counted"
    )
    ap.add_argument("--routes", type=int, default=300)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--cores", type=int, default=2)
    ap.add_argument(
        "--buckets",
        type=int,
        default=0,
        help="state buckets unless a variant says otherwise (0: the processor's default)",
    )
    ap.add_argument(
        "--max-events", type=int, default=400_000, help="batch cap unless a variant says otherwise"
    )
    ap.add_argument(
        "--quiet-load",
        type=float,
        default=0.0,
        help="before each run wait until the 1-min load average is below this (0: don't wait)",
    )
    ap.add_argument("--record", action="store_true", help="add the run to docs/bench-log/latency.md")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--bootstrap", help=argparse.SUPPRESS)
    ap.add_argument("--redis", help=argparse.SUPPRESS)
    ap.add_argument("--prefix", default="", help=argparse.SUPPRESS)
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if args.child:
        args.rate = args.rate[0]
        run_child(args)
        return
    specs = args.variant or ["base"]
    # The processor's defaults for this many cores, pinned in every variant that does not set them,
    # so a child from another tree (`tree=`) with other defaults runs the same configuration.
    partitions = default_shuffle_partitions(args.cores)
    args.buckets = args.buckets or default_buckets(partitions)
    variants = [parse_variant(x) for x in specs]
    variants = [replace(v, settings={"shuffle_partitions": str(partitions), **v.settings}) for v in variants]
    if len({v.name for v in variants}) != len(variants):
        raise SystemExit("variant names must differ")
    rates = args.rate or [2000.0]
    state = Path(tempfile.mkdtemp(prefix="ff-latency-"))
    s = Settings(**infra.private_fields(state), telemetry_partitions=PARTITIONS)
    infra.up(s, create_topics=False)
    tables = []
    try:
        for ri, rate in enumerate(rates):
            runs: dict[str, list[dict[str, Any]]] = {v.name: [] for v in variants}
            for r in range(args.repeats):
                order = list(zip(variants, specs, strict=True))
                for k, (v, spec) in enumerate(order if r % 2 == 0 else order[::-1]):
                    res = run_variant(args, s, v, spec, rate, f"r{ri}k{r}v{k}")
                    runs[v.name].append(res)
                    console.print(
                        f"  {v.name} at {rate:,.0f} ev/s, repeat {r + 1}: p50 {res.get('p50_ms')} ms, "
                        f"p99 {res.get('p99_ms')} ms, {res.get('alerts')} alerts, batch "
                        f"{res.get('phases', {}).get('triggerExecution')} ms, load {res.get('load')}"
                        + (f" [red]{res['error']}[/]" if "error" in res else "")
                    )
            head, rows = table_rows(variants, runs)
            console.print(console_table(rate, head, rows), width=260)
            console.print_json(json.dumps({"rate": rate, "runs": runs}))
            tables.append((rate, head, rows))
        if args.record:
            record(args, tables)
    finally:
        infra.down(s)
        shutil.rmtree(state, ignore_errors=True)


if __name__ == "__main__":
    main()
