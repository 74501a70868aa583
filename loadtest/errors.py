"""Errors of the load test. Each derives from `FleetFenceError` (fleetfence.errors), the one root."""

from __future__ import annotations

from fleetfence.errors import FleetFenceError


class LoadtestError(FleetFenceError):
    """Base of the load test's own errors."""


class ThresholdMissedError(LoadtestError):
    """A threshold given on the command line (--max-p99-ms, --min-recall, --max-rss-growth) was
    missed: the run itself worked, the installation did not meet the bar."""
