"""Teltonika trackers on the device edge: Codec 8 / 8 Extended / 16 over TCP, each packet's
acknowledgement sent only once Kafka has every record of it.

A unit connects, says its IMEI and waits for one byte: 0x01 when the IMEI is bound to a vehicle
(`vehicle_master.trackers`) and that vehicle's credentials are not disabled or revoked, else 0x00
and the connection is closed. It then sends AVL packets; the edge turns each record into the one
telemetry record the MQTT path produces (`gateway.protocols.teltonika.to_telemetry`: `seq` is the
record's time) or a dead letter with its reason (a record without a GPS position: `no_fix`; a value
out of the contract's range: the contract's reason), produces them all, and answers the packet's
record count once Kafka has confirmed every one (acks=all). A unit that gets no answer keeps the
records in its flash and sends them again, so a fix it was told is stored is in Kafka, and one it
was not told about is its own to resend; a copy stored twice is dropped downstream by `seq`.

A frame that cannot be used (its CRC wrong, a codec this edge does not know, two record counts
that differ) is counted in `fleetfence_gateway_protocol_errors_total{code}` and left unanswered:
the unit sends it again. A frame that makes the stream unreadable (a bad preamble, a length over
the bound) closes the connection. Everything runs on the edge's event loop (`gateway.edge`); only
the Redis reads of the IMEI's binding run in worker threads.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Protocol, cast

import orjson

from fleetfence.contracts import dead_letter as dead_letter_record
from fleetfence.devices import LoginVerdict, TrackerProtocol
from fleetfence.settings import TopicNames
from gateway.core import Record
from gateway.errors import TeltonikaFrameError
from gateway.held import EdgeHost, HeldConnection
from gateway.inflight import Pending
from gateway.protocols import teltonika as t

logger = logging.getLogger(__name__)

PROTOCOL = TrackerProtocol.TELTONIKA


def record_payload(record: t.AvlRecord) -> bytes:
    """What a dead-lettered record keeps: its decoded fields as JSON (the packet's bytes hold many
    records; the letter is about this one)."""
    return orjson.dumps(
        {
            "timestamp_ms": record.timestamp_ms,
            "lat": record.lat,
            "lon": record.lon,
            "speed_kmh": record.speed_kmh,
            "angle_deg": record.angle_deg,
            "satellites": record.satellites,
            "altitude_m": record.altitude_m,
            "priority": record.priority,
        }
    )


def record_of(
    topics_telemetry: str, topics_dlq: str, imei: str, vehicle_id: str, rec: t.AvlRecord, now_ms: int
) -> Record:
    """One AVL record as the Kafka record the edge produces: telemetry, or a dead letter."""
    try:
        fix = t.to_telemetry(rec, vehicle_id=vehicle_id, received_ms=now_ms)
    except TeltonikaFrameError as exc:
        value, headers = dead_letter_record(
            record_payload(rec),
            reason=exc.reason,
            detail=exc.detail,
            origin=("tracker", f"{PROTOCOL.value}:{imei}".encode()),
            received_ms=now_ms,
        )
        return Record(topics_dlq, vehicle_id.encode(), value, headers, exc.reason)
    return Record(topics_telemetry, vehicle_id.encode(), fix.to_json(), None, None)


class TrackerHost(EdgeHost, Protocol):
    """What a tracker's connection needs of the edge it runs in (`gateway.edge.EdgeGateway`)."""

    draining: bool

    @property
    def topics(self) -> TopicNames: ...

    def produce(self, e: Pending) -> None: ...

    def check_tracker(
        self, conn: TeltonikaConnection, protocol: TrackerProtocol, tracker_id: str
    ) -> None: ...

    def tracker_opened(self, conn: TeltonikaConnection) -> None: ...

    def tracker_lost(self, conn: TeltonikaConnection) -> None: ...

    def tracker_admitted(self, conn: TeltonikaConnection) -> None: ...


