"""Processor benchmark: FleetFence's Spark job vs the naive loop vs quixstreams, in one run.

    .venv/bin/python bench/processor.py --vehicles 10000 --fixes 60 [--route-rules both] [--record]

Every contender reads the same pre-loaded `fleet.telemetry` topic on a private embedded Apache
Kafka broker, in its own process (so each gets the whole box in turn), and produces deviation
alerts. Reported:
sustained events/s (after warm-up), ratios, and the alert counts (which must agree). A second
phase drives the Spark job at half its measured rate with live timestamps and reports the
event→alert latency p50/p99 (alert commit time minus the fix's ingest time).

Route awareness (issue #26) is master data, so `--route-rules` picks the master data the Spark job
reads (bench/workload.py): `off` (the routes' wrong-way, stop and arrival rules null, no planned
times), `on` (the rules' defaults, planned departure and arrival on every assignment, `--late-share`
of the trips planned so early that ARRIVAL_AT_RISK fires) or `both`: the same telemetry under a
second topic prefix, and the Spark contender run once with each, side by side (`--repeats` times,
alternating the order), with the on/off ratio of throughput and CPU per event. The peers only do
deviations: deviation alerts are compared across every contender, the route-awareness alerts of the
Spark runs are reported apart. `--baseline-tree` adds the Spark contender of another checkout (say,
the commit before #26) on the same topic: what the rules cost against no route awareness at all;
with `--baseline-python` (that checkout's virtualenv, say with another pyspark) it runs on that
interpreter and reads the same master data as this tree's first `--route-rules` mode, so the two
differ only in their code and their Spark.

`--proximity-m M` adds `spark-proximity`: the job with the vehicle-proximity query beside it in the
same driver (processor.spark.job.start_proximity_query: enter at M metres, exit at twice that),
alternated with `spark` over the repeats; timed until both queries have read every event, with the
with/without ratio of throughput and CPU per event (what turning the rule on costs).
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
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import orjson
from confluent_kafka import Producer
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from bench import workload as wl
from bench.common import BENCH_LOG, find_heading, log_text, settle_load
from bench.cpu import broker_pid, pid_cpu_s, tree_cpu_s
from bench.state_api import FLOOR, FLOOR_ALERT_TYPE, FLOOR_QUIET, starter
from embedded import infra
from fleetfence.kafka import ensure_topics, idempotent_producer, produce_waiting, topic_specs
from fleetfence.settings import Settings
from processor.spark.layout import default_buckets
from processor.spark.session import default_shuffle_partitions

console = Console()
PARTITIONS = 4
COMPRESSION = os.environ.get("FF_BENCH_COMPRESSION", "lz4")
DEVIATION_TYPES = ("ROUTE_DEVIATION", "ROUTE_RETURN")  # what every contender raises
# The job's query shape around an operator that only emits one alert per fix, or only counts (--floor).
FLOOR_CONTENDERS = {"spark-floor": FLOOR, "spark-floor-quiet": FLOOR_QUIET}
GUARANTEE = {
    "naive": "at-least-once, no checkpoint",
    "quix": "exactly-once (RocksDB)",
    "spark": "exactly-once (Spark state + Kafka txn), Spark's Kafka connector",
    "spark-floor": "exactly-once; Spark's floor: the job's query, an alert per fix (bench/state_api.py)",
    "spark-floor-quiet": "exactly-once; Spark's floor: the job's query, no alerts (bench/state_api.py)",
    "spark-proximity": "exactly-once; the job and the proximity query beside it (two queries, one driver)",
}
PROXIMITY = "spark-proximity"


def produce_all(bootstrap: str, topic: str, records: list[tuple[bytes, bytes]], label: str) -> None:
    p = idempotent_producer(
        bootstrap, **{"linger.ms": 20, "batch.num.messages": 20000, "compression.type": COMPRESSION}
    )
    with Progress(console=console, transient=True) as prog:
        task = prog.add_task(label, total=len(records))
        for i, (k, v) in enumerate(records):
            produce_one(p, topic, k, v)
            if i % 5000 == 0:
                p.poll(0)
                prog.update(task, completed=i)
        p.flush(120)


def produce_one(p: Producer, topic: str, key: bytes, value: bytes) -> None:
    """Produce, waiting for room when the client's queue is full (a bench outruns the broker)."""
    produce_waiting(p, topic, key=key, value=value)


