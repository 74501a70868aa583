"""History reports: SedonaDB vs a plain Shapely/pandas implementation, over a synthetic archive.

Generates (once per parameter set, reused afterwards) a GeoParquet archive in the layout of
history/schema.py under /tmp: `--vehicles` vehicles x `--fixes` fixes (default 2,000 x 5,000 =
10M), on `--routes` routes around Berlin, with off-route excursions, speeding episodes and zones
(depots at route starts, customer sites along the routes). Then times each report with both
engines in the same run and prints a table with the ratios.

    .venv/bin/python bench/reports.py                      # 10M fixes
    .venv/bin/python bench/reports.py --vehicles 200       # 1M fixes, quick
    .venv/bin/python bench/reports.py --record             # also write docs/bench-log/reports.md

Memory: the baseline holds the columns it needs for the whole range (~60 bytes per fix, ~0.6 GB
at 10M plus temporaries) and SedonaDB materialises the enriched fixes once (~1.2 GB at 10M); the
peak RSS of the run is printed. Both fit easily in this box's 24 GiB, so neither is split per
partition.
"""

from __future__ import annotations

import argparse
import gc
import hashlib
import json
import math
import os
import resource
import shutil
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import shapely
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.common import BENCH_LOG, write_section  # noqa: E402
from fleetfence.geo import LocalProjection  # noqa: E402
from history.report_inputs import ReportRange  # noqa: E402
from history.reports import REPORTS, SedonaReports  # noqa: E402
from history.reports_baseline import BaselineReports  # noqa: E402
from history.schema import TELEMETRY_SCHEMA, points_wkb  # noqa: E402
from history.synthetic import write_master, write_telemetry_partitioned  # noqa: E402

CENTER_LON, CENTER_LAT = 13.40, 52.52
START_MS = 1_795_305_600_000  # 2026-11-22 00:00 UTC
DAY_MS = 86_400_000
FIX_INTERVAL_MS = 5_000
CORRIDOR_WIDTH_M = 100.0
SPEED_LIMIT_KMH = 50.0
DAY_FIXES = 5_000  # fixes per vehicle per day at most: ~7 h of driving, no run crosses midnight
CHUNK_VEHICLES = 200


def _routes(n: int, rng: np.random.Generator) -> list[list[list[float]]]:
    """Random-walk polylines of ~25 km in metres around the centre, as lon/lat coordinates."""
    proj = LocalProjection(CENTER_LON, CENTER_LAT)
    out = []
    for _ in range(n):
        start = rng.uniform(-15_000, 15_000, 2)
        heading = rng.uniform(0, 2 * math.pi)
        pts = [start]
        for _ in range(24):
            heading += rng.normal(0, 0.4)
            pts.append(pts[-1] + 1_000 * np.array([math.cos(heading), math.sin(heading)]))
        xy = np.array(pts)
        lon, lat = proj.inverse(xy[:, 0], xy[:, 1])
        out.append([[float(a), float(b)] for a, b in zip(lon, lat, strict=True)])
    return out


def _zones(routes: list[list[list[float]]], rng: np.random.Generator) -> list[dict[str, Any]]:
    """A depot at each route's start and two customer sites along it: ~300 m squares."""
    zones = []
    for i, coords in enumerate(routes):
        for k, where in enumerate((0, 8, 16)):
            lon, lat = coords[where]
            proj = LocalProjection(lon, lat)
            half = 150.0 if k == 0 else 100.0
            sq = shapely.box(-half, -half, half, half)
            poly = proj.to_lonlat(sq)
            zones.append(
                {"zone_id": f"z{i:03d}-{k}", "kind": "depot" if k == 0 else "customer", "poly": poly}
            )
    return zones


