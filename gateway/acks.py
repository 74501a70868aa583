"""Acknowledgement order: nothing is acknowledged to MQTT before Kafka has the fix.

A PUBACK tells Mosquitto it may forget the message, so it is sent only once Kafka has confirmed
the record, and only on the connection the message arrived on: packet ids are per connection, and
after a reconnect Mosquitto redelivers whatever was not acknowledged (a duplicate, never a loss).
`InFlight` decides which confirmed messages may be acknowledged (receive order by default);
`AckOrder` turns them into PUBACK bytes and writes them between paho's packets, and
`DrainBarrier` proves on shutdown that Mosquitto has read them all.

Everything here runs on the gateway's I/O thread, so it needs no locks.
"""

from __future__ import annotations

import paho.mqtt.client as mqtt

from gateway.core import Record
from gateway.inflight import InFlight, Pending
from gateway.metrics import GatewayStats
from gateway.mqtt_client import BufferedClient, RawWrite

# UNSUBSCRIBE of a topic we never subscribed: its UNSUBACK proves Mosquitto has processed every
# PUBACK sent before it. Closing without that proof can lose them: a close() with unread bytes in
# our receive buffer sends a TCP RST, and Mosquitto drops what it had not read yet.
DRAIN_BARRIER_TOPIC = "fleetfence/gateway/drain-barrier"
# MQTT 5 PUBACK, reason "success" omitted (allowed when there are no properties): 4 bytes with the id.
PUBACK_HEAD = b"\x40\x02"


class AckOrder:
    """The messages held for Kafka and the PUBACKs they release, tied to one MQTT connection.

    `generation` counts connections: an entry remembers the one it arrived on, and a confirmation
    for an older connection is dropped instead of acknowledging an unrelated message that reuses
    its packet id. Released PUBACKs collect in one buffer and go out in one `send` per loop turn
    instead of one per message through paho's packet queue.
    """

    def __init__(self, in_order: bool, stats: GatewayStats) -> None:
        self._inflight = InFlight(in_order)
        self._stats = stats
        self.generation = 0
        self.connected = False
        self._unsent = bytearray()

    def __len__(self) -> int:
        """Messages received and not yet released for acknowledgement (the Receive Maximum's count)."""
        return len(self._inflight)

    @property
    def max_seen(self) -> int:
        return self._inflight.max_seen

    @property
    def released_out_of_order(self) -> int:
        """Releases before an earlier-received message: 0 with in-order acks."""
        return self._inflight.released_out_of_order

    @property
    def unsent(self) -> bool:
        """PUBACKs released but not yet written."""
        return bool(self._unsent)

    def unconfirmed(self) -> list[Pending]:
        """Held messages Kafka has not confirmed yet, in receive order."""
        return self._inflight.unconfirmed()

    def hold(self, mid: int, qos: int, record: Record, now_mono_s: float) -> Pending:
        """Hold a received message until Kafka has its record (QoS 0 needs no PUBACK: mid 0)."""
        return self._inflight.add(mid if qos > 0 else 0, self.generation, record, now_mono_s)

    def pass_on(self, mid: int, qos: int, now_mono_s: float) -> None:
        """Acknowledge another shard's message without producing it, in its place in the order."""
        self.stored(self._inflight.add(mid if qos > 0 else 0, self.generation, None, now_mono_s))

    def stored(self, e: Pending) -> None:
        """Kafka has `e`'s record: release the PUBACKs that may go now."""
        for done in self._inflight.confirm(e):
            self._release(done)

    def _release(self, e: Pending) -> None:
        if e.mid == 0:
            return
        ours = e.record is not None  # the counters are about this replica's shard
        if e.generation != self.generation or not self.connected:
            self._stats.acks_dropped += ours
            return
        self._unsent += PUBACK_HEAD
        self._unsent += e.mid.to_bytes(2, "big")
        self._stats.acked += ours

    def connection_opened(self) -> None:
        self.connected = True

    def connection_lost(self) -> None:
        """The connection is gone: its packet ids mean nothing any more, Mosquitto redelivers."""
        self.generation += 1
        self._unsent.clear()
        self.connected = False

    def flush(self, client: BufferedClient) -> None:
        """Write the released PUBACKs, only between paho's packets so bytes never interleave."""
        if client.writes_pending():
            return  # paho's packet first; ours wait for the next loop turn
        data = bytes(self._unsent)
        self._unsent.clear()
        if client.write_raw(data) is RawWrite.CLOSED:
            self.connection_lost()


class DrainBarrier:
    """On shutdown: once every PUBACK is written, an UNSUBSCRIBE whose UNSUBACK proves them read."""

    def __init__(self) -> None:
        self._mid: int | None = None
        self.done = False

    def send_when_acked(self, client: mqtt.Client, acks: AckOrder) -> None:
        """Send the barrier once nothing is held, released-but-unwritten, or queued in paho."""
        if self._mid is None and not len(acks) and not acks.unsent and not client.want_write():
            _rc, self._mid = client.unsubscribe(DRAIN_BARRIER_TOPIC)

    def unsubscribed(self, mid: int) -> None:
        """paho's UNSUBACK callback: the barrier's means every earlier PUBACK was processed."""
        if mid == self._mid:
            self.done = True
