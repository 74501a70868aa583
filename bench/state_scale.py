"""State at scale: bytes of state per vehicle, and what a micro-batch costs when many vehicles are
registered and few of them report (issue #23).

    .venv/bin/python bench/state_scale.py --registered 100000 --registered 1000000 \
        --reporting 0.01 --reporting 0.1 [--buckets 16] [--rounds 4] [--phases engine,spark] [--record]

A national fleet is mostly calm or parked. A bucket's state blob is read and written whole by every
micro-batch that touches the bucket (docs/architecture.md, "Logically per vehicle, physically per
bucket"), so every vehicle in it costs every such batch; a parked vehicle (silent, nothing pending)
leaves the blob for a value of its own (processor.core.parking). Two views, each against a baseline in
the same run:

- `engine`: one bucket's blob exactly as the stateful operator handles it (unpickle the blob,
  advance it by the reporters' fixes with `processor.core.engine.process_bucket`, pickle it back), with
  N/buckets vehicles in it (vehicles that are not parked: calm ones that keep reporting) against
  only its reporters in it: what the blob's idle vehicles cost a batch, phase by phase, and the
  blob's bytes per vehicle. No Spark, no Kafka.
- `spark`: the real job on local[2] (Spark's Kafka source, `transformWithStateInPandas` on
  RocksDB, the exactly-once sink, live state to Redis) on the embedded broker: N vehicles
  registered (one fix each, two hours before the bursts: the fleet has gone silent, and its
  vehicles are parked, processor.core.parking), then bursts of `reporting`·N fixes, each committed in
  one Kafka transaction so it is read as one micro-batch. Side by side in one run, the burst's
  micro-batch: with the fleet registered (parked vehicles out of the blob: the job as it runs),
  with the fleet registered and every vehicle kept in its bucket's blob (the layout before
  parking), and with only its reporters registered. State bytes per vehicle from the checkpoint
  (Spark's `statestore` reader: the vehicles blob, the parked values and the master data blob of
  every bucket) and RocksDB's own figures from the query's progress.

The first round of every configuration warms up (JIT, worker caches) and is not counted; the
others' median is reported.
"""

from __future__ import annotations

import argparse
import os
import pickle
import statistics
import sys
import tempfile
import time
import uuid
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np
import orjson
from rich.console import Console
from rich.table import Table

from bench import workload as wl
from bench.common import BENCH_LOG, write_section
from bench.processor import produce_all, produce_one, telemetry_end
from embedded import infra
from fleetfence.contracts import Telemetry, bucket_of
from fleetfence.kafka import ensure_topics, plain_consumer, topic_specs, transactional_producer
from fleetfence.settings import Settings
from fleetfence.testing import wait_for
from processor.core.columns import Fixes, empty_states
from processor.core.domain import EngineConfig
from processor.core.engine import process_bucket
from processor.core.master import Catalog, MasterState
from processor.spark.rebucket import master_for_bucket

console = Console(width=170)
PARTITIONS = 4
# The registration fixes' age at the first burst: past the workload's silence threshold (3600 s),
# so the fleet has gone silent (and parked) before the bursts.
QUIET_FOR_MS = 2 * 3600 * 1000
SECTION = "## State at scale (bench/state_scale.py)"
LOG = BENCH_LOG / "state_scale.md"


def median_ms(xs: list[float]) -> float:
    return round(statistics.median(xs) * 1000, 1) if xs else float("nan")


# ----------------------------------------------------------------------------- engine


def fleet_master(w: wl.Workload) -> MasterState:
    return MasterState.of(w.master)


def step_fixes(w: wl.Workload, n: int, step: int, vehicles: np.ndarray) -> Fixes:
    """Fix number `step` of the given vehicles (the workload is time-major: step k of every vehicle
    is the k-th slice of n records)."""
    rows = step * n + vehicles
    assert (w.seq[rows] == step).all(), "the workload is not time-major"
    return Fixes(
        w.vehicle[rows],
        w.seq[rows],
        w.ts_ms[rows],
        w.lat[rows],
        w.lon[rows],
        w.speed_kmh[rows],
        w.ts_ms[rows],
    )


def vehicle_index(w: wl.Workload, n: int) -> np.ndarray:
    """The vehicles in the order of each step's slice (vehicle ids of step 0)."""
    return w.vehicle[:n]


