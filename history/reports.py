"""Spatial reports over the telemetry archive, computed by Apache Sedona's SedonaDB in SQL.

Six reports (definitions, SQL and tolerances in docs/reports.md):

- `adherence`: per vehicle and UTC day, share of fixes inside the assigned route's corridor, time
  and distance off-route;
- `zone_visits`: runs of consecutive fixes inside a zone, with entry/exit and dwell time (a circle
  zone exactly as the processor decides it: within its radius of the centre, measured in the
  centre's local projection; not ST_DistanceSphere, whose great-circle metres differ from the
  projection's by a sliver, enough to put a fix at the edge on the other side);
- `speeding`: runs of consecutive fixes above the assigned route's speed limit;
- `heatmap`: off-route fixes counted per H3 cell (GeoJSON polygons);
- `stops` and `trips`, as Traccar's operators know them, cut by `MotionParams`
  (history/report_params.py): a fix is stationary when `speed_kmh <= stop_speed_kmh`; a stop is a
  run of consecutive stationary fixes of one vehicle lasting at least `min_stop_s`, from its first
  fix to the first fix after the run (or its last fix when the data ends stopped); a trip is a
  maximal run of consecutive fixes of one vehicle in no stop, with at least 2 fixes. Two
  consecutive fixes more than `max_gap_s` apart (a tracker off overnight) end a trip and a stop (a
  stop ended so ends at its last fix: the silence is not counted as stopped). A trip's distance is
  its reported speeds integrated over time (`speed_step_m`), so its average speed is a mean of the
  speeds its maximum is the largest of.

Master data (routes, zones, assignments) comes from `master/` in the archive and is applied *as of
each fix's time*: the version in force is the latest whose change event is not after the fix.
Decoding those JSON events is done here in Python (SedonaDB has no JSON functions); everything
spatial (buffering the corridor in metres, point-in-polygon, run detection with window functions,
haversine distances) is SedonaDB SQL.

The corridor is buffered exactly the way the live processor does (processor/core/geometry.py): in the
route's local equirectangular projection around the route centroid, by half the corridor width,
`quad_segs=4`. That projection is affine, so testing the fix projected into metres against the
metric buffer (here, `ST_Affine` + `ST_Buffer` + `ST_Contains`) is the same test as the
processor's lon/lat polygon up to floating-point rounding, not an approximation of it.
"""

from __future__ import annotations

import logging
import math
import warnings
from dataclasses import dataclass
from datetime import date, timedelta
from pathlib import Path
from typing import Any

import h3
import numpy as np
import pandas as pd
import pyarrow as pa

from fleetfence.contracts import VEHICLE_ID_RE
from fleetfence.geo import EARTH_RADIUS_M
from history.errors import ReportError
from history.report_inputs import (
    DAY_MS,
    NEVER_MS,
    ReportRange,
    master_tables,
    read_master_events,
    telemetry_files,
)
from history.report_params import DEFAULT_MOTION, MotionParams
from history.report_sql import (
    ADHERENCE_SQL,
    ENRICHED_SQL,
    HAVERSINE_NEXT_SQL,
    HEATMAP_SQL,
    SPEEDING_SQL,
    SPEEDING_TRACKS_SQL,
    STOPS_SQL,
    TRIP_TRACKS_SQL,
    TRIPS_SQL,
    ZONE_VISITS_SQL,
)
from history.schema import TELEMETRY_SCHEMA

logger = logging.getLogger(__name__)

DEFAULT_H3_RESOLUTION = 9
REPORTS = ("adherence", "zone_visits", "speeding", "heatmap", "stops", "trips")

