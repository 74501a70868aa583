"""Vehicle proximity's stages (processor.core.proximity) against the all-pairs check they replace.

    .venv/bin/python -m bench.proximity [--vehicles 10000] [--ticks 10] [--depot 500] [--record]

`--record` replaces its sections of docs/bench-log/proximity.md.

Two fleets, each reporting every 2 s (each vehicle at its own offset in the interval) for `--ticks`
intervals: `city`, the vehicles spread over 20 x 20 km (the common case: few neighbours per cell),
and `depot`, every vehicle within 300 m (the worst case: one cell and its ring hold the whole fleet,
so each fix meets every other vehicle). Timed on one core, in one run, side by side:
- the stages as the Spark query folds them, in columns: each interval's fixes fanned out to their
  buckets of cells, each bucket stepped (`CellWindow.step`), the meetings folded per bucket of pairs
  (`pairs_step`);
- the peer: the all-pairs check a stream keyed by nothing must make, each fix against every other
  vehicle's fixes within the tolerance, vectorised with numpy (haversine), timed on a sample of
  intervals.
Both must find the same meetings within the exit distance, or the run fails. The stages without
Spark against a vectorised peer: the ratio shows where the sharding wins (city) and what the worst case
costs (depot), not Spark's overhead, which bench/processor.py measures for the job.

Then rules per fleet group, on the city fleet (its vehicles in two groups, north and south, in
turn, as the vehicle master's data): the fleet's rule alone, against the fleet's rule with a rule
per group beside it (the same distances), and the group rules alone, each timed twice, alternating.
Each group rule must find exactly the fleet rule's meetings of two of its vehicles, or the run fails.
"""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass
from datetime import UTC, datetime

import numpy as np
import pandas as pd
from rich.console import Console
from rich.table import Table

from bench.common import BENCH_LOG, write_section
from fleetfence.geo import haversine_m
from fleetfence.rules import ProximityRule, ProximityScope
from processor.core.proximity import BucketedStages, HomedFixes, Position
from processor.core.proximity_members import Members

console = Console(width=150)
RULE = ProximityRule(
    "bench", enter_m=50, exit_m=80, min_duration_ms=10_000, tolerance_ms=2_000, lost_after_ms=60_000
)
T0 = 1_795_320_000_000
INTERVAL_MS = 2_000
BUCKETS = 8  # the query's default on 2 shuffle partitions (processor.spark.layout)
LAT0, LON0 = 52.40, 13.20
M_PER_DEG_LAT = 111_320.0
M_PER_DEG_LON = 111_320.0 * np.cos(np.radians(LAT0))


@dataclass
class Result:
    fleet: str
    vehicles: int
    fixes: int
    meetings_near: int
    stages_us: float  # per fix
    peer_us: float  # per fix
    state_fixes: int
    state_pairs: int


def intervals(vehicles: int, ticks: int, spread_m: float, seed: int) -> list[list[Position]]:
    """Each interval's fixes: vehicles moving up to 20 m an interval, each at its own offset."""
    rng = np.random.default_rng(seed)
    x = rng.uniform(0, spread_m, vehicles)
    y = rng.uniform(0, spread_m, vehicles)
    offset = rng.integers(0, INTERVAL_MS, vehicles)
    ids = [f"v{i:05d}" for i in range(vehicles)]
    out = []
    for k in range(ticks):
        x += rng.uniform(-20, 20, vehicles)
        y += rng.uniform(-20, 20, vehicles)
        lat = LAT0 + y / M_PER_DEG_LAT
        lon = LON0 + x / M_PER_DEG_LON
        ts = T0 + k * INTERVAL_MS + offset
        order = np.argsort(ts, kind="stable")
        out.append([Position(ids[i], k, int(ts[i]), float(lat[i]), float(lon[i]), 0.0) for i in order])
    return out


Meeting = tuple[str, str, int, float]  # (a, b, event time, distance_m rounded to the mm)


