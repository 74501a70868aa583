"""The `fleetfence` console script: the root app with every command group registered on it.

Importing a group's module registers its commands (typer lists them in this order in `--help`).
"""

from __future__ import annotations

import sys

from cli import alerts, demo, history, infra, loadtest, mqtt, services, simulation, status  # noqa: F401  (registration)
from cli.common import app

__all__ = ["app", "main"]


def main() -> None:  # pragma: no cover - console entry
    sys.exit(app())