# Each report's columns and their types, in order: the one statement of a report's shape. The
# exports (history/report_formats.py) cast every DataFrame to its schema, so a report whose columns
# drift from it fails loudly instead of writing a different file.
ADHERENCE_SCHEMA = pa.schema(
    [
        ("vehicle_id", pa.string()),
        ("date", pa.string()),  # YYYY-MM-DD, UTC day of the fix
        ("fixes", pa.int64()),  # all fixes of the vehicle that day
        ("assigned_fixes", pa.int64()),  # fixes with a route assigned (only these can be on or off route)
        ("inside_fixes", pa.int64()),  # assigned fixes inside the corridor
        ("inside_share", pa.float64()),  # in [0, 1]: inside_fixes / assigned_fixes, NaN when nothing assigned
        ("off_route_s", pa.float64()),  # sum of intervals to the next fix, over fixes outside the corridor
        ("off_route_m", pa.float64()),  # haversine metres to the next fix, over fixes outside the corridor
    ]
)
VISIT_SCHEMA = pa.schema(
    [
        ("vehicle_id", pa.string()),
        ("zone_id", pa.string()),
        ("entry_ts_ms", pa.int64()),  # first fix inside
        ("exit_ts_ms", pa.int64()),  # first fix after the run (outside); null when the data ends inside
        ("last_inside_ts_ms", pa.int64()),
        ("dwell_s", pa.float64()),  # (exit or last inside) - entry, seconds
        ("fixes", pa.int64()),  # fixes inside in the run
        ("entry_lon", pa.float64()),
        ("entry_lat", pa.float64()),
    ]
)
SPEEDING_SCHEMA = pa.schema(
    [
        ("vehicle_id", pa.string()),
        ("route_id", pa.string()),
        ("speed_limit_kmh", pa.float64()),
        ("start_ts_ms", pa.int64()),  # first fix above the limit
        ("end_ts_ms", pa.int64()),  # last fix above the limit
        ("duration_s", pa.float64()),
        ("fixes", pa.int64()),
        ("max_kmh", pa.float64()),
    ]
)
HEATMAP_SCHEMA = pa.schema([("h3_cell", pa.string()), ("off_route_fixes", pa.int64())])
STOP_SCHEMA = pa.schema(
    [
        ("vehicle_id", pa.string()),
        ("start_ts_ms", pa.int64()),  # first stationary fix
        ("end_ts_ms", pa.int64()),  # first fix after the run (its last fix when the data or a gap ends it)
        ("duration_s", pa.float64()),  # end - start, at least min_stop_s
        ("fixes", pa.int64()),  # stationary fixes in the run
        ("lon", pa.float64()),  # the first fix
        ("lat", pa.float64()),
    ]
)
TRIP_SCHEMA = pa.schema(
    [
        ("vehicle_id", pa.string()),
        ("start_ts_ms", pa.int64()),  # first fix of the trip
        ("end_ts_ms", pa.int64()),  # last fix of the trip
        ("duration_s", pa.float64()),
        ("fixes", pa.int64()),  # at least 2
        ("distance_m", pa.float64()),  # the reported speeds integrated over time (speed_step_m)
        ("max_kmh", pa.float64()),  # of the fixes' reported speeds
        ("avg_kmh", pa.float64()),  # distance / duration, <= max_kmh; NaN for a 0 s trip
        ("start_lon", pa.float64()),
        ("start_lat", pa.float64()),
        ("end_lon", pa.float64()),
        ("end_lat", pa.float64()),
    ]
)
# The fixes of each speeding episode (or trip), in fix order: its track for the GPX, KML, GeoJSON and
# GeoParquet exports. (vehicle_id, start_ts_ms) is the episode's key in SPEEDING_SCHEMA (the trip's
# in TRIP_SCHEMA).
TRACK_SCHEMA = pa.schema(
    [
        ("vehicle_id", pa.string()),
        ("start_ts_ms", pa.int64()),
        ("ts_ms", pa.int64()),
        ("lon", pa.float64()),
        ("lat", pa.float64()),
        ("speed_kmh", pa.float64()),
    ]
)
SCHEMAS = {
    "adherence": ADHERENCE_SCHEMA,
    "zone_visits": VISIT_SCHEMA,
    "speeding": SPEEDING_SCHEMA,
    "heatmap": HEATMAP_SCHEMA,
    "stops": STOP_SCHEMA,
    "trips": TRIP_SCHEMA,
}
ADHERENCE_COLUMNS: list[str] = ADHERENCE_SCHEMA.names
VISIT_COLUMNS: list[str] = VISIT_SCHEMA.names
SPEEDING_COLUMNS: list[str] = SPEEDING_SCHEMA.names
HEATMAP_COLUMNS: list[str] = HEATMAP_SCHEMA.names
TRACK_COLUMNS: list[str] = TRACK_SCHEMA.names
STOP_COLUMNS: list[str] = STOP_SCHEMA.names
TRIP_COLUMNS: list[str] = TRIP_SCHEMA.names


