"""Processor benchmark: FleetFence's Spark job vs the naive loop vs quixstreams, in one run.

    .venv/bin/python bench/processor.py --vehicles 10000 --fixes 60 [--record]

Every contender reads the same pre-loaded `fleet.telemetry` topic on a private embedded Apache
Kafka broker, in its own process (so each gets the whole box in turn), and produces deviation
alerts. Reported:
sustained events/s (after warm-up), ratios, and the alert counts (which must agree). A second
phase drives the Spark job at half its measured rate with live timestamps and reports the
event→alert latency p50/p99 (alert commit time minus the fix's ingest time).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import orjson
from confluent_kafka import Producer
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from bench import workload as wl
from bench.cpu import broker_pid, pid_cpu_s, tree_cpu_s
from embedded import infra
from fleetfence.kafka import ensure_topics, producer_config, topic_specs
from fleetfence.settings import Settings

console = Console()
PARTITIONS = 4
COMPRESSION = os.environ.get("FF_BENCH_COMPRESSION", "lz4")


def produce_all(bootstrap: str, topic: str, records: list[tuple[bytes, bytes]], label: str) -> None:
    p = Producer(
        producer_config(
            bootstrap, **{"linger.ms": 20, "batch.num.messages": 20000, "compression.type": COMPRESSION}
        )
    )
    with Progress(console=console, transient=True) as prog:
        task = prog.add_task(label, total=len(records))
        for i, (k, v) in enumerate(records):
            while True:
                try:
                    p.produce(topic, key=k, value=v)
                    break
                except BufferError:
                    p.poll(0.05)
            if i % 5000 == 0:
                p.poll(0)
                prog.update(task, completed=i)
        p.flush(120)


def contender_spark(
    args: argparse.Namespace,
    s: Settings,
    total: int,
    checkpoint: str,
    cpu: Callable[[], tuple[float, float]] = lambda: (0.0, 0.0),
) -> dict[str, Any]:
    from processor.job import start_query
    from processor.service import telemetry_events
    from processor.settings import ProcessorSettings
    from processor.spark import build_session

    ps = ProcessorSettings(
        **{
            **s.model_dump(exclude={"topics"}),
            "processor_checkpoint": checkpoint,
            "processor_buckets": args.buckets,
            "processor_trigger_ms": 0,
            "processor_max_events_per_batch": args.batch,
            "processor_live_state": args.live,
            "redis_prefix": "bench:",
        }
    )
    spark = build_session(
        app_name="bench",
        master=args.spark_master or f"local[{args.cores}]",
        local_dir=Path(checkpoint).parent,
        shuffle_partitions=args.shuffle_partitions,
        extra_conf=dict(kv.split("=", 1) for kv in args.spark_conf),
    )
    t_start = time.perf_counter()
    q = start_query(spark, ps)
    seen = 0
    ends: list[tuple[float, int]] = []  # (time, events so far) at the end of each batch
    cpus: list[tuple[float, float]] = []  # CPU snapshots taken when each batch end was seen
    last_batch = -1
    while seen < total:
        if q.exception() is not None:
            raise RuntimeError(q.exception())
        for p in q.recentProgress:
            if p["batchId"] > last_batch:
                last_batch = p["batchId"]
                rows = telemetry_events(p, s.topics.telemetry)
                seen += rows
                ends.append((time.perf_counter(), seen))
                cpus.append(cpu())
        time.sleep(0.2)
    q.stop()
    spark.stop()
    # Sustained: from the end of the first batch that completes the warm-up share to the end of the
    # last one (the same rule as the peers: `warmup_events`).
    data = [
        (t, n, c)
        for i, ((t, n), c) in enumerate(zip(ends, cpus, strict=True))
        if n > (ends[i - 1][1] if i else 0)
    ]
    t_first = data[0][0]
    t_warm, n_warm, cpu_warm = next((d for d in data if d[1] >= warmup_events(args, total)), data[0])
    t_end, _, cpu_end = data[-1]
    return {
        "events": seen,
        "seconds": t_end - t_warm,
        "sustained_events": seen - n_warm,
        "startup_s": t_first - t_start,
        "batches": len(data),
        "measured_batches": sum(1 for t, _, _ in data if t > t_warm),
        "cpu_s": [cpu_end[0] - cpu_warm[0], cpu_end[1] - cpu_warm[1]],
    }


def warmup_events(args: argparse.Namespace, total: int) -> int:
    """Events every contender processes before its sustained rate is timed. A streaming job runs
    for days: its steady state is what counts, and the JVM's JIT was measured compiling through the
    first ~40 s of a run (docs/benchmarks.md), which the Python contenders never pay."""
    return int(total * args.warmup_share)


def count_alerts(s: Settings, topic: str) -> int:
    """Committed alert records (offsets would also count the transaction markers)."""
    return len(read_alerts(s, topic))


def read_alerts(s: Settings, topic: str) -> list[Any]:
    from fleetfence.testing import read_all

    return read_all(s, topic, PARTITIONS, timeout_s=30)


def run_child(args: argparse.Namespace) -> None:
    """One contender in its own process; prints one JSON line."""
    s = Settings(kafka_bootstrap=args.bootstrap, redis_url=args.redis, topic_prefix=args.prefix)
    w = wl.build(args.vehicles, args.fixes, args.routes, seed=args.seed)
    total = len(w)
    out_topic = f"{args.prefix}out.{args.child}"
    bpid = broker_pid(int(args.bootstrap.rsplit(":", 1)[1]))
    me = os.getpid()

    def cpu() -> tuple[float, float]:
        """CPU seconds so far of this contender's process tree and of the broker."""
        return tree_cpu_s(me), (pid_cpu_s(bpid) if bpid else 0.0)

    if args.child == "naive":
        from bench.peers import run_naive

        res = run_naive(
            s.bootstrap_servers,
            s.topics.telemetry,
            PARTITIONS,
            total,
            out_topic,
            w.routes,
            w.assignment,
            warmup=warmup_events(args, total),
            cpu=cpu,
        )
    elif args.child == "quix":
        from bench.peers import run_quix

        res = run_quix(
            s.bootstrap_servers,
            s.topics.telemetry,
            total,
            out_topic,
            w.routes,
            w.assignment,
            tempfile.mkdtemp(),
            warmup=warmup_events(args, total),
            cpu=cpu,
        )
    else:
        res = contender_spark(args, s, total, tempfile.mkdtemp() + "/cp", cpu)
    print("RESULT " + json.dumps(res), flush=True)


