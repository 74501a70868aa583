"""Trackers on the device edge under the fault that lost acknowledged fixes behind Mosquitto (issue
#58): Kafka SIGKILLed, the edge holding the trackers' fixes SIGKILLed meanwhile, both back. A
Teltonika unit and a Traccar Client phone are played as the devices behave: each keeps its fixes
until the edge acknowledges them (the unit in its flash, the phone in its queue) and sends the
oldest again after a lost connection or a silence. Every fix a device was told is stored must be in
Kafka, and once both are back, every fix is."""

from __future__ import annotations

import collections
import os
import signal
import socket
import threading
import time
import uuid
from pathlib import Path

import orjson
import pytest
import redis

from embedded import infra
from embedded.processes import alive, read_pid
from fleetfence import probes
from fleetfence.devices import TrackerProtocol
from fleetfence.kafka import ensure_topics, topic_specs
from fleetfence.mqtt import DynSec
from fleetfence.settings import Settings
from fleetfence.testing import wait_for
from gateway.protocols import teltonika as t
from gateway.testing import KafkaRecord, TopicReader
from tests.gateway.helpers import EdgeProcess, gw_settings, own_kafka
from vehicle_master.credentials import VehicleCredentials
from vehicle_master.trackers import VehicleTrackers

pytestmark = [pytest.mark.services, pytest.mark.slow, pytest.mark.fault]

FIXES = 120  # per device
T0_S = int(time.time()) - 3600
ANSWER_WAIT_S = 2.0  # a device that hears nothing for this long reconnects and sends again


class Device(threading.Thread):
    """A tracker: fixes queued in order, the oldest sent until acknowledged, again after a failure."""

    def __init__(self, name: str) -> None:
        super().__init__(name=name, daemon=True)
        self.pending: collections.deque[int] = collections.deque()  # fix times (s), oldest first
        self.acked: list[int] = []
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.sock: socket.socket | None = None
        self.cut = 0  # connections lost or refused (not silences): the edge's kill reached it
        self.failed: BaseException | None = None  # what stopped the device, for the test to say

    def record(self, ts_s: int) -> None:
        with self.lock:
            self.pending.append(ts_s)

    def run(self) -> None:
        try:
            self._run()
        except BaseException as exc:
            self.failed = exc
            raise

    def _run(self) -> None:
        while not self.stop.is_set():
            with self.lock:
                batch = list(self.pending)[: self.batch_size]
            if not batch:
                self.stop.wait(0.01)
                continue
            try:
                if self.sock is None:
                    self.sock = self.connect()
                self.deliver(self.sock, batch)
            except OSError as exc:
                if isinstance(exc, ConnectionError):
                    self.cut += 1
                if self.sock is not None:
                    self.sock.close()
                self.sock = None
                self.stop.wait(0.2)  # a device's reconnect pause
                continue
            with self.lock:
                for _ in batch:
                    self.acked.append(self.pending.popleft())

    batch_size = 1

    def connect(self) -> socket.socket:
        raise NotImplementedError

    def deliver(self, sock: socket.socket, batch: list[int]) -> None:
        raise NotImplementedError

    def acked_count(self) -> int:
        with self.lock:
            return len(self.acked)


def read_exactly(sock: socket.socket, n: int) -> bytes:
    buf = b""
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise ConnectionResetError("closed by the edge")
        buf += chunk
    return buf


class Unit(Device):
    """A Teltonika unit: up to 5 records a packet, the packet sent again until its count comes."""

    batch_size = 5

    def __init__(self, port: int, imei: str) -> None:
        super().__init__(f"unit-{imei}")
        self.port, self.imei = port, imei

    def connect(self) -> socket.socket:
        sock = socket.create_connection(("127.0.0.1", self.port), timeout=ANSWER_WAIT_S)
        sock.sendall(t.encode_imei(self.imei))
        if read_exactly(sock, 1) != b"\x01":
            raise ConnectionRefusedError("IMEI refused")
        return sock

    def deliver(self, sock: socket.socket, batch: list[int]) -> None:
        records = [
            t.AvlRecord(
                timestamp_ms=ts * 1000,
                priority=0,
                lon=24.94,
                lat=60.17,
                altitude_m=10,
                angle_deg=90,
                satellites=9,
                speed_kmh=40,
                event_io_id=0,
                io={},
            )
            for ts in batch
        ]
        sock.sendall(t.encode_avl_packet(records, codec=t.CODEC_8E))
        if read_exactly(sock, 4) != t.encode_ack(len(batch)):
            raise ConnectionResetError("a wrong record count")


class Phone(Device):
    """Traccar Client: one GET per fix on a kept-alive connection, sent again until its 200."""

    def __init__(self, port: int, device: str, secret: str) -> None:
        super().__init__(f"phone-{device}")
        self.port, self.device, self.secret = port, device, secret

    def connect(self) -> socket.socket:
        return socket.create_connection(("127.0.0.1", self.port), timeout=ANSWER_WAIT_S)

    def deliver(self, sock: socket.socket, batch: list[int]) -> None:
        (ts,) = batch
        sock.sendall(
            f"GET /key/{self.secret}?id={self.device}&lat=60.17&lon=24.94&timestamp={ts}&speed=20 "
            "HTTP/1.1\r\nHost: edge\r\n\r\n".encode()
        )
        head = b""
        while b"\r\n\r\n" not in head:
            chunk = sock.recv(4096)
            if not chunk:
                raise ConnectionResetError("closed by the edge")
            head += chunk
        if not head.startswith(b"HTTP/1.1 200 "):
            raise AssertionError(f"the edge refused a fix: {head[:200]!r}")


