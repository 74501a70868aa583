"""The batch engine alone, route-awareness rules off vs on: where the time of the rules goes.

    .venv/bin/python -m bench.engine_rules [--vehicles 10000] [--fixes 120] [--batch 400000]
        [--buckets 4] [--rounds 3] [--profile on]

No Spark, no Kafka: `bench/processor.py`'s workload cut into the micro-batches and buckets its
Spark contender sees (`--batch` events in stream order, vehicles bucketed by `bucket_of`), each
bucket advanced by `processor.core.engine.process_bucket` exactly as the stateful operator calls it,
once with the master data of `--route-rules off` and once with `on` (bench/workload.py). Rounds
alternate the two, best of each (a shared box's neighbours only ever add time). Reported: the
engine's µs per fix in each mode after the first batch (where every vehicle is new and folded fix
by fix; the Spark contender is timed after its first third too) and their ratio, the first batch
apart, the vehicle-batches after the first taken by the fast path and folded by `domain.step`, and
the alerts by type (of the whole run). `--profile MODE` adds a cProfile of one more pass of that
mode after its first batch: the functions with the most own time.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np
from rich.console import Console
from rich.table import Table

from bench import workload as wl
from fleetfence.contracts import bucket_of
from processor.core.columns import Fixes, StateTable, empty_states
from processor.core.domain import EngineConfig, RawFix
from processor.core.engine import process_bucket
from processor.core.master import Catalog, MasterState

console = Console()
MODES = ("off", "on")


def batches(w: wl.Workload, batch: int, buckets: int) -> list[list[Fixes]]:
    """The workload as micro-batches of `batch` fixes in stream order, each cut into its buckets."""
    codes = {v: bucket_of(v, buckets) for v in set(w.vehicle.tolist())}
    bucket = np.fromiter((codes[v] for v in w.vehicle.tolist()), np.int64, len(w))
    out = []
    for a in range(0, len(w), batch):
        sl = slice(a, min(a + batch, len(w)))
        fx = Fixes(w.vehicle[sl], w.seq[sl], w.ts_ms[sl], w.lat[sl], w.lon[sl], w.speed_kmh[sl], w.ts_ms[sl])
        b = bucket[sl]
        out.append([fx.take(np.flatnonzero(b == k)) for k in range(buckets)])
    return out


def run(
    parts: list[list[Fixes]],
    master: MasterState,
    cfg: EngineConfig,
    lateness_ms: int,
    profile: cProfile.Profile | None = None,
) -> dict[str, Any]:
    """Every batch through every bucket, from empty state, with a fresh geometry catalog (compiled
    once per route, as a worker does); the engine's time alone, and what it decided. `profile` is
    enabled around the engine's calls after the first batch."""
    catalog = Catalog(cfg)
    n_buckets = len(parts[0]) if parts else 0
    states: list[StateTable] = [empty_states() for _ in range(n_buckets)]
    held: list[dict[str, list[RawFix]]] = [{} for _ in range(n_buckets)]
    # Compile the routes and the zone index before timing: a worker does it once per version.
    for rid in master.routes:
        v, data = master.routes[rid]
        if data is not None:
            catalog.route(rid, v, data)
    catalog.zone_index(master)
    alerts: Counter[str] = Counter()
    fast = slow = 0
    watermark = 0
    seconds: list[float] = []  # engine time per batch
    fixes: list[int] = []
    for part in parts:
        top = 0
        seconds.append(0.0)
        fixes.append(0)
        prof = profile if profile is not None and len(seconds) > 1 else None
        for k, fx in enumerate(part):
            if prof is not None:
                prof.enable()
            t = time.perf_counter()
            res = process_bucket(states[k], held[k], master, fx, watermark, cfg, catalog)
            seconds[-1] += time.perf_counter() - t
            if prof is not None:
                prof.disable()
            states[k], held[k] = res.states, res.held
            alerts.update(a.type.value for a in res.alerts)
            if len(seconds) > 1:
                fast += res.fast_vehicles
                slow += res.slow_vehicles
            fixes[-1] += res.accepted
            if len(fx):
                top = max(top, int(fx.ts_ms.max()))
        watermark = max(watermark, top - lateness_ms)
    # Steady: after the first batch, where every vehicle is new and folded fix by fix (Spark's
    # contender is timed after its first third too).
    steady = slice(1, None) if len(seconds) > 1 else slice(None)
    return {
        "seconds": sum(seconds[steady]),
        "fixes": sum(fixes[steady]),
        "first_us": seconds[0] / max(1, fixes[0]) * 1e6,
        "fast": fast,
        "slow": slow,
        "alerts": dict(alerts),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--vehicles", type=int, default=10000)
    ap.add_argument("--fixes", type=int, default=120, help="fixes per vehicle")
    ap.add_argument("--routes", type=int, default=300)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--batch", type=int, default=400_000, help="events per micro-batch")
    ap.add_argument("--buckets", type=int, default=4)
    ap.add_argument("--late-share", type=float, default=0.01, help="as in bench/processor.py")
    ap.add_argument("--rounds", type=int, default=3, help="alternating off/on rounds (best of each)")
    ap.add_argument("--profile", choices=MODES, help="cProfile one more pass of this mode")
    ap.add_argument("--top", type=int, default=25, help="profile lines to print")
    args = ap.parse_args()

    w = wl.build(args.vehicles, args.fixes, args.routes, seed=args.seed)
    parts = batches(w, args.batch, args.buckets)
    cfg = EngineConfig()
    masters = {m: MasterState.of(w.master_for(m, args.late_share)) for m in MODES}
    console.print(
        f"workload: {len(w):,} fixes, {args.vehicles:,} vehicles, {args.routes} routes; "
        f"{len(parts)} batches x {args.buckets} buckets"
    )
    best: dict[str, dict[str, Any]] = {}
    for r in range(args.rounds):
        for m in MODES if r % 2 == 0 else MODES[::-1]:
            res = run(parts, masters[m], cfg, cfg.lateness_ms)
            console.print(f"round {r + 1} {m}: {res['seconds'] / res['fixes'] * 1e6:.2f} µs/fix")
            if m not in best or res["seconds"] < best[m]["seconds"]:
                best[m] = res

    table = Table(title=f"batch engine alone, {len(w):,} fixes, best of {args.rounds} rounds, one core")
    for col in (
        "route rules",
        "µs/fix",
        "× off",
        "fixes/s",
        "first batch µs/fix",
        "vehicle-batches fast / folded",
        "alerts",
    ):
        table.add_column(col)
    base = best["off"]["seconds"]
    for m in MODES:
        b = best[m]
        table.add_row(
            m,
            f"{b['seconds'] / b['fixes'] * 1e6:.2f}",
            f"{b['seconds'] / base:.3f}",
            f"{b['fixes'] / b['seconds']:,.0f}",
            f"{b['first_us']:.2f}",
            f"{b['fast']:,} / {b['slow']:,}",
            ", ".join(f"{k} {v}" for k, v in sorted(b["alerts"].items())),
        )
    console.print(table)
    if args.profile:
        prof = cProfile.Profile()
        run(parts, masters[args.profile], cfg, cfg.lateness_ms, prof)
        out = io.StringIO()
        pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(args.top)
        console.print(out.getvalue(), markup=False, highlight=False)


if __name__ == "__main__":
    main()