def master_events(
    routes: list[list[list[float]]], zones: list[dict[str, Any]], vehicles: int
) -> list[dict[str, Any]]:
    ts = START_MS - DAY_MS
    rows: list[dict[str, Any]] = []
    for i, coords in enumerate(routes):
        data = {
            "route_id": f"r{i:03d}",
            "name": f"route {i}",
            "geometry": {"type": "LineString", "coordinates": coords},
            "corridor_width_m": CORRIDOR_WIDTH_M,
            "speed_limit_kmh": SPEED_LIMIT_KMH,
        }
        rows.append({"entity": "route", "id": f"r{i:03d}", "version": 1, "data": data, "event_ts_ms": ts})
    for z in zones:
        data = {
            "zone_id": z["zone_id"],
            "name": z["zone_id"],
            "kind": z["kind"],
            "geometry": shapely.geometry.mapping(z["poly"]),
        }
        rows.append({"entity": "zone", "id": z["zone_id"], "version": 1, "data": data, "event_ts_ms": ts})
    for v in range(vehicles):
        vid = f"v{v:05d}"
        data = {
            "vehicle_id": vid,
            "route_id": f"r{v % len(routes):03d}",
            "valid_from_ms": 0,
            "valid_to_ms": None,
        }
        rows.append({"entity": "assignment", "id": vid, "version": 1, "data": data, "event_ts_ms": ts})
    return rows


def _chunk(
    v0: int, v1: int, fixes: int, routes_m: list[shapely.LineString], n_routes: int, rng: np.random.Generator
) -> pa.Table:
    """Fixes of vehicles v0..v1-1: driving back and forth along the route, with excursions."""
    nv = v1 - v0
    days = math.ceil(fixes / DAY_FIXES)
    k = np.arange(fixes)
    day = k // DAY_FIXES
    ts = (
        START_MS
        + day[None, :] * DAY_MS
        + 5 * 3_600_000
        + rng.integers(0, 3_600_000, (nv, days))[:, day]
        + (k % DAY_FIXES)[None, :] * FIX_INTERVAL_MS
    )
    speed = np.clip(rng.normal(35, 5, (nv, fixes)), 0, None)
    # Speeding episodes: ~3 per vehicle, 6..40 fixes long, 55..90 km/h.
    for _ in range(3):
        s = rng.integers(0, fixes - 50, nv)
        ln = rng.integers(6, 40, nv)
        idx = s[:, None] + np.arange(40)[None, :]
        mask = np.arange(40)[None, :] < ln[:, None]
        rows = np.repeat(np.arange(nv), 40).reshape(nv, 40)
        speed[rows[mask], idx[mask]] = rng.uniform(55, 90, mask.sum())
    step_m = speed * FIX_INTERVAL_MS / 3_600_000 * 1000
    dist = np.cumsum(step_m, axis=1)
    lon = np.empty((nv, fixes))
    lat = np.empty((nv, fixes))
    for j in range(nv):
        r = (v0 + j) % n_routes
        line = routes_m[r]
        length = line.length
        along = np.abs(((dist[j] + rng.uniform(0, length)) % (2 * length)) - length)  # ping-pong
        pts = shapely.line_interpolate_point(line, along)
        x, y = shapely.get_coordinates(pts).T
        # Off-route excursions: ~4 per vehicle, 10..60 fixes, 80..400 m sideways.
        off = np.zeros(fixes)
        for _ in range(4):
            start = int(rng.integers(0, fixes - 60))
            off[start : start + int(rng.integers(10, 60))] = rng.uniform(80, 400)
        ang = rng.uniform(0, 2 * math.pi)
        x = x + off * math.cos(ang) + rng.normal(0, 5, fixes)
        y = y + off * math.sin(ang) + rng.normal(0, 5, fixes)
        lon[j], lat[j] = LocalProjection(CENTER_LON, CENTER_LAT).inverse(x, y)
    vid = np.repeat(np.array([f"v{v:05d}" for v in range(v0, v1)], dtype=object), fixes)
    ts_flat = ts.ravel().astype(np.int64)
    lon_f, lat_f = lon.ravel(), lat.ravel()
    return pa.table(
        {
            "vehicle_id": pa.array(vid, type=pa.string()),
            "seq": pa.array(np.tile(k, nv).astype(np.int64)),
            "ts_ms": pa.array(ts_flat),
            "ts": pa.array(ts_flat, type=pa.timestamp("ms", tz="UTC")),
            "lat": pa.array(lat_f),
            "lon": pa.array(lon_f),
            "speed_kmh": pa.array(speed.ravel()),
            "heading_deg": pa.nulls(nv * fixes, pa.float64()),
            "accuracy_m": pa.array(np.full(nv * fixes, 5.0)),
            "received_ms": pa.array(ts_flat + 50),
            "geometry": points_wkb(lon_f, lat_f),
        },
        schema=TELEMETRY_SCHEMA,
    )


