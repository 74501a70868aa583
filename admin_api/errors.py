"""Errors of the admin API.

Each derives from `FleetFenceError` (fleetfence.errors), the one root, so a CLI or a service loop
tells an explained failure from a bug the same way for every package.
"""

from __future__ import annotations

from fleetfence.errors import FleetFenceError


class ApiError(FleetFenceError):
    """Base of the admin_api package's own errors."""


class BodyTooLargeError(ApiError):
    """A request body exceeds FLEETFENCE_API_MAX_BODY_BYTES (answered with 413)."""


class ApiKeyError(ApiError):
    """An API key could not be created or revoked."""