def run_stages(batches: list[list[Position]], buckets: int) -> tuple[float, set[Meeting], int, int]:
    """The stages over every interval, as the Spark query folds them (`BucketedStages`). Seconds,
    the meetings within exit_m, the fixes and the pairs kept at the end."""
    stages = BucketedStages((RULE,), buckets)
    near: set[Meeting] = set()
    watermark = 0
    t = time.perf_counter()
    for batch in batches:
        m, _rules, _events = stages.step(HomedFixes.from_positions(batch, stages.resolution), watermark)
        # Of a moment reported by two buckets, the one the pair stage takes (closest in time).
        taken = pd.DataFrame(m.columns()).sort_values(["a", "b", "ts_ms", "skew_ms"], kind="stable")
        taken = taken.drop_duplicates(["a", "b", "ts_ms"])
        taken = taken[taken["distance_m"] <= RULE.exit_m]
        for a, b_, ts, d in zip(
            taken["a"], taken["b"], taken["ts_ms"].tolist(), taken["distance_m"].tolist(), strict=True
        ):
            near.add((a, b_, ts, round(d, 3)))
        watermark = max(p.ts_ms for p in batch)
    kept = sum(len(w.kept) for cells in stages.cells for w in cells.windows.values())
    pairs = sum(len(states) for p in stages.pairs for states in p.states.values())
    return time.perf_counter() - t, near, kept, pairs


def run_peer(batches: list[list[Position]], sample: int) -> tuple[float, set[Meeting], int]:
    """All pairs: each fix against every fix of another vehicle within the tolerance (numpy, per
    fix: the previous interval's and the current one's so far), timed on `sample` intervals after
    the first. Of each other vehicle the fix closest in time counts (its latest: the stages report
    that one a moment, `CellWindow.step`), found by following the near hits to the same vehicle's
    later fixes. Seconds, the meetings within exit_m (of the timed intervals), fixes timed."""
    near: set[Meeting] = set()
    fixes = 0
    prev: list[Position] = []
    t = 0.0
    for n, batch in enumerate(batches[: sample + 1]):
        if n == 0:  # the first interval, untimed: every timed fix has a previous one to meet
            prev = batch
            continue
        start = time.perf_counter()
        window = prev + batch
        ids = np.array([p.vehicle_id for p in window])
        lat = np.array([p.lat for p in window])
        lon = np.array([p.lon for p in window])
        ts = np.array([p.ts_ms for p in window], dtype=np.int64)
        later = np.full(len(window), len(window), np.int64)  # the same vehicle's next fix
        last: dict[str, int] = {}
        for k in range(len(window) - 1, -1, -1):
            later[k] = last.get(window[k].vehicle_id, len(window))
            last[window[k].vehicle_id] = k
        for p in batch:
            # The fixes before this one and those at the same time (a moment is the later fix's).
            limit = int(np.searchsorted(ts, p.ts_ms, "right"))
            d = haversine_m(p.lon, p.lat, lon[:limit], lat[:limit])
            hit = np.flatnonzero((d <= RULE.exit_m) & (np.abs(p.ts_ms - ts[:limit]) <= RULE.tolerance_ms))
            for h in hit.tolist():
                if ids[h] == p.vehicle_id:
                    continue
                k = h
                while later[k] < limit:
                    k = int(later[k])
                dk = float(haversine_m(p.lon, p.lat, lon[k], lat[k]))
                if dk <= RULE.exit_m:
                    a, b = sorted((p.vehicle_id, str(ids[k])))
                    near.add((a, b, max(p.ts_ms, int(ts[k])), round(dk, 3)))
            fixes += 1
        t += time.perf_counter() - start
        prev = batch
    return t, near, fixes


