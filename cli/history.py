"""`fleetfence archive`, `restate` and `report`: the telemetry archive and what reads it (history)."""

from __future__ import annotations

import os
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from cli.common import app, console, friendly_errors, settings_from_env
from history.report_params import DEFAULT_MOTION, MotionParams

archive_app = typer.Typer(
    help="The telemetry/alert archive (GeoParquet): writer, compaction, retention.", no_args_is_help=True
)
app.add_typer(archive_app, name="archive")


def _historysettings_from_env() -> Any:
    from history.settings import HistorySettings

    return HistorySettings.from_base(settings_from_env())


@archive_app.command("run")
@friendly_errors
def archive_run() -> None:
    """Run the archive writer (Spark streaming, exactly once) until Ctrl-C/SIGTERM."""
    from history.archive import run_archive

    run_archive(_historysettings_from_env())


@archive_app.command("compact")
@friendly_errors
def archive_compact() -> None:
    """Merge the files of each partition older than the current UTC day into one."""
    from history.maintenance import compact

    hs = _historysettings_from_env()
    r = compact(hs.archive_root, hs.checkpoint_location)
    console.print(
        f"compacted {r.partitions} partitions: {r.files_removed} files -> {r.partitions}, {r.rows} rows"
        f" ({r.skipped_uncommitted} files of uncommitted batches left alone)"
    )


@archive_app.command("retention")
@friendly_errors
def archive_retention(
    days: Annotated[
        int | None, typer.Option(min=1, help="Default: FLEETFENCE_HISTORY_RETENTION_DAYS.")
    ] = None,
) -> None:
    """Delete telemetry and alert date partitions older than the retention (master data is kept)."""
    from history.maintenance import apply_retention

    hs = _historysettings_from_env()
    deleted = apply_retention(hs.archive_root, days or hs.history_retention_days)
    console.print(f"deleted {len(deleted)} date partitions")


@app.command("restate")
@friendly_errors
def restate_cmd(
    start: Annotated[str, typer.Option("--from", help="Window start: ISO-8601 with offset, or epoch ms.")],
    end: Annotated[str, typer.Option("--to", help="Window end (exclusive).")],
    out: Annotated[str, typer.Option("--out", help="Result folder: alerts.parquet and diff.json.")],
    routes: Annotated[
        str | None,
        typer.Option("--routes", help="Proposed routes: GeoJSON FeatureCollection (bulk import format)."),
    ] = None,
    route_version: Annotated[
        list[str] | None, typer.Option("--route-version", help="ID=VER: use an archived route version.")
    ] = None,
    batch_s: Annotated[float, typer.Option(min=0.001, help="Event-time slice (a live micro-batch).")] = 10.0,
    warmup_s: Annotated[float, typer.Option(min=0, help="Replay this long before --from first.")] = 0.0,
    archive: Annotated[
        str | None, typer.Option("--archive", help="Default: FLEETFENCE_HISTORY_ARCHIVE_PATH.")
    ] = None,
) -> None:
    """Re-run the live geofence logic over the archive (Spark batch) and diff with the live alerts."""
    import json

    from fleetfence.contracts import ms_to_iso, parse_ts_ms
    from fleetfence.errors import ConfigError
    from history.restate import RestateRequest, run_restatement
    from processor.settings import ProcessorSettings
    from processor.spark.session import build_session, spark_master_url

    hs = _historysettings_from_env()
    pins: dict[str, int] = {}
    for item in route_version or []:
        rid, sep, ver = item.partition("=")
        if not sep or not ver.isdigit():
            raise ConfigError(f"--route-version must look like ID=VERSION, got {item!r}")
        pins[rid] = int(ver)
    geojson = None
    if routes is not None:
        try:
            with open(routes) as f:
                geojson = json.load(f)
        except (OSError, ValueError) as exc:
            raise ConfigError(f"cannot read proposed routes {routes!r}: {exc}") from exc
    req = RestateRequest(
        parse_ts_ms(int(start) if start.isdigit() else start),
        parse_ts_ms(int(end) if end.isdigit() else end),
        out,
        geojson,
        pins,
        batch_ms=int(batch_s * 1000),
        warmup_ms=int(warmup_s * 1000),
    )
    from pyspark.sql import SparkSession

    # A session that already runs in this process (a notebook, a test) is used and left running.
    started = SparkSession.getActiveSession() is None
    spark = build_session(
        app_name="fleetfence-restate", spark_master=spark_master_url(hs.history_spark_master)
    )
    try:
        with console.status("restating over the archive (Spark batch)..."):
            r = run_restatement(spark, archive or hs.archive_root, req, ProcessorSettings().engine_config())
    finally:
        if started:
            spark.stop()
    table = Table(title=f"restated {r.fixes} fixes")
    for col in ("result", "alerts"):
        table.add_column(col)
    for name, n in (
        ("live", len(r.live)),
        ("restated", len(r.restated)),
        ("same", len(r.same)),
        ("changed", len(r.changed)),
        ("only live", len(r.only_live)),
        ("only restated", len(r.only_restated)),
    ):
        table.add_row(name, str(n))
    Console().print(table)
    diff = Table(title="differences")
    for col in ("side", "alert_id", "type", "vehicle", "seq", "ts"):
        diff.add_column(col)
    for side, df, ids in (("live", r.live, r.only_live), ("restated", r.restated, r.only_restated)):
        for row in df[df["alert_id"].isin(ids)].to_dict("records"):
            diff.add_row(
                side,
                row["alert_id"],
                row["type"],
                row["vehicle_id"],
                str(row["seq"]),
                ms_to_iso(row["ts_ms"]),
            )
    for a in r.changed:
        diff.add_row("changed", a, "", "", "", "")
    if r.only_live or r.only_restated or r.changed:
        Console().print(diff)
    console.print(f"wrote {os.path.join(out, 'alerts.parquet')} and {os.path.join(out, 'diff.json')}")


