"""Scale-out: the same processor job on a local Spark standalone cluster with 1, then 2 workers.

    .venv/bin/python bench/scaleout.py --vehicles 10000 --fixes 40 [--record]

One private broker is pre-loaded once with the workload (4 telemetry partitions >= workers); for
each worker count a fresh standalone master + workers (`embedded.spark_cluster`, started from the
pyspark install, 1 core each) runs the processor from an empty checkpoint over the whole topic, in
a child process, exactly as `bench/processor.py` runs its Spark contender. Reported: sustained
events/s per configuration, the speed-up over one worker, and the alert counts (which must agree).

On this 2-core machine the driver, the broker and Redis share the same two cores as the
executors, so "2 workers" is two executor cores plus everything else on two cores: the ratio says
how much of the job is parallel executor work, not what two real machines would give.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import orjson
from rich.console import Console
from rich.table import Table

from bench import workload as wl
from bench.common import BENCH_LOG, write_section
from bench.processor import PARTITIONS, produce_all, run_contender
from embedded import infra
from embedded.spark_cluster import StandaloneCluster
from fleetfence.kafka import ensure_topics, topic_specs
from fleetfence.settings import Settings

ROOT = Path(__file__).resolve().parent.parent
LOG = BENCH_LOG / "scaleout.md"
console = Console()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--vehicles", type=int, default=10000)
    ap.add_argument("--fixes", type=int, default=40, help="fixes per vehicle")
    ap.add_argument("--routes", type=int, default=300)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--buckets", type=int, default=4)
    ap.add_argument("--batch", type=int, default=100_000, help="max events per micro-batch")
    ap.add_argument("--workers", default="1,2", help="worker counts to run, in order")
    ap.add_argument("--cores-per-worker", type=int, default=1)
    ap.add_argument("--warmup-share", type=float, default=1 / 3, help="as in bench/processor.py")
    ap.add_argument("--worker-memory", default="3g")
    ap.add_argument("--record", action="store_true", help="write the section of docs/bench-log/scaleout.md")
    args = ap.parse_args()

    state = Path(tempfile.mkdtemp(prefix="ff-bench-scaleout-"))
    s = Settings(
        **infra.private_fields(state),
        telemetry_partitions=PARTITIONS,
    )
    infra.up(s, create_topics=False)
    rows: list[dict[str, Any]] = []
    try:
        ensure_topics(s.bootstrap_servers, topic_specs(s))
        w = wl.build(args.vehicles, args.fixes, args.routes, seed=args.seed)
        console.print(f"workload: {len(w):,} fixes, {args.vehicles:,} vehicles, {args.routes} routes")
        produce_all(
            s.bootstrap_servers,
            s.topics.master,
            [(f"{e['entity']}:{e['id']}".encode(), orjson.dumps(e)) for e in w.master],
            "master data",
        )
        produce_all(s.bootstrap_servers, s.topics.telemetry, w.records(), "telemetry")
        for n in (int(x) for x in args.workers.split(",")):
            cores = n * args.cores_per_worker
            with StandaloneCluster(
                state / f"cluster{n}",
                workers=n,
                cores_per_worker=args.cores_per_worker,
                memory_per_worker=args.worker_memory,
            ) as cluster:
                run_args = argparse.Namespace(
                    **{**vars(args), "cores": cores, "live": True, "spark_master": cluster.url},
                    shuffle_partitions=cores,
                )
                console.print(f"[bold]{n} worker(s)[/] at {cluster.url}")
                res = run_contender(run_args, s, "spark")
                launched = cluster.executors_launched()
            if not all(launched):
                raise SystemExit(f"not every worker ran an executor: {launched}")
            res["workers"] = n
            res["cores"] = cores
            res["rate"] = res["sustained_events"] / res["seconds"]
            rows.append(res)
            console.print(f"  {res['rate']:,.0f} events/s sustained, {res['alerts']} alerts")
    finally:
        infra.down(s)

    base = rows[0]["rate"]
    load = os.getloadavg()[0]
    table = Table(
        title=f"processor scale-out on a local standalone cluster ({len(w):,} events, {os.cpu_count()} cores)"
    )
    for col in ("workers", "executor cores", "events/s (sustained)", "× 1 worker", "batches", "alerts"):
        table.add_column(col, justify="right")
    for r in rows:
        table.add_row(
            str(r["workers"]),
            str(r["cores"]),
            f"{r['rate']:,.0f}",
            f"{r['rate'] / base:.2f}",
            str(r["batches"]),
            str(r["alerts"]),
        )
    console.print(table)
    alerts = {r["alerts"] for r in rows}
    if len(alerts) != 1:
        raise SystemExit(f"the configurations disagree on the alerts: {sorted(alerts)}")
    console.print_json(json.dumps(rows, default=str))
    if args.record:
        record(rows, args, len(w), load)


def record(rows: list[dict[str, Any]], args: argparse.Namespace, n: int, load: float) -> None:
    header = "## Processor scale-out (bench/scaleout.py)"
    base = rows[0]["rate"]
    lines = [
        header,
        "",
        f"`.venv/bin/python bench/scaleout.py {' '.join(sys.argv[1:])}`: {n:,} events, "
        f"{args.vehicles:,} vehicles, {PARTITIONS} telemetry partitions, a local Spark standalone master "
        f"with 1 then 2 workers of {args.cores_per_worker} core each (started from the pyspark install by "
        "`embedded.spark_cluster`), the "
        f"processor submitted by `spark://` URL from an empty checkpoint each time; load average {load:.1f} "
        "at the end. The driver, the broker and Redis share the same "
        f"{os.cpu_count()} cores, so the ratio is how much of the job is parallel executor work on this box, "
        "not a two-machine figure.",
        "",
        "| workers | executor cores | events/s (sustained) | × 1 worker | batches | alerts |",
        "|---|---|---|---|---|---|",
        *(
            f"| {r['workers']} | {r['cores']} | {r['rate']:,.0f} | {r['rate'] / base:.2f} | {r['batches']} | "
            f"{r['alerts']} |"
            for r in rows
        ),
        "",
    ]
    write_section(header, lines, LOG)


if __name__ == "__main__":
    main()