def run_contender(args: argparse.Namespace, s: Settings, name: str) -> dict[str, Any]:
    """Run one contender in a child process against the pre-loaded broker; its RESULT line."""
    cmd = [
        sys.executable,
        __file__,
        "--child",
        name,
        "--bootstrap",
        s.bootstrap_servers,
        "--redis",
        s.redis_dsn,
        "--vehicles",
        str(args.vehicles),
        "--fixes",
        str(args.fixes),
        "--routes",
        str(args.routes),
        "--seed",
        str(args.seed),
        "--buckets",
        str(args.buckets),
        "--batch",
        str(args.batch),
        "--cores",
        str(args.cores),
        "--warmup-share",
        str(args.warmup_share),
        "--live" if args.live else "--no-live",
    ]
    if getattr(args, "spark_master", None):
        cmd += ["--spark-master", args.spark_master]
    if getattr(args, "shuffle_partitions", None):
        cmd += ["--shuffle-partitions", str(args.shuffle_partitions)]
    for kv in getattr(args, "spark_conf", []):
        cmd += ["--spark-conf", kv]
    spark = name.startswith("spark")
    before = count_alerts(s, s.topics.alerts) if spark else 0
    with console.status(f"running {name}…"):
        out = subprocess.run(
            cmd,
            check=False,
            capture_output=True,
            text=True,
            timeout=3600,
            env={**os.environ, "PYSPARK_PYTHON": sys.executable},
        )
    line = next((ln for ln in out.stdout.splitlines() if ln.startswith("RESULT ")), None)
    if line is None:
        console.print(out.stdout[-3000:], out.stderr[-3000:])
        raise SystemExit(f"{name} failed")
    res: dict[str, Any] = json.loads(line[7:])
    if spark:
        # Delta: several Spark runs (bench/scaleout.py) share the alert topic, each with a fresh checkpoint.
        res["alerts"] = count_alerts(s, s.topics.alerts) - before
    return res


