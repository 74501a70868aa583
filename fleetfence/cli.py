"""The `fleetfence` command line: infrastructure, services, demo, simulator.

Each sub-command is a thin adapter: it reads settings, configures logging and calls into the
component package, turning a `FleetFenceError` into a readable message and exit code 2.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from functools import wraps
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer
from rich.console import Console
from rich.table import Table

from fleetfence import infra
from fleetfence.errors import FleetFenceError
from fleetfence.logs import configure_logging
from fleetfence.settings import Settings, get_settings

app = typer.Typer(help="FleetFence: real-time fleet geofencing.", no_args_is_help=True, add_completion=False)
infra_app = typer.Typer(
    help="Embedded infrastructure: Apache Kafka (KRaft), Mosquitto, Redis.", no_args_is_help=True
)
app.add_typer(infra_app, name="infra")

console = Console(stderr=True)
F = TypeVar("F", bound=Callable[..., Any])


def friendly_errors(fn: F) -> F:
    """Print FleetFence's own errors as one readable message instead of a traceback."""

    @wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except FleetFenceError as exc:
            console.print(f"[bold red]error:[/] {exc}")
            raise typer.Exit(2) from exc

    return wrapper  # type: ignore[return-value]


def _settings() -> Settings:
    s = get_settings()
    configure_logging(s.log_level, s.log_json)
    return s


def print_status(statuses: list[infra.ServiceStatus]) -> bool:
    table = Table(title="FleetFence infrastructure")
    for col in ("service", "address", "mode", "pid", "health", "detail"):
        table.add_column(col)
    for s in statuses:
        table.add_row(
            s.name,
            s.address,
            "embedded" if s.managed else "external",
            str(s.pid or "-"),
            "[green]healthy[/]" if s.healthy else "[red]DOWN[/]",
            s.detail,
        )
    Console().print(table)
    return all(s.healthy for s in statuses)


@infra_app.command("up")
@friendly_errors
def infra_up() -> None:
    """Start the embedded services (those without an external endpoint) and create the topics."""
    s = _settings()
    with console.status("starting Kafka, Mosquitto and Redis…"):
        statuses = infra.up(s)
    print_status(statuses)


@infra_app.command("down")
@friendly_errors
def infra_down() -> None:
    """Stop exactly the processes `infra up` started (data stays in the state folder)."""
    stopped = infra.down(_settings())
    console.print(f"stopped: {', '.join(stopped) if stopped else 'nothing was running'}")


@infra_app.command("status")
@friendly_errors
def infra_status() -> None:
    """Show each service, its address and whether it answers a protocol round trip."""
    if not print_status(infra.status(_settings())):
        raise typer.Exit(1)


@infra_app.command("restart")
@friendly_errors
def infra_restart(
    service: Annotated[str, typer.Argument(help=f"One of: {', '.join(infra.SERVICES)}.")],
) -> None:
    """Restart one embedded service: SIGTERM (as `down` does), then start it again on its data."""
    s = _settings()
    with console.status(f"restarting {service}…"):
        statuses = infra.restart(s, service)
    if not print_status(statuses):
        raise typer.Exit(1)


@infra_app.command("jars")
@friendly_errors
def infra_jars(
    bundles: Annotated[
        list[str] | None, typer.Argument(help="Bundles to fetch (default all: kafka, spark).")
    ] = None,
) -> None:
    """Fetch the JVM jars (the embedded Kafka broker, Spark's Kafka connector) with Maven, once,
    into the jar cache (FLEETFENCE_JAR_CACHE); later runs find them there offline."""
    from fleetfence import jars

    _settings()
    for bundle in bundles or jars.BUNDLES:
        with console.status(f"fetching the {bundle} jars (Maven, first time only)…"):
            libs = jars.ensure_jars(bundle)
        version = jars.pom_property(bundle, f"{bundle}.version")
        print(f"{bundle} {version}: {len(libs)} jars in {jars.bundle_dir(bundle) / 'libs'}")


@app.command()
@friendly_errors
def demo(
    vehicles: Annotated[int, typer.Option(min=1, max=500, help="Simulated vehicles.")] = 12,
    duration_s: Annotated[float, typer.Option(min=30, help="Simulated driving time, real time.")] = 150.0,
    seed: Annotated[int, typer.Option(help="Scenario seed.")] = 7,
) -> None:
    """Run the live demo: embedded infra, gateway, processor, API, receivers, simulator, verify."""
    import os

    from fleetfence.demo import main_demo

    s = _settings()
    if "FLEETFENCE_LOG_LEVEL" not in os.environ:
        # The terminal is for the live alerts; the services' logs go to files under the state folder.
        os.environ["FLEETFENCE_LOG_LEVEL"] = "WARNING"
        configure_logging("WARNING", s.log_json)
    raise typer.Exit(main_demo(s, vehicles=vehicles, duration_s=duration_s, seed=seed))


