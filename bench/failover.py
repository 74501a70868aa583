"""Failover benchmark: SIGKILL the processor under a steady stream: cold restart, warm standby, hot driver.

    .venv/bin/python bench/failover.py --kills 10 [--record]

A private embedded Kafka broker and Redis; a producer writes a steady stream of canonical telemetry
(`--vehicles` vehicles at 1 Hz, each leaving and rejoining its corridor every `--cycle-s`, so
alerts keep coming); a read_committed consumer stamps each alert with the moment it saw it. Then,
for each mode, `--kills` times at a random moment: SIGKILL the active driver's process group, and
measure from the kill to the first committed alert whose triggering fix was published after the
kill (its fix's `received_ms`).
- cold: the supervisor (this script) starts a new `python -m processor` at once; it waits out the
  dead driver's lease (`FLEETFENCE_PROCESSOR_LEASE_TTL_MS`), starts Spark and restores the state;
- warm: a standby (`--standby`) has Spark and its Python workers up and takes over when the lease
  expires; a new standby is started behind it and is warm before the next kill;
- hot: two hot drivers (`--hot`), each running the job on its own checkpoint; the standby's next
  batch after it takes the lease commits live; the killed driver is restarted (on its own
  checkpoint) as the next standby and has caught up before the next kill;
- `warm-ttl1000` (or `cold-ttl…`, `hot-ttl…`): the same with its own lease ttl, side by side in the same run.
Every run ends by checking the alerts against the pure engine over everything produced: lost and
duplicated must both be 0. Prints a table (p50/p99/max per mode, the ratio) and records it in
docs/bench-log/failover.md with --record.
"""

from __future__ import annotations

import argparse
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np
import orjson
import pandas as pd
from rich.console import Console
from rich.table import Table

from bench.common import BENCH_LOG, write_section
from embedded import infra
from fleetfence.contracts import master_key, utc_now_ms
from fleetfence.geo import LocalProjection
from fleetfence.kafka import committed_reader, ensure_topics, idempotent_producer, topic_specs
from fleetfence.service import stop_process_group
from fleetfence.settings import Settings
from fleetfence.testing import wait_for
from processor.core.columns import empty_states
from processor.core.engine import process_bucket
from processor.core.master import Catalog, MasterState
from processor.settings import ProcessorSettings

console = Console()
LINE = [[13.0, 52.5], [13.2, 52.5]]  # ~13.6 km east-west
PROJ = LocalProjection(13.1, 52.5)


def master_events(vehicles: int) -> list[dict[str, Any]]:
    route = {
        "route_id": "r1",
        "name": "failover",
        "geometry": {"type": "LineString", "coordinates": LINE},
        "corridor_width_m": 100,
        "speed_limit_kmh": 200,
        "deviation_min_fixes": 2,
        "silent_after_s": 3600,
    }
    ev: list[dict[str, Any]] = [{"entity": "route", "id": "r1", "version": 1, "op": "upsert", "data": route}]
    for v in range(vehicles):
        data = {"vehicle_id": f"f{v:04d}", "route_id": "r1", "valid_from_ms": 0, "valid_to_ms": None}
        ev.append({"entity": "assignment", "id": f"f{v:04d}", "version": 1, "op": "upsert", "data": data})
    return ev


@dataclass
class Stream:
    """The steady telemetry stream: every fix produced, with the wall time it was handed over."""

    s: Settings
    vehicles: int
    cycle_s: int
    fixes: list[dict[str, Any]] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)

    def fix(self, v: int, seq: int) -> dict[str, Any]:
        # Along the line at 20 m/s; out of the corridor for 3 fixes of every cycle (staggered).
        x = -6000.0 + (seq * 20.0) % 12000.0
        phase = (seq + v * 7) % self.cycle_s
        y = 300.0 if phase < 3 else 0.0
        lon, lat = PROJ.inverse(np.array([x]), np.array([y]))
        now = utc_now_ms()
        return {
            "vehicle_id": f"f{v:04d}",
            "seq": seq,
            "ts_ms": now,
            "lat": float(lat[0]),
            "lon": float(lon[0]),
            "speed_kmh": 72.0,
            "received_ms": now,
        }

    def run(self) -> None:
        p = idempotent_producer(self.s.bootstrap_servers, **{"linger.ms": 5})
        seq = 0
        next_tick = time.monotonic()
        while not self.stop.is_set():
            for v in range(self.vehicles):
                f = self.fix(v, seq)
                p.produce(self.s.topics.telemetry, key=f["vehicle_id"].encode(), value=orjson.dumps(f))
                self.fixes.append(f)
            p.poll(0)
            seq += 1
            next_tick += 1.0
            self.stop.wait(max(next_tick - time.monotonic(), 0))
        p.flush(30)


