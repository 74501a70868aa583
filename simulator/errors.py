"""Errors of the simulator.

Each derives from `FleetFenceError` (fleetfence.errors), the one root, so a CLI or a service loop
tells an explained failure from a bug the same way for every package.
"""

from __future__ import annotations

from fleetfence.errors import FleetFenceError


class SimulatorError(FleetFenceError):
    """Base of the simulator package's own errors."""


class RegistrationError(SimulatorError):
    """The vehicle master or the admin API refused the scenario's entities."""
