"""`fleetfence report ...`: run a history report and show it as a rich table, JSON, GeoJSON or a
PNG chart. The typer commands live in cli/history.py; this module does the work so the CLI's
start-up does not import SedonaDB, pandas or matplotlib until a report actually runs.
"""

from __future__ import annotations

import logging
import math
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pandas as pd
from rich.console import Console
from rich.table import Table

from fleetfence.contracts import ms_to_iso
from fleetfence.settings import Settings
from history.report_formats import heatmap_geojson, records, visits_geojson
from history.report_inputs import report_range
from history.reports import run_report
from history.settings import HistorySettings

logger = logging.getLogger(__name__)

MAX_TABLE_ROWS = 200
MAX_BARS = 40
TITLES = {
    "adherence": "Route adherence per vehicle and UTC day",
    "zone_visits": "Zone visits",
    "speeding": "Speeding episodes",
    "heatmap": "Off-route fixes per H3 cell",
}


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
    cols = [c for c in df.columns if c not in ("entry_lon", "entry_lat")]
    table = Table(title=f"{TITLES[name]} ({len(df):,} rows)")
    for c in cols:
        table.add_column(
            c, justify="left" if c in ("vehicle_id", "zone_id", "route_id", "date", "h3_cell") else "right"
        )
    for row in df.head(MAX_TABLE_ROWS).astype(object).itertuples(index=False):
        table.add_row(*(_cell(c, getattr(row, c)) for c in cols))
    console.print(table)
    if len(df) > MAX_TABLE_ROWS:
        console.print(f"[dim]first {MAX_TABLE_ROWS} of {len(df):,} rows; --json for all[/]")


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
) -> None:
    """Validate the range, run the report, print it (table or JSON), optionally chart/GeoJSON it."""
    rng = report_range(start, end, vehicle_id)
    hs = HistorySettings.from_base(base)
    root = archive or hs.archive_root
    err = Console(stderr=True)
    with err.status(f"computing {name} over {root}…"):
        df = run_report(name, root, rng, hs.history_buckets, resolution=resolution)
    out = Console()
    if as_json:
        out.file.write(orjson.dumps(records(df)).decode() + "\n")
    else:
        render_table(name, df, out)
    if geojson is not None:
        fc = heatmap_geojson(df, resolution) if name == "heatmap" else visits_geojson(df)
        geojson.write_bytes(orjson.dumps(fc))
        err.print(f"wrote {geojson} ({len(fc['features']):,} features)")
    if png is not None:
        write_png(name, df, png)
        err.print(f"wrote {png}")