def _connect() -> Any:
    with warnings.catch_warnings():
        # SedonaDB probes for PROJ and GDAL at import; the reports need neither (no ST_Transform).
        warnings.simplefilter("ignore")
        import sedonadb
    return sedonadb.connect()


class SedonaReports:
    """One SedonaDB session over one archive and range: the telemetry files, master views and
    the enriched fixes view (materialised once, shared by every report of the session)."""

    def __init__(self, root: str | Path, rng: ReportRange, buckets: int) -> None:
        self.root = Path(root)
        self.rng = rng
        self.sd = _connect()
        master = master_tables(read_master_events(self.root))
        for name, table in (
            ("routes", master.routes),
            ("zones", master.zones),
            ("assignments", master.assignments),
        ):
            self.sd.create_data_frame(table).to_view(name, overwrite=True)
        files = telemetry_files(self.root, rng, buckets)
        if files:
            self.sd.read_parquet(files).to_view("telemetry", overwrite=True)
        else:
            self.sd.create_data_frame(_empty_telemetry()).to_view("telemetry", overwrite=True)
        self.files = len(files)
        if rng.vehicle_id is not None and not VEHICLE_ID_RE.match(rng.vehicle_id):
            raise ReportError(f"vehicle id {rng.vehicle_id!r} is not allowed")  # it is spliced into SQL
        vf = "" if rng.vehicle_id is None else f"AND vehicle_id = '{rng.vehicle_id}'"
        sql = ENRICHED_SQL.format(
            ky=math.radians(1.0) * EARTH_RADIUS_M, from_ms=rng.from_ms, to_ms=rng.to_ms, vehicle_filter=vf
        )
        self._enriched_sql = sql
        self._materialised = False

    def prepare(self) -> None:
        """Materialise the enriched fixes once (read, route as of each fix, corridor test)."""
        if not self._materialised:
            self.sd.sql(self._enriched_sql).to_memtable().to_view("enriched", overwrite=True)
            self._materialised = True

    def _query(self, sql: str) -> pd.DataFrame:
        self.prepare()
        df: pd.DataFrame = self.sd.sql(sql).to_arrow_table().to_pandas()
        return df

    def adherence(self) -> pd.DataFrame:
        df = self._query(
            ADHERENCE_SQL.format(day_ms=DAY_MS, haversine=HAVERSINE_NEXT_SQL.format(r=EARTH_RADIUS_M))
        )
        return finish_adherence(df)

    def zone_visits(self) -> pd.DataFrame:
        return finish_visits(self._query(ZONE_VISITS_SQL.format(never=NEVER_MS)))

    def speeding(self) -> pd.DataFrame:
        return finish_speeding(self._query(SPEEDING_SQL))

    def speeding_tracks(self) -> pd.DataFrame:
        """The fixes of every speeding episode (TRACK_COLUMNS), in fix order."""
        return finish_tracks(self._query(SPEEDING_TRACKS_SQL))

    def _motion_sql(self, sql: str, motion: MotionParams) -> str:
        return sql.format(
            stop_kmh=repr(motion.stop_speed_kmh),
            gap_ms=repr(motion.max_gap_ms),
            min_stop_ms=repr(motion.min_stop_ms),
        )

    def stops(self, motion: MotionParams = DEFAULT_MOTION) -> pd.DataFrame:
        return finish_stops(self._query(self._motion_sql(STOPS_SQL, motion)))

    def trips(self, motion: MotionParams = DEFAULT_MOTION) -> pd.DataFrame:
        return finish_trips(self._query(self._motion_sql(TRIPS_SQL, motion)))

    def trip_tracks(self, motion: MotionParams = DEFAULT_MOTION) -> pd.DataFrame:
        """The fixes of every trip (TRACK_COLUMNS), in fix order."""
        return finish_tracks(self._query(self._motion_sql(TRIP_TRACKS_SQL, motion)))

    def heatmap(self, resolution: int = DEFAULT_H3_RESOLUTION) -> pd.DataFrame:
        """SedonaDB has no H3 functions (0.5.0): the off-route fixes come from SQL, h3-py bins them."""
        df = self._query(HEATMAP_SQL)
        return h3_counts(df["lat"].to_numpy(), df["lon"].to_numpy(), resolution)