def master_bytes(masters: list[MasterState]) -> dict[str, int]:
    """The master data blobs' bytes: routes and zones (every bucket holds all of them, whatever its
    vehicles) apart from assignments and vehicle records (each in its vehicle's bucket only)."""
    shared = sum(len(pickle.dumps((m.routes, m.zones), protocol=5)) for m in masters)
    own = sum(len(pickle.dumps((m.assignments, m.vehicles), protocol=5)) for m in masters)
    return {"routes_bytes": shared, "assign_bytes": own}


def engine_bucket(
    w: wl.Workload, n: int, buckets: int, registered: np.ndarray, reporters: np.ndarray, rounds: int
) -> dict[str, Any]:
    """One bucket: register `registered` (step 0), then `rounds` batches of the reporters' next fixes,
    each through unpickle -> process_bucket -> pickle, timed phase by phase."""
    cfg = EngineConfig()
    cat = Catalog(cfg)
    master = master_for_bucket(fleet_master(w), 0, buckets)
    reg = process_bucket(empty_states(), {}, master, step_fixes(w, n, 0, registered), 0, cfg, cat)
    blob = pickle.dumps((reg.states, reg.held), protocol=5)
    size = len(blob)
    t_load, t_engine, t_dump = [], [], []
    for r in range(1, rounds + 1):
        fx = step_fixes(w, n, r, reporters)
        t0 = time.perf_counter()
        states, held = pickle.loads(blob)
        t1 = time.perf_counter()
        res = process_bucket(states, held, master, fx, 0, cfg, cat)
        t2 = time.perf_counter()
        blob = pickle.dumps((res.states, res.held), protocol=5)
        t3 = time.perf_counter()
        if r > 1:  # the first round warms the catalog and the allocator
            t_load.append(t1 - t0)
            t_engine.append(t2 - t1)
            t_dump.append(t3 - t2)
    total = [a + b + c for a, b, c in zip(t_load, t_engine, t_dump, strict=True)]
    return {
        "registered": len(registered),
        "reporters": len(reporters),
        "blob_bytes": size,
        **master_bytes([master]),
        "load_ms": median_ms(t_load),
        "engine_ms": median_ms(t_engine),
        "dump_ms": median_ms(t_dump),
        "total_ms": median_ms(total),
    }


def engine_view(args: argparse.Namespace) -> list[dict[str, Any]]:
    out = []
    for n in args.registered:
        w = wl.build(n, args.rounds + 1, args.routes, seed=args.seed)
        ids = vehicle_index(w, n).tolist()
        in_bucket = np.fromiter((i for i, v in enumerate(ids) if bucket_of(v, args.buckets) == 0), np.int64)
        for p in args.reporting:
            k = max(1, int(len(in_bucket) * p))
            reporters = in_bucket[:k]
            full = engine_bucket(w, n, args.buckets, in_bucket, reporters, args.rounds)
            base = engine_bucket(w, n, args.buckets, reporters, reporters, args.rounds)
            out.append({"fleet": n, "reporting": p, "full": full, "base": base})
            console.print(
                f"engine: fleet {n:,}, bucket 0 of {args.buckets}: {len(in_bucket):,} registered, {k:,} "
                f"report: {full['total_ms']} ms vs {base['total_ms']} ms with only the reporters"
            )
    return out


def engine_table(rows: list[dict[str, Any]], buckets: int) -> Table:
    t = Table(title=f"one bucket of {buckets} per batch: registered vs only the reporters (median ms)")
    for c in ENGINE_COLUMNS:
        t.add_column(c, justify="right")
    for r in engine_rows(rows):
        t.add_row(*r)
    return t


ENGINE_COLUMNS = (
    "fleet",
    "vehicles in the bucket",
    "report",
    "unpickle ms",
    "engine ms",
    "pickle ms",
    "total ms",
    "only reporters: total ms",
    "ratio",
    "blob B/vehicle",
    "assignment B/vehicle",
    "routes MiB/bucket",
)


