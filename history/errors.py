"""Errors of the archive, the reports and restatement.

Each derives from `FleetFenceError` (fleetfence.errors), the one root, so a CLI or a service loop
tells an explained failure from a bug the same way for every package.
"""

from __future__ import annotations

from fleetfence.errors import FleetFenceError


class HistoryError(FleetFenceError):
    """Base of the history package's own errors."""


class ReportError(HistoryError):
    """A report request is invalid (bad range, bad vehicle id, unknown report)."""


class ArchiveError(HistoryError):
    """The archive query failed or the archive is not in the expected layout."""


class RestateError(HistoryError):
    """The restatement request cannot be served (bad window, unknown route version, bad GeoJSON)."""
