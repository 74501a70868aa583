"""`python -m gateway` / `fleetfence gateway`: run one replica until SIGTERM or SIGINT, then drain."""

from __future__ import annotations

import logging
import signal
import sys
from types import FrameType

from fleetfence.errors import FleetFenceError
from fleetfence.logs import configure_logging
from gateway.service import Gateway
from gateway.settings import GatewaySettings

logger = logging.getLogger(__name__)


def run(settings: GatewaySettings) -> bool:
    """Run until a signal; True when every in-flight message was confirmed and acknowledged."""
    gw = Gateway(settings)

    def _on_signal(signum: int, _frame: FrameType | None) -> None:
        logger.info("signal received signal=%s: draining", signal.Signals(signum).name)
        gw.request_stop()

    signal.signal(signal.SIGTERM, _on_signal)
    signal.signal(signal.SIGINT, _on_signal)
    gw.start()
    while not gw.wait(0.5):
        if gw._thread is None or not gw._thread.is_alive():
            break
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