# --------------------------------------------------------------------------- alerts (issue 6)

alerts_app = typer.Typer(help="Alert receivers: tail, MQTT fan-out, webhooks, history.", no_args_is_help=True)
app.add_typer(alerts_app, name="alerts")


@alerts_app.command("tail")
@friendly_errors
def alerts_tail(
    *,
    vehicle: Annotated[
        list[str] | None, typer.Option("--vehicle", "-v", help="Only this vehicle (repeatable).")
    ] = None,
    alert_type: Annotated[
        list[str] | None, typer.Option("--type", "-t", help="Only this type (repeatable).")
    ] = None,
    route: Annotated[
        list[str] | None, typer.Option("--route", "-r", help="Only this route (repeatable).")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="One alert JSON per line, for scripts.")] = False,
    from_beginning: Annotated[
        bool, typer.Option("--from-beginning", help="Start at the oldest alert.")
    ] = False,
    limit: Annotated[int | None, typer.Option("--limit", "-n", min=1, help="Exit after N alerts.")] = None,
    group: Annotated[
        str | None, typer.Option("--group", help="Durable consumer group (default none).")
    ] = None,
) -> None:
    """Show committed alerts live as they arrive."""
    from alerts.config import AlertsSettings
    from alerts.model import AlertFilter
    from alerts.service import tail

    s = AlertsSettings()
    configure_logging(s.log_level, s.log_json)
    flt = AlertFilter.of(alert_type or (), vehicle or (), route or ())
    if not as_json:
        console.print(f"[dim]tailing {s.topics.alerts} ({flt.describe()}), Ctrl-C to stop[/]")
    tail(s, flt, as_json=as_json, from_beginning=from_beginning, limit=limit, group=group)


@alerts_app.command("run")
@friendly_errors
def alerts_run(
    config: Annotated[
        str | None, typer.Option("--config", "-c", help="Receivers TOML (default FLEETFENCE_ALERTS_CONFIG).")
    ] = None,
) -> None:
    """Run the configured receivers until SIGINT/SIGTERM."""
    from pathlib import Path

    from alerts.config import AlertsSettings, load_config
    from alerts.service import run_forever
    from fleetfence.errors import ConfigError

    s = AlertsSettings()
    configure_logging(s.log_level, s.log_json)
    path = Path(config) if config else s.alerts_config
    if path is None:
        raise ConfigError("no receivers config: pass --config FILE or set FLEETFENCE_ALERTS_CONFIG")
    run_forever(s, load_config(path))


@alerts_app.command("check")
@friendly_errors
def alerts_check(config: Annotated[str, typer.Argument(help="Receivers TOML file.")]) -> None:
    """Validate a receivers config and show what each receiver will get."""
    from pathlib import Path

    from alerts.config import load_config

    cfg = load_config(Path(config))
    table = Table(title=f"receivers in {config}")
    for col in ("name", "kind", "enabled", "filter"):
        table.add_column(col)
    for r in cfg.receivers:
        table.add_row(r.name, r.kind, "yes" if r.enabled else "no", r.filter.build().describe())
    Console().print(table)


# --------------------------------------------------------------------------- admin API (issue 5)

apikey_app = typer.Typer(help="API keys of the admin API (stored hashed in Redis).", no_args_is_help=True)
app.add_typer(apikey_app, name="apikey")


@app.command("api")
@friendly_errors
def api(
    host: Annotated[str | None, typer.Option(help="Default: FLEETFENCE_API_HOST.")] = None,
    port: Annotated[int | None, typer.Option(help="Default: FLEETFENCE_API_PORT.")] = None,
    workers: Annotated[int | None, typer.Option(help="Default: FLEETFENCE_API_WORKERS.")] = None,
) -> None:
    """Serve the admin API (with the outbox relay inside unless FLEETFENCE_API_RUN_RELAY=false)."""
    import uvicorn

    from admin_api.settings import ApiSettings

    s = ApiSettings()
    configure_logging(s.log_level, s.log_json)
    uvicorn.run(
        "admin_api.app:create_app",
        factory=True,
        host=host or s.api_host,
        port=port or s.api_port,
        workers=workers or s.api_workers,
        log_config=None,
        access_log=False,
    )


