"""Teltonika units on the device edge (gateway.teltonika_edge) over real TCP, with real Kafka and
Redis: a unit is admitted by its IMEI's binding, each packet is answered with its record count only
once Kafka has every record, a record without a position is dead-lettered with its reason, a
packet sent again gives the same fixes, and a broken frame costs its own connection only."""

from __future__ import annotations

import dataclasses
import socket
import time
import uuid

import orjson
import pytest

from fleetfence.devices import TrackerProtocol
from fleetfence.kafka import ensure_topics, topic_specs
from fleetfence.settings import Settings
from fleetfence.testing import wait_for
from gateway.edge import EdgeGateway
from gateway.protocols import teltonika as t
from gateway.settings import GatewaySettings
from tests.gateway.helpers import gw_settings, records_of
from vehicle_master.credentials import VehicleCredentials
from vehicle_master.trackers import VehicleTrackers

pytestmark = pytest.mark.services

T0_MS = int(time.time() * 1000) - 60_000  # a minute ago: inside the contract's time bounds


def imei_of(n: int) -> str:
    return f"35{uuid.uuid4().int % 10**12:012d}{n}"


def record(i: int) -> t.AvlRecord:
    return t.AvlRecord(
        timestamp_ms=T0_MS + i * 1000,
        priority=0,
        lon=24.94,
        lat=60.17 + i * 1e-4,
        altitude_m=12,
        angle_deg=90,
        satellites=9,
        speed_kmh=40 + i,
        event_io_id=0,
        io={239: 1},
    )


class Unit:
    """A Teltonika unit's TCP connection, spoken byte for byte as the protocol says."""

    def __init__(self, port: int, imei: str) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=15)
        self.sock.sendall(t.encode_imei(imei))
        self.answer = self.read(1)

    def read(self, n: int) -> bytes:
        buf = b""
        while len(buf) < n:
            chunk = self.sock.recv(n - len(buf))
            if not chunk:
                break
            buf += chunk
        return buf

    def send(self, records: list[t.AvlRecord], codec: int = t.CODEC_8E) -> bytes:
        packet = t.encode_avl_packet(records, codec=codec)
        self.sock.sendall(packet)
        return packet

    def closed_by_peer(self) -> bool:
        self.sock.settimeout(15)
        try:
            return self.sock.recv(1) == b""
        except ConnectionResetError:
            return True

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def gs(settings: Settings) -> GatewaySettings:
    ensure_topics(settings.bootstrap_servers, topic_specs(settings))
    return gw_settings(settings, gateway_edge_port=0, gateway_teltonika_port=0, gateway_edge_recheck_s=0.5)


def test_a_bound_unit_is_answered_once_kafka_has_every_record(
    gs: GatewaySettings, edge: EdgeGateway, trackers: VehicleTrackers
) -> None:
    vid, imei = f"tv{uuid.uuid4().hex[:6]}", imei_of(1)
    trackers.bind(vid, TrackerProtocol.TELTONIKA, imei)
    assert edge.teltonika_port
    unit = Unit(edge.teltonika_port, imei)
    try:
        assert unit.answer == b"\x01"
        no_fix = dataclasses.replace(record(1), lat=0.0, lon=0.0)  # the wiki's "no GPS data"
        packet = [record(0), no_fix, record(2)]
        unit.send(packet)
        assert unit.read(4) == t.encode_ack(3)
        # The answer came after Kafka confirmed all three: the edge holds nothing for them.
        assert edge.in_flight == 0
        got = records_of(gs, vid, 3)
        fixes = [orjson.loads(r.value) for r in got if r.topic == gs.topics.telemetry]
        assert sorted(f["seq"] for f in fixes) == [T0_MS, T0_MS + 2000]
        assert all(f["vehicle_id"] == vid and f["ts_ms"] == f["seq"] for f in fixes)
        assert {round(f["speed_kmh"]) for f in fixes} == {40, 42}
        (letter,) = [r for r in got if r.topic == gs.topics.telemetry_dlq]
        assert letter.headers["reason"] == b"no_fix"
        assert letter.headers["tracker"] == f"teltonika:{imei}".encode()
        assert orjson.loads(letter.value)["timestamp_ms"] == no_fix.timestamp_ms

        # Sent again (its answer lost, as the unit would see it): answered again, the same fixes.
        unit.send(packet, codec=t.CODEC_8)
        assert unit.read(4) == t.encode_ack(3)
        again = records_of(gs, vid, 6)
        seqs = sorted(orjson.loads(r.value)["seq"] for r in again if r.topic == gs.topics.telemetry)
        assert seqs == [T0_MS, T0_MS, T0_MS + 2000, T0_MS + 2000]  # one fix each, downstream
    finally:
        unit.close()
    s = edge.stats
    assert s.tracker_records == {
        ("teltonika", "received"): 6,
        ("teltonika", "forwarded"): 4,
        ("teltonika", "dead_lettered"): 2,
    }
    assert s.received == s.forwarded + s.dead_lettered_total == 6
    assert s.acked == 2