def measure(fleet: str, vehicles: int, ticks: int, spread_m: float, peer_sample: int) -> Result:
    batches = intervals(vehicles, ticks, spread_m, seed=7)
    fixes = sum(map(len, batches))
    stages_s, near, cells, pairs = run_stages(batches, BUCKETS)
    peer_s, peer_near, peer_fixes = run_peer(batches, peer_sample)
    sampled_fixes = sum(len(b) for b in batches[1 : peer_sample + 1])
    # Both date a meeting at its later fix: on the timed intervals the two sets must be equal.
    lo, hi = batches[1][0].ts_ms, batches[peer_sample][-1].ts_ms
    mine = {m for m in near if lo <= m[2] <= hi}
    if mine != peer_near:
        raise SystemExit(
            f"{fleet}: the stages and the all-pairs check disagree on {len(mine ^ peer_near)} meetings"
        )
    assert peer_fixes == sampled_fixes
    return Result(
        fleet,
        vehicles,
        fixes,
        len(near),
        stages_s / fixes * 1e6,
        peer_s / peer_fixes * 1e6,
        cells,
        pairs,
    )


GROUPS = ("north", "south")


def group_members(batches: list[list[Position]]) -> Members:
    """Each vehicle's group (GROUPS in turn, by its number), as the vehicle master's events give it."""
    members = Members()
    ids = sorted({p.vehicle_id for p in batches[0]})
    for i, vid in enumerate(ids):
        data = {"vehicle_id": vid, "label": vid, "attributes": {"group": GROUPS[i % len(GROUPS)]}}
        members.apply({"entity": "vehicle", "id": vid, "version": 1, "op": "upsert", "data": data})
    return members


def run_rules(
    batches: list[list[Position]], rules: tuple[ProximityRule, ...], members: Members
) -> tuple[float, dict[str, set[tuple[str, str, int]]]]:
    """The stages with `rules` over every interval: seconds, and each rule's meetings (a, b, moment)."""
    stages = BucketedStages(rules, BUCKETS, members)
    found: dict[str, set[tuple[str, str, int]]] = {r.rule_id: set() for r in rules}
    watermark = 0
    t = time.perf_counter()
    for batch in batches:
        m, rule_ids, _events = stages.step(HomedFixes.from_positions(batch, stages.resolution), watermark)
        for rule, a, b, ts in zip(
            rule_ids.tolist(), m.a.tolist(), m.b.tolist(), m.ts_ms.tolist(), strict=True
        ):
            found[rule].add((a, b, ts))
        watermark = max(p.ts_ms for p in batch)
    return time.perf_counter() - t, found