@app.command("master-relay")
@friendly_errors
def master_relay() -> None:
    """Publish the vehicle master's outbox to fleet.master until SIGTERM/SIGINT."""
    import signal
    import threading

    from vehicle_master.relay import OutboxRelay
    from vehicle_master.settings import MasterSettings

    s = MasterSettings()
    configure_logging(s.log_level, s.log_json)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_a: stop.set())
    relay = OutboxRelay(s)
    try:
        relay.run_forever(stop)
    finally:
        relay.stop()


@apikey_app.command("create")
@friendly_errors
def apikey_create(
    name: Annotated[str, typer.Argument(help="A unique name, e.g. ops-dashboard.")],
    role: Annotated[str, typer.Option(help="admin (read and write) or viewer (read only).")] = "viewer",
) -> None:
    """Create an API key and print it once (only its hash is stored)."""
    import redis

    from admin_api.security import ApiKeyError, Role, create_api_key

    s = _settings()
    if role not in {r.value for r in Role}:
        raise ApiKeyError(f"role must be admin or viewer, got {role!r}")
    r = redis.Redis.from_url(s.redis_dsn)
    try:
        key = create_api_key(r, s.redis_prefix, name, Role(role))
    finally:
        r.close()
    console.print(f"created {role} key [bold]{name}[/]; store it now, it is not shown again:")
    print(key)


@apikey_app.command("list")
@friendly_errors
def apikey_list() -> None:
    """List key names and roles (never the keys)."""
    import redis

    from admin_api.security import list_api_keys

    s = _settings()
    r = redis.Redis.from_url(s.redis_dsn)
    try:
        keys = list_api_keys(r, s.redis_prefix)
    finally:
        r.close()
    table = Table(title="API keys")
    for col in ("name", "role", "created_ms"):
        table.add_column(col)
    for k in keys:
        table.add_row(k["name"], k.get("role", "?"), k.get("created_ms", "?"))
    Console().print(table)


@apikey_app.command("revoke")
@friendly_errors
def apikey_revoke(name: Annotated[str, typer.Argument(help="The key's name.")]) -> None:
    """Revoke a key (the API stops accepting it within FLEETFENCE_API_KEY_CACHE_S)."""
    import redis

    from admin_api.security import revoke_api_key

    s = _settings()
    r = redis.Redis.from_url(s.redis_dsn)
    try:
        revoke_api_key(r, s.redis_prefix, name)
    finally:
        r.close()
    console.print(f"revoked {name}")


# --------------------------------------------------------------------------- gateway (issue 3)


@app.command("gateway")
@friendly_errors
def gateway_cmd() -> None:
    """Run one gateway replica (MQTT -> Kafka) until SIGTERM/Ctrl-C, then drain what is in flight."""
    from gateway.__main__ import run
    from gateway.settings import GatewaySettings

    settings = GatewaySettings()
    configure_logging(settings.log_level, settings.log_json)
    if not run(settings):
        raise typer.Exit(1)


# --------------------------------------------------------------------------- processor (issue 4)


@app.command("processor")
@friendly_errors
def processor_cmd() -> None:
    """Run the PySpark geofencing job (FLEETFENCE_PROCESSOR_* settings) until Ctrl-C/SIGTERM."""
    from processor.job import ProcessorSettings
    from processor.service import run_processor

    s = ProcessorSettings()
    configure_logging(s.log_level, s.log_json)
    run_processor(s)


# --------------------------------------------------------------------------- simulator (issue 7)


