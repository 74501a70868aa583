"""The contract between the runner and a receiver's side effect: a `Sink` delivers one alert with a
`Context` and answers with an `Outcome`. The webhook, MQTT fan-out, history and tail receivers
implement it (a receiver of one's own implements this Protocol).

A sink that batches (the e-mail receiver) is a `HoldingSink`: it may answer `HELD`, keeping the
alert for a later side effect that covers several alerts, and reports it `settle`d once that side
effect happened. The runner commits no offset at or past an alert still held, so a crash or a
rebalance leaves it to be read again, never lost."""

from __future__ import annotations

import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import Enum
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from alerts.errors import StopRequestedError
from alerts.metrics import ReceiverMetrics
from alerts.model import Alert, SourceRecord

if TYPE_CHECKING:
    from alerts.dead_letters import DeadLetters


class Outcome(Enum):
    DELIVERED = "delivered"
    DUPLICATE = "duplicate"
    DEAD_LETTERED = "dead_lettered"
    #: Kept by a `HoldingSink` for a later side effect; its final outcome comes from `settle`.
    HELD = "held"


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


@dataclass(frozen=True)
class Settled:
    """A held alert whose side effect is done: DELIVERED, DEAD_LETTERED or DUPLICATE."""

    alert: Alert
    outcome: Outcome


@runtime_checkable
class HoldingSink(Sink, Protocol):
    def settle(self, now: float) -> list[Settled]:
        """Perform the side effects that are due at `now` (time.monotonic()) and return the alerts
        they completed, which the sink no longer holds. The sink has recorded whatever it needs to
        never repeat them before it returns; raise on an infrastructure failure (the runner calls
        again after a back-off)."""
        ...

    def held_count(self) -> int:
        """How many alerts the sink holds now."""
        ...

    def held_from(self) -> Mapping[tuple[str, int], int]:
        """The smallest offset held per (topic, partition): the runner commits no further."""
        ...

    def release(self, partitions: Iterable[tuple[str, int]]) -> int:
        """Forget what is held of partitions this member no longer owns: their next owner reads
        them again from the committed offset, which is at or before them. Returns how many alerts
        it dropped (the runner counts them as released, so its counts still reconcile)."""
        ...
