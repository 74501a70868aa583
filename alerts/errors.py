"""Errors of the alert receivers.

Each derives from `FleetFenceError` (fleetfence.errors), the one root, so a CLI or a service loop
tells an explained failure from a bug the same way for every package.
"""

from __future__ import annotations

from fleetfence.errors import FleetFenceError


class AlertsError(FleetFenceError):
    """Base of the alerts package's own errors."""


class ReceiverCrashedError(AlertsError):
    """A receiver thread died; the process exits non-zero so a supervisor restarts it."""


class StopRequestedError(AlertsError):
    """The runner is stopping while a sink waits (e.g. in a retry back-off): nothing was recorded."""


class MqttPublishError(AlertsError):
    """The broker did not acknowledge a publish in time (the runner retries the alert)."""


class UnmappedAlertTypeError(AlertsError):
    """An alert type that alerts.model.condition_change has no rule for: a programming error that
    mypy and the tests catch first; at run time the history receiver retries the alert rather than
    guess its condition."""


class FatalConsumerError(AlertsError):
    """The receiver's Kafka consumer is dead (librdkafka's fatal error, e.g. fenced by a member with
    the same group.instance.id): the runner replaces it, within a budget (alerts.runner)."""
