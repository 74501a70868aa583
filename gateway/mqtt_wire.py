"""The server side of MQTT 3.1, 3.1.1 and 5.0 on the wire, as far as a telemetry edge needs it.

Pure: bytes in, packets out, bytes back; no sockets, no clock. `gateway.edge` owns the connections
and decides what each packet means for Kafka; this module only says what the client sent and how
an answer is spelled, so every malformed input can be tried without a network.

What an edge for vehicles receives: CONNECT, PUBLISH (QoS 0, 1, 2), PUBREL, PINGREQ, SUBSCRIBE,
UNSUBSCRIBE and DISCONNECT. A vehicle gets no messages from the edge, so PUBACK, PUBREC and PUBCOMP
from a client answer nothing and are ignored, and AUTH (MQTT 5 enhanced authentication) is refused
at CONNECT. A packet that breaks the protocol raises `gateway.errors.MqttProtocolError` with the MQTT 5
reason code the connection is closed with.
"""

from __future__ import annotations

from dataclasses import dataclass

from gateway.errors import MqttProtocolError

# Packet types (MQTT 5 section 2.1.2).
CONNECT, CONNACK, PUBLISH, PUBACK, PUBREC, PUBREL, PUBCOMP = 1, 2, 3, 4, 5, 6, 7
SUBSCRIBE, SUBACK, UNSUBSCRIBE, UNSUBACK, PINGREQ, PINGRESP, DISCONNECT, AUTH = 8, 9, 10, 11, 12, 13, 14, 15

MQTT_31, MQTT_311, MQTT_5 = 3, 4, 5
_PROTOCOL_NAMES = {MQTT_31: b"MQIsdp", MQTT_311: b"MQTT", MQTT_5: b"MQTT"}

# MQTT 5 reason codes this edge sends (section 2.4).
RC_SUCCESS = 0x00
RC_UNSPECIFIED = 0x80
RC_MALFORMED = 0x81
RC_PROTOCOL_ERROR = 0x82
RC_UNSUPPORTED_VERSION = 0x84
RC_CLIENT_ID_INVALID = 0x85
RC_BAD_LOGIN = 0x86
RC_NOT_AUTHORIZED = 0x87
RC_SERVER_UNAVAILABLE = 0x88
RC_SERVER_SHUTTING_DOWN = 0x8B
RC_BAD_AUTH_METHOD = 0x8C
RC_KEEP_ALIVE_TIMEOUT = 0x8D
RC_SESSION_TAKEN_OVER = 0x8E
RC_TOPIC_NAME_INVALID = 0x90
RC_NO_SUBSCRIPTION = 0x11
RC_PACKET_TOO_LARGE = 0x95
RC_QOS_NOT_SUPPORTED = 0x9B

# MQTT 3.1.1's CONNACK return codes for the reasons above (section 3.2.2.3).
_CONNACK_311 = {
    RC_SUCCESS: 0,
    RC_UNSUPPORTED_VERSION: 1,
    RC_CLIENT_ID_INVALID: 2,
    RC_SERVER_UNAVAILABLE: 3,
    RC_SERVER_SHUTTING_DOWN: 3,
    RC_BAD_LOGIN: 4,
    RC_NOT_AUTHORIZED: 5,
}

# MQTT 5 property identifiers read or written here (section 2.2.2.2).
PROP_SESSION_EXPIRY = 0x11
PROP_ASSIGNED_CLIENT_ID = 0x12
PROP_SERVER_KEEP_ALIVE = 0x13
PROP_AUTH_METHOD = 0x15
PROP_RECEIVE_MAXIMUM = 0x21
PROP_TOPIC_ALIAS_MAXIMUM = 0x22
PROP_TOPIC_ALIAS = 0x23
PROP_RETAIN_AVAILABLE = 0x25
PROP_MAXIMUM_PACKET_SIZE = 0x27
PROP_WILDCARD_SUB_AVAILABLE = 0x28
PROP_SHARED_SUB_AVAILABLE = 0x2A