def test_trackers_lose_no_acknowledged_fix_when_the_edge_is_sigkilled_in_a_kafka_outage(
    settings: Settings, tmp_path: Path
) -> None:
    own = own_kafka(settings, tmp_path)
    gs = gw_settings(
        own,
        gateway_edge_port=probes.free_port(),
        gateway_teltonika_port=probes.free_port(),
        gateway_http_port=probes.free_port(),
    )
    r = redis.Redis.from_url(settings.redis_dsn)
    control = DynSec.from_settings(settings)
    creds = VehicleCredentials(r, settings.redis_prefix, control)
    trackers = VehicleTrackers(r, settings.redis_prefix)
    run = uuid.uuid4().hex[:6]
    unit_vid, phone_vid = f"tu{run}", f"tp{run}"
    imei, device = f"35{uuid.uuid4().int % 10**13:013d}", f"p{run}"
    edges: list[EdgeProcess] = []
    devices: list[Device] = []
    reader: TopicReader | None = None
    try:
        infra.up(own)  # only the broker: Redis is the session's
        ensure_topics(own.bootstrap_servers, topic_specs(own))
        trackers.bind(unit_vid, TrackerProtocol.TELTONIKA, imei)
        trackers.bind(phone_vid, TrackerProtocol.OSMAND, device)
        _, secret = creds.issue(phone_vid)
        edges.append(EdgeProcess(gs, tmp_path / "edge1.log"))
        assert gs.gateway_teltonika_port is not None
        assert gs.gateway_http_port is not None
        unit = Unit(gs.gateway_teltonika_port, imei)
        phone = Phone(gs.gateway_http_port, device, secret)
        devices += [unit, phone]
        for d in devices:
            d.start()
        recorded = 0

        def record_some(n: int) -> None:
            nonlocal recorded
            for _ in range(n):
                for d in devices:
                    d.record(T0_S + recorded)
                recorded += 1
                time.sleep(0.005)  # a fleet's pace, not synchronisation

        def acked() -> int:
            for d in devices:
                assert d.failed is None, f"{d.name} stopped: {d.failed!r}"
            return sum(d.acked_count() for d in devices)

        def held(protocol: str) -> bool:
            """The edge holds a fix of `protocol` for Kafka (received, neither forwarded nor
            dead-lettered yet)."""
            m = edges[-1].metrics()
            n = "fleetfence_gateway_tracker_records_total{outcome=%s,protocol=" + protocol + "}"
            return m.get(n % "received", 0) > m.get(n % "forwarded", 0) + m.get(n % "dead_lettered", 0)

        record_some(30)
        wait_for(lambda: acked() >= 40, 30, "acknowledgements before the outage")
        kafka = read_pid(own, "kafka")
        assert kafka is not None
        os.kill(kafka[0], signal.SIGKILL)
        wait_for(lambda: not alive(*kafka), 10, "Kafka gone")
        acked_at_outage = acked()
        record_some(40)  # into the outage: the edge holds what it reads and answers none of it
        wait_for(
            lambda: held("teltonika") and held("osmand"),
            30,
            "each device's fixes held by the edge while Kafka is down",
        )
        cut_before = unit.cut, phone.cut
        edges[0].kill()
        acked_at_kill = acked()
        # At most what Kafka had confirmed before it died: a packet and a request in flight then.
        assert acked_at_kill - acked_at_outage <= unit.batch_size + 1, (acked_at_outage, acked_at_kill)
        edges.append(EdgeProcess(gs, tmp_path / "edge2.log"))
        record_some(FIXES - recorded)
        infra.up(own, create_topics=False)  # same port, same data folder
        wait_for(lambda: acked() == 2 * FIXES, 120, "every fix acknowledged once Kafka is back")

        reader = TopicReader(own.bootstrap_servers, [own.topics.telemetry])
        want = {(vid, (T0_S + i) * 1000) for vid in (unit_vid, phone_vid) for i in range(FIXES)}

        def fixes(rs: list[KafkaRecord]) -> list[tuple[str, int]]:
            out = []
            for rec in rs:
                d = orjson.loads(rec.value)
                if d["vehicle_id"] in (unit_vid, phone_vid):
                    out.append((d["vehicle_id"], d["seq"]))
            return out

        reader.read_until(lambda rs: want <= set(fixes(rs)), 60, "every fix in Kafka")
        got = fixes(reader.records)
        copies = len(got) - len(set(got))
        print(
            f"trackers, edge SIGKILLed in a Kafka outage: acked_at_outage={acked_at_outage} "
            f"acked_at_kill={acked_at_kill} records={len(got)} copies={copies} "
            f"connections cut={unit.cut}/{phone.cut} (unit/phone; {cut_before} before the kill)"
        )
        assert set(got) == want
        assert unit.cut > cut_before[0], "the edge's kill cut the unit's connection"
        assert phone.cut > cut_before[1], "the edge's kill cut the phone's connection"
        m = edges[1].metrics()
        assert m["fleetfence_gateway_received_total"] == m["fleetfence_gateway_forwarded_total"]
    finally:
        for d in devices:
            d.stop.set()
        for d in devices:
            d.join(10)
        for e in edges:
            e.kill()
        if reader is not None:
            reader.close()
        creds.revoke(phone_vid)
        trackers.unbind_all(unit_vid)
        trackers.unbind_all(phone_vid)
        control.close()
        r.close()
        infra.down(own)