def measure_rules(vehicles: int, ticks: int) -> list[tuple[str, ...]]:
    """The fleet's rule alone, with a rule per group, and the group rules alone (table rows)."""
    batches = intervals(vehicles, ticks, 20_000, seed=7)
    fixes = sum(map(len, batches))
    members = group_members(batches)
    groups = tuple(
        ProximityRule(
            g,
            RULE.enter_m,
            RULE.exit_m,
            RULE.min_duration_ms,
            RULE.tolerance_ms,
            RULE.lost_after_ms,
            ProximityScope(group=g),
        )
        for g in GROUPS
    )
    variants = {
        "the fleet's": (RULE,),
        "the fleet's + one per group": (RULE, *groups),
        "one per group": groups,
    }
    best: dict[str, float] = {}
    meetings: dict[str, dict[str, set[tuple[str, str, int]]]] = {}
    for _ in range(2):
        for name, rules in variants.items():
            s, meetings[name] = run_rules(batches, rules, members)
            best[name] = min(best.get(name, s), s)
    fleet = meetings["the fleet's"][RULE.rule_id]
    group_of = {
        vid: GROUPS[i % len(GROUPS)] for i, vid in enumerate(sorted({p.vehicle_id for p in batches[0]}))
    }
    for name, found in meetings.items():
        for g in GROUPS:
            if g in found and found[g] != {m for m in fleet if group_of[m[0]] == group_of[m[1]] == g}:
                raise SystemExit(f"{name}: group {g}'s meetings are not the fleet rule's of its vehicles")
        if RULE.rule_id in found and found[RULE.rule_id] != fleet:
            raise SystemExit(f"{name}: the fleet rule's meetings changed beside other rules")
    base = best["the fleet's"]
    return [
        (
            name,
            str(len(variants[name])),
            f"{best[name] / fixes * 1e6:,.1f}",
            f"{best[name] / base:,.2f}×",
            ", ".join(f"{r}: {len(v):,}" for r, v in meetings[name].items()),
        )
        for name in variants
    ]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--vehicles", type=int, default=10_000)
    ap.add_argument("--ticks", type=int, default=10)
    ap.add_argument("--depot", type=int, default=500, help="vehicles in the worst-case fleet")
    ap.add_argument("--peer-sample", type=int, default=2, help="intervals the all-pairs peer is timed on")
    ap.add_argument("--record", action="store_true")
    args = ap.parse_args()
    results = [
        measure("city", args.vehicles, args.ticks, 20_000, args.peer_sample),
        measure("depot", args.depot, args.ticks, 300, args.peer_sample),
    ]
    table = Table(
        title=f"proximity: the H3 stages against all pairs (enter {RULE.enter_m:g} m, exit {RULE.exit_m:g} m)"
    )
    for col in (
        "fleet",
        "vehicles",
        "fixes",
        "meetings ≤ exit",
        "stages µs/fix",
        "all pairs µs/fix",
        "all pairs / stages",
        "fixes, pairs kept",
    ):
        table.add_column(col, justify="right")
    rows = []
    for r in results:
        row = (
            r.fleet,
            f"{r.vehicles:,}",
            f"{r.fixes:,}",
            f"{r.meetings_near:,}",
            f"{r.stages_us:,.1f}",
            f"{r.peer_us:,.1f}",
            f"{r.peer_us / r.stages_us:,.2f}×",
            f"{r.state_fixes:,}, {r.state_pairs:,}",
        )
        rows.append(row)
        table.add_row(*row)
    console.print(table)
    rule_rows = measure_rules(args.vehicles, args.ticks)
    rules_table = Table(
        title=f"proximity rules per fleet group: {args.vehicles:,} vehicles in {len(GROUPS)} groups"
    )
    for col in ("rules", "count", "stages µs/fix", "against the fleet's alone", "meetings per rule"):
        rules_table.add_column(col, justify="right")
    for rule_row in rule_rows:
        rules_table.add_row(*rule_row)
    console.print(rules_table)
    if args.record:
        now = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
        cmd = (
            f".venv/bin/python -m bench.proximity --vehicles {args.vehicles} --ticks {args.ticks} "
            f"--depot {args.depot} --peer-sample {args.peer_sample} --record"
        )
        lines = [
            "## Proximity stages (bench/proximity.py)",
            "",
            f"Recorded {now}. `{cmd}` (one core; the peer timed on {args.peer_sample} intervals, "
            "after an untimed first)",
            "",
            "| " + " | ".join(c.header for c in table.columns) + " |",  # type: ignore[misc]
            "|" + "---|" * len(table.columns),
            *("| " + " | ".join(r) + " |" for r in rows),
            "",
            "Both find the same meetings within the exit distance on the peer's timed intervals.",
        ]
        write_section("## Proximity stages", lines, BENCH_LOG / "proximity.md")
        lines = [
            "## Proximity rules per fleet group (bench/proximity.py)",
            "",
            f"Recorded {now}. `{cmd}` (one core; the city fleet, each variant timed twice, the best kept)",
            "",
            "| " + " | ".join(c.header for c in rules_table.columns) + " |",  # type: ignore[misc]
            "|" + "---|" * len(rules_table.columns),
            *("| " + " | ".join(r) + " |" for r in rule_rows),
            "",
            "Each group rule finds exactly the fleet rule's meetings of two of its vehicles; the fleet "
            "rule finds the same meetings beside them.",
        ]
        write_section("## Proximity rules per fleet group", lines, BENCH_LOG / "proximity.md")


if __name__ == "__main__":
    main()