def generate(
    root: Path, vehicles: int, fixes: int, n_routes: int, buckets: int, seed: int, console: Console
) -> None:
    """Write the archive unless `root/.done` says it is complete for these parameters."""
    params = {"vehicles": vehicles, "fixes": fixes, "routes": n_routes, "buckets": buckets, "seed": seed}
    done = root / ".done"
    if done.exists() and json.loads(done.read_text()) == params:
        console.print(f"reusing archive {root}")
        return
    shutil.rmtree(root, ignore_errors=True)
    rng = np.random.default_rng(seed)
    routes = _routes(n_routes, rng)
    zones = _zones(routes, rng)
    proj = LocalProjection(CENTER_LON, CENTER_LAT)
    routes_m = [proj.to_metric(shapely.LineString(c)) for c in routes]
    write_master(root, master_events(routes, zones, vehicles))
    with Progress(console=console) as prog:
        task = prog.add_task(f"generating {vehicles * fixes:,} fixes", total=vehicles * fixes)
        for c, v0 in enumerate(range(0, vehicles, CHUNK_VEHICLES)):
            v1 = min(vehicles, v0 + CHUNK_VEHICLES)
            table = _chunk(v0, v1, fixes, routes_m, n_routes, rng)
            write_telemetry_partitioned(table, root, buckets, f"part-{c:05d}.parquet")
            prog.advance(task, table.num_rows)
            del table
            gc.collect()
    done.write_text(json.dumps(params))


def _rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _time(fn: Any) -> tuple[float, Any]:
    t0 = time.perf_counter()
    out = fn()
    return time.perf_counter() - t0, out


def run(root: Path, rng: ReportRange, buckets: int, console: Console) -> list[dict[str, Any]]:
    """Time the shared fix enrichment and each report, per engine; check both give equal tables."""
    results: list[dict[str, Any]] = []
    sed = SedonaReports(root, rng, buckets)
    base = BaselineReports(root, rng, buckets)
    t_sed, _ = _time(sed.prepare)
    t_base, _ = _time(base.prepare)
    results.append(
        {
            "report": "prepare (enrich fixes)",
            "sedonadb_s": t_sed,
            "baseline_s": t_base,
            "rows": None,
            "agree": "",
        }
    )
    for name in REPORTS:
        ts_, out_s = _time(getattr(sed, name))
        tb_, out_b = _time(getattr(base, name))
        try:
            pd.testing.assert_frame_equal(out_s, out_b, check_dtype=False, rtol=1e-9)
            agree = "yes"
        except AssertionError as exc:
            agree = "NO"
            console.print(f"[red]{name}: the engines disagree[/] {str(exc)[:300]}")
        results.append(
            {
                "report": name,
                "sedonadb_s": ts_,
                "baseline_s": tb_,
                "rows": len(out_s),
                "rows_baseline": len(out_b),
                "agree": agree,
            }
        )
        console.print(
            f"{name}: sedonadb {ts_:.2f}s ({len(out_s)} rows), baseline {tb_:.2f}s ({len(out_b)} rows), "
            f"equal: {agree}"
        )
    return results


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--vehicles", type=int, default=2_000)
    ap.add_argument("--fixes", type=int, default=5_000, help="fixes per vehicle")
    ap.add_argument("--routes", type=int, default=100)
    ap.add_argument("--buckets", type=int, default=16)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--dir", type=Path, default=None, help="archive folder (default under /tmp)")
    ap.add_argument("--record", action="store_true", help="write the section of docs/bench-log/reports.md")
    args = ap.parse_args()
    console = Console()
    key = hashlib.sha1(
        f"{args.vehicles}-{args.fixes}-{args.routes}-{args.buckets}-{args.seed}".encode()
    ).hexdigest()
    root = args.dir or Path("/tmp") / f"fleetfence-bench-reports-{key[:10]}"
    t0 = time.perf_counter()
    generate(root, args.vehicles, args.fixes, args.routes, args.buckets, args.seed, console)
    gen_s = time.perf_counter() - t0
    days = math.ceil(args.fixes / DAY_FIXES) + 1
    rng = ReportRange(START_MS, START_MS + days * DAY_MS)
    load_before = os.getloadavg()
    results = run(root, rng, args.buckets, console)
    load_after = os.getloadavg()
    table = Table(title=f"History reports over {args.vehicles * args.fixes:,} fixes")
    for col in ("report", "SedonaDB s", "Shapely/pandas s", "baseline / SedonaDB", "rows", "equal"):
        table.add_column(col)
    for r in results:
        table.add_row(
            r["report"],
            f"{r['sedonadb_s']:.2f}",
            f"{r['baseline_s']:.2f}",
            f"{r['baseline_s'] / r['sedonadb_s']:.2f}x",
            "" if r["rows"] is None else f"{r['rows']:,} / {r['rows_baseline']:,}",
            r["agree"],
        )
    console.print(table)
    console.print(
        f"archive ready in {gen_s:.1f}s; load average before {load_before[0]:.2f}, "
        f"after {load_after[0]:.2f}; peak RSS {_rss_mib():,.0f} MiB"
    )
    if args.record:
        record(args, results, load_before, load_after)