class AlertClock:
    """Every committed alert, with the wall time a read_committed consumer first saw it."""

    def __init__(self, s: Settings) -> None:
        self.seen: list[tuple[float, dict[str, Any]]] = []
        self.stop = threading.Event()
        self.c = committed_reader(
            s.bootstrap_servers, f"failover-{os.getpid()}", **{"auto.offset.reset": "earliest"}
        )
        self.c.subscribe([s.topics.alerts])

    def first_after(self, killed_ms: float) -> Callable[[], float | None]:
        """A check: ms from the kill to the first alert seen of a fix published after it."""

        def check() -> float | None:
            for seen_ms, a in list(self.seen):
                if seen_ms > killed_ms and a.get("trigger_received_ms", 0) > killed_ms:
                    return seen_ms - killed_ms
            return None

        return check

    def run(self) -> None:
        while not self.stop.is_set():
            for m in self.c.consume(500, 0.05):
                if m.error() is None and m.value():
                    self.seen.append((time.time() * 1000, orjson.loads(m.value())))
        self.c.close()


def spawn(ps: ProcessorSettings, log: Path, standby: bool, hot_name: str = "") -> subprocess.Popen[bytes]:
    """A driver process: plain, a warm standby, or (with `hot_name`) the hot driver of that name."""
    env = {
        **os.environ,
        **{
            f"FLEETFENCE_{k.upper()}": str(v)
            for k, v in ps.model_dump(exclude={"topics"}).items()
            if v is not None
        },
        "FLEETFENCE_PROCESSOR_STANDBY": str(standby).lower(),
        "FLEETFENCE_PROCESSOR_METRICS_PORT": "0",
        "FLEETFENCE_PROCESSOR_HOT": str(bool(hot_name)).lower(),
        **({"FLEETFENCE_PROCESSOR_DRIVER_NAME": hot_name} if hot_name else {}),
    }
    return subprocess.Popen(
        [sys.executable, "-m", "processor"],
        env=env,
        stdout=log.open("ab"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )


def ready(log: Path, text: str = "standby ready") -> Callable[[], bool]:
    """A check: the standby logging to `log` has Spark and its Python workers up (a hot one: has
    committed a shadow batch)."""
    return lambda: log.exists() and text in log.read_text(errors="replace")


HOT_READY = "role=shadow"


def caught_up(log: Path, batches: int = 3) -> Callable[[], bool]:
    """A check: the hot standby logging to `log` has committed `batches` shadow batches: the first
    after its start reads its whole backlog (up to the batch cap), the ones after it the stream."""
    return lambda: log.exists() and log.read_text(errors="replace").count(HOT_READY) >= batches


def expected_ids(fixes: list[dict[str, Any]], vehicles: int, ps: ProcessorSettings) -> set[str]:
    m = MasterState.of(master_events(vehicles))
    cfg = ps.engine_config()
    r = process_bucket(empty_states(), {}, m, pd.DataFrame(fixes), 0, cfg, Catalog(cfg))
    return {a.alert_id for a in r.alerts}


PHASES = {
    "lease": "lease acquired",
    "query": "processor started",
    "first_batch": "first batch after start",
}
# A hot driver's query runs before the kill: its takeover is the lease, then its first live batch.
HOT_PHASES = {"lease": "lease acquired", "first_batch": "role=live"}


def takeover_phases(log: Path, killed_ms: float, phases: dict[str, str] = PHASES) -> dict[str, float] | None:
    """Seconds from the kill to each step of the takeover in the new driver's log (lease, query
    started, first batch done) and that first batch's own phases (ms), once they are all there."""
    if not log.exists():
        return None
    out: dict[str, float] = {}
    for line in log.read_text(errors="replace").splitlines():
        if not line.startswith("ts="):
            continue
        at = datetime.fromisoformat(line[3 : line.index(" ")]).timestamp() * 1000
        for key, text in phases.items():
            if text in line and at >= killed_ms and key not in out:
                out[key] = (at - killed_ms) / 1000
                if key == "first_batch":  # its phases: `addBatch_ms=1234` and the like
                    for name, _, value in (w.partition("=") for w in line.split()):
                        if name.endswith("_ms") and value.isdigit():
                            out["batch." + name.removesuffix("_ms")] = float(value)
    return out if all(k in out for k in phases) else None


def parse_mode(spec: str, default_ttl_ms: int) -> tuple[str, str, int]:
    """`cold`, `warm`, `hot`, or one with its own lease, `warm-ttl1000`: (name, kind, lease ttl ms)."""
    kind, _, ttl = spec.partition("-ttl")
    if kind not in ("cold", "warm", "hot") or (ttl and not ttl.isdigit()):
        raise SystemExit(f"mode {spec!r}: cold, warm or hot, optionally -ttl<ms> (e.g. warm-ttl1000)")
    return spec, kind, int(ttl) if ttl else default_ttl_ms


@dataclass
class Harness:
    """One mode's steady stream, its alert clock and the driver processes it started."""

    stream: Stream
    clock: AlertClock
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)
    threads: list[threading.Thread] = field(default_factory=list)

    @classmethod
    def start(cls, s: Settings, args: argparse.Namespace) -> Harness:
        h = cls(Stream(s, args.vehicles, args.cycle_s), AlertClock(s))
        h.threads = [threading.Thread(target=t.run, daemon=True) for t in (h.stream, h.clock)]
        for t in h.threads:
            t.start()
        return h

    def verdict(
        self,
        mode: str,
        ttl_ms: int,
        takeovers: list[float],
        phases: list[dict[str, float]],
        ps: ProcessorSettings,
    ) -> dict[str, Any]:
        """Stop the stream, wait for every alert the pure engine expects, and count what was lost,
        duplicated or unexpected."""
        self.stream.stop.set()
        self.threads[0].join(30)
        want = expected_ids(self.stream.fixes, self.stream.vehicles, ps)
        seen = self.clock.seen
        wait_for(lambda: {a["alert_id"] for _, a in seen} >= want, 300, f"{mode}: every expected alert")
        got = [a["alert_id"] for _, a in seen]
        return {
            "mode": mode,
            "lease_ttl_ms": ttl_ms,
            "takeover_s": takeovers,
            "phases": phases,
            "expected": len(want),
            "lost": len(want - set(got)),
            "duplicated": len(got) - len(set(got)),
            "unexpected": len(set(got) - want),
        }

    def close(self) -> None:
        self.stream.stop.set()
        self.clock.stop.set()
        for proc in self.procs:
            stop_process_group(proc)