# --------------------------------------------------------------------------- history reports

report_app = typer.Typer(
    help="History reports over the telemetry archive (SedonaDB): tables, exports (JSON, GeoJSON, CSV,"
    " GeoParquet, GPX, KML), PNG charts.",
    no_args_is_help=True,
)
app.add_typer(report_app, name="report")

ReportFrom = Annotated[str, typer.Option("--from", help="UTC date (whole day) or ISO-8601 time.")]
ReportTo = Annotated[str, typer.Option("--to", help="UTC date (inclusive) or ISO-8601 time (exclusive).")]
ReportVehicle = Annotated[str | None, typer.Option("--vehicle", help="Only this vehicle.")]
ReportPng = Annotated[Path | None, typer.Option("--png", help="Also write a chart to this PNG file.")]
ReportJson = Annotated[bool, typer.Option("--json", help="Print the rows as JSON instead of a table.")]
ReportArchive = Annotated[
    str | None, typer.Option("--archive", help="Default: FLEETFENCE_HISTORY_ARCHIVE_PATH.")
]
ReportGeojson = Annotated[Path | None, typer.Option("--geojson", help="Also write GeoJSON to this file.")]


class ReportFormat(StrEnum):
    """`--format`: `table` or an export of history/report_formats.py (MEDIA_TYPES); each report gives
    some of them (report_formats.OFFERED), and refuses the others naming the ones it gives."""

    table = "table"
    json = "json"
    geojson = "geojson"
    csv = "csv"
    geoparquet = "geoparquet"
    parquet = "parquet"
    gpx = "gpx"
    kml = "kml"


ReportFormatOpt = Annotated[
    ReportFormat | None,
    typer.Option(
        "--format",
        help="table (default) or an export: json, geojson, csv, geoparquet (parquet for adherence), gpx and"
        " kml (zones, speeding, stops, trips). Exports go to --out or standard output (Parquet: not to a"
        " terminal).",
    ),
]
ReportOut = Annotated[Path | None, typer.Option("--out", help="Write the --format export to this file.")]
StopSpeed = Annotated[
    float, typer.Option("--stop-speed-kmh", help="A fix is stationary at or below this speed (>= 0).")
]
MinStop = Annotated[float, typer.Option("--min-stop-s", help="A stop lasts at least this long (> 0).")]
MaxGap = Annotated[
    float,
    typer.Option("--max-gap-s", help="Fixes further apart than this end a trip and a stop (> 0)."),
]


def _report(name: str, fmt: ReportFormat | None, **kwargs: Any) -> None:
    from history.report_cli import run as run_report_cli

    run_report_cli(name, settings_from_env(), fmt=None if fmt is None else fmt.value, **kwargs)


@report_app.command("adherence")
@friendly_errors
def report_adherence(
    start: ReportFrom,
    end: ReportTo,
    vehicle: ReportVehicle = None,
    png: ReportPng = None,
    as_json: ReportJson = False,
    archive: ReportArchive = None,
    fmt: ReportFormatOpt = None,
    out: ReportOut = None,
) -> None:
    """Share of fixes inside the route corridor, time and distance off-route, per vehicle and day."""
    _report(
        "adherence",
        fmt,
        start=start,
        end=end,
        vehicle_id=vehicle,
        png=png,
        as_json=as_json,
        archive=archive,
        out=out,
    )


