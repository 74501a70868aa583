"""What every command of the `fleetfence` command line shares: the root app, the error handling
that turns FleetFence's own errors into a readable message and exit code 2, settings and logging.

The commands themselves live in a module per group (cli.infra, cli.services, cli.alerts,
cli.simulation, cli.history, cli.demo); each is a thin adapter that reads settings, configures
logging and calls into a component package.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import wraps
from typing import Any, TypeVar

import typer
from rich.console import Console
from rich.text import Text

from fleetfence.errors import FleetFenceError
from fleetfence.logs import configure_logging
from fleetfence.settings import Settings, get_settings

app = typer.Typer(help="FleetFence: real-time fleet geofencing.", no_args_is_help=True, add_completion=False)
console = Console(stderr=True)
F = TypeVar("F", bound=Callable[..., Any])


def friendly_errors(fn: F) -> F:
    """Print FleetFence's own errors as a readable message instead of a traceback, and in full: a
    message can carry a service's log lines (embedded.pipeline's ServiceExitedError), whose
    brackets rich would take for markup (`[type=value_error, ...]` vanished, a `[/]` raised
    MarkupError instead of printing anything), and whose long lines rich would break at 80
    columns where stderr is no terminal (a CI log, a pipe). So plain text, soft-wrapped."""

    @wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except FleetFenceError as exc:
            console.print(Text.assemble(("error:", "bold red"), " ", str(exc)), soft_wrap=True)
            raise typer.Exit(2) from exc

    return wrapper  # type: ignore[return-value]


def settings_from_env(**overrides: Any) -> Settings:
    """The settings from the environment (a command's options in `overrides` win), with logging
    configured from them."""
    s = Settings(**overrides) if overrides else get_settings()
    configure_logging(s.log_level, s.log_json)
    return s