def engine_rows(rows: list[dict[str, Any]]) -> list[list[str]]:
    out = []
    for r in rows:
        f, b = r["full"], r["base"]
        out.append(
            [
                f"{r['fleet']:,}",
                f"{f['registered']:,}",
                f"{f['reporters']:,} ({r['reporting']:.0%})",
                f"{f['load_ms']}",
                f"{f['engine_ms']}",
                f"{f['dump_ms']}",
                f"{f['total_ms']}",
                f"{b['total_ms']}",
                f"{f['total_ms'] / b['total_ms']:.2f}" if b["total_ms"] else "-",
                f"{f['blob_bytes'] / f['registered']:.0f}",
                f"{f['assign_bytes'] / f['registered']:.0f}",
                f"{f['routes_bytes'] / 2**20:.1f}",
            ]
        )
    return out


# ----------------------------------------------------------------------------- spark


def produce_in_one_transaction(bootstrap: str, topic: str, records: list[tuple[bytes, bytes]]) -> None:
    """A burst committed atomically: a read_committed reader sees all of it or none, so it lands in
    one micro-batch."""
    p = transactional_producer(bootstrap, f"bench-burst-{uuid.uuid4().hex[:8]}")
    p.init_transactions(30)
    p.begin_transaction()
    for k, v in records:
        produce_one(p, topic, k, v)
    p.commit_transaction(120)


def topic_end(bootstrap: str, topic: str) -> int:
    """The sum of the topic's end offsets (transaction markers included, as the source counts)."""
    from confluent_kafka import TopicPartition

    c = plain_consumer(bootstrap, f"bench-{uuid.uuid4().hex[:6]}")
    try:
        parts = c.list_topics(topic, timeout=10).topics[topic].partitions
        return sum(c.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1] for p in parts)
    finally:
        c.close()


def read_up_to(q: Any, topic: str, end: int) -> bool:
    return running(q) and bool(q.lastProgress) and telemetry_end(q.lastProgress, topic) >= end


def running(q: Any) -> bool:
    """True while the query runs; its error, raised, once it has failed (a wait must not outlast it)."""
    error = q.exception()
    if error is not None:
        raise error
    return True


def spark_config(
    spark: Any,
    s: Settings,
    w: wl.Workload,
    n: int,
    registered: int,
    bursts: list[int],
    buckets: int,
    parking: bool = True,
) -> dict[str, Any]:
    """One checkpoint: `registered` vehicles register (two hours ago: they go silent, and park
    unless `parking` is off, when the first fix of the present moves the watermark on), then each
    burst (a size: the first that many vehicles' next fix) is one transaction; the micro-batches
    that read each burst, timed."""
    from processor.ops.progress import telemetry_events
    from processor.settings import ProcessorSettings
    from processor.spark.job import start_query
    from processor.spark.rebucket import read_bucket_states, state_bytes

    prefix = f"scale{uuid.uuid4().hex[:6]}."
    ps_ = s.model_copy(update={"topic_prefix": prefix})
    ensure_topics(s.bootstrap_servers, topic_specs(ps_))
    t = ps_.topics
    vids = set(w.vehicle[:registered].tolist())
    master = [e for e in w.master if e["entity"] != "assignment" or e["id"] in vids]
    produce_all(
        s.bootstrap_servers,
        t.master,
        [(f"{e['entity']}:{e['id']}".encode(), orjson.dumps(e)) for e in master],
        "master",
    )
    produce_all(
        s.bootstrap_servers,
        t.telemetry,
        w.records(0, registered, shift_ms=-QUIET_FOR_MS),
        f"registering {registered:,}",
    )
    checkpoint = tempfile.mkdtemp(prefix="ff-scale-cp-")
    ps = ProcessorSettings(
        **{
            **ps_.model_dump(exclude={"topics"}),
            "processor_checkpoint": checkpoint,
            "processor_buckets": buckets,
            "redis_prefix": f"{prefix}ff:",
            "processor_parking": parking,
        }
    )
    q = start_query(spark, ps)
    batches: list[dict[str, Any]] = []
    try:
        with console.status(f"registering {registered:,} vehicles"):
            done = topic_end(s.bootstrap_servers, t.telemetry)
            wait_for(lambda: read_up_to(q, t.telemetry, done), 1800, "registration")
        with console.status(f"{registered:,} vehicles fall silent"):
            # One fix of the present from a vehicle of no fleet moves the watermark on; the batch
            # after it fires every registered vehicle's silence timer.
            clock = Telemetry("clock", 0, wl.T0_MS, 0.0, 0.0, 0.0, None, None, wl.T0_MS)
            produce_all(s.bootstrap_servers, t.telemetry, [(b"clock", clock.to_json())], "clock")
            done = topic_end(s.bootstrap_servers, t.telemetry)
            wait_for(lambda: read_up_to(q, t.telemetry, done), 600, "the clock fix")
            read_at = int(q.lastProgress["batchId"])
            wait_for(lambda: running(q) and int(q.lastProgress["batchId"]) > read_at, 1800, "the silences")
        for step, k in enumerate(bursts, start=1):
            before = q.lastProgress["batchId"]
            produce_in_one_transaction(s.bootstrap_servers, t.telemetry, w.records(step * n, step * n + k))
            done = topic_end(s.bootstrap_servers, t.telemetry)
            wait_for(partial(read_up_to, q, t.telemetry, done), 600, f"burst {step}")
            mine = [
                p for p in q.recentProgress if p["batchId"] > before and telemetry_events(p, t.telemetry) > 0
            ]
            batches.append(
                {
                    "fixes": k,
                    "batches": len(mine),
                    "trigger_ms": sum(p["durationMs"].get("triggerExecution", 0) for p in mine),
                    "add_batch_ms": sum(p["durationMs"].get("addBatch", 0) for p in mine),
                    "state": (mine[-1].get("stateOperators") or [{}])[0] if mine else {},
                }
            )
    finally:
        q.stop()
    # The last batch that reported progress is committed; a no-data batch the stop cut short is not.
    batch = int(q.lastProgress["batchId"])
    state = read_bucket_states(spark, checkpoint, batch)
    vehicles, _ = state_bytes(state.values())
    return {
        "registered": registered,
        "vehicles": vehicles,
        "blob_vehicles": sum(len(b.states) for b in state.values()),
        "blob_bytes": sum(len(pickle.dumps((b.states, b.held), protocol=5)) for b in state.values()),
        "parked_vehicles": sum(len(b.parked) for b in state.values()),
        "parked_bytes": sum(b.parked_bytes for b in state.values()),
        **master_bytes([b.master for b in state.values()]),
        "bursts": batches,
    }


