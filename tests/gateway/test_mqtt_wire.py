"""The device edge's MQTT codec (gateway.mqtt_wire), without a network: packets as the MQTT 3.1.1
and 5.0 specifications spell them, any split of a byte stream into reads, and each protocol breach
refused with its MQTT 5 reason code."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gateway import mqtt_wire as w
from gateway.errors import MqttProtocolError


def s(text: str | bytes) -> bytes:
    raw = text.encode() if isinstance(text, str) else text
    return len(raw).to_bytes(2, "big") + raw


def connect_packet(
    version: int = w.MQTT_5,
    client_id: str = "truck-1",
    user: str | None = "truck-1",
    password: bytes | None = b"secret",
    keepalive: int = 30,
    clean: bool = True,
    props: bytes = b"\x00",
    will: bool = False,
) -> bytes:
    flags = (0x80 if user is not None else 0) | (0x40 if password is not None else 0) | (0x02 if clean else 0)
    flags |= 0x04 if will else 0
    name = b"MQIsdp" if version == w.MQTT_31 else b"MQTT"
    body = s(name) + bytes([version, flags]) + keepalive.to_bytes(2, "big")
    body += props if version == w.MQTT_5 else b""
    body += s(client_id)
    if will:
        body += (b"\x00" if version == w.MQTT_5 else b"") + s("fleet/truck-1/lwt") + s(b"gone")
    if user is not None:
        body += s(user)
    if password is not None:
        body += s(password)
    return w.frame(w.CONNECT << 4, body)


def publish_packet(
    topic: bytes, payload: bytes, qos: int = 1, pid: int = 7, version: int = w.MQTT_5
) -> bytes:
    body = s(topic) + (pid.to_bytes(2, "big") if qos else b"") + (b"\x00" if version == w.MQTT_5 else b"")
    return w.frame((w.PUBLISH << 4) | (qos << 1), body + payload)


def one(data: bytes, limit: int = 1 << 20) -> tuple[int, bytes]:
    frames = w.FrameReader(limit).feed(data)
    assert len(frames) == 1
    return frames[0]


@pytest.mark.parametrize("version", [w.MQTT_31, w.MQTT_311, w.MQTT_5])
def test_connect_of_each_version(version: int) -> None:
    first, body = one(connect_packet(version, clean=False, keepalive=45, will=True))
    c = w.decode_connect(body)
    assert first >> 4 == w.CONNECT
    assert (c.version, c.client_id, c.username, c.password) == (version, "truck-1", "truck-1", b"secret")
    assert (c.keepalive_s, c.clean_start, c.will) == (45, False, True)


def test_connect_properties_of_mqtt5() -> None:
    # Session Expiry 3600 (0x11, four bytes) and Receive Maximum 20 (0x21, two bytes), 8 bytes.
    props = bytes([8, 0x11, 0, 0, 0x0E, 0x10, 0x21, 0, 20])
    c = w.decode_connect(one(connect_packet(props=props))[1])
    assert (c.session_expiry_s, c.receive_maximum, c.auth_method) == (3600, 20, None)


@pytest.mark.parametrize(
    ("packet", "code"),
    [
        (w.frame(0x10, s("MQTT") + bytes([6, 0x02, 0, 30])), w.RC_UNSUPPORTED_VERSION),
        (w.frame(0x10, s("MQTX") + bytes([4, 0x02, 0, 30]) + s("x")), w.RC_UNSUPPORTED_VERSION),
        (w.frame(0x10, s("MQTT") + bytes([4, 0x03, 0, 30]) + s("x")), w.RC_MALFORMED),  # reserved flag
        (w.frame(0x10, s("MQTT") + bytes([4, 0x42, 0, 30]) + s("x") + s(b"p")), w.RC_MALFORMED),
        (w.frame(0x10, s("MQTT") + bytes([4, 0x82, 0, 30]) + s("x")), w.RC_MALFORMED),  # user missing
        (w.frame(0x10, s("MQTT") + bytes([4, 0x02, 0, 30]) + s(b"\xff\xfe")), w.RC_MALFORMED),
        (w.frame(0x10, s("MQTT") + bytes([5, 0x02, 0, 30, 3, 0x21, 0, 0]) + s("x")), w.RC_PROTOCOL_ERROR),
        (w.frame(0x10, s("MQTT") + bytes([5, 0x02, 0, 30, 2, 0x7F, 0]) + s("x")), w.RC_MALFORMED),
    ],
    ids=["level-6", "name", "reserved", "password-no-user", "truncated-user", "utf8", "recv-max-0", "prop"],
)
def test_bad_connects_are_refused_with_their_reason(packet: bytes, code: int) -> None:
    with pytest.raises(MqttProtocolError) as err:
        w.decode_connect(one(packet)[1])
    assert err.value.code == code


def test_publish_fields_for_both_versions() -> None:
    for version in (w.MQTT_311, w.MQTT_5):
        first, body = one(
            publish_packet(b"fleet/truck-1/telemetry", b'{"a":1}', qos=1, pid=513, version=version)
        )
        p = w.decode(first | 0x08, body, version)  # with DUP
        assert isinstance(p, w.Publish)
        assert (p.topic, p.payload, p.qos, p.packet_id, p.dup) == (
            b"fleet/truck-1/telemetry",
            b'{"a":1}',
            1,
            513,
            True,
        )
    p0 = w.decode(*one(publish_packet(b"t", b"x", qos=0, version=w.MQTT_311)), w.MQTT_311)
    assert isinstance(p0, w.Publish)
    assert (p0.qos, p0.packet_id) == (0, 0)


@pytest.mark.parametrize(
    ("first", "body", "code"),
    [
        (0x36, s("t") + b"\x00\x01", w.RC_MALFORMED),  # QoS 3
        (0x38, s("t"), w.RC_MALFORMED),  # DUP on QoS 0
        (0x32, s("t") + b"\x00\x00", w.RC_MALFORMED),  # packet id 0
        (0x32, s("fleet/+/telemetry") + b"\x00\x01", w.RC_TOPIC_NAME_INVALID),
        (0x32, s("") + b"\x00\x01", w.RC_TOPIC_NAME_INVALID),
        (0x32, b"\x00", w.RC_MALFORMED),  # topic length cut
        (0x10, b"", w.RC_PROTOCOL_ERROR),  # a second CONNECT
        (0xC1, b"", w.RC_MALFORMED),  # PINGREQ with flags
        (0x80, b"\x00\x01" + s("a") + b"\x01", w.RC_MALFORMED),  # SUBSCRIBE flags not 0010
        (0x20, b"\x00\x00", w.RC_PROTOCOL_ERROR),  # CONNACK from a client
    ],
)
def test_bad_packets_are_refused_with_their_reason(first: int, body: bytes, code: int) -> None:
    with pytest.raises(MqttProtocolError) as err:
        w.decode(first, body, w.MQTT_311)
    assert err.value.code == code


def test_control_packets() -> None:
    assert isinstance(w.decode(0xC0, b"", w.MQTT_5), w.PingReq)
    assert w.decode(0x62, b"\x01\x02", w.MQTT_5) == w.PubRel(258)
    sub = w.decode(0x82, b"\x00\x05\x00" + s("fleet/a/alerts") + b"\x01" + s("x/#") + b"\x00", w.MQTT_5)
    assert sub == w.Subscribe(5, ["fleet/a/alerts", "x/#"])
    assert w.decode(0xA2, b"\x00\x06" + s("a"), w.MQTT_311) == w.Unsubscribe(6, ["a"])
    assert w.decode(0xE0, b"\x04\x00", w.MQTT_5) == w.Disconnect(4)
    assert w.decode(0x40, b"\x00\x01", w.MQTT_5) == w.Ignored(w.PUBACK)


def test_answers_as_the_specifications_spell_them() -> None:
    assert w.connack(w.MQTT_311, w.RC_SUCCESS, session_present=True) == b"\x20\x02\x01\x00"
    assert w.connack(w.MQTT_311, w.RC_BAD_LOGIN) == b"\x20\x02\x00\x04"
    assert w.connack(w.MQTT_311, w.RC_NOT_AUTHORIZED) == b"\x20\x02\x00\x05"
    assert w.connack(w.MQTT_5, w.RC_BAD_LOGIN) == b"\x20\x03\x00\x86\x00"
    ok = w.connack(w.MQTT_5, w.RC_SUCCESS, receive_maximum=100, max_packet_bytes=65536)
    # flags, reason, then properties: Receive Maximum 100, Maximum Packet Size 65536, no retain,
    # no wildcard and no shared subscriptions.
    assert ok == b"\x20\x11\x00\x00\x0e\x21\x00\x64\x27\x00\x01\x00\x00\x25\x00\x28\x00\x2a\x00"
    assert w.puback(10, w.MQTT_311) == b"\x40\x02\x00\x0a"
    assert w.puback(10, w.MQTT_311, w.RC_NOT_AUTHORIZED) == b"\x40\x02\x00\x0a"  # 3.1.1 has no reason
    assert w.puback(10, w.MQTT_5, w.RC_NOT_AUTHORIZED) == b"\x40\x03\x00\x0a\x87"
    assert w.pubrec(11, w.MQTT_5) == b"\x50\x02\x00\x0b"
    assert w.pubcomp(11) == b"\x70\x02\x00\x0b"
    assert w.suback(3, w.MQTT_311, 2) == b"\x90\x04\x00\x03\x80\x80"
    assert w.suback(3, w.MQTT_5, 1) == b"\x90\x04\x00\x03\x00\x87"
    assert w.disconnect(w.MQTT_311, w.RC_SESSION_TAKEN_OVER) == b""
    assert w.disconnect(w.MQTT_5, w.RC_SESSION_TAKEN_OVER) == b"\xe0\x02\x8e\x00"


@given(
    payloads=st.lists(st.binary(max_size=300), min_size=1, max_size=20),
    cuts=st.lists(st.integers(min_value=0, max_value=10_000), max_size=30),
)
def test_any_split_of_a_stream_gives_the_same_packets(payloads: list[bytes], cuts: list[int]) -> None:
    stream = b"".join(publish_packet(b"fleet/v/telemetry", p, pid=i + 1) for i, p in enumerate(payloads))
    points = sorted({c % (len(stream) + 1) for c in cuts} | {0, len(stream)})
    reader = w.FrameReader(1 << 20)
    frames: list[tuple[int, bytes]] = []
    for a, b in itertools.pairwise(points):
        frames += reader.feed(stream[a:b])
    got = [w.decode(first, body, w.MQTT_5) for first, body in frames]
    assert [p.payload for p in got if isinstance(p, w.Publish)] == payloads
    assert [p.packet_id for p in got if isinstance(p, w.Publish)] == list(range(1, len(payloads) + 1))
    assert reader.buffered == 0


@given(st.integers(min_value=0, max_value=w.MAX_REMAINING_LENGTH))
def test_remaining_length_round_trip(n: int) -> None:
    encoded = w.varint(n)
    assert 1 <= len(encoded) <= 4
    reader = w.FrameReader(w.MAX_REMAINING_LENGTH + 5)
    # Only the header: the frame is incomplete (unless empty), and nothing is lost meanwhile.
    frames = reader.feed(bytes([0x30]) + encoded)
    assert frames == ([(0x30, b"")] if n == 0 else [])


def test_oversized_and_endless_lengths_are_refused_before_the_body() -> None:
    with pytest.raises(MqttProtocolError) as err:
        w.FrameReader(1024).feed(bytes([0x30]) + w.varint(5000))
    assert err.value.code == w.RC_PACKET_TOO_LARGE
    with pytest.raises(MqttProtocolError) as err:
        w.FrameReader(1 << 30).feed(bytes([0x30, 0xFF, 0xFF, 0xFF, 0xFF, 0x01]))
    assert err.value.code == w.RC_MALFORMED
