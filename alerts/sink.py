"""The contract between the runner and a receiver's side effect: a `Sink` delivers one alert with a
`Context` and answers with an `Outcome`. The webhook, MQTT fan-out, history and tail receivers
implement it (a receiver of one's own implements this Protocol)."""

from __future__ import annotations

import threading
from dataclasses import dataclass
from enum import Enum
from typing import TYPE_CHECKING, Protocol

from alerts.errors import StopRequestedError
from alerts.metrics import ReceiverMetrics
from alerts.model import Alert, SourceRecord

if TYPE_CHECKING:
    from alerts.dead_letters import DeadLetters


class Outcome(Enum):
    DELIVERED = "delivered"
    DUPLICATE = "duplicate"
    DEAD_LETTERED = "dead_lettered"


@dataclass
class Context:
    """What a sink may use while delivering one alert."""

    source: SourceRecord
    metrics: ReceiverMetrics
    dead_letters: DeadLetters | None
    stopping: threading.Event

    def sleep(self, seconds: float) -> None:
        """Back-off that a stop request interrupts."""
        if self.stopping.wait(seconds):
            raise StopRequestedError("receiver stopping during back-off")


class Sink(Protocol):
    #: True when the side effect itself refuses repeats, so the runner needs no dedup store.
    idempotent: bool

    def deliver(self, alert: Alert, ctx: Context) -> Outcome: ...

    def close(self) -> None: ...