def run_mode(spec: str, args: argparse.Namespace, base: Settings, work: Path) -> dict[str, Any]:
    mode, kind, ttl_ms = parse_mode(spec, args.lease_ttl_ms)
    if kind == "hot":
        return run_hot(mode, ttl_ms, args, base, work)
    warm = kind == "warm"
    s, ps = mode_setup(mode, ttl_ms, args, base, work)
    logs = (work / mode / f"processor-{n}.log" for n in range(1000))
    h = Harness.start(s, args)
    clock, procs = h.clock, h.procs
    rng = random.Random(args.seed)
    active_log = next(logs)
    active = spawn(ps, active_log, standby=False)
    procs.append(active)
    standby_log = next(logs)
    standby = spawn(ps, standby_log, standby=True) if warm else None
    if standby is not None:
        procs.append(standby)
    takeovers: list[float] = []
    phases: list[dict[str, float]] = []
    try:
        wait_for(lambda: len(clock.seen) > 0, 300, f"{mode}: the first alert")
        for k in range(args.kills):
            if standby is not None:
                wait_for(ready(standby_log), 300, f"{mode}: the standby to be warm")
            # A random moment of steady running: alerts flowing from the active driver.
            time.sleep(rng.uniform(args.min_gap_s, args.max_gap_s))
            killed_ms = time.time() * 1000
            os.killpg(active.pid, signal.SIGKILL)
            active.wait(30)
            if standby is not None:
                active, active_log = standby, standby_log
            else:
                active_log = next(logs)
                active = spawn(ps, active_log, standby=False)
            procs.append(active)
            took = wait_for(clock.first_after(killed_ms), 300, f"{mode}: the first alert after kill {k + 1}")
            takeovers.append(float(took) / 1000)
            logged = partial(takeover_phases, active_log, killed_ms)
            phases.append(wait_for(logged, 60, f"{mode}: the takeover's log lines"))
            if standby is not None:
                # The next standby starts once the takeover is done: on this one box it would
                # otherwise take the cores from the takeover (a real standby has a machine of its own).
                standby_log = next(logs)
                standby = spawn(ps, standby_log, standby=True)
                procs.append(standby)
            console.print(
                f"  {mode} kill {k + 1}/{args.kills}: first new alert after {float(took) / 1000:.2f} s"
            )
        return h.verdict(mode, ttl_ms, takeovers, phases, ps)
    finally:
        h.close()


