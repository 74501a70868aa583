"""`python -m gateway` / `fleetfence gateway`: run one replica (the device edge, or the reader of
Mosquitto) until SIGTERM or SIGINT, then drain."""

from __future__ import annotations

import logging
import sys
import threading

from fleetfence.errors import FleetFenceError
from fleetfence.logs import configure_logging
from fleetfence.service import run_until_stopped, stop_on_signals
from gateway.edge import EdgeGateway
from gateway.service import Gateway
from gateway.settings import GatewaySettings

logger = logging.getLogger(__name__)


def run(settings: GatewaySettings) -> bool:
    """Run until a signal, then drain; True when every in-flight message was confirmed and
    acknowledged."""
    # With an edge port the replica is the vehicles' MQTT endpoint (gateway.edge); without one it
    # reads their messages from Mosquitto (gateway.service).
    gw: Gateway | EdgeGateway = EdgeGateway(settings) if settings.gateway_edge_listens else Gateway(settings)

    def exited() -> bool:
        gw.wait(0.5)
        return not gw.running

    with stop_on_signals() as stop:
        gw.start()
        if not run_until_stopped(exited, stop):
            logger.info("draining")
            gw.request_stop()
            run_until_stopped(exited, threading.Event())
    return gw.wait(0)


def main() -> int:
    settings = GatewaySettings()
    configure_logging(settings.log_level, settings.log_json)
    try:
        return 0 if run(settings) else 1
    except FleetFenceError as exc:
        logger.error("gateway failed: %s", exc)
        return 2


if __name__ == "__main__":
    sys.exit(main())
