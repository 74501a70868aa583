"""`fleetfence demo`: the README's main command.

Brings up the embedded infrastructure and shows its status. The live pipeline (gateway, processor,
admin API, alert receivers, simulator) joins here as each component lands.
"""

from __future__ import annotations

import logging

from rich.console import Console

from fleetfence import infra
from fleetfence.settings import Settings

logger = logging.getLogger(__name__)


def run_demo(settings: Settings) -> None:
    console = Console()
    with console.status("starting the embedded infrastructure…"):
        statuses = infra.up(settings)
    from fleetfence.cli import print_status

    print_status(statuses)
    console.print(f"state folder: {settings.state_dir.resolve()} — stop with `fleetfence infra down`")
