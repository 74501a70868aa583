"""The load test's accuracy over many fleets: every alert type's precision and recall against the
simulator's ground truth, per fleet, side by side in one table.

    .venv/bin/python bench/accuracy.py                      # 8 fleets (seeds 11-18) from 1,000, one of 4,000
    .venv/bin/python bench/accuracy.py --steps 2 --big 0    # a quick look
    .venv/bin/python bench/accuracy.py --record             # and write docs/bench-log/accuracy.md

The fleets are the steps of one `fleetfence loadtest --ramp` (step k: seed + k, its own part of the
map, the fleet growing by --growth a step; one embedded pipeline for all, as a user runs it), then
one `fleetfence loadtest` of --big vehicles on a pipeline of its own. The truth is the baseline, so
the figure that matters is exact: precision = recall = 1.0 for every type, no duplicate, every
record reconciled. A fleet that is not exact lists its mismatched alerts in the report folder's
`summary.md`.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson
from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.common import BENCH_LOG, write_section  # noqa: E402
from fleetfence.console import two_lines  # noqa: E402

HEADER = "## Accuracy sweep: the load test over many fleets"
LOG = BENCH_LOG / "accuracy.md"


@dataclass
class Run:
    seed: int
    vehicles: int
    exit_code: int  # the loadtest's: 1 when any of its steps misses --min-recall
    seconds: float
    accuracy: dict[str, Any]
    reconciled: bool
    report_dir: Path

    @property
    def exact(self) -> bool:
        a = self.accuracy
        return a["precision"] == 1.0 and a["recall"] == 1.0 and a["duplicates"] == 0 and self.reconciled


def loadtest(args: list[str], name: str, out: Path, console: Console) -> list[Run]:
    """One `fleetfence loadtest`, a Run per step of its report."""
    report_dir = out / name
    cmd = [str(ROOT / ".venv" / "bin" / "fleetfence"), "loadtest", *args, "--report-dir", str(report_dir)]
    console.print(f"[dim]fleetfence {' '.join(cmd[1:])}[/]")
    t0 = time.monotonic()
    with (out / f"{name}.log").open("wb") as f:
        code = subprocess.run(
            cmd, stdout=f, stderr=subprocess.STDOUT, env=os.environ.copy(), check=False
        ).returncode
    seconds = time.monotonic() - t0
    report = orjson.loads((report_dir / "report.json").read_bytes())
    seed = int(report["options"]["seed"])
    return [
        Run(
            seed + int(st["step"]),
            int(st["vehicles"]),
            code,
            seconds,
            st["accuracy"],
            bool(st["reconciliation"]["reconciled"]),
            report_dir,
        )
        for st in report["steps"]
    ]


def per_type_table(runs: list[Run]) -> Table:
    """Alert types down, runs across: precision / recall of each (1 / 1 when exact)."""
    t = Table(title="precision / recall per alert type and run (truth: the simulator's plan)")
    t.add_column("type", no_wrap=True)
    for r in runs:
        t.add_column(f"{r.seed}\n{r.vehicles:,}", justify="right", no_wrap=True)
    types = sorted({k for r in runs for k in r.accuracy["per_type"]})
    for typ in types:
        cells = []
        for r in runs:
            f = r.accuracy["per_type"].get(typ)
            if f is None:
                cells.append("-")
                continue
            p, rc = f["precision"], f["recall"]
            cells.append(
                "1 / 1"
                if p == 1.0 and rc == 1.0
                else f"{p if p is None else round(p, 4)} / {rc if rc is None else round(rc, 4)}"
            )
        t.add_row(two_lines(typ), *cells)
    return t


def summary_rows(runs: list[Run]) -> list[list[str]]:
    return [
        [
            str(r.seed),
            f"{r.vehicles:,}",
            f"{r.accuracy['expected']:,}",
            f"{r.accuracy['observed']:,}",
            f"{r.accuracy['matched']:,}",
            f"{r.accuracy['precision']:.4f}",
            f"{r.accuracy['recall']:.4f}",
            str(r.accuracy["duplicates"]),
            str(r.accuracy.get("mismatch_count", 0)),
            "yes" if r.reconciled else "NO",
            str(r.exit_code),
            f"{r.seconds:,.0f}",
        ]
        for r in runs
    ]


SUMMARY_COLS = [
    "seed",
    "vehicles",
    "expected",
    "observed",
    "matched",
    "precision",
    "recall",
    "dups",
    "mismatches",
    "reconciled",
    "exit",
    "s",
]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--seed", type=int, default=11, help="The first fleet's seed (fleet k: seed + k).")
    ap.add_argument("--steps", type=int, default=8, help="Fleets in the ramp run.")
    ap.add_argument("--vehicles", type=int, default=1000, help="The first fleet's size.")
    ap.add_argument("--growth", type=float, default=1.05, help="Fleet growth per step.")
    ap.add_argument("--big", type=int, default=4000, help="One more fleet of this size (0: none).")
    ap.add_argument("--duration-s", type=float, default=90.0)
    ap.add_argument("--out", type=Path, default=None, help="Report folders (default: a temporary one).")
    ap.add_argument("--record", action="store_true", help="Write the result into docs/bench-log/accuracy.md.")
    args = ap.parse_args()
    console = Console()
    common = ["--duration-s", str(args.duration_s), "--min-recall", "1.0"]
    with tempfile.TemporaryDirectory() as tmp:
        out = args.out or Path(tmp)
        out.mkdir(parents=True, exist_ok=True)
        runs = loadtest(
            [
                "--vehicles",
                str(args.vehicles),
                "--seed",
                str(args.seed),
                "--ramp",
                "--ramp-factor",
                str(args.growth),
                "--max-steps",
                str(args.steps),
                *common,
            ],
            "ramp",
            out,
            console,
        )
        if args.big:
            big = ["--vehicles", str(args.big), "--seed", str(args.seed), *common]
            runs += loadtest(big, f"fixed-{args.big}", out, console)
        summary = Table(title="accuracy sweep: each fleet against its ground truth")
        for col in SUMMARY_COLS:
            summary.add_column(col, justify="right")
        for row in summary_rows(runs):
            summary.add_row(*row)
        console.print(summary)
        console.print(per_type_table(runs))
        exact = len(runs) == args.steps + (1 if args.big else 0) and all(r.exact for r in runs)
        console.print(
            "[green]every fleet exact[/]" if exact else "[red]not every fleet exact (or a step missing)[/]"
        )
        if args.record:
            record(runs, args)
    sys.exit(0 if exact else 1)


def record(runs: list[Run], args: argparse.Namespace) -> None:
    cmd = (
        f"  .venv/bin/python bench/accuracy.py --seed {args.seed} --steps {args.steps} "
        f"--vehicles {args.vehicles} --growth {args.growth} --big {args.big} --record"
    )
    types = sorted({k for r in runs for k in r.accuracy["per_type"]})
    exact_types = [
        t
        for t in types
        if all(
            r.accuracy["per_type"].get(t, {}).get("precision") in (1.0, None)
            and r.accuracy["per_type"].get(t, {}).get("recall") in (1.0, None)
            for r in runs
        )
    ]
    lines = [
        HEADER,
        "",
        f"Recorded {datetime.now(UTC).date().isoformat()} on this project's machine (2 cores), with:",
        "",
        "```",
        cmd,
        "```",
        "",
        "The fleets are the steps of one `fleetfence loadtest --ramp` (fleet k: seed + k, the fleet growing",
        f"by {args.growth} a step, {args.duration_s:.0f} s each, one embedded pipeline), then one fleet of "
        f"{args.big:,} on its own; the baseline is the simulator's ground truth.",
        "`s` is the whole loadtest run's time (every step of the ramp).",
        "",
        "| " + " | ".join(SUMMARY_COLS) + " |",
        "|" + "---|" * len(SUMMARY_COLS),
        *("| " + " | ".join(row) + " |" for row in summary_rows(runs)),
        "",
        f"Alert types exact (precision = recall = 1) in every run: {len(exact_types)} of {len(types)}"
        + (
            f" ({', '.join(t for t in types if t not in exact_types)} not)"
            if len(exact_types) < len(types)
            else ""
        )
        + ".",
        "",
    ]
    write_section(HEADER, lines, LOG)


if __name__ == "__main__":
    main()