@app.command("simulate")
@friendly_errors
def simulate_cmd(
    vehicles: Annotated[int, typer.Option("--vehicles", "-n", min=1, max=1_000_000, help="Fleet size.")] = 10,
    duration: Annotated[float, typer.Option(min=0.05, help="Seconds of event time.")] = 600.0,
    rate: Annotated[float, typer.Option(min=0.05, max=50, help="Fixes per second per vehicle.")] = 1.0,
    seed: Annotated[int, typer.Option(help="Same seed and start time: same scenario and truth.")] = 1,
    noise: Annotated[
        float, typer.Option(min=0, help="GPS noise sigma in metres (bounded at 3 sigma).")
    ] = 3.0,
    routes: Annotated[
        int, typer.Option(min=0, help="Synthetic routes (0: one per 25 vehicles, max 20).")
    ] = 0,
    routes_geojson: Annotated[
        str | None,
        typer.Option("--routes-geojson", help="Use the LineStrings of this GeoJSON file as routes."),
    ] = None,
    route_length: Annotated[float, typer.Option(min=200, help="Synthetic route length in metres.")] = 8000.0,
    zones_per_route: Annotated[int, typer.Option(min=0, max=10)] = 2,
    bbox: Annotated[
        str | None, typer.Option(help="City box min_lon,min_lat,max_lon,max_lat (default central Berlin).")
    ] = None,
    corridor_width: Annotated[float, typer.Option(min=1, help="Route corridor full width, metres.")] = 100.0,
    speed_limit: Annotated[float, typer.Option(min=1, help="Route speed limit, km/h.")] = 50.0,
    deviation_min_fixes: Annotated[int, typer.Option(min=1)] = 3,
    deviation_min_s: Annotated[float, typer.Option(min=0)] = 0.0,
    overspeed_min_s: Annotated[float, typer.Option(min=0)] = 10.0,
    silent_after: Annotated[float, typer.Option(min=1, help="Route silent_after_s.")] = 120.0,
    deviations: Annotated[
        float, typer.Option(min=0, max=1, help="Fraction of vehicles that leave the corridor.")
    ] = 0.1,
    overspeeds: Annotated[
        float, typer.Option(min=0, max=1, help="Fraction of vehicles with a speeding episode.")
    ] = 0.1,
    dwells: Annotated[
        float, typer.Option(min=0, max=1, help="Fraction of vehicles that stop in a zone.")
    ] = 0.1,
    silences: Annotated[
        float, typer.Option(min=0, max=1, help="Fraction of vehicles that go silent.")
    ] = 0.05,
    duplicates: Annotated[
        float, typer.Option(min=0, max=1, help="Probability a message is sent twice.")
    ] = 0.01,
    out_of_order: Annotated[
        float, typer.Option(min=0, max=1, help="Probability a fix swaps with the next.")
    ] = 0.01,
    late: Annotated[
        float, typer.Option(min=0, max=1, help="Probability a calm fix arrives after the lateness.")
    ] = 0.005,
    direct: Annotated[
        bool, typer.Option("--direct", help="Write canonical records straight to Kafka instead of MQTT.")
    ] = False,
    realtime: Annotated[
        bool,
        typer.Option("--realtime/--fast", help="Pace at the rate (demos) or publish as fast as possible."),
    ] = False,
    start_time: Annotated[
        str | None, typer.Option(help="Event time of the first fix: ISO-8601, epoch ms or 'now'.")
    ] = None,
    truth: Annotated[
        str, typer.Option("--truth", help="Ground truth output (JSON lines).")
    ] = "sim-truth.jsonl",
    register: Annotated[
        bool, typer.Option("--register/--no-register", help="Register routes, zones, vehicles, assignments.")
    ] = True,
    api_url: Annotated[str | None, typer.Option(help="Register through the admin API at this URL.")] = None,
    api_key: Annotated[
        str | None, typer.Option(help="Admin API key (or FLEETFENCE_SIMULATOR_API_KEY).")
    ] = None,
    vehicle_prefix: Annotated[str, typer.Option(help="Prefix of vehicle, route and zone ids.")] = "sim-",
    as_json: Annotated[bool, typer.Option("--json", help="Print the closing report as JSON.")] = False,
) -> None:
    """Drive simulated vehicles with injected deviations, speeding, zone stops, silences and
    transport faults; publish them (MQTT or Kafka) and write the exact expected alerts."""
    from pathlib import Path

    from simulator.commands import simulate
    from simulator.scenario import Injections

    simulate(
        vehicles=vehicles,
        duration_s=duration,
        rate_hz=rate,
        seed=seed,
        noise_m=noise,
        routes=routes,
        routes_geojson=Path(routes_geojson) if routes_geojson else None,
        route_length_m=route_length,
        zones_per_route=zones_per_route,
        bbox=bbox,
        corridor_width_m=corridor_width,
        speed_limit_kmh=speed_limit,
        deviation_min_fixes=deviation_min_fixes,
        deviation_min_s=deviation_min_s,
        overspeed_min_s=overspeed_min_s,
        silent_after_s=silent_after,
        injections=Injections(deviations, overspeeds, dwells, silences, duplicates, out_of_order, late),
        direct=direct,
        realtime=realtime,
        start_time=start_time,
        truth_path=Path(truth),
        register=register,
        api_url=api_url,
        api_key=api_key,
        vehicle_prefix=vehicle_prefix,
        as_json=as_json,
    )