def record(args: argparse.Namespace, results: list[dict[str, Any]], before: Any, after: Any) -> None:
    """Replace (or add) the `## History reports` section of the log; other sections stay untouched."""
    header = "## History reports (bench/reports.py)"
    cmd = (
        f".venv/bin/python bench/reports.py --vehicles {args.vehicles} --fixes {args.fixes} "
        f"--routes {args.routes}"
    )
    lines = [
        header,
        "",
        f"Run {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}: `{cmd} --record`. "
        f"{args.vehicles * args.fixes:,} fixes ({args.vehicles:,} vehicles x {args.fixes:,}) on "
        f"{args.routes} routes, GeoParquet partitioned by date and {args.buckets} buckets. Each report "
        "reads the archive, applies master data as of each fix and computes the report; `prepare` is "
        "the shared part (read + route/corridor test per fix), timed once, reused by the four reports. "
        "SedonaDB 0.5.0 vs Shapely 2 + pandas (processor/core/geometry.py's corridors, contains_xy), "
        f"2 cores shared with other work: load average {before[0]:.2f} before, {after[0]:.2f} after.",
        "",
        "| report | SedonaDB s | Shapely/pandas s | baseline / SedonaDB | rows (SedonaDB / baseline) "
        "| equal |",
        "|---|---|---|---|---|---|",
    ]
    for r in results:
        rows = "" if r["rows"] is None else f"{r['rows']:,} / {r['rows_baseline']:,}"
        lines.append(
            f"| {r['report']} | {r['sedonadb_s']:.2f} | {r['baseline_s']:.2f} | "
            f"{r['baseline_s'] / r['sedonadb_s']:.2f}x | {rows} | {r['agree']} |"
        )
    tot_s = sum(r["sedonadb_s"] for r in results)
    tot_b = sum(r["baseline_s"] for r in results)
    lines += [
        "",
        f"Ratios above 1 mean SedonaDB is faster. Everything (prepare + four reports): SedonaDB "
        f"{tot_s:.1f} s, baseline {tot_b:.1f} s; every report's table is equal between the engines "
        f"(`equal`). Peak RSS of the run (both engines in one process): {_rss_mib():,.0f} MiB.",
    ]
    write_section(header, lines, BENCH_LOG / "reports.md")


if __name__ == "__main__":
    main()