@report_app.command("zones")
@friendly_errors
def report_zones(
    start: ReportFrom,
    end: ReportTo,
    vehicle: ReportVehicle = None,
    png: ReportPng = None,
    as_json: ReportJson = False,
    archive: ReportArchive = None,
    geojson: ReportGeojson = None,
    fmt: ReportFormatOpt = None,
    out: ReportOut = None,
) -> None:
    """Zone visits: entry, exit and dwell time of each run of fixes inside a zone."""
    _report(
        "zone_visits",
        fmt,
        out=out,
        start=start,
        end=end,
        vehicle_id=vehicle,
        png=png,
        as_json=as_json,
        archive=archive,
        geojson=geojson,
    )


@report_app.command("speeding")
@friendly_errors
def report_speeding(
    start: ReportFrom,
    end: ReportTo,
    vehicle: ReportVehicle = None,
    png: ReportPng = None,
    as_json: ReportJson = False,
    archive: ReportArchive = None,
    fmt: ReportFormatOpt = None,
    out: ReportOut = None,
) -> None:
    """Speeding episodes: runs of fixes above the assigned route's limit (tracks in GPX, KML, GeoJSON)."""
    _report(
        "speeding",
        fmt,
        start=start,
        end=end,
        vehicle_id=vehicle,
        png=png,
        as_json=as_json,
        archive=archive,
        out=out,
    )


@report_app.command("heatmap")
@friendly_errors
def report_heatmap(
    start: ReportFrom,
    end: ReportTo,
    vehicle: ReportVehicle = None,
    png: ReportPng = None,
    as_json: ReportJson = False,
    archive: ReportArchive = None,
    geojson: ReportGeojson = None,
    resolution: Annotated[int, typer.Option(min=0, max=15, help="H3 resolution.")] = 9,
    fmt: ReportFormatOpt = None,
    out: ReportOut = None,
) -> None:
    """Off-route fixes per H3 cell (GeoJSON polygons with --geojson)."""
    _report(
        "heatmap",
        fmt,
        out=out,
        start=start,
        end=end,
        vehicle_id=vehicle,
        png=png,
        as_json=as_json,
        archive=archive,
        geojson=geojson,
        resolution=resolution,
    )


@report_app.command("stops")
@friendly_errors
def report_stops(
    start: ReportFrom,
    end: ReportTo,
    vehicle: ReportVehicle = None,
    png: ReportPng = None,
    as_json: ReportJson = False,
    archive: ReportArchive = None,
    fmt: ReportFormatOpt = None,
    out: ReportOut = None,
    stop_speed_kmh: StopSpeed = DEFAULT_MOTION.stop_speed_kmh,
    min_stop_s: MinStop = DEFAULT_MOTION.min_stop_s,
    max_gap_s: MaxGap = DEFAULT_MOTION.max_gap_s,
) -> None:
    """Stops: runs of stationary fixes lasting at least --min-stop-s (GPX waypoints, KML points)."""
    _report(
        "stops",
        fmt,
        start=start,
        end=end,
        vehicle_id=vehicle,
        png=png,
        as_json=as_json,
        archive=archive,
        out=out,
        motion=MotionParams(stop_speed_kmh, min_stop_s, max_gap_s),
    )


@report_app.command("trips")
@friendly_errors
def report_trips(
    start: ReportFrom,
    end: ReportTo,
    vehicle: ReportVehicle = None,
    png: ReportPng = None,
    as_json: ReportJson = False,
    archive: ReportArchive = None,
    fmt: ReportFormatOpt = None,
    out: ReportOut = None,
    stop_speed_kmh: StopSpeed = DEFAULT_MOTION.stop_speed_kmh,
    min_stop_s: MinStop = DEFAULT_MOTION.min_stop_s,
    max_gap_s: MaxGap = DEFAULT_MOTION.max_gap_s,
) -> None:
    """Trips: the driving between stops and gaps, with distance and speeds (tracks in GPX, KML, GeoJSON)."""
    _report(
        "trips",
        fmt,
        start=start,
        end=end,
        vehicle_id=vehicle,
        png=png,
        as_json=as_json,
        archive=archive,
        out=out,
        motion=MotionParams(stop_speed_kmh, min_stop_s, max_gap_s),
    )
