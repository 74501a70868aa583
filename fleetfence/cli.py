"""The `fleetfence` command line: infrastructure, services, demo, simulator.

Each sub-command is a thin adapter: it reads settings, configures logging and calls into the
component package, turning a `FleetFenceError` into a readable message and exit code 2.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from functools import wraps
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
    help="Embedded infrastructure: Kafka-protocol broker, Mosquitto, Redis.", no_args_is_help=True
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
    with console.status("starting broker, Mosquitto and Redis…"):
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


@app.command()
@friendly_errors
def demo() -> None:
    """Run the live demo on the embedded infrastructure."""
    from fleetfence.demo import run_demo

    run_demo(_settings())


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


def main() -> None:  # pragma: no cover - console entry
    sys.exit(app())
