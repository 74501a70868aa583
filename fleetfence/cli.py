"""The `fleetfence` command line: infrastructure, services, demo, simulator.

Each sub-command is a thin adapter: it reads settings, configures logging and calls into the
component package, turning a `FleetFenceError` into a readable message and exit code 2.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from functools import wraps
from typing import Any, TypeVar

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


def main() -> None:  # pragma: no cover - console entry
    sys.exit(app())