def _empty_telemetry() -> pa.Table:
    return TELEMETRY_SCHEMA.empty_table()


# --------------------------------------------------------------------------- shaping (shared)


def finish_adherence(df: pd.DataFrame) -> pd.DataFrame:
    """Engine output (vehicle_id, day, counts, sums) -> ADHERENCE_COLUMNS, sorted."""
    out = pd.DataFrame(
        {
            "vehicle_id": df["vehicle_id"].astype(str),
            "date": [(date(1970, 1, 1) + timedelta(days=int(d))).isoformat() for d in df["day"]],
            "fixes": df["fixes"].astype("int64"),
            "assigned_fixes": df["assigned_fixes"].astype("int64"),
            "inside_fixes": df["inside_fixes"].fillna(0).astype("int64"),
            "off_route_s": df["off_route_s"].astype("float64"),
            "off_route_m": df["off_route_m"].astype("float64"),
        }
    )
    with np.errstate(invalid="ignore", divide="ignore"):
        out.insert(
            5, "inside_share", out["inside_fixes"] / out["assigned_fixes"].where(out["assigned_fixes"] > 0)
        )
    return out.sort_values(["vehicle_id", "date"], kind="stable").reset_index(drop=True)[ADHERENCE_COLUMNS]


def finish_visits(df: pd.DataFrame) -> pd.DataFrame:
    """Engine output (..., exit_or_never) -> VISIT_COLUMNS, sorted."""
    exit_raw = df["exit_or_never"].astype("int64")
    exit_ts = exit_raw.where(exit_raw < NEVER_MS).astype("Int64")
    end = exit_ts.fillna(df["last_inside_ts_ms"]).astype("int64")
    out = pd.DataFrame(
        {
            "vehicle_id": df["vehicle_id"].astype(str),
            "zone_id": df["zone_id"].astype(str),
            "entry_ts_ms": df["entry_ts_ms"].astype("int64"),
            "exit_ts_ms": exit_ts,
            "last_inside_ts_ms": df["last_inside_ts_ms"].astype("int64"),
            "dwell_s": (end - df["entry_ts_ms"].astype("int64")) / 1000.0,
            "fixes": df["fixes"].astype("int64"),
            "entry_lon": df["entry_lon"].astype("float64"),
            "entry_lat": df["entry_lat"].astype("float64"),
        }
    )
    return out.sort_values(["vehicle_id", "entry_ts_ms", "zone_id"], kind="stable").reset_index(drop=True)