# Each property's value type: how many bytes to skip, or a variable form (section 2.2.2.2).
_BYTE, _U16, _U32, _VARINT, _STR, _BIN, _PAIR = "b", "h", "i", "v", "s", "d", "p"
_PROPERTY_TYPES = {
    0x01: _BYTE, 0x02: _U32, 0x03: _STR, 0x08: _STR, 0x09: _BIN, 0x0B: _VARINT, 0x11: _U32,
    0x12: _STR, 0x13: _U16, 0x15: _STR, 0x16: _BIN, 0x17: _BYTE, 0x18: _U32, 0x19: _BYTE,
    0x1A: _STR, 0x1C: _STR, 0x1F: _STR, 0x21: _U16, 0x22: _U16, 0x23: _U16, 0x24: _BYTE,
    0x25: _BYTE, 0x26: _PAIR, 0x27: _U32, 0x28: _BYTE, 0x29: _BYTE, 0x2A: _BYTE,
}  # fmt: skip

MAX_REMAINING_LENGTH = 268_435_455  # four bytes of variable-length integer


@dataclass(frozen=True, slots=True)
class Connect:
    """A CONNECT's fields that an edge acts on (the will is parsed and not kept: see `gateway.edge`)."""

    version: int
    client_id: str
    clean_start: bool
    keepalive_s: int
    username: str | None
    password: bytes | None
    session_expiry_s: int
    receive_maximum: int
    auth_method: str | None
    will: bool


@dataclass(frozen=True, slots=True)
class Publish:
    """A PUBLISH as received. `topic` is bytes: a topic that is not UTF-8 is still dead-lettered."""

    topic: bytes
    payload: bytes
    qos: int
    packet_id: int
    dup: bool
    retain: bool
    topic_alias: int | None


@dataclass(frozen=True, slots=True)
class Subscribe:
    packet_id: int
    filters: list[str]


@dataclass(frozen=True, slots=True)
class Unsubscribe:
    packet_id: int
    filters: list[str]


@dataclass(frozen=True, slots=True)
class Disconnect:
    reason: int


@dataclass(frozen=True, slots=True)
class PubRel:
    packet_id: int


@dataclass(frozen=True, slots=True)
class PingReq:
    pass


@dataclass(frozen=True, slots=True)
class Ignored:
    """A packet that needs no answer from an edge (PUBACK, PUBREC, PUBCOMP from a client)."""

    kind: int


Packet = Connect | Publish | Subscribe | Unsubscribe | Disconnect | PubRel | PingReq | Ignored


# ---------------------------------------------------------------------------------------- framing


class FrameReader:
    """Cuts a byte stream into (first byte, body) frames, whatever the reads' boundaries.

    `max_packet_bytes` bounds what one client can make the edge buffer: a frame that announces
    more raises before its body is read (MQTT 5's Maximum Packet Size, announced in CONNACK)."""

    __slots__ = ("_buf", "max_packet_bytes")

    def __init__(self, max_packet_bytes: int) -> None:
        self._buf = bytearray()
        self.max_packet_bytes = max_packet_bytes

    @property
    def buffered(self) -> int:
        return len(self._buf)

    @property
    def first_byte(self) -> int | None:
        """The first byte of the frame being collected (None: nothing buffered)."""
        return self._buf[0] if self._buf else None

    def feed(self, data: bytes) -> list[tuple[int, bytes]]:
        buf = self._buf
        buf += data
        out: list[tuple[int, bytes]] = []
        pos, end = 0, len(buf)
        while end - pos >= 2:
            remaining, mult, i, complete = 0, 1, pos + 1, False
            for _ in range(4):
                if i >= end:
                    break
                b = buf[i]
                i += 1
                remaining += (b & 0x7F) * mult
                if not b & 0x80:
                    complete = True
                    break
                mult *= 128
            else:
                raise MqttProtocolError("remaining length longer than four bytes")
            if not complete:
                break  # the length itself is not complete yet
            if remaining + (i - pos) > self.max_packet_bytes:
                raise MqttProtocolError(
                    f"packet of {remaining + i - pos} bytes over the limit of {self.max_packet_bytes}",
                    RC_PACKET_TOO_LARGE,
                )
            if i + remaining > end:
                break
            out.append((buf[pos], bytes(buf[i : i + remaining])))
            pos = i + remaining
        if pos:
            del buf[:pos]
        return out