def spark_view(args: argparse.Namespace) -> list[dict[str, Any]]:
    from processor.spark.session import build_session

    state_dir = Path(tempfile.mkdtemp(prefix="ff-scale-"))
    s = Settings(**infra.private_fields(state_dir), telemetry_partitions=PARTITIONS)
    infra.up(s, create_topics=False)
    # The fleet's first silence is one batch of N alerts on their way through the JVM to the sink:
    # a million of them do not fit the processor's default 2 GiB heap.
    spark = build_session(
        app_name="bench-state-scale",
        spark_master=f"local[{args.cores}]",
        extra_conf={"spark.driver.memory": args.driver_memory},
    )
    out = []
    try:
        for n in args.registered:
            w = wl.build(n, args.rounds * len(args.reporting) + 1, args.routes, seed=args.seed)
            sizes = [max(1, int(n * p)) for p in args.reporting]
            bursts = [k for _ in range(args.rounds) for k in sizes]
            for k in sizes:
                base = spark_config(spark, s, w, n, k, [k] * args.rounds, args.buckets)
                console.print(
                    f"spark: only {k:,} registered: bursts {[b['trigger_ms'] for b in base['bursts']]} ms"
                )
                out.append({"fleet": n, "fixes": k, "kind": "base", **base})
            for kind, parking in (("full", True), ("blob", False)):
                full = spark_config(spark, s, w, n, n, bursts, args.buckets, parking)
                timed = [(b["fixes"], b["trigger_ms"]) for b in full["bursts"]]
                console.print(f"spark: {n:,} registered ({kind}): bursts {timed} ms")
                out.append({"fleet": n, "fixes": 0, "kind": kind, **full})
    finally:
        spark.stop()
        infra.down(s)
    return out