def contender_spark(
    args: argparse.Namespace,
    s: Settings,
    total: int,
    checkpoint: str,
    cpu: Callable[[], tuple[float, float]] = lambda: (0.0, 0.0),
    state_api: str = "transformWithState",
    proximity_m: float = 0.0,
) -> dict[str, Any]:
    from processor.ops.progress import telemetry_events
    from processor.settings import ProcessorSettings
    from processor.spark.job import start_proximity_query
    from processor.spark.session import build_session

    ps = ProcessorSettings(
        **{
            **s.model_dump(exclude={"topics"}),
            "processor_checkpoint": checkpoint,
            "processor_buckets": args.buckets or None,
            "processor_trigger_ms": 0,
            "processor_max_events_per_batch": args.batch,
            "processor_live_state": args.live,
            "redis_prefix": "bench:",
            "processor_proximity_enter_m": proximity_m or None,
            "processor_proximity_checkpoint": checkpoint + "-proximity",
            "processor_proximity_starting_offsets": "earliest",  # the topic was filled before
        }
    )
    spark = build_session(
        app_name="bench",
        spark_master=args.spark_master or f"local[{args.cores}]",
        local_dir=Path(checkpoint).parent,
        shuffle_partitions=args.shuffle_partitions,
        extra_conf=dict(kv.split("=", 1) for kv in args.spark_conf),
    )
    t_start = time.perf_counter()
    q = starter(state_api)(spark, ps)
    rules = ps.proximity_rules()
    queries = [q, start_proximity_query(spark, ps, rules)] if rules else [q]
    seen = 0  # events read by every query (the slower one's count)
    read = [0] * len(queries)
    ends: list[tuple[float, int]] = []  # (time, events so far) at the end of each batch
    cpus: list[tuple[float, float]] = []  # CPU snapshots taken when each batch end was seen
    progress: list[tuple[float, Any]] = []  # the job's batches, with when each was seen
    last_batch = [-1] * len(queries)
    while seen < total:
        for k, query in enumerate(queries):
            if query.exception() is not None:
                raise RuntimeError(query.exception())
            for p in query.recentProgress:
                if p["batchId"] > last_batch[k]:
                    last_batch[k] = p["batchId"]
                    read[k] += telemetry_events(p, s.topics.telemetry)
                    if k == 0:
                        progress.append((time.perf_counter(), p))
        if min(read) > seen:
            seen = min(read)
            ends.append((time.perf_counter(), seen))
            cpus.append(cpu())
        time.sleep(0.2)
    for query in queries:
        query.stop()
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
    if t_end <= t_warm:
        raise SystemExit(
            f"the run had no batch after its warm-up ({len(data)} batches in all): nothing to time; "
            "lower --batch (or --warmup-share) so that the workload spans several batches"
        )
    # Where the job's measured batches' time went (Spark's durationMs phases, median per batch).
    measured = [p for t, p in progress if t > t_warm]
    return {
        "phases": batch_phases(measured, s.topics.telemetry),
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
    first ~40 s of a run (docs/bench-log/processor.md), which the Python contenders never pay."""
    return int(total * args.warmup_share)


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
        state_api = FLOOR_CONTENDERS.get(args.child, "transformWithState")
        proximity_m = args.proximity_m if args.child == PROXIMITY else 0.0
        res = contender_spark(args, s, total, tempfile.mkdtemp() + "/cp", cpu, state_api, proximity_m)
    print("RESULT " + json.dumps(res), flush=True)


def run_contender(
    args: argparse.Namespace, s: Settings, name: str, tree: Path | None = None
) -> dict[str, Any]:
    """Run one contender in a child process against the pre-loaded broker (the topics under
    `s.topic_prefix`); its RESULT line. With `tree`, the child is that checkout's own
    bench/processor.py, run from it with it first on the path (the Spark job's Python workers
    included), so its processor is the one measured."""
    script = tree / "bench" / "processor.py" if tree is not None else Path(__file__)
    python = args.baseline_python if tree is not None and args.baseline_python else sys.executable
    cmd = [
        python,
        str(script),
        "--child",
        name,
        "--bootstrap",
        s.bootstrap_servers,
        "--redis",
        s.redis_dsn,
        "--prefix",
        s.topic_prefix,
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
    if name == PROXIMITY:  # only then: a --baseline-tree's older script has no such option
        cmd += ["--proximity-m", str(args.proximity_m)]
    if getattr(args, "spark_master", None):
        cmd += ["--spark-master", args.spark_master]
    if getattr(args, "shuffle_partitions", None):
        cmd += ["--shuffle-partitions", str(args.shuffle_partitions)]
    for kv in getattr(args, "spark_conf", []):
        cmd += ["--spark-conf", kv]
    spark = name.startswith("spark")
    before = alert_types(s) if spark else Counter()
    env = {**os.environ, "PYSPARK_PYTHON": python, "PYSPARK_DRIVER_PYTHON": python}
    if tree is not None:
        env["PYTHONPATH"] = str(tree)
    load0 = settle_load(getattr(args, "quiet_load", 0.0))
    with console.status(f"running {name}{f' from {tree}' if tree else ''}…"):
        out = subprocess.run(
            cmd,
            check=False,
            capture_output=True,
            text=True,
            timeout=3600,
            env=env,
            cwd=tree,
        )
    line = next((ln for ln in out.stdout.splitlines() if ln.startswith("RESULT ")), None)
    if line is None:
        # The whole output kept: Spark's plan dump alone is longer than a terminal's tail.
        saved = Path(tempfile.mkstemp(prefix=f"bench-{name}-", suffix=".log")[1])
        saved.write_text(f"$ {' '.join(cmd)}\n--- stdout\n{out.stdout}\n--- stderr\n{out.stderr}")
        console.print(out.stdout[-3000:], out.stderr[-3000:])
        raise SystemExit(f"{name} failed (its whole output: {saved})")
    res: dict[str, Any] = json.loads(line[7:])
    res["load"] = [load0, round(os.getloadavg()[0], 2)]
    if spark:
        # Delta: several Spark runs (bench/scaleout.py, --repeats) share the alert topic, each with
        # a fresh checkpoint.
        types = alert_types(s)
        types.subtract(before)
        res["alert_types"] = {k: v for k, v in sorted(types.items()) if v}
        res["alerts"] = sum(res["alert_types"].values())
    else:
        res["alert_types"] = {"ROUTE_DEVIATION+ROUTE_RETURN": res["alerts"]}
    return res


def alert_types(s: Settings) -> Counter[str]:
    """Committed alerts on the prefix's alert topic, by type."""
    return Counter(str(orjson.loads(m.value())["type"]) for m in read_alerts(s, s.topics.alerts))


def deviation_alerts(res: dict[str, Any]) -> int:
    """Alerts every contender raises (the peers only do deviations)."""
    types: dict[str, int] = res.get("alert_types", {})
    if "ROUTE_DEVIATION+ROUTE_RETURN" in types:
        return types["ROUTE_DEVIATION+ROUTE_RETURN"]
    return sum(types.get(t, 0) for t in DEVIATION_TYPES)


def route_alerts(res: dict[str, Any]) -> str:
    """The route-awareness alerts of a Spark run, by type (everything but deviations)."""
    types: dict[str, int] = res.get("alert_types", {})
    other = {k: v for k, v in types.items() if k not in DEVIATION_TYPES and "+" not in k}
    return ", ".join(f"{k} {v}" for k, v in other.items()) or "-"


def latency_phase(
    args: argparse.Namespace, s: Settings, rate: float, seconds: float, route_rules: str = "default"
) -> dict[str, Any]:
    """Drive the Spark job live at `rate` events/s; measure alert commit time - fix ingest time.

    `route_rules` as in `Workload.master_for`, without planned times (`default`: the rules'
    defaults) since the live fixes carry the send time, not the workload's."""
    cfg = LiveConfig(
        routes=args.routes,
        seed=args.seed,
        cores=args.cores,
        buckets=args.buckets or None,
        trigger_ms=args.trigger_ms,
        live=args.live,
        spark_conf=dict(kv.split("=", 1) for kv in args.spark_conf),
        route_rules=route_rules,
    )
    return live_latency(s, rate, seconds, cfg)


@dataclass(frozen=True)
class LiveConfig:
    """What the live latency phase varies: the job's settings and Spark's, and the live workload.

    bench/latency.py runs one of these per variant, side by side; `latency_phase` builds it from
    this bench's arguments."""

    routes: int = 300
    seed: int = 1
    cores: int = 2
    buckets: int | None = None  # the processor's default
    trigger_ms: int = 200
    live: bool = True
    max_events_per_batch: int = 0  # 0 = no cap (the live batches stay far below the default)
    shuffle_partitions: int | None = None
    spark_conf: dict[str, str] = field(default_factory=dict)
    route_rules: str = "default"
    vehicles: int | None = None  # default: one vehicle per event/s (1 Hz), at most 20k
    warmup_s: float = 0.0  # alerts of fixes sent in the first seconds are not counted
    checkpoint: str | None = None  # default: a fresh temp folder
    local_dir: Path | None = None  # Spark's scratch space; default Spark's own
    state_api: str = "transformWithState"  # or applyInPandasWithState, or floor (bench/state_api.py)


def live_latency(s: Settings, rate: float, seconds: float, cfg: LiveConfig) -> dict[str, Any]:
    """Drive the Spark job live at `rate` events/s for `seconds`; alert commit time - fix ingest
    time over the deviation alerts, Spark's median micro-batch phases, the broker's cores.

    The topics are `s`'s under a `lat.` prefix, so a caller that runs this several times on one
    broker gives each run its own `s.topic_prefix` (the alerts read back are the whole topic)."""
    from processor.settings import ProcessorSettings
    from processor.spark.session import build_session

    prefix = s.topic_prefix + "lat."
    ls = s.model_copy(update={"topic_prefix": prefix})
    ensure_topics(s.bootstrap_servers, topic_specs(ls))
    # 1 Hz per vehicle up to 20k vehicles, faster fixes beyond: the workload is built up front, and
    # one vehicle per event/s at 56k events/s (5M records) did not fit in memory with its encodings.
    n_vehicles = cfg.vehicles or max(100, min(int(rate), 20_000))
    fixes = math.ceil(rate * (seconds + 10) / n_vehicles)
    w = wl.build(n_vehicles, fixes, cfg.routes, seed=cfg.seed + 1, deviating_share=0.2)
    produce_all(
        s.bootstrap_servers,
        ls.topics.master,
        [(f"{e['entity']}:{e['id']}".encode(), orjson.dumps(e)) for e in w.master_for(cfg.route_rules)],
        "master data",
    )
    ps = ProcessorSettings(
        **{
            **ls.model_dump(exclude={"topics"}),
            "processor_checkpoint": cfg.checkpoint or tempfile.mkdtemp(),
            "processor_buckets": cfg.buckets,
            "processor_trigger_ms": cfg.trigger_ms,
            "processor_max_events_per_batch": cfg.max_events_per_batch,
            "processor_live_state": cfg.live,
            "redis_prefix": "benchlat:",
            "processor_starting_offsets": "latest",
        }
    )
    spark = build_session(
        app_name="bench-latency",
        spark_master=f"local[{cfg.cores}]",
        local_dir=cfg.local_dir,
        shuffle_partitions=cfg.shuffle_partitions,
        extra_conf=dict(cfg.spark_conf),
    )
    q = starter(cfg.state_api)(spark, ps)
    try:
        p = idempotent_producer(s.bootstrap_servers, **{"linger.ms": 5})
        recs = LazyRecords(w)
        # Wait for the first (empty) batch so start-up does not count as latency.
        while not q.recentProgress:
            if q.exception() is not None:
                raise RuntimeError(q.exception())
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
        t_sent = time.time()
        # Until the query has committed a batch that ends at everything we sent.
        deadline = time.time() + 120
        while time.time() < deadline:
            last = q.lastProgress
            if last and telemetry_end(last, ls.topics.telemetry) >= sent:
                break
            time.sleep(0.2)
        # How long the job took to catch up once the load stopped: a backlog shows here.
        drain_s = time.time() - t_sent
        progress = q.recentProgress
        phases = batch_phases(progress, ls.topics.telemetry)
        # The broker's share of the box while it serves the live load and the read tasks' fetches.
        broker_cores = ((pid_cpu_s(bpid) if bpid else 0.0) - broker0) / (time.time() - t0)
    finally:
        q.stop()
        spark.stop()
    counted_from = int((t0 + cfg.warmup_s) * 1000)
    lat = []
    for m in read_alerts(ls, ls.topics.alerts):
        a = orjson.loads(m.value())
        if a["type"] in (*DEVIATION_TYPES, FLOOR_ALERT_TYPE) and a["trigger_received_ms"] >= counted_from:
            lat.append(m.timestamp()[1] - a["trigger_received_ms"])
    lat.sort()
    if not lat:
        return {"rate": rate, "alerts": 0, "sent": sent, "phases": phases}
    return {
        "rate": rate,
        "sent": sent,
        "alerts": len(lat),
        "p50_ms": lat[len(lat) // 2],
        "p99_ms": lat[int(len(lat) * 0.99)],
        "max_ms": lat[-1],
        "phases": phases,
        "broker_cores": round(broker_cores, 2),
        "batches_total": len(progress),
        "drain_s": round(drain_s, 1),
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
    from processor.ops.progress import telemetry_events

    return int(telemetry_events(progress, topic))


def telemetry_end(progress: dict[str, Any], topic: str) -> int:
    """Sum of the telemetry topic's end offsets in a progress report (any source, either format)."""
    from processor.ops.progress import source_offsets

    total = 0
    for src in progress["sources"] or []:
        end = source_offsets(src, "endOffset")
        if isinstance(end, dict):
            total += sum(int(x) for x in end.get(topic, {}).values())
    return total


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--vehicles", type=int, default=10000)
    ap.add_argument("--fixes", type=int, default=60, help="fixes per vehicle")
    ap.add_argument("--routes", type=int, default=300)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--buckets", type=int, default=0, help="state buckets (0: the processor's default)")
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
    ap.add_argument(
        "--route-rules",
        choices=("off", "on", "both"),
        default="on",
        help="the route-awareness rules in the Spark job's master data; both: one Spark run with each",
    )
    ap.add_argument(
        "--late-share",
        type=float,
        default=0.01,
        help="with the rules on: share of trips planned to arrive 15-30 min before their ETA",
    )
    ap.add_argument("--repeats", type=int, default=1, help="runs of each Spark configuration, alternating")
    ap.add_argument(
        "--floor",
        action="store_true",
        help=f"add {', '.join(FLOOR_CONTENDERS)}: Spark's floor for the job's query shape, alternated "
        "with the job",
    )
    ap.add_argument(
        "--baseline-tree",
        type=Path,
        help="also run the Spark contender of this checkout (e.g. `git worktree add /tmp/pre26 03964a9~1`)",
    )
    ap.add_argument(
        "--baseline-python",
        help="the baseline tree's interpreter (its own virtualenv, e.g. with another pyspark)",
    )
    ap.add_argument(
        "--proximity-m",
        type=float,
        default=0.0,
        help=f"add {PROXIMITY}: the job with the proximity query beside it (enter at this many metres), "
        "alternated with the job",
    )
    ap.add_argument("--latency-s", type=float, default=60.0, help="0 skips the latency phase")
    ap.add_argument(
        "--latency-rate", type=float, help="events/s of the latency phase (default: half the Spark rate)"
    )
    ap.add_argument(
        "--quiet-load",
        type=float,
        default=0.0,
        help="before each run wait until the 1-min load average is below this (0: don't wait)",
    )
    ap.add_argument("--record", action="store_true", help="add the run to docs/bench-log/processor.md")
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
    # The processor's defaults for this many cores, resolved here and passed to every child, so a
    # --baseline-tree with other defaults runs the same configuration.
    args.shuffle_partitions = args.shuffle_partitions or default_shuffle_partitions(args.cores)
    args.buckets = args.buckets or default_buckets(args.shuffle_partitions)

    modes = ["off", "on"] if args.route_rules == "both" else [args.route_rules]
    state = Path(tempfile.mkdtemp(prefix="ff-bench-"))
    s = Settings(
        **infra.private_fields(state),
        telemetry_partitions=PARTITIONS,
    )
    infra.up(s, create_topics=False)
    try:
        w = wl.build(args.vehicles, args.fixes, args.routes, seed=args.seed)
        console.print(f"workload: {len(w):,} fixes, {args.vehicles:,} vehicles, {args.routes} routes")
        # One topic prefix per master data set (the first mode keeps the plain names), each with
        # the same telemetry.
        prefixed = {
            m: s.model_copy(update={"topic_prefix": "" if k == 0 else f"{m}."}) for k, m in enumerate(modes)
        }
        for m, ms in prefixed.items():
            ensure_topics(ms.bootstrap_servers, topic_specs(ms))
            produce_all(
                ms.bootstrap_servers,
                ms.topics.master,
                [
                    (f"{e['entity']}:{e['id']}".encode(), orjson.dumps(e))
                    for e in w.master_for(m, args.late_share)
                ],
                f"master data, route rules {m}",
            )
            produce_all(ms.bootstrap_servers, ms.topics.telemetry, w.records(), f"telemetry ({m})")
        first = prefixed[modes[0]]
        runs: list[tuple[str, str, dict[str, Any]]] = []  # (contender, route rules, result)
        for name in [c for c in args.contenders.split(",") if c]:
            if name != "spark":
                topic = first.topic_prefix + f"out.{name}"
                ensure_topics(s.bootstrap_servers, [type(topic_specs(s)[0])(topic, PARTITIONS)])
                runs.append((name, "-", run_contender(args, first, name)))
                continue
            # (contender, route rules or tree, settings, tree): alternated over the repeats.
            configs: list[tuple[str, str, Settings, Path | None]] = [
                (name, m, prefixed[m], None) for m in modes
            ]
            if args.baseline_tree:
                base = first if args.baseline_python else prefixed.get("off", first)
                label = tree_label(args.baseline_tree, "baseline" if args.baseline_python else "none")
                configs.append((name, label, base, args.baseline_tree.resolve()))
            if args.floor:
                configs += [(floor, "-", first, None) for floor in FLOOR_CONTENDERS]
            if args.proximity_m > 0:
                configs.append((PROXIMITY, modes[0], first, None))
                if args.baseline_tree and args.baseline_python:
                    # The same job with its proximity query, on the baseline's interpreter (another
                    # pyspark): both queries compared across the two Spark lines, not just the job.
                    configs.append((PROXIMITY, label, base, args.baseline_tree.resolve()))
            for r in range(args.repeats):
                for child, label, ms, tree in configs if r % 2 == 0 else configs[::-1]:
                    res = run_contender(args, ms, child, tree)
                    console.print(
                        f"  {child}, rules {label}: {rate_of(res):,.0f} events/s, {cpu_per_event(res)}, "
                        f"load {res['load'][0]} before / {res['load'][1]} after"
                    )
                    runs.append((child, label, res))
        console.print(results_table(runs, len(w), args))
        summary = comparison(runs)
        for line in summary:
            console.print(line)
        lat: dict[str, Any] = {}
        spark_rates = [rate_of(r) for c, m, r in runs if c == "spark" and m == modes[-1]]
        half = args.latency_rate or (statistics.median(spark_rates) / 2 if spark_rates else 0.0)
        if half > 0 and args.latency_s > 0:
            lat = latency_phase(args, s, half, args.latency_s, "off" if modes == ["off"] else "default")
            console.print(
                f"latency at {lat['rate']:,.0f} ev/s: p50 {lat.get('p50_ms')} ms, "
                f"p99 {lat.get('p99_ms')} ms over {lat['alerts']} alerts; broker "
                f"{lat.get('broker_cores')} cores; median batch phases (ms): "
                + ", ".join(f"{k} {v:,.0f}" for k, v in lat.get("phases", {}).items())
            )
        out = {"runs": [{"contender": c, "route_rules": m, **r} for c, m, r in runs], "latency": lat}
        console.print_json(json.dumps({**out, "args": vars(args)}, default=str))
        if args.record:
            record(args, runs, summary, lat, len(w))
    finally:
        infra.down(s)


def tree_label(tree: Path, role: str = "none") -> str:
    """A checkout's commit, to name its Spark contender (`none`: without route awareness)."""
    out = subprocess.run(
        ["git", "-C", str(tree), "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=False
    )
    return f"{role} (tree {out.stdout.strip() or tree.name})"


def rate_of(res: dict[str, Any]) -> float:
    """Sustained events/s of one run."""
    return float(res.get("sustained_events", res["events"]) / res["seconds"])


def cpu_us(res: dict[str, Any]) -> float:
    """The contender's own CPU µs per measured event."""
    own = float(res.get("cpu_s", (0.0, 0.0))[0])
    return own / max(1, int(res.get("sustained_events", res["events"]))) * 1e6


def _median_of(runs: list[tuple[str, str, dict[str, Any]]], contender: str, rules: str) -> float | None:
    rates = [rate_of(r) for c, m, r in runs if c == contender and m == rules]
    return statistics.median(rates) if rates else None


def results_table(runs: list[tuple[str, str, dict[str, Any]]], n: int, args: argparse.Namespace) -> Table:
    table = Table(title=f"processor: {n:,} events, {args.vehicles:,} vehicles, local[{args.cores}]")
    for col in (
        "contender",
        "route rules",
        "guarantee",
        "events/s (sustained)",
        "vs naive",
        "vs quix",
        "vs spark, rules off",
        "CPU µs/event own / broker",
        "deviation alerts",
        "route-awareness alerts",
    ):
        table.add_column(col)
    for row in table_rows(runs):
        table.add_row(*row)
    return table


def table_rows(runs: list[tuple[str, str, dict[str, Any]]]) -> list[list[str]]:
    """One row per run: what the console table and the recorded table show."""
    naive, quix = _median_of(runs, "naive", "-"), _median_of(runs, "quix", "-")
    off = _median_of(runs, "spark", "off")
    rows = []
    for c, m, r in runs:
        rate = rate_of(r)
        rows.append(
            [
                c,
                m,
                GUARANTEE.get(c, ""),
                f"{rate:,.0f}",
                f"{rate / naive:.2f}" if naive else "-",
                f"{rate / quix:.2f}" if quix else "-",
                f"{rate / off:.3f}" if off and c == "spark" else "-",
                cpu_per_event(r),
                str(deviation_alerts(r)),
                route_alerts(r) if c in ("spark", PROXIMITY) else "-",
            ]
        )
    return rows


def comparison(runs: list[tuple[str, str, dict[str, Any]]]) -> list[str]:
    """The side-by-side reading: rules on against off (and against a baseline tree), medians over
    the repeats; and whether every contender raised the same deviation alerts."""
    lines = []
    spark = [(m, r) for c, m, r in runs if c == "spark"]
    by_rules: dict[str, list[dict[str, Any]]] = {}
    for m, r in spark:
        by_rules.setdefault(m, []).append(r)
    med = {m: statistics.median(rate_of(r) for r in rs) for m, rs in by_rules.items()}
    cpu = {m: statistics.median(cpu_us(r) for r in rs) for m, rs in by_rules.items()}
    if "off" in med and "on" in med:
        lines.append(
            f"Spark, route rules on / off: throughput x{med['on'] / med['off']:.3f} "
            f"({med['on']:,.0f} / {med['off']:,.0f} events/s), own CPU per event "
            f"x{cpu['on'] / cpu['off']:.3f} ({cpu['on']:.1f} / {cpu['off']:.1f} µs), medians over "
            f"{len(by_rules['on'])} / {len(by_rules['off'])} runs"
        )
    for m, base in med.items():
        if not m.startswith(("none", "baseline")):
            continue
        for other in ("off", "on"):
            if other in med:
                lines.append(
                    f"Spark, route rules {other} / {m}: throughput x{med[other] / base:.3f}, "
                    f"own CPU per event x{cpu[other] / cpu[m]:.3f} ({cpu[other]:.1f} / {cpu[m]:.1f} µs)"
                )
    # The floor runs on the first mode's topics: the job's runs of that mode are its match.
    floor_mode = next((m for _, m, _ in runs if m in ("off", "on")), None)
    job = [r for m, r in spark if m == floor_mode]
    for contender in FLOOR_CONTENDERS:
        floor = [r for c, _, r in runs if c == contender]
        if not (floor and job):
            continue
        f_rate = statistics.median(rate_of(r) for r in floor)
        f_cpu = statistics.median(cpu_us(r) for r in floor)
        j_rate = statistics.median(rate_of(r) for r in job)
        j_cpu = statistics.median(cpu_us(r) for r in job)
        lines.append(
            f"Spark job / {contender}: throughput x{j_rate / f_rate:.3f} ({j_rate:,.0f} / {f_rate:,.0f} "
            f"events/s), own CPU per event x{j_cpu / f_cpu:.3f} ({j_cpu:.1f} / {f_cpu:.1f} µs)"
        )
    near = [r for c, _, r in runs if c == PROXIMITY]
    if near and job:
        n_rate = statistics.median(rate_of(r) for r in near)
        n_cpu = statistics.median(cpu_us(r) for r in near)
        j_rate = statistics.median(rate_of(r) for r in job)
        j_cpu = statistics.median(cpu_us(r) for r in job)
        pairs = statistics.median(r.get("alert_types", {}).get("PROXIMITY_ENTER", 0) for r in near)
        lines.append(
            f"Spark job with proximity / without: throughput x{n_rate / j_rate:.3f} ({n_rate:,.0f} / "
            f"{j_rate:,.0f} events/s), own CPU per event x{n_cpu / j_cpu:.3f} ({n_cpu:.1f} / "
            f"{j_cpu:.1f} µs); {pairs:.0f} PROXIMITY_ENTER alerts"
        )
    floor_alerts = [r for c, _, r in runs if c == "spark-floor"]
    if floor_alerts:
        exact = {r.get("alert_types", {}).get(FLOOR_ALERT_TYPE, 0) == r["events"] for r in floor_alerts}
        lines.append(
            "spark-floor emitted exactly one alert per event in every run"
            if exact == {True}
            else "[bold red]spark-floor did NOT emit exactly one alert per event[/]"
        )
    judged = [(c, r) for c, _, r in runs if c not in FLOOR_CONTENDERS]
    counts = {deviation_alerts(r) for _, r in judged}
    lines.append(
        f"deviation alerts agree across all {len(judged)} runs: {counts.pop()}"
        if len(counts) == 1
        else f"[bold red]deviation alerts DISAGREE: {sorted(counts)}[/]"
    )
    return lines


def cpu_per_event(res: dict[str, Any]) -> str:
    """CPU microseconds per measured event of the contender's processes and of the broker."""
    own, broker = res.get("cpu_s", (0.0, 0.0))
    n = max(1, int(res.get("sustained_events", res["events"])))
    return f"{own / n * 1e6:.1f} / {broker / n * 1e6:.1f}"


SECTION = "## Processor (bench/processor.py)"
LOG = BENCH_LOG / "processor.md"


def record(
    args: argparse.Namespace,
    runs: list[tuple[str, str, dict[str, Any]]],
    summary: list[str],
    lat: dict[str, Any],
    n: int,
) -> None:
    """Write the run into the processor section of its log, above its earlier runs."""
    cmd = " ".join(a if " " not in a else f"'{a}'" for a in sys.argv[1:])
    lines = [
        f"### Processor run {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}",
        "",
        f"`.venv/bin/python bench/processor.py {cmd}`: {n:,} events, local[{args.cores}]; each contender "
        f"timed after its first {args.warmup_share:.0%} of the events; CPU per measured event of the "
        "contender's processes (Spark: driver, JVM and Python workers) and of the broker; load average "
        f"{os.getloadavg()[0]:.1f} at the end",
        "",
        "| contender | route rules | events/s | vs naive | vs quix | vs spark, rules off "
        "| CPU µs/event own / broker | deviation alerts | route-awareness alerts | load before / after |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row, (_c, _m, r) in zip(table_rows(runs), runs, strict=True):
        del row[2]  # the guarantee: the section's text says it
        load = r.get("load")
        row.append(f"{load[0]} / {load[1]}" if load else "-")
        lines.append("| " + " | ".join(row) + " |")
    lines.append("")
    lines.extend(f"- {x.replace('[bold red]', '**').replace('[/]', '**')}." for x in summary)
    if lat:
        lines.append(
            f"\nEvent→alert latency at half load ({lat['rate']:,.0f} ev/s, trigger {args.trigger_ms} ms): "
            f"p50 {lat.get('p50_ms')} ms, p99 {lat.get('p99_ms')} ms ({lat['alerts']} alerts); the "
            f"broker used {lat.get('broker_cores')} cores; median micro-batch phases (ms): "
            + ", ".join(f"{k} {v:,.0f}" for k, v in lat.get("phases", {}).items())
            + "."
        )
    lines.append("")
    insert_run(LOG, lines)


def insert_run(doc: Path, lines: list[str]) -> None:
    """Put a run's lines in the processor section, above its newest `### Processor run` (runs are
    kept newest first), or at the section's end; the section is created when missing."""
    text = log_text(doc)
    block = "\n".join(lines) + "\n"
    start = find_heading(text, SECTION)
    if start < 0:
        doc.write_text(text.rstrip("\n") + "\n\n" + SECTION + "\n\n" + block)
        return
    end = text.find("\n## ", start + len(SECTION))
    end = len(text) if end < 0 else end + 1
    sub = find_heading(text, "### Processor run", start, end)
    at = end if sub < 0 else sub
    head = text[:at] if text[:at].endswith("\n\n") else text[:at].rstrip("\n") + "\n\n"
    doc.write_text(head + block + text[at:])


if __name__ == "__main__":
    main()