def test_units_not_bound_or_disabled_are_refused_and_unbinding_cuts_one_off(
    gs: GatewaySettings, edge: EdgeGateway, trackers: VehicleTrackers, creds: VehicleCredentials
) -> None:
    assert edge.teltonika_port
    port = edge.teltonika_port
    unknown = Unit(port, imei_of(2))
    try:
        assert unknown.answer == b"\x00"
        assert unknown.closed_by_peer()
    finally:
        unknown.close()

    vid, imei = f"td{uuid.uuid4().hex[:6]}", imei_of(3)
    trackers.bind(vid, TrackerProtocol.TELTONIKA, imei)
    creds.issue(vid)
    creds.disable(vid)
    disabled = Unit(port, imei)
    try:
        assert disabled.answer == b"\x00", "a disabled vehicle's tracker is refused too"
    finally:
        disabled.close()

    creds.enable(vid)
    unit = Unit(port, imei)
    try:
        assert unit.answer == b"\x01"
        unit.send([record(0)])
        assert unit.read(4) == t.encode_ack(1)
        trackers.unbind(vid, TrackerProtocol.TELTONIKA, imei)
        assert unit.closed_by_peer(), "unbound: cut off at the next re-check"
    finally:
        unit.close()
    refused = edge.stats.logins_refused
    assert refused == {
        "teltonika:unknown_device": 1,
        "teltonika:not_active": 1,
        "teltonika:binding_changed": 1,
    }


def test_a_broken_frame_costs_its_connection_only(
    gs: GatewaySettings, edge: EdgeGateway, trackers: VehicleTrackers
) -> None:
    """A packet whose CRC is wrong is not answered (the unit sends it again) and the connection
    goes on; a stream that cannot be cut into frames any more closes that connection, not another."""
    assert edge.teltonika_port
    vid, imei_a, imei_b = f"tb{uuid.uuid4().hex[:6]}", imei_of(4), imei_of(5)
    trackers.bind(vid, TrackerProtocol.TELTONIKA, imei_a)
    trackers.bind(vid, TrackerProtocol.TELTONIKA, imei_b)
    a, b = Unit(edge.teltonika_port, imei_a), Unit(edge.teltonika_port, imei_b)
    try:
        assert a.answer == b.answer == b"\x01"
        bad = bytearray(t.encode_avl_packet([record(0)], codec=t.CODEC_8E))
        bad[-1] ^= 0xFF  # the CRC
        a.sock.sendall(bytes(bad))
        a.send([record(1)])
        assert a.read(4) == t.encode_ack(1), "only the good packet is answered"
        wait_for(lambda: edge.stats.protocol_errors["teltonika:bad_crc"] == 1, 10, "the bad CRC counted")

        a.sock.sendall(b"\x01\x02\x03\x04" + b"\x00" * 8)  # not a preamble: the stream is lost
        assert a.closed_by_peer()
        b.send([record(2)])
        assert b.read(4) == t.encode_ack(1), "the other unit's connection is untouched"
    finally:
        a.close()
        b.close()
    assert edge.stats.protocol_errors["teltonika:bad_preamble"] == 1
    got = records_of(gs, vid, 2)
    assert sorted(orjson.loads(r.value)["seq"] for r in got) == [T0_MS + 1000, T0_MS + 2000]