def mode_setup(
    mode: str, ttl_ms: int, args: argparse.Namespace, base: Settings, work: Path
) -> tuple[Settings, ProcessorSettings]:
    """The mode's topics (with the fleet's master data) and its processor settings."""
    s = base.model_copy(update={"topic_prefix": f"{mode}."})
    ensure_topics(s.bootstrap_servers, topic_specs(s))
    p = idempotent_producer(s.bootstrap_servers)
    for e in master_events(args.vehicles):
        p.produce(s.topics.master, key=master_key(e["entity"], e["id"]), value=orjson.dumps(e))
    p.flush(30)
    ps = ProcessorSettings(
        **{
            **s.model_dump(exclude={"topics"}),
            "processor_checkpoint": str(work / mode / "cp"),
            "processor_buckets": 4,
            "processor_trigger_ms": 100,
            "processor_live_state": False,
            "redis_prefix": f"{mode}.ff:",
            "processor_spark_master": f"local[{args.cores}]",
            "processor_lease_ttl_ms": ttl_ms,
        }
    )
    (work / mode).mkdir(parents=True, exist_ok=True)
    return s, ps


def run_hot(mode: str, ttl_ms: int, args: argparse.Namespace, base: Settings, work: Path) -> dict[str, Any]:
    """Two hot drivers, `d0` and `d1`: kill the live one, measure, restart it as the standby."""
    s, ps = mode_setup(mode, ttl_ms, args, base, work)
    logs = (work / mode / f"processor-{n}.log" for n in range(1000))
    h = Harness.start(s, args)
    clock, procs = h.clock, h.procs
    rng = random.Random(args.seed)
    active_name, standby_name = "d0", "d1"
    active_log = next(logs)
    active = spawn(ps, active_log, standby=False, hot_name=active_name)
    procs.append(active)
    takeovers: list[float] = []
    phases: list[dict[str, float]] = []
    try:
        wait_for(ready(active_log, "hot driver is live"), 300, f"{mode}: the first driver to go live")
        standby_log = next(logs)
        standby = spawn(ps, standby_log, standby=False, hot_name=standby_name)
        procs.append(standby)
        wait_for(lambda: len(clock.seen) > 0, 300, f"{mode}: the first alert")
        for k in range(args.kills):
            wait_for(caught_up(standby_log), 300, f"{mode}: the standby to catch up")
            time.sleep(rng.uniform(args.min_gap_s, args.max_gap_s))
            killed_ms = time.time() * 1000
            os.killpg(active.pid, signal.SIGKILL)
            active.wait(30)
            killed = active_name
            active, active_log, active_name = standby, standby_log, standby_name
            took = wait_for(clock.first_after(killed_ms), 300, f"{mode}: the first alert after kill {k + 1}")
            takeovers.append(float(took) / 1000)
            logged = partial(takeover_phases, active_log, killed_ms, HOT_PHASES)
            phases.append(wait_for(logged, 60, f"{mode}: the takeover's log lines"))
            # The killed driver comes back on its own checkpoint as the next standby.
            standby_log, standby_name = next(logs), killed
            standby = spawn(ps, standby_log, standby=False, hot_name=standby_name)
            procs.append(standby)
            console.print(
                f"  {mode} kill {k + 1}/{args.kills}: first new alert after {float(took) / 1000:.2f} s"
            )
        return h.verdict(mode, ttl_ms, takeovers, phases, ps)
    finally:
        h.close()


