"""What every device connection on the edge shares, whatever its protocol: the messages it holds
for Kafka in receive order, the acknowledgements Kafka's confirmations release, and the
transport's back-pressure. An MQTT connection (`gateway.edge.DeviceConnection`) and a Teltonika
one (`gateway.teltonika_edge.TeltonikaConnection`) differ only in how they read frames, what their
acknowledgement looks like and how they close; the promise (an acknowledgement only once Kafka has
everything it covers) lives here once.
"""

from __future__ import annotations

import asyncio
import time
from typing import Protocol

from gateway.inflight import InFlight, Pending
from gateway.metrics import GatewayStats
from gateway.settings import GatewaySettings


class EdgeHost(Protocol):
    """What a held connection reads of the edge it runs in."""

    settings: GatewaySettings
    stats: GatewayStats
    all_paused: bool


class HeldConnection(asyncio.Protocol):
    """A device's connection whose messages wait for Kafka before they are acknowledged."""

    def __init__(self, edge: EdgeHost) -> None:
        self.host = edge
        self.transport: asyncio.Transport | None = None
        self.inflight = InFlight(in_order=True)
        self.out = bytearray()
        self.opened_mono_s = time.monotonic()
        self.last_rx_mono_s = self.opened_mono_s
        self.closed = False
        self.paused = False

    def counted(self, e: Pending) -> None:
        """A tracker's message is counted by its protocol when it is settled: forwarded or
        dead-lettered once Kafka has it, ignored (a message that carries no fix) at once."""
        if e.protocol is None:
            return
        if e.record is None:
            outcome = "ignored"
        else:
            outcome = "forwarded" if e.record.reason is None else "dead_lettered"
        self.host.stats.tracker_records[(e.protocol, outcome)] += 1

    def stored(self, e: Pending) -> None:
        """Kafka has `e`: queue the acknowledgements this releases, in receive order (an entry
        carries its acknowledgement in `reply`, empty for one that needs none)."""
        self.counted(e)
        stats = self.host.stats
        for done in self.inflight.confirm(e):
            if not done.reply:
                continue
            if self.closed:
                stats.acks_dropped += 1  # the device sends it again on its next connection
                continue
            self.out += done.reply
            stats.acked += 1
        if self.paused and len(self.inflight) < self.host.settings.gateway_edge_receive_maximum // 2 + 1:
            self.resume()

    def hold_back(self) -> None:
        """Read no more from a device with a full window, until Kafka confirms half of it."""
        if len(self.inflight) >= self.host.settings.gateway_edge_receive_maximum and not self.paused:
            self.pause()

    def close(self, reason: int | None = None) -> None:
        """Close the connection with what Kafka released written first (`reason` is MQTT's: a
        protocol without a goodbye, Teltonika or HTTP, is told nothing)."""
        if self.closed or self.transport is None:
            return
        self.flush()
        self.transport.close()
        self.closed = True

    def flush(self) -> None:
        if self.out and not self.closed and self.transport is not None:
            self.transport.write(bytes(self.out))
        self.out.clear()

    def write(self, data: bytes) -> None:
        if data and not self.closed and self.transport is not None:
            self.transport.write(data)

    def pause(self) -> None:
        if self.transport is not None and not self.closed:
            self.transport.pause_reading()
        self.paused = True

    def resume(self) -> None:
        self.paused = False
        if self.transport is not None and not self.closed and not self.host.all_paused:
            self.transport.resume_reading()

    @property
    def peer(self) -> str:
        info = self.transport.get_extra_info("peername") if self.transport is not None else None
        return f"{info[0]}:{info[1]}" if isinstance(info, tuple) and len(info) >= 2 else "?"