class TeltonikaConnection(HeldConnection):
    """One unit's TCP connection: the handshake, its records held for Kafka, its acknowledgements."""

    def __init__(self, edge: TrackerHost) -> None:
        super().__init__(edge)
        self.edge = edge
        self.stream = t.TeltonikaStream()
        self.imei: str | None = None
        self.vehicle_id: str | None = None  # set once the IMEI is admitted
        self.seen: tuple[str | None, str] | None = None  # (vehicle, credential status) at admission
        self._waiting: list[t.Frame | TeltonikaFrameError] = []
        self._checking = False

    # ------------------------------------------------------------------ asyncio callbacks

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)
        self.edge.tracker_opened(self)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if (err := self.stream.close()) is not None:
            self.edge.stats.protocol_errors[f"{PROTOCOL.value}:{err.reason}"] += 1
        self.edge.tracker_lost(self)

    def data_received(self, data: bytes) -> None:
        self.last_rx_mono_s = time.monotonic()
        if self.stream.error is not None:
            return  # closing after a fatal frame
        items = self.stream.feed(data)
        if self._checking:
            self._waiting.extend(items)
            return
        self._handle(items)

    # ------------------------------------------------------------------ frames

    def _handle(self, items: list[t.Frame | TeltonikaFrameError]) -> None:
        for i, item in enumerate(items):
            if self.closed:
                return
            if isinstance(item, TeltonikaFrameError):
                self._frame_error(item)
            elif isinstance(item, t.ImeiFrame):
                self.imei = item.imei
                self._checking = True
                self._waiting = list(items[i + 1 :])
                self.edge.check_tracker(self, PROTOCOL, item.imei)
                return
            elif isinstance(item, t.AvlPacket):
                self._on_packet(item)
            else:  # a Codec 12 response: no fix, no record count to answer
                self.edge.stats.protocol_errors[f"{PROTOCOL.value}:command_response"] += 1

    def admitted(self, verdict: LoginVerdict, vehicle_id: str | None, seen: tuple[str | None, str]) -> None:
        """The IMEI's binding was read: answer the unit, then go on with what it sent meanwhile."""
        if self.closed:
            return
        self._checking = False
        if verdict is not LoginVerdict.ACCEPTED or vehicle_id is None:
            self.edge.stats.logins_refused[f"{PROTOCOL.value}:{verdict.value}"] += 1
            logger.info("tracker refused protocol=%s imei=%s reason=%s", PROTOCOL, self.imei, verdict)
            self.write(t.imei_answer(False))
            self.close()
            return
        self.vehicle_id = vehicle_id
        self.seen = seen
        self.edge.tracker_admitted(self)
        self.write(t.imei_answer(True))
        waiting, self._waiting = self._waiting, []
        self._handle(waiting)

    def unavailable(self) -> None:
        """The binding could not be read (Redis down): refused for now; the unit connects again."""
        if self.closed:
            return
        self.edge.stats.logins_refused[f"{PROTOCOL.value}:unavailable"] += 1
        self.write(t.imei_answer(False))
        self.close()

    def _frame_error(self, exc: TeltonikaFrameError) -> None:
        self.edge.stats.protocol_errors[f"{PROTOCOL.value}:{exc.reason}"] += 1
        logger.warning(
            "tracker frame refused protocol=%s imei=%s peer=%s reason=%s detail=%s",
            PROTOCOL,
            self.imei,
            self.peer,
            exc.reason,
            exc.detail,
        )
        if exc.fatal:
            self.close()

    def _on_packet(self, packet: t.AvlPacket) -> None:
        edge = self.edge
        stats = edge.stats
        assert self.imei is not None
        assert self.vehicle_id is not None
        if edge.draining:
            stats.deferred += len(packet.records)  # unanswered: the unit sends it again
            return
        if not packet.records:
            self.write(packet.ack)
            return
        now_ms = time.time_ns() // 1_000_000
        now_mono = time.monotonic()
        topics = edge.topics
        last = len(packet.records) - 1
        for i, rec in enumerate(packet.records):
            stats.received += 1
            stats.tracker_records[(PROTOCOL.value, "received")] += 1
            record = record_of(
                topics.telemetry, topics.telemetry_dlq, self.imei, self.vehicle_id, rec, now_ms
            )
            e = self.inflight.add(i, 0, record, now_mono)
            e.owner = self
            e.protocol = PROTOCOL.value
            if i == last:
                e.reply = packet.ack  # released once this and every earlier record are in Kafka
            edge.produce(e)
        self.hold_back()