def latency_phase(args: argparse.Namespace, s: Settings, rate: float, seconds: float) -> dict[str, Any]:
    """Drive the Spark job live at `rate` events/s; measure alert commit time - fix ingest time."""
    from processor.job import start_query
    from processor.settings import ProcessorSettings
    from processor.spark import build_session

    prefix = s.topic_prefix + "lat."
    ls = s.model_copy(update={"topic_prefix": prefix})
    ensure_topics(s.bootstrap_servers, topic_specs(ls))
    # 1 Hz per vehicle up to 20k vehicles, faster fixes beyond: the workload is built up front, and
    # one vehicle per event/s at 56k events/s (5M records) did not fit in memory with its encodings.
    n_vehicles = max(100, min(int(rate), 20_000))
    fixes = math.ceil(rate * (seconds + 10) / n_vehicles)
    w = wl.build(n_vehicles, fixes, args.routes, seed=args.seed + 1, deviating_share=0.2)
    produce_all(
        s.bootstrap_servers,
        ls.topics.master,
        [(f"{e['entity']}:{e['id']}".encode(), orjson.dumps(e)) for e in w.master],
        "master data",
    )
    ps = ProcessorSettings(
        **{
            **ls.model_dump(exclude={"topics"}),
            "processor_checkpoint": tempfile.mkdtemp(),
            "processor_buckets": args.buckets,
            "processor_trigger_ms": args.trigger_ms,
            "processor_max_events_per_batch": 0,
            "processor_live_state": args.live,
            "redis_prefix": "benchlat:",
            "processor_starting_offsets": "latest",
        }
    )
    spark = build_session(
        app_name="bench-latency",
        master=f"local[{args.cores}]",
        extra_conf=dict(kv.split("=", 1) for kv in args.spark_conf),
    )
    q = start_query(spark, ps)
    try:
        p = Producer(producer_config(s.bootstrap_servers, **{"linger.ms": 5}))
        recs = LazyRecords(w)
        # Wait for the first (empty) batch so start-up does not count as latency.
        while not q.recentProgress:
            time.sleep(0.2)
        bpid = broker_pid(int(s.bootstrap_servers.rsplit(":", 1)[1]))
        t0 = time.time()
        broker0 = pid_cpu_s(bpid) if bpid else 0.0
        sent = 0
        with Progress(console=console, transient=True) as prog:
            task = prog.add_task(f"live load at {rate:.0f} ev/s", total=seconds)
            while time.time() - t0 < seconds and sent < len(recs):
                due = int((time.time() - t0) * rate)
                now = b"%d" % int(time.time() * 1000)
                while sent < min(due, len(recs)):
                    k, v = recs[sent]
                    p.produce(ls.topics.telemetry, key=k, value=v.replace(STAMP, now))
                    sent += 1
                p.poll(0)
                prog.update(task, completed=time.time() - t0)
                time.sleep(0.005)  # pacing of the load generator, not synchronisation
        p.flush(30)
        # Until the query has committed a batch that ends at everything we sent.
        deadline = time.time() + 120
        while time.time() < deadline:
            last = q.lastProgress
            if last and telemetry_end(last, ls.topics.telemetry) >= sent:
                break
            time.sleep(0.2)
        phases = batch_phases(q.recentProgress, ls.topics.telemetry)
        # The broker's share of the box while it serves the live load and the read tasks' fetches.
        broker_cores = ((pid_cpu_s(bpid) if bpid else 0.0) - broker0) / (time.time() - t0)
    finally:
        q.stop()
        spark.stop()
    lat = []
    for m in read_alerts(ls, ls.topics.alerts):
        a = orjson.loads(m.value())
        if a["type"] in ("ROUTE_DEVIATION", "ROUTE_RETURN"):
            lat.append(m.timestamp()[1] - a["trigger_received_ms"])
    lat.sort()
    if not lat:
        return {"rate": rate, "alerts": 0}
    return {
        "rate": rate,
        "alerts": len(lat),
        "p50_ms": lat[len(lat) // 2],
        "p99_ms": lat[int(len(lat) * 0.99)],
        "phases": phases,
        "broker_cores": round(broker_cores, 2),
    }


STAMP = b"9999999999999"  # 13 digits like an epoch-ms time, so the JSON keeps its shape


class LazyRecords:
    """The workload's records with a time placeholder, encoded a slice at a time as they are sent."""

    SLICE = 50_000

    def __init__(self, w: wl.Workload) -> None:
        self.w = w
        self._start = -1
        self._slice: list[tuple[bytes, bytes]] = []

    def __len__(self) -> int:
        return len(self.w)

    def __getitem__(self, i: int) -> tuple[bytes, bytes]:
        start = i - i % self.SLICE
        if start != self._start:
            self._slice = stamped_templates(self.w.records(start, min(start + self.SLICE, len(self.w))))
            self._start = start
        return self._slice[i - start]


def stamped_templates(records: list[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
    """The live phase's records with `ts_ms` and `received_ms` as a placeholder that the load
    generator replaces with the send time: decoding and re-encoding each record there cost ~10 µs,
    a third of the box at 60k events/s, taken from the processor being measured."""
    out = []
    for k, v in records:
        d = orjson.loads(v)
        d["ts_ms"] = d["received_ms"] = int(STAMP)
        t = orjson.dumps(d)
        if t.count(STAMP) != 2:
            raise ValueError(f"placeholder collides with the record's content: {t!r}")
        out.append((k, t))
    return out


def batch_phases(progress: list[dict[str, Any]], topic: str) -> dict[str, float]:
    """Median of each `durationMs` phase and of the rows per batch over the batches that read data:
    where a live micro-batch's time goes, which is what the event->alert latency is made of."""
    rows = [p for p in progress if telemetry_rows(p, topic) > 0]
    if not rows:
        return {}
    keys = sorted({k for p in rows for k in p.get("durationMs", {})})
    out = {k: float(statistics.median([p["durationMs"].get(k, 0) for p in rows])) for k in keys}
    out["rows"] = float(statistics.median([telemetry_rows(p, topic) for p in rows]))
    out["batches"] = float(len(rows))
    return out


def telemetry_rows(progress: dict[str, Any], topic: str) -> int:
    from processor.service import telemetry_events

    return int(telemetry_events(progress, topic))


def telemetry_end(progress: dict[str, Any], topic: str) -> int:
    """Sum of the telemetry topic's end offsets in a progress report (any source, either format)."""
    total = 0
    for src in progress.get("sources") or []:
        end = src.get("endOffset")
        end = orjson.loads(end) if isinstance(end, str) else end
        if isinstance(end, dict):
            total += sum(int(x) for x in end.get(topic, {}).values())
    return total


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--vehicles", type=int, default=10000)
    ap.add_argument("--fixes", type=int, default=60, help="fixes per vehicle")
    ap.add_argument("--routes", type=int, default=300)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--buckets", type=int, default=16)
    ap.add_argument("--batch", type=int, default=400_000, help="max events per micro-batch")
    ap.add_argument("--cores", type=int, default=2)
    ap.add_argument(
        "--warmup-share",
        type=float,
        default=1 / 3,
        help="share of the events each contender processes before its sustained rate is timed",
    )
    ap.add_argument("--trigger-ms", type=int, default=200)
    ap.add_argument("--live", action=argparse.BooleanOptionalAction, default=True, help="live state to Redis")
    ap.add_argument("--contenders", default="naive,quix,spark")
    ap.add_argument("--latency-s", type=float, default=60.0, help="0 skips the latency phase")
    ap.add_argument(
        "--latency-rate", type=float, help="events/s of the latency phase (default: half the Spark rate)"
    )
    ap.add_argument("--record", action="store_true", help="append the results to docs/benchmarks.md")
    ap.add_argument("--spark-master", help="spark:// URL instead of local[cores] (bench/scaleout.py)")
    ap.add_argument("--shuffle-partitions", type=int, help="default: the machine's cores")
    ap.add_argument(
        "--spark-conf",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="extra Spark setting for the Spark contender (repeatable), e.g. spark.eventLog.enabled=true",
    )
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--bootstrap", help=argparse.SUPPRESS)
    ap.add_argument("--redis", help=argparse.SUPPRESS)
    ap.add_argument("--prefix", default="", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        run_child(args)
        return

    state = Path(tempfile.mkdtemp(prefix="ff-bench-"))
    s = Settings(
        **infra.private_fields(state),
        telemetry_partitions=PARTITIONS,
    )
    infra.up(s, create_topics=False)
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
        results: dict[str, dict[str, Any]] = {}
        for name in [c for c in args.contenders.split(",") if c]:
            ensure_topics(s.bootstrap_servers, [type(topic_specs(s)[0])(f"out.{name}", PARTITIONS)])
            res = run_contender(args, s, name)
            results[name] = res
        table = Table(title=f"processor: {len(w):,} events, {args.vehicles:,} vehicles, local[{args.cores}]")
        for col in (
            "contender",
            "guarantee",
            "events/s (sustained)",
            "vs naive",
            "vs quix",
            "CPU µs/event own / broker",
            "alerts",
        ):
            table.add_column(col)
        rate = {k: (v.get("sustained_events", v["events"]) / v["seconds"]) for k, v in results.items()}
        guarantee = {
            "naive": "at-least-once, no checkpoint",
            "quix": "exactly-once (RocksDB)",
            "spark": "exactly-once (Spark state + Kafka txn), Spark's Kafka connector",
        }
        for k, v in results.items():
            table.add_row(
                k,
                guarantee[k],
                f"{rate[k]:,.0f}",
                f"{rate[k] / rate['naive']:.2f}" if "naive" in rate else "-",
                f"{rate[k] / rate['quix']:.2f}" if "quix" in rate else "-",
                cpu_per_event(v),
                str(v["alerts"]),
            )
        console.print(table)
        lat: dict[str, Any] = {}
        half = args.latency_rate or (rate["spark"] / 2 if "spark" in rate else 0.0)
        if half > 0 and args.latency_s > 0:
            lat = latency_phase(args, s, half, args.latency_s)
            console.print(
                f"latency at {lat['rate']:,.0f} ev/s: p50 {lat.get('p50_ms')} ms, "
                f"p99 {lat.get('p99_ms')} ms over {lat['alerts']} alerts; broker "
                f"{lat.get('broker_cores')} cores; median batch phases (ms): "
                + ", ".join(f"{k} {v:,.0f}" for k, v in lat.get("phases", {}).items())
            )
        summary = {"results": results, "rates": rate, "latency": lat, "args": vars(args)}
        console.print_json(json.dumps(summary, default=str))
        if args.record:
            record(args, rate, results, lat, len(w))
    finally:
        infra.down(s)


def cpu_per_event(res: dict[str, Any]) -> str:
    """CPU microseconds per measured event of the contender's processes and of the broker."""
    own, broker = res.get("cpu_s", (0.0, 0.0))
    n = max(1, int(res.get("sustained_events", res["events"])))
    return f"{own / n * 1e6:.1f} / {broker / n * 1e6:.1f}"


def record(
    args: argparse.Namespace, rate: dict[str, float], results: dict[str, Any], lat: dict[str, Any], n: int
) -> None:
    doc = Path(__file__).resolve().parent.parent / "docs" / "benchmarks.md"
    lines = [
        f"\n### Processor run {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}\n",
        f"`.venv/bin/python bench/processor.py --vehicles {args.vehicles} --fixes {args.fixes} "
        f"--routes {args.routes} --buckets {args.buckets} --batch {args.batch} "
        f"--latency-s {args.latency_s:g} --contenders {args.contenders} --record`: {n:,} events, "
        f"local[{args.cores}]; each contender "
        f"timed after its first {args.warmup_share:.0%} of the events; CPU per measured event of the "
        "contender's processes (Spark: driver, JVM and Python workers) and of the broker\n",
        "| contender | events/s | vs naive | vs quix | CPU µs/event own / broker | alerts |",
        "|---|---|---|---|---|---|",
    ]
    for k, v in results.items():
        lines.append(
            f"| {k} | {rate[k]:,.0f} | {rate[k] / rate.get('naive', rate[k]):.2f} | "
            f"{rate[k] / rate.get('quix', rate[k]):.2f} | {cpu_per_event(v)} | {v['alerts']} |"
        )
    if lat:
        lines.append(
            f"\nEvent→alert latency at half load ({lat['rate']:,.0f} ev/s, trigger {args.trigger_ms} ms): "
            f"p50 {lat.get('p50_ms')} ms, p99 {lat.get('p99_ms')} ms ({lat['alerts']} alerts); the "
            f"broker used {lat.get('broker_cores')} cores; median micro-batch phases (ms): "
            + ", ".join(f"{k} {v:,.0f}" for k, v in lat.get("phases", {}).items())
            + ".\n"
        )
    with doc.open("a") as f:
        f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