def varint(n: int) -> bytes:
    out = bytearray()
    while True:
        b, n = n & 0x7F, n >> 7
        out.append(b | (0x80 if n else 0))
        if not n:
            return bytes(out)


def frame(first: int, body: bytes) -> bytes:
    return bytes([first]) + varint(len(body)) + body


# ---------------------------------------------------------------------------------------- decoding


class _Body:
    """A cursor over one packet's body; every read checks the bytes are there."""

    __slots__ = ("b", "i")

    def __init__(self, body: bytes) -> None:
        self.b = body
        self.i = 0

    def left(self) -> int:
        return len(self.b) - self.i

    def take(self, n: int) -> bytes:
        if n > len(self.b) - self.i:
            raise MqttProtocolError(f"packet ends {n - (len(self.b) - self.i)} bytes early")
        v = self.b[self.i : self.i + n]
        self.i += n
        return v

    def u8(self) -> int:
        return self.take(1)[0]

    def u16(self) -> int:
        return int.from_bytes(self.take(2), "big")

    def u32(self) -> int:
        return int.from_bytes(self.take(4), "big")

    def varint(self) -> int:
        n, mult = 0, 1
        for _ in range(4):
            b = self.u8()
            n += (b & 0x7F) * mult
            if not b & 0x80:
                return n
            mult *= 128
        raise MqttProtocolError("variable byte integer longer than four bytes")

    def binary(self) -> bytes:
        return self.take(self.u16())

    def text(self) -> str:
        raw = self.binary()
        try:
            s = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise MqttProtocolError(f"string is not UTF-8: {exc}") from exc
        if "\x00" in s:
            raise MqttProtocolError("string holds U+0000")
        return s

    def properties(self) -> dict[int, object]:
        """MQTT 5 properties: those with one value kept, repeated ones (user properties) skipped."""
        n = self.varint()
        end = self.i + n
        if end > len(self.b):
            raise MqttProtocolError("properties run past the packet")
        out: dict[int, object] = {}
        while self.i < end:
            pid = self.varint()
            kind = _PROPERTY_TYPES.get(pid)
            value: object
            if kind is None:
                raise MqttProtocolError(f"unknown property 0x{pid:02x}")
            if kind == _BYTE:
                value = self.u8()
            elif kind == _U16:
                value = self.u16()
            elif kind == _U32:
                value = self.u32()
            elif kind == _VARINT:
                value = self.varint()
            elif kind == _STR:
                value = self.text()
            elif kind == _BIN:
                value = self.binary()
            else:
                value = (self.text(), self.text())
            if pid != 0x26:
                if pid in out:
                    raise MqttProtocolError(f"property 0x{pid:02x} given twice", RC_PROTOCOL_ERROR)
                out[pid] = value
        if self.i != end:
            raise MqttProtocolError("properties end inside a property")
        return out


def _int_prop(props: dict[int, object], pid: int, default: int) -> int:
    v = props.get(pid, default)
    return v if isinstance(v, int) else default