@app.command("verify")
@friendly_errors
def verify_cmd(
    truth: Annotated[
        str, typer.Option("--truth", help="Ground truth written by `simulate`.")
    ] = "sim-truth.jsonl",
    timeout: Annotated[float, typer.Option(min=0, help="Wait up to this long for missing alerts.")] = 0.0,
    seq_tolerance: Annotated[int, typer.Option(min=0, help="Match alerts whose seq is this close.")] = 0,
    min_precision: Annotated[float, typer.Option(min=0, max=1)] = 1.0,
    min_recall: Annotated[float, typer.Option(min=0, max=1)] = 1.0,
    max_duplicates: Annotated[int, typer.Option(min=0)] = 0,
    as_json: Annotated[bool, typer.Option("--json", help="Print the figures as JSON.")] = False,
) -> None:
    """Compare committed alerts (read_committed) with a ground truth; exit 1 below the thresholds."""
    from pathlib import Path

    from simulator.commands import verify

    code = verify(
        truth_path=Path(truth),
        timeout_s=timeout,
        seq_tolerance=seq_tolerance,
        min_precision=min_precision,
        min_recall=min_recall,
        max_duplicates=max_duplicates,
        as_json=as_json,
    )
    if code:
        raise typer.Exit(code)


# --------------------------------------------------------------------------- history archive, restatement

archive_app = typer.Typer(
    help="The telemetry/alert archive (GeoParquet): writer, compaction, retention.", no_args_is_help=True
)
app.add_typer(archive_app, name="archive")


def _history_settings() -> Any:
    from history.settings import HistorySettings

    return HistorySettings.from_settings(_settings())


@archive_app.command("run")
@friendly_errors
def archive_run() -> None:
    """Run the archive writer (Spark streaming, exactly once) until Ctrl-C/SIGTERM."""
    from history.archive import run_archive

    run_archive(_history_settings())


@archive_app.command("compact")
@friendly_errors
def archive_compact() -> None:
    """Merge the files of each partition older than the current UTC day into one."""
    from history.archive import compact

    hs = _history_settings()
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
    from history.archive import apply_retention

    hs = _history_settings()
    deleted = apply_retention(hs.archive_root, days or hs.retention_days)
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
    import os

    from fleetfence.contracts import ms_to_iso, parse_ts_ms
    from fleetfence.errors import ConfigError
    from history.restate import RestateRequest, run_restatement
    from processor.job import ProcessorSettings
    from processor.spark import build_session

    hs = _history_settings()
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
    master = hs.spark_master or (None if os.environ.get("SPARK_ENV_LOADED") else "local[*]")
    spark = build_session(app_name="fleetfence-restate", master=master)
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


def main() -> None:  # pragma: no cover - console entry
    sys.exit(app())


# --------------------------------------------------------------------------- history reports

report_app = typer.Typer(
    help="History reports over the telemetry archive (SedonaDB): tables, JSON, PNG charts.",
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


def _report(name: str, **kwargs: Any) -> None:
    from history.report_cli import run as run_report_cli

    run_report_cli(name, _settings(), **kwargs)


@report_app.command("adherence")
@friendly_errors
def report_adherence(
    start: ReportFrom,
    end: ReportTo,
    vehicle: ReportVehicle = None,
    png: ReportPng = None,
    as_json: ReportJson = False,
    archive: ReportArchive = None,
) -> None:
    """Share of fixes inside the route corridor, time and distance off-route, per vehicle and day."""
    _report("adherence", start=start, end=end, vehicle_id=vehicle, png=png, as_json=as_json, archive=archive)


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
) -> None:
    """Zone visits: entry, exit and dwell time of each run of fixes inside a zone."""
    _report(
        "zone_visits",
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
) -> None:
    """Speeding episodes: runs of fixes above the assigned route's limit."""
    _report("speeding", start=start, end=end, vehicle_id=vehicle, png=png, as_json=as_json, archive=archive)


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
) -> None:
    """Off-route fixes per H3 cell (GeoJSON polygons with --geojson)."""
    _report(
        "heatmap",
        start=start,
        end=end,
        vehicle_id=vehicle,
        png=png,
        as_json=as_json,
        archive=archive,
        geojson=geojson,
        resolution=resolution,
    )
