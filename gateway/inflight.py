"""In-flight bookkeeping between MQTT receipt and Kafka confirmation (pure, single-threaded).

Every received message becomes a `Pending` entry in receive order. Kafka confirms entries in any
order (partitions complete independently); `confirm` returns the entries whose PUBACK may be sent
now. With `in_order` (the default) that is the longest confirmed prefix, because MQTT 5 section 4.6
asks a receiver to send PUBACKs in the order the PUBLISHes arrived; without it, each entry as soon
as Kafka has it (Mosquitto accepts that too, see tests/gateway/test_gateway.py).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

from gateway.core import Record


@dataclass(slots=True, eq=False)
class Pending:
    """One received message until its PUBACK is sent (or its connection is gone)."""

    serial: int
    mid: int
    generation: int  # MQTT connection it arrived on; its mid is meaningless on any other
    record: Record | None  # None: another replica's message, acknowledged without producing
    received_mono_s: float
    attempt: int = 0
    produced_mono_s: float = 0.0
    confirmed: bool = False
    # The device edge's (gateway.edge): the connection the message came on and the bytes that
    # acknowledge it there (PUBACK or PUBREC, with its reason code).
    owner: object | None = None
    reply: bytes = b""
    # The tracker protocol it came in (`fleetfence.devices.TrackerProtocol`'s value): counted per
    # protocol once Kafka has it (`gateway.held.HeldConnection.counted`). None: FleetFence's own JSON.
    protocol: str | None = None


class InFlight:
    """Entries received and not yet released for acknowledgement, in receive order."""

    def __init__(self, in_order: bool) -> None:
        self.in_order = in_order
        self._entries: OrderedDict[int, Pending] = OrderedDict()
        self._next_serial = 0
        self.max_seen = 0
        self.last_released = -1
        self.released_out_of_order = 0  # releases before an earlier-received entry: measured, not assumed

    def __len__(self) -> int:
        return len(self._entries)

    def add(self, mid: int, generation: int, record: Record | None, now_mono_s: float) -> Pending:
        e = Pending(self._next_serial, mid, generation, record, now_mono_s)
        self._next_serial += 1
        self._entries[e.serial] = e
        self.max_seen = max(self.max_seen, len(self._entries))
        return e

    def confirm(self, e: Pending) -> list[Pending]:
        """Mark `e` as stored by Kafka; return the entries to acknowledge now, in order."""
        e.confirmed = True
        if not self.in_order:
            if self._entries.pop(e.serial, None) is None:
                return []
            if e.serial < self.last_released:
                self.released_out_of_order += 1
            self.last_released = max(self.last_released, e.serial)
            return [e]
        out: list[Pending] = []
        entries = self._entries
        while entries:
            first = next(iter(entries.values()))
            if not first.confirmed:
                break
            entries.popitem(last=False)
            self.last_released = first.serial
            out.append(first)
        return out

    def unconfirmed(self) -> list[Pending]:
        """Entries Kafka has not confirmed yet (to produce again on a new producer)."""
        return [e for e in self._entries.values() if not e.confirmed]