def decode_connect(body: bytes) -> Connect:
    """A CONNECT. An unsupported protocol level raises with RC_UNSUPPORTED_VERSION, which the edge
    answers with a CONNACK before it closes (MQTT 3.1.1 section 3.1.2.2)."""
    c = _Body(body)
    name = c.binary()
    version = c.u8()
    if version not in _PROTOCOL_NAMES or _PROTOCOL_NAMES[version] != name:
        raise MqttProtocolError(f"protocol {name!r} level {version} is not served", RC_UNSUPPORTED_VERSION)
    flags = c.u8()
    if flags & 0x01:
        raise MqttProtocolError("CONNECT's reserved flag is set")
    will = bool(flags & 0x04)
    will_qos = (flags >> 3) & 3
    if will_qos == 3 or (not will and (will_qos or flags & 0x20)):
        raise MqttProtocolError("CONNECT's will flags are inconsistent")
    has_user, has_password = bool(flags & 0x80), bool(flags & 0x40)
    if version != MQTT_5 and has_password and not has_user:
        raise MqttProtocolError("a password without a user name (MQTT 3.1.1 section 3.1.2.9)")
    keepalive = c.u16()
    props = c.properties() if version == MQTT_5 else {}
    client_id = c.text()
    if will:
        if version == MQTT_5:
            c.properties()
        c.text()
        c.binary()
    username = c.text() if has_user else None
    password = c.binary() if has_password else None
    if c.left():
        raise MqttProtocolError(f"{c.left()} bytes after the CONNECT payload")
    receive_max = _int_prop(props, PROP_RECEIVE_MAXIMUM, 65535)
    if receive_max == 0:
        raise MqttProtocolError("Receive Maximum of 0", RC_PROTOCOL_ERROR)
    method = props.get(PROP_AUTH_METHOD)
    return Connect(
        version=version,
        client_id=client_id,
        clean_start=bool(flags & 0x02),
        keepalive_s=keepalive,
        username=username,
        password=password,
        session_expiry_s=_int_prop(props, PROP_SESSION_EXPIRY, 0),
        receive_maximum=receive_max,
        auth_method=method if isinstance(method, str) else None,
        will=will,
    )


def decode(first: int, body: bytes, version: int) -> Packet:
    """Any packet after CONNECT, for a connection of protocol `version`."""
    kind, flags = first >> 4, first & 0x0F
    if kind == PUBLISH:
        return decode_publish(flags, body, version)
    if kind == PINGREQ:
        if flags or body:
            raise MqttProtocolError("PINGREQ with flags or a body")
        return PingReq()
    if kind == PUBREL:
        if flags != 0x02:
            raise MqttProtocolError("PUBREL's fixed header flags must be 0010")
        c = _Body(body)
        return PubRel(c.u16())
    if kind in (SUBSCRIBE, UNSUBSCRIBE):
        if flags != 0x02:
            raise MqttProtocolError(f"packet type {kind}'s fixed header flags must be 0010")
        c = _Body(body)
        pid = c.u16()
        if pid == 0:
            raise MqttProtocolError("packet identifier 0")
        if version == MQTT_5:
            c.properties()
        filters: list[str] = []
        while c.left():
            filters.append(c.text())
            if kind == SUBSCRIBE:
                c.u8()  # requested QoS / subscription options
        if not filters:
            raise MqttProtocolError("no topic filter", RC_PROTOCOL_ERROR)
        return Subscribe(pid, filters) if kind == SUBSCRIBE else Unsubscribe(pid, filters)
    if kind == DISCONNECT:
        return Disconnect(body[0] if version == MQTT_5 and body else RC_SUCCESS)
    if kind in (PUBACK, PUBREC, PUBCOMP):
        return Ignored(kind)
    if kind == CONNECT:
        raise MqttProtocolError("a second CONNECT", RC_PROTOCOL_ERROR)
    raise MqttProtocolError(f"packet type {kind} is not accepted from a client", RC_PROTOCOL_ERROR)


def decode_publish(flags: int, body: bytes, version: int) -> Publish:
    qos = (flags >> 1) & 3
    if qos == 3:
        raise MqttProtocolError("PUBLISH with QoS 3")
    dup = bool(flags & 0x08)
    if dup and qos == 0:
        raise MqttProtocolError("DUP set on a QoS 0 PUBLISH")
    c = _Body(body)
    topic = c.binary()
    packet_id = 0
    if qos:
        packet_id = c.u16()
        if packet_id == 0:
            raise MqttProtocolError("packet identifier 0")
    alias: int | None = None
    if version == MQTT_5:
        props = c.properties()
        a = props.get(PROP_TOPIC_ALIAS)
        alias = a if isinstance(a, int) else None
    if b"+" in topic or b"#" in topic:
        raise MqttProtocolError("wildcard in a topic name", RC_TOPIC_NAME_INVALID)
    if not topic and alias is None:
        raise MqttProtocolError("empty topic name", RC_TOPIC_NAME_INVALID)
    return Publish(topic, body[c.i :], qos, packet_id, dup, bool(flags & 0x01), alias)


