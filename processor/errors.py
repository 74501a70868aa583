"""Errors of the streaming processor.

Each derives from `FleetFenceError` (fleetfence.errors), the one root, so a CLI or a service loop
tells an explained failure from a bug the same way for every package.
"""

from __future__ import annotations

from fleetfence.errors import FleetFenceError


class ProcessorError(FleetFenceError):
    """The streaming query failed."""


class LateReadBackError(ProcessorError):
    """The original record of a fix beyond the lateness bound is on the telemetry topic but could
    not be read back in time: the sink's task fails and Spark retries it."""


class LeaseLostError(ProcessorError):
    """This driver no longer holds the checkpoint's lease (processor.ops.lease): it must stop its query."""


class StalledError(ProcessorError):
    """A micro-batch has run longer than `processor_stall_timeout_s`: the query is stuck, and only a
    new driver on the checkpoint gets it going again."""


class StateError(ProcessorError):
    """A value in the checkpoint's state store is in no format this version can read."""