def spark_rows(rows: list[dict[str, Any]]) -> list[list[str]]:
    """Per fleet size and burst size: the burst's micro-batch with the fleet registered (parked, and
    all in the blob) against only its reporters registered (medians, the first round not counted)."""

    def burst_ms(config: dict[str, Any], k: int, key: str = "trigger_ms") -> float:
        return float(statistics.median([b[key] for b in config["bursts"] if b["fixes"] == k][1:]))

    out = []
    for full in (r for r in rows if r["kind"] == "full"):
        n = full["fleet"]
        blob = next(r for r in rows if r["kind"] == "blob" and r["fleet"] == n)
        for base in (r for r in rows if r["kind"] == "base" and r["fleet"] == n):
            k = base["fixes"]
            fm, om, bm = burst_ms(full, k), burst_ms(blob, k), burst_ms(base, k)
            st = full["bursts"][-1]["state"]
            cm = st.get("customMetrics") or {}
            out.append(
                [
                    f"{n:,}",
                    f"{k:,} ({k / n:.0%})",
                    f"{fm:,.0f}",
                    f"{burst_ms(full, k, 'add_batch_ms'):,.0f}",
                    f"{om:,.0f}",
                    f"{bm:,.0f}",
                    f"{fm / bm:.2f}",
                    f"{om / bm:.2f}",
                    f"{full['blob_vehicles']:,}",
                    f"{full['blob_bytes'] / max(full['blob_vehicles'], 1):.0f}",
                    f"{full['parked_bytes'] / max(full['parked_vehicles'], 1):.0f}",
                    f"{blob['blob_bytes'] / blob['vehicles']:.0f}",
                    f"{full['assign_bytes'] / full['vehicles']:.0f}",
                    f"{full['routes_bytes'] / 2**20:.1f}",
                    f"{cm.get('rocksdbSstFileSize', 0) / full['vehicles']:.0f}" if cm else "-",
                    f"{st.get('memoryUsedBytes', 0) / 2**20:,.0f}",
                ]
            )
    return out


SPARK_COLUMNS = (
    "registered",
    "burst fixes",
    "parked: batch ms",
    "parked: addBatch ms",
    "all in blob: batch ms",
    "only reporters: batch ms",
    "parked / only reporters",
    "all in blob / only reporters",
    "vehicles in blobs",
    "blob B/vehicle",
    "parked B/vehicle",
    "all in blob: B/vehicle",
    "assignment B/vehicle",
    "routes MiB (all buckets)",
    "RocksDB SST B/vehicle",
    "state memory MiB",
)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--registered", type=int, action="append", help="fleet sizes (repeatable)")
    ap.add_argument("--reporting", type=float, action="append", help="share reporting per batch (repeatable)")
    ap.add_argument("--buckets", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=4, help="bursts per size; the first warms up")
    ap.add_argument("--routes", type=int, default=300)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--cores", type=int, default=2)
    ap.add_argument("--driver-memory", default="8g", help="the Spark driver's (and local executor's) heap")
    ap.add_argument("--phases", default="engine,spark")
    ap.add_argument("--record", action="store_true", help="write the results into its log, docs/bench-log/")
    args = ap.parse_args()
    args.registered = args.registered or [100_000, 1_000_000]
    args.reporting = args.reporting or [0.01, 0.1]
    if args.rounds < 2:
        ap.error("--rounds must be at least 2 (the first warms up)")
    phases = set(args.phases.split(","))
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    started = datetime.now(UTC)
    load0 = os.getloadavg()[0]
    lines = [SECTION, ""]
    cmd = ".venv/bin/python bench/state_scale.py " + " ".join(sys.argv[1:])
    lines += [f"`{cmd}` ({started:%Y-%m-%d %H:%M} UTC, load average {load0:.1f} at the start)", ""]
    if "engine" in phases:
        rows = engine_view(args)
        console.print(engine_table(rows, args.buckets))
        lines += [f"Engine, one bucket of {args.buckets} (median of {args.rounds - 1} batches):", ""]
        lines += table_md(list(ENGINE_COLUMNS), engine_rows(rows))
    if "spark" in phases:
        srows = spark_view(args)
        t = Table(title="Spark, local[2]: a burst's micro-batch, the fleet registered vs only its reporters")
        for c in SPARK_COLUMNS:
            t.add_column(c, justify="right")
        for r in spark_rows(srows):
            t.add_row(*r)
        console.print(t)
        lines += [
            "",
            f"Spark, local[{args.cores}], {args.buckets} buckets (median of {args.rounds - 1} bursts):",
            "",
        ]
        lines += table_md(list(SPARK_COLUMNS), spark_rows(srows))
    if args.record:
        write_section(SECTION, [*lines, ""], LOG)
        console.print(f"recorded in docs/bench-log/state_scale.md ({SECTION})")


def table_md(head: list[str], rows: list[list[str]]) -> list[str]:
    return ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)] + [
        "| " + " | ".join(r) + " |" for r in rows
    ]


if __name__ == "__main__":
    main()