# ---------------------------------------------------------------------------------------- encoding


def _props(**values: int) -> bytes:
    """MQTT 5 properties from `P<id>=value` for the byte/u16/u32 properties this edge sends."""
    out = bytearray()
    for key, v in values.items():
        pid = int(key[1:], 16)
        out += varint(pid)
        kind = _PROPERTY_TYPES[pid]
        out += v.to_bytes({_BYTE: 1, _U16: 2, _U32: 4}[kind], "big")
    return varint(len(out)) + bytes(out)


def connack(
    version: int,
    reason: int,
    *,
    session_present: bool = False,
    receive_maximum: int = 0,
    max_packet_bytes: int = 0,
    assigned_client_id: str | None = None,
) -> bytes:
    """CONNACK with `reason` (an MQTT 5 code, mapped to 3.1.1's where the client speaks that).

    To an MQTT 5 client that is accepted it announces what the edge does not offer (retain, topic
    aliases, wildcard and shared subscriptions), its Receive Maximum and Maximum Packet Size, so a
    conforming client never sends what would be refused."""
    flags = 1 if session_present and reason == RC_SUCCESS else 0
    if version != MQTT_5:
        return frame(CONNACK << 4, bytes([flags, _CONNACK_311.get(reason, 3)]))
    if reason != RC_SUCCESS:
        return frame(CONNACK << 4, bytes([0, reason, 0]))
    props = bytearray(_props(P21=receive_maximum, P27=max_packet_bytes, P25=0, P28=0, P2A=0)[1:])
    if assigned_client_id is not None:
        raw = assigned_client_id.encode()
        props += bytes([PROP_ASSIGNED_CLIENT_ID]) + len(raw).to_bytes(2, "big") + raw
    return frame(CONNACK << 4, bytes([flags, RC_SUCCESS]) + varint(len(props)) + bytes(props))


def puback(packet_id: int, version: int, reason: int = RC_SUCCESS) -> bytes:
    """PUBACK; with a reason only for MQTT 5 (3.1.1 has none: a refused message is acknowledged)."""
    if version == MQTT_5 and reason != RC_SUCCESS:
        return bytes([PUBACK << 4, 3]) + packet_id.to_bytes(2, "big") + bytes([reason])
    return bytes([PUBACK << 4, 2]) + packet_id.to_bytes(2, "big")


def pubrec(packet_id: int, version: int, reason: int = RC_SUCCESS) -> bytes:
    # A PUBREC reason of 0x80 or above ends the QoS 2 flow (MQTT 5 section 4.3.3): never sent,
    # the refusal is a PUBREC "success" for a message that went to the dead letters.
    del version, reason
    return bytes([PUBREC << 4, 2]) + packet_id.to_bytes(2, "big")


def pubcomp(packet_id: int) -> bytes:
    return bytes([PUBCOMP << 4, 2]) + packet_id.to_bytes(2, "big")


PINGRESP_BYTES = bytes([PINGRESP << 4, 0])


def suback(packet_id: int, version: int, count: int) -> bytes:
    """Every filter refused: an edge publishes nothing to vehicles (their alerts come from the
    alert broker, docs/contracts.md)."""
    code = RC_NOT_AUTHORIZED if version == MQTT_5 else RC_UNSPECIFIED
    props = b"\x00" if version == MQTT_5 else b""
    return frame(SUBACK << 4, packet_id.to_bytes(2, "big") + props + bytes([code]) * count)


def unsuback(packet_id: int, version: int, count: int) -> bytes:
    if version != MQTT_5:
        return frame(UNSUBACK << 4, packet_id.to_bytes(2, "big"))
    return frame(UNSUBACK << 4, packet_id.to_bytes(2, "big") + b"\x00" + bytes([RC_NO_SUBSCRIPTION]) * count)


def disconnect(version: int, reason: int) -> bytes:
    """The server's DISCONNECT exists in MQTT 5 only; a 3.1.1 connection is just closed."""
    if version != MQTT_5:
        return b""
    return frame(DISCONNECT << 4, bytes([reason, 0]))
