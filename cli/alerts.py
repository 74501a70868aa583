"""`fleetfence alerts`: run, tail and check the alert receivers (the alerts package)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from cli.common import app, console, friendly_errors
from fleetfence.logs import configure_logging

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
    # The alerts are the output here: the receiver's own INFO lines (started, partitions assigned)
    # would interleave with them, so only warnings unless FLEETFENCE_LOG_LEVEL asks for more.
    configure_logging(s.log_level if "FLEETFENCE_LOG_LEVEL" in os.environ else "WARNING", s.log_json)
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

    from alerts.config import load_config

    cfg = load_config(Path(config))
    table = Table(title=f"receivers in {config}")
    for col in ("name", "kind", "enabled", "filter"):
        table.add_column(col)
    for r in cfg.receivers:
        table.add_row(r.name, r.kind, "yes" if r.enabled else "no", r.filter.build().describe())
    Console().print(table)


# --------------------------------------------------------------------------- admin API