def finish_speeding(df: pd.DataFrame) -> pd.DataFrame:
    out = pd.DataFrame(
        {
            "vehicle_id": df["vehicle_id"].astype(str),
            "route_id": df["route_id"].astype(str),
            "speed_limit_kmh": df["speed_limit_kmh"].astype("float64"),
            "start_ts_ms": df["start_ts_ms"].astype("int64"),
            "end_ts_ms": df["end_ts_ms"].astype("int64"),
            "duration_s": (df["end_ts_ms"].astype("int64") - df["start_ts_ms"].astype("int64")) / 1000.0,
            "fixes": df["fixes"].astype("int64"),
            "max_kmh": df["max_kmh"].astype("float64"),
        }
    )
    return out.sort_values(["vehicle_id", "start_ts_ms"], kind="stable").reset_index(drop=True)


def finish_stops(df: pd.DataFrame) -> pd.DataFrame:
    """Engine output (vehicle_id, start/end, fixes, lon, lat) -> STOP_COLUMNS, sorted."""
    start = df["start_ts_ms"].astype("int64")
    end = df["end_ts_ms"].astype("int64")
    out = pd.DataFrame(
        {
            "vehicle_id": df["vehicle_id"].astype(str),
            "start_ts_ms": start,
            "end_ts_ms": end,
            "duration_s": (end - start) / 1000.0,
            "fixes": df["fixes"].astype("int64"),
            "lon": df["lon"].astype("float64"),
            "lat": df["lat"].astype("float64"),
        }
    )
    return out.sort_values(["vehicle_id", "start_ts_ms"], kind="stable").reset_index(drop=True)


def speed_step_m(speed_kmh: Any, next_speed_kmh: Any, dt_ms: Any) -> Any:
    """Metres driven from one fix to the next, by the speeds the tracker reported at both: the
    trapezoid (v1 + v2) / 2 over the interval (km/h x ms / 3600 = m, halved). A trip's distance is
    the sum of its steps; the SQL of SedonaDB computes the same expression (`step_m` in
    history/report_sql.py), the numpy baseline calls this.

    Why the speeds and not the fixes' positions: GPS noise that varies from fix to fix lengthens
    every fix-to-fix segment (by about sigma^2 / step on average), and at the rates trackers report
    while driving a step is not much longer than the noise: at 1 fix/s, 36 km/h and sigma = 8 m the
    summed segments come out 60-70% long, at 2 s ~17% (issue #64: every trip averaging more than its
    top speed). Smoothing the positions first trades that for cut corners (a moving average over +-2
    to +-5 s shortened a simulated track with a right-angle turn every 200 m by 2 to 13%) and a
    window to tune, and still gathers metres while the vehicle idles at a light. The reported speed
    is measured apart from the position (Doppler), is what the trips are cut by and what their
    maximum is taken from: integrated, it lengthens nothing, cuts no corner, adds nothing at
    standstill, and the average speed (distance / duration) is a time-weighted mean of the speeds,
    so never above their maximum. What it costs: with fixes far apart (30 s and more) the trapezoid
    samples a stop-and-go profile coarsely (no bias, but a 30-minute simulated city trip's figure
    spreads by ~5% at 30 s, ~20% at 60 s), where positions would have served; and a tracker whose
    speed is wrong has a wrong distance (its stops, trips and maximum are wrong already). The fixes
    carry no odometer (the telemetry contract has none) that could take precedence."""
    return (speed_kmh + next_speed_kmh) * dt_ms / 7200.0


