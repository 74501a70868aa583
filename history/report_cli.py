"""`fleetfence report ...`: run a history report and show it as a rich table or export it
(`--format`: JSON, GeoJSON, CSV, (Geo)Parquet, GPX, KML; history/report_formats.py), optionally with a
PNG chart. The typer commands live in cli/history.py; this module does the work so the CLI's
start-up does not import SedonaDB, pandas or matplotlib until a report actually runs.

Where an export goes: `--out FILE`, else standard output. Parquet is binary, so it is written to
standard output only when that is not a terminal (a pipe or a redirect); to a terminal it needs
`--out`. A format the report cannot give is refused before anything is computed.
"""

from __future__ import annotations

import logging
import math
import sys
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pandas as pd
from rich.console import Console
from rich.table import Table

from fleetfence.contracts import ms_to_iso
from fleetfence.settings import Settings
from history.errors import ReportError
from history.report_formats import BINARY, check_format, export, heatmap_geojson, visits_geojson, wants_tracks
from history.report_inputs import report_range
from history.report_params import DEFAULT_MOTION, MotionParams
from history.reports import report_data
from history.settings import HistorySettings

logger = logging.getLogger(__name__)

MAX_TABLE_ROWS = 200
MAX_BARS = 40
TITLES = {
    "adherence": "Route adherence per vehicle and UTC day",
    "zone_visits": "Zone visits",
    "speeding": "Speeding episodes",
    "heatmap": "Off-route fixes per H3 cell",
    "stops": "Stops",
    "trips": "Trips",
}
# Coordinates are in the exports; a table at one decimal would only mislead.
HIDDEN = frozenset({"entry_lon", "entry_lat", "lon", "lat", "start_lon", "start_lat", "end_lon", "end_lat"})


def _cell(col: str, v: Any) -> str:
    if v is None or (isinstance(v, float) and pd.isna(v)) or v is pd.NA:
        return "-"
    if col.endswith("_ts_ms"):
        return ms_to_iso(int(v))
    if col == "inside_share":
        return f"{float(v):.1%}"
    if isinstance(v, float):
        return f"{v:,.1f}"
    return str(v)


def render_table(name: str, df: pd.DataFrame, console: Console) -> None:
    cols = [c for c in df.columns if c not in HIDDEN]
    table = Table(title=f"{TITLES[name]} ({len(df):,} rows)")
    for c in cols:
        table.add_column(
            c, justify="left" if c in ("vehicle_id", "zone_id", "route_id", "date", "h3_cell") else "right"
        )
    for row in df.head(MAX_TABLE_ROWS).astype(object).itertuples(index=False):
        table.add_row(*(_cell(c, getattr(row, c)) for c in cols))
    console.print(table)
    if len(df) > MAX_TABLE_ROWS:
        console.print(f"[dim]first {MAX_TABLE_ROWS} of {len(df):,} rows; --format json|csv|... for all[/]")


def write_png(name: str, df: pd.DataFrame, path: Path) -> None:
    """One chart per report, rendered off-screen (Agg): no display needed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(11, 5.5), dpi=110)
    if df.empty:
        ax.text(0.5, 0.5, "no data in range", ha="center", va="center")
    elif name == "adherence":
        worst = df.sort_values("inside_share").head(MAX_BARS)
        ax.bar(
            [f"{v} {d}" for v, d in zip(worst["vehicle_id"], worst["date"], strict=True)],
            worst["inside_share"] * 100,
        )
        ax.set_ylabel(f"fixes inside the corridor, % (worst {len(worst)})")
        ax.set_ylim(0, 100)
        ax.tick_params(axis="x", rotation=70, labelsize=7)
    elif name == "zone_visits":
        per_zone = df.groupby("zone_id")["dwell_s"].sum().sort_values(ascending=False).head(MAX_BARS) / 3600
        ax.bar(per_zone.index.astype(str), per_zone.to_numpy())
        ax.set_ylabel("total dwell, h")
        ax.tick_params(axis="x", rotation=70, labelsize=7)
    elif name == "speeding":
        ax.hist(df["max_kmh"], bins=30)
        ax.set_xlabel("episode max speed, km/h")
        ax.set_ylabel("episodes")
    elif name == "stops":
        ax.hist(df["duration_s"] / 60, bins=30)
        ax.set_xlabel("stop duration, min")
        ax.set_ylabel("stops")
    elif name == "trips":
        ax.hist(df["distance_m"] / 1000, bins=30)
        ax.set_xlabel("trip distance, km")
        ax.set_ylabel("trips")
    else:
        import h3

        centers = [h3.cell_to_latlng(c) for c in df["h3_cell"]]
        sc = ax.scatter(
            [c[1] for c in centers], [c[0] for c in centers], c=df["off_route_fixes"], s=8, cmap="inferno_r"
        )
        fig.colorbar(sc, ax=ax, label="off-route fixes")
        ax.set_xlabel("lon")
        ax.set_ylabel("lat")
        mean_lat = float(np.mean([c[0] for c in centers]))
        ax.set_aspect(1 / math.cos(math.radians(mean_lat)), adjustable="datalim")
    ax.set_title(TITLES[name])
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def output_format(name: str, fmt: str | None, as_json: bool, out: Path | None) -> str:
    """The format asked for (`--format`, or the older `--json`), checked against what the report
    can give and where it would go, before anything is computed."""
    if as_json and fmt not in (None, "json"):
        raise ReportError(f"--json and --format {fmt} ask for two formats; give one")
    chosen = fmt or ("json" if as_json else "table")
    if chosen == "table":
        if out is not None:
            raise ReportError("--out writes an export: give a --format too (e.g. --format csv)")
        return chosen
    check_format(name, chosen)
    if chosen in BINARY and out is None and sys.stdout.isatty():
        raise ReportError(f"{chosen} is binary: give --out FILE, or redirect standard output")
    return chosen


def run(
    name: str,
    base: Settings,
    *,
    start: str,
    end: str,
    vehicle_id: str | None,
    archive: str | None,
    as_json: bool,
    png: Path | None,
    geojson: Path | None = None,
    resolution: int = 9,
    fmt: str | None = None,
    out: Path | None = None,
    motion: MotionParams = DEFAULT_MOTION,
) -> None:
    """Validate the range and the format, run the report, show or export it, optionally chart it and
    write GeoJSON beside it; `motion` cuts the stops and trips."""
    chosen = output_format(name, fmt, as_json, out)
    rng = report_range(start, end, vehicle_id)
    hs = HistorySettings.from_base(base)
    root = archive or hs.archive_root
    err = Console(stderr=True)
    with err.status(f"computing {name} over {root}…"):
        tracks = wants_tracks(name, chosen) or (geojson is not None and wants_tracks(name, "geojson"))
        data = report_data(
            name, root, rng, hs.history_buckets, resolution=resolution, tracks=tracks, motion=motion
        )
    df = data.rows
    if chosen == "table":
        render_table(name, df, Console())
    else:
        body = export(data, chosen)
        if out is not None:
            out.write_bytes(body)
            err.print(f"wrote {out} ({chosen}, {len(df):,} rows)")
        else:
            sys.stdout.flush()
            sys.stdout.buffer.write(body if chosen in BINARY or body.endswith(b"\n") else body + b"\n")
            sys.stdout.buffer.flush()
    if geojson is not None:
        fc = heatmap_geojson(df, resolution) if name == "heatmap" else visits_geojson(df)
        geojson.write_bytes(orjson.dumps(fc))
        err.print(f"wrote {geojson} ({len(fc['features']):,} features)")
    if png is not None:
        write_png(name, df, png)
        err.print(f"wrote {png}")