def pct(xs: list[float], q: float) -> float:
    return float(np.percentile(xs, q)) if xs else float("nan")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kills", type=int, default=10)
    ap.add_argument("--vehicles", type=int, default=50)
    ap.add_argument("--cycle-s", type=int, default=12, help="each vehicle leaves its corridor once per cycle")
    ap.add_argument("--cores", type=int, default=2)
    ap.add_argument("--lease-ttl-ms", type=int, default=2000)
    ap.add_argument("--min-gap-s", type=float, default=8.0)
    ap.add_argument("--max-gap-s", type=float, default=20.0)
    ap.add_argument(
        "--modes",
        default="cold,warm,hot",
        help="comma-separated: cold, warm, hot, or e.g. warm-ttl1000 (own lease ttl)",
    )
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--record", action="store_true")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="ff-failover-"))
    base = Settings(**infra.private_fields(work / "state"))
    infra.up(base, create_topics=False)
    results = []
    try:
        for mode in args.modes.split(","):
            parse_mode(mode, args.lease_ttl_ms)  # refuse a bad one before the first run
        for mode in args.modes.split(","):
            console.print(f"[bold]{mode}[/]: {args.kills} kills under {args.vehicles} fixes/s")
            results.append(run_mode(mode, args, base, work))
    finally:
        infra.down(base)
    t = Table(
        title=f"failover: SIGKILL -> first committed alert of a fix published after it ({args.kills} kills)"
    )
    for col in ("mode", "p50 s", "p99 s", "max s", "mean s", "alerts", "lost", "duplicated", "unexpected"):
        t.add_column(col, justify="left" if col == "mode" else "right")
    for r in results:
        xs = r["takeover_s"]
        t.add_row(
            r["mode"],
            f"{pct(xs, 50):.2f}",
            f"{pct(xs, 99):.2f}",
            f"{max(xs):.2f}",
            f"{statistics.mean(xs):.2f}",
            str(r["expected"]),
            str(r["lost"]),
            str(r["duplicated"]),
            str(r["unexpected"]),
        )
    console.print(t)
    phase_lines = phase_table(results)
    for line in phase_lines:
        console.print(line)
    by = {r["mode"]: r for r in results}
    ratio = ""
    if "cold" in by:
        cold = pct(by["cold"]["takeover_s"], 50)
        ratio = ", ".join(
            f"{m} / cold restart, p50: {pct(by[m]['takeover_s'], 50) / cold:.2f}"
            for m in ("warm", "hot")
            if m in by
        )
        console.print(ratio)
    if args.record:
        cmd = "python bench/failover.py " + " ".join(sys.argv[1:])
        lines = [
            "## Failover: cold restart, warm standby, hot driver (bench/failover.py)",
            "",
            f"`{cmd}` on {datetime.now(UTC).date().isoformat()}: {args.vehicles} vehicles at 1 Hz, "
            f"local[{args.cores}], lease ttl {args.lease_ttl_ms} ms (a mode `-ttl<ms>` has its own), "
            f"{args.kills} SIGKILLs per mode at "
            f"random moments ({args.min_gap_s:.0f}-{args.max_gap_s:.0f} s apart); measured from the kill "
            "to the first committed alert of a fix published after it.",
            "",
            "| mode | p50 s | p99 s | max s | mean s | alerts | lost | duplicated | unexpected |",
            "|---|---|---|---|---|---|---|---|---|",
        ]
        for r in results:
            xs = r["takeover_s"]
            lines.append(
                f"| {r['mode']} | {pct(xs, 50):.2f} | {pct(xs, 99):.2f} | {max(xs):.2f} | "
                f"{statistics.mean(xs):.2f} | {r['expected']} | {r['lost']} | {r['duplicated']} | "
                f"{r['unexpected']} |"
            )
        lines += ["", ratio, ""] if ratio else [""]
        lines += [*phase_lines, ""]
        write_section("## Failover: cold restart, warm standby, hot driver", lines, BENCH_LOG / "failover.md")
    bad = [r for r in results if r["lost"] or r["duplicated"] or r["unexpected"]]
    sys.exit(1 if bad else 0)


def phase_table(results: list[dict[str, Any]]) -> list[str]:
    """Where a takeover's time goes (medians over the kills, from the new driver's log): seconds from
    the kill to the lease, to the query's start, to its first micro-batch done, and that batch's own
    phases in ms (Spark's durationMs)."""
    keys = ["lease", "query", "first_batch"]

    def median(ps: list[dict[str, float]], k: str, fmt: str) -> str:
        xs = [p[k] for p in ps if k in p]
        return format(statistics.median(xs), fmt) if xs else "-"

    extra = sorted({k for r in results for p in r["phases"] for k in p if k.startswith("batch.")})
    head = ["mode", "kill->lease s", "kill->query started s", "kill->first batch done s"] + [
        k.removeprefix("batch.") + " ms" for k in extra
    ]
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in results:
        ps = r["phases"]
        cells = [r["mode"]] + [median(ps, k, ".2f") for k in keys]
        cells += [median(ps, k, ",.0f") for k in extra]
        out.append("| " + " | ".join(cells) + " |")
    return out


if __name__ == "__main__":
    main()