def finish_trips(df: pd.DataFrame) -> pd.DataFrame:
    """Engine output (vehicle_id, start/end, fixes, distance, max, end points) -> TRIP_COLUMNS, sorted;
    the average speed is computed here, once for both engines. It is a time-weighted mean of the
    speeds `max_kmh` is the largest of (speed_step_m), so at most that; the minimum only keeps the
    float rounding of the sum from putting it a last bit above (a constant-speed trip)."""
    start = df["start_ts_ms"].astype("int64")
    end = df["end_ts_ms"].astype("int64")
    duration_s = (end - start) / 1000.0
    distance_m = df["distance_m"].astype("float64")
    max_kmh = df["max_kmh"].astype("float64")
    out = pd.DataFrame(
        {
            "vehicle_id": df["vehicle_id"].astype(str),
            "start_ts_ms": start,
            "end_ts_ms": end,
            "duration_s": duration_s,
            "fixes": df["fixes"].astype("int64"),
            "distance_m": distance_m,
            "max_kmh": max_kmh,
            "avg_kmh": np.minimum(distance_m / duration_s.where(duration_s > 0) * 3.6, max_kmh),
            "start_lon": df["start_lon"].astype("float64"),
            "start_lat": df["start_lat"].astype("float64"),
            "end_lon": df["end_lon"].astype("float64"),
            "end_lat": df["end_lat"].astype("float64"),
        }
    )
    return out.sort_values(["vehicle_id", "start_ts_ms"], kind="stable").reset_index(drop=True)


def finish_tracks(df: pd.DataFrame) -> pd.DataFrame:
    out = pd.DataFrame({c: df[c] for c in TRACK_COLUMNS}).astype(
        {"vehicle_id": str, "start_ts_ms": "int64", "ts_ms": "int64", "lon": "float64", "lat": "float64"}
    )
    out["speed_kmh"] = out["speed_kmh"].astype("float64")
    return out.reset_index(drop=True)


def h3_counts(lat: np.ndarray, lon: np.ndarray, resolution: int) -> pd.DataFrame:
    """Count points per H3 cell with h3-py (one call per point; only off-route fixes get here)."""
    cells = [h3.latlng_to_cell(la, lo, resolution) for la, lo in zip(lat.tolist(), lon.tolist(), strict=True)]
    counts = pd.Series(cells, dtype=object).value_counts() if cells else pd.Series([], dtype="int64")
    out = pd.DataFrame(
        {"h3_cell": counts.index.astype(str), "off_route_fixes": counts.to_numpy().astype("int64")}
    )
    return out.sort_values(
        ["off_route_fixes", "h3_cell"], ascending=[False, True], kind="stable"
    ).reset_index(drop=True)


@dataclass(frozen=True)
class ReportData:
    """A report's rows with what its exports need beside them: the heat map's resolution, and the
    speeding episodes' or trips' tracks (TRACK_COLUMNS; None when not asked for)."""

    name: str
    rows: pd.DataFrame
    resolution: int = DEFAULT_H3_RESOLUTION
    tracks: pd.DataFrame | None = None


def report_data(
    name: str,
    root: str | Path,
    rng: ReportRange,
    buckets: int,
    *,
    resolution: int = DEFAULT_H3_RESOLUTION,
    tracks: bool = False,
    motion: MotionParams = DEFAULT_MOTION,
) -> ReportData:
    """One report by name, with SedonaDB (the entry point of the API and the CLI); `tracks` adds the
    speeding episodes' or trips' fixes from the same session (the enriched fixes are materialised
    once); `motion` is what the stops and trips reports cut the fixes by."""
    if name not in REPORTS:
        raise ReportError(f"unknown report {name!r}; one of {', '.join(REPORTS)}")
    reports = SedonaReports(root, rng, buckets)
    logger.info("report %s over %d files %s..%s", name, reports.files, rng.from_ms, rng.to_ms)
    if name == "adherence":
        return ReportData(name, reports.adherence())
    if name == "zone_visits":
        return ReportData(name, reports.zone_visits())
    if name == "speeding":
        return ReportData(name, reports.speeding(), tracks=reports.speeding_tracks() if tracks else None)
    if name == "stops":
        return ReportData(name, reports.stops(motion))
    if name == "trips":
        return ReportData(name, reports.trips(motion), tracks=reports.trip_tracks(motion) if tracks else None)
    return ReportData(name, reports.heatmap(resolution), resolution=resolution)
