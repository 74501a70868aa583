"""Teltonika's TCP protocol (FMB/FMC family): Codec 8, Codec 8 Extended and Codec 16 AVL data,
Codec 12 commands, the IMEI handshake and the acknowledgements, as pure functions.

Written from Teltonika's public description of its data sending protocols
(https://wiki.teltonika-gps.com/view/Teltonika_Data_Sending_Protocols, formerly
https://wiki.teltonika-gps.com/view/Codec). A connection runs:

1. the device sends its IMEI: 2 bytes of length (15) and the IMEI in ASCII (`encode_imei`);
2. the server answers one byte, 0x01 to accept it or 0x00 to refuse (`imei_answer`), and closes
   after a refusal;
3. the device sends AVL packets: 4 zero bytes, the data field's length (4 bytes), the data field
   (codec id, record count, the records, the record count again) and its CRC-16/IBM in 4 bytes;
4. the server answers each packet with the number of records it accepted, 4 bytes big-endian
   (`encode_ack`); a device that reads another number sends the packet again. FleetFence sends it
   only once Kafka has every record, so a lost acknowledgement means a retransmitted packet, whose
   records are the same fixes (`gateway.protocols.telemetry_of`: one fix per vehicle and time).

`TeltonikaStream` cuts the byte stream of one connection into those frames whatever the reads'
boundaries, and bounds what a device can make the server buffer. A frame it cannot use is reported
as a `TeltonikaFrameError` among the frames, with a short `reason`; a `fatal` one (the stream can no
longer be cut into frames, or the IMEI is garbage) ends the stream, and the connection should close.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

from fleetfence.contracts import Telemetry
from gateway.errors import TeltonikaFrameError
from gateway.protocols import telemetry_of

CODEC_8 = 0x08
CODEC_8E = 0x8E
CODEC_16 = 0x10
CODEC_12 = 0x0C
COMMAND = 0x05  # Codec 12 message type: a command, server to device
RESPONSE = 0x06  # Codec 12 message type: the device's response

IMEI_LENGTH = 15
# A device sends at most about 1280 bytes per packet (the wiki's "Maximum AVL packet size"); a
# megabyte is far above any real packet and still a bound on what one connection can make us hold.
MAX_DATA_BYTES = 1 << 20


@dataclass(frozen=True, slots=True)
class ImeiFrame:
    """The first frame of a connection: the device's IMEI, 15 ASCII digits."""

    imei: str


@dataclass(frozen=True, slots=True)
class AvlRecord:
    """One record of an AVL packet.

    Coordinates are degrees (the wire's signed 1e-7 degrees); altitude in metres, angle in degrees
    clockwise from north, speed in km/h (0 when the GPS has no fix, with all GPS fields zero).
    `io` maps each IO element's AVL id to its raw unsigned value, or to its bytes for a variable
    length (NX) element of Codec 8 Extended: what an id means, its sign and its scale depend on
    the device's model and configuration, so they are left to the reader (`io_attributes` names the
    common FMB ones). `io_sizes` keeps each value's width on the wire, so that a decoded record
    encodes to the very same bytes; it takes no part in comparisons."""

    timestamp_ms: int
    priority: int
    lon: float
    lat: float
    altitude_m: int
    angle_deg: int
    satellites: int
    speed_kmh: int
    event_io_id: int = 0
    io: dict[int, int | bytes] = field(default_factory=dict)
    generation_type: int | None = None  # Codec 16 only: why the record was generated
    io_sizes: dict[int, int] = field(default_factory=dict, compare=False, repr=False)


@dataclass(frozen=True, slots=True)
class AvlPacket:
    """An AVL data packet: its codec and its records. `ack` is the answer once all are kept."""

    codec: int
    records: tuple[AvlRecord, ...]

    @property
    def ack(self) -> bytes:
        return encode_ack(len(self.records))


@dataclass(frozen=True, slots=True)
class CommandPacket:
    """A Codec 12 frame: a command (`COMMAND`, server to device) or a device's response to one
    (`RESPONSE`), as text bytes. It carries no fix: it is reported, counted and not acknowledged
    with a record count."""

    message_type: int
    text: bytes


Frame = ImeiFrame | AvlPacket | CommandPacket

# --------------------------------------------------------------------------- checksums and IMEI


def _crc_table() -> tuple[int, ...]:
    table = []
    for byte in range(256):
        crc = byte
        for _ in range(8):
            crc = (crc >> 1) ^ 0xA001 if crc & 1 else crc >> 1
        table.append(crc)
    return tuple(table)


_CRC_TABLE = _crc_table()


def crc16_ibm(data: bytes | bytearray | memoryview) -> int:
    """CRC-16/IBM (also called ARC): polynomial 0x8005 reflected (0xA001), initial value 0, no
    final XOR; what Teltonika computes from the codec id to the second record count."""
    crc = 0
    table = _CRC_TABLE
    for byte in data:
        crc = (crc >> 8) ^ table[(crc ^ byte) & 0xFF]
    return crc


def luhn_valid(imei: str) -> bool:
    """True when the IMEI's last digit is its Luhn check digit, as every IMEI a GSM module carries.
    Not required by the handshake (`decode_imei(check_luhn=True)` asks for it): a registry lookup
    already refuses an unknown device; the check tells a typo in the registry from a device."""
    if not imei.isascii() or not imei.isdigit():
        return False
    total = 0
    for i, ch in enumerate(reversed(imei)):
        d = int(ch)
        if i % 2:
            d = d * 2 - 9 if d > 4 else d * 2
        total += d
    return total % 10 == 0


def decode_imei(frame: bytes, *, check_luhn: bool = False) -> str:
    """The IMEI of a handshake frame (2 bytes of length, then ASCII digits), or `bad_imei`."""
    if len(frame) < 2:
        raise TeltonikaFrameError("truncated", f"IMEI frame of {len(frame)} bytes")
    n = int.from_bytes(frame[:2], "big")
    if n != IMEI_LENGTH:
        raise TeltonikaFrameError("bad_imei", f"IMEI length {n}, expected {IMEI_LENGTH}")
    if len(frame) != 2 + n:
        raise TeltonikaFrameError("truncated" if len(frame) < 2 + n else "bad_length", "IMEI frame size")
    raw = frame[2:]
    if not raw.isdigit():
        raise TeltonikaFrameError("bad_imei", f"IMEI {raw[:IMEI_LENGTH]!r} is not 15 ASCII digits")
    imei = raw.decode("ascii")
    if check_luhn and not luhn_valid(imei):
        raise TeltonikaFrameError("bad_imei", f"IMEI {imei} fails its Luhn check digit")
    return imei


def encode_imei(imei: str) -> bytes:
    """The handshake frame a device opens its connection with."""
    raw = imei.encode("ascii")
    return len(raw).to_bytes(2, "big") + raw


def imei_answer(accepted: bool) -> bytes:
    """The server's one-byte answer to the IMEI: 0x01 go on, 0x00 refused (then close)."""
    return b"\x01" if accepted else b"\x00"


def encode_ack(count: int) -> bytes:
    """The answer to an AVL packet: how many of its records the server accepted."""
    return count.to_bytes(4, "big")


# --------------------------------------------------------------------------- AVL data layouts

_HEADER = struct.Struct(">II")  # preamble (zero), data field length
_GPS = struct.Struct(">QBiihHBH")  # time ms, priority, lon, lat, altitude, angle, satellites, speed
_U8, _U16 = struct.Struct(">B"), struct.Struct(">H")
_NX_ITEM = struct.Struct(">HH")  # AVL id, value length
_WIDTHS = (1, 2, 4, 8)
_VALUE_CODES = {1: "B", 2: "H", 4: "I", 8: "Q"}


class _Layout(NamedTuple):
    """How a codec spells a record's IO element: the widths of its ids and counts."""

    head: struct.Struct  # event IO id, [generation type], total count
    group_count: struct.Struct  # the count before each group
    items: dict[int, struct.Struct]  # width -> (id, value)
    nx: bool  # a group of variable-length values follows the 8-byte group
    generation: bool


def _layout(head: str, count: str, id_code: str, *, nx: bool = False, generation: bool = False) -> _Layout:
    items = {w: struct.Struct(f">{id_code}{c}") for w, c in _VALUE_CODES.items()}
    return _Layout(struct.Struct(head), struct.Struct(count), items, nx, generation)


_LAYOUTS = {
    CODEC_8: _layout(">BB", ">B", "B"),
    CODEC_8E: _layout(">HH", ">H", "H", nx=True),
    CODEC_16: _layout(">HBB", ">B", "H", generation=True),
}


def _read_record(data: bytes, pos: int, layout: _Layout) -> tuple[AvlRecord, int]:
    ts, priority, lon, lat, alt, angle, sats, speed = _GPS.unpack_from(data, pos)
    pos += _GPS.size
    head = layout.head.unpack_from(data, pos)
    pos += layout.head.size
    event, generation = head[0], (head[1] if layout.generation else None)
    io: dict[int, int | bytes] = {}
    sizes: dict[int, int] = {}
    for width in _WIDTHS:
        (n,) = layout.group_count.unpack_from(data, pos)
        pos += layout.group_count.size
        item = layout.items[width]
        for _ in range(n):
            key, value = item.unpack_from(data, pos)
            pos += item.size
            io[key], sizes[key] = value, width
    if layout.nx:
        (n,) = _U16.unpack_from(data, pos)
        pos += 2
        for _ in range(n):
            key, length = _NX_ITEM.unpack_from(data, pos)
            pos += _NX_ITEM.size
            if pos + length > len(data):
                raise struct.error("NX value runs past the data field")
            io[key], sizes[key] = data[pos : pos + length], length
            pos += length
    record = AvlRecord(
        timestamp_ms=ts,
        priority=priority,
        lon=lon / 1e7,
        lat=lat / 1e7,
        altitude_m=alt,
        angle_deg=angle,
        satellites=sats,
        speed_kmh=speed,
        event_io_id=event,
        io=io,
        generation_type=generation,
        io_sizes=sizes,
    )
    return record, pos


def _decode_command(data: bytes) -> CommandPacket:
    # codec id, quantity 1, type, text size (4 bytes), text, quantity 2
    if len(data) < 8:
        raise TeltonikaFrameError("bad_length", f"Codec 12 data field of {len(data)} bytes")
    size = int.from_bytes(data[3:7], "big")
    if 7 + size + 1 != len(data):
        raise TeltonikaFrameError("bad_length", f"Codec 12 text of {size} bytes in {len(data)}")
    if data[1] != data[-1]:
        raise TeltonikaFrameError("count_mismatch", f"Codec 12 quantities {data[1]} and {data[-1]}")
    return CommandPacket(message_type=data[2], text=data[7 : 7 + size])


def decode_data(data: bytes) -> AvlPacket | CommandPacket:
    """The packet in a data field (codec id to the second record count), its CRC already checked.

    Codec 13 and 14 (commands with a timestamp or an IMEI, server to device) and any other codec
    are `unknown_codec`: none carries a fix a device sends. Each IO element's total count is
    redundant with its groups' counts and is not checked: the CRC already catches a corrupted
    packet, and a firmware that miscounts is still heard."""
    if len(data) < 3:
        raise TeltonikaFrameError("bad_length", f"data field of {len(data)} bytes")
    codec, count = data[0], data[1]
    if codec == CODEC_12:
        return _decode_command(data)
    layout = _LAYOUTS.get(codec)
    if layout is None:
        raise TeltonikaFrameError("unknown_codec", f"codec id {codec:#04x}")
    records = []
    pos = 2
    try:
        for _ in range(count):
            record, pos = _read_record(data, pos, layout)
            records.append(record)
    except struct.error as exc:
        raise TeltonikaFrameError("bad_length", f"{count} records overrun the data field") from exc
    if pos != len(data) - 1:
        raise TeltonikaFrameError("bad_length", f"{len(data) - 1 - pos} bytes after {count} records")
    if data[pos] != count:
        raise TeltonikaFrameError("count_mismatch", f"record counts {count} and {data[pos]}")
    return AvlPacket(codec=codec, records=tuple(records))


def decode_packet(frame: bytes) -> AvlPacket | CommandPacket:
    """One whole frame (preamble to CRC) -> its packet, or a TeltonikaFrameError."""
    if len(frame) < _HEADER.size:
        raise TeltonikaFrameError("truncated", f"frame of {len(frame)} bytes")
    preamble, length = _HEADER.unpack_from(frame, 0)
    if preamble != 0:
        raise TeltonikaFrameError("bad_preamble", f"preamble {preamble:#010x}, expected 0")
    end = _HEADER.size + length
    if len(frame) < end + 4:
        raise TeltonikaFrameError("truncated", f"frame of {len(frame)} bytes, announced {end + 4}")
    if len(frame) > end + 4:
        raise TeltonikaFrameError("bad_length", f"{len(frame) - end - 4} bytes after the CRC")
    data = frame[_HEADER.size : end]
    crc, expected = int.from_bytes(frame[end:], "big"), crc16_ibm(data)
    if crc != expected:
        raise TeltonikaFrameError("bad_crc", f"CRC {crc:#06x}, computed {expected:#06x}")
    return decode_data(data)


# --------------------------------------------------------------------------- encoders


def encode_frame(data: bytes) -> bytes:
    """A data field (codec id to the second record count) framed: preamble, length, CRC."""
    return _HEADER.pack(0, len(data)) + data + crc16_ibm(data).to_bytes(4, "big")


def _fit(value: int) -> int:
    for width in _WIDTHS:
        if 0 <= value < 1 << (8 * width):
            return width
    raise ValueError(f"IO value {value} does not fit 8 unsigned bytes")


def _encode_record(record: AvlRecord, codec: int, layout: _Layout) -> bytes:
    groups: dict[int, list[tuple[int, int]]] = {w: [] for w in _WIDTHS}
    nx: list[tuple[int, bytes]] = []
    for key, value in record.io.items():
        if isinstance(value, bytes):
            nx.append((key, value))
        else:
            groups[record.io_sizes.get(key) or _fit(value)].append((key, value))
    if nx and not layout.nx:
        raise ValueError(f"codec {codec:#04x} has no variable-length IO elements")
    total = sum(len(g) for g in groups.values()) + len(nx)
    if layout.generation:
        if record.generation_type is None:
            raise ValueError("a Codec 16 record needs its generation_type")
        head = layout.head.pack(record.event_io_id, record.generation_type, total)
    else:
        head = layout.head.pack(record.event_io_id, total)
    lon, lat = round(record.lon * 1e7), round(record.lat * 1e7)
    gps = (record.timestamp_ms, record.priority, lon, lat, record.altitude_m, record.angle_deg)
    parts = [_GPS.pack(*gps, record.satellites, record.speed_kmh), head]
    for width in _WIDTHS:
        parts.append(layout.group_count.pack(len(groups[width])))
        parts += [layout.items[width].pack(k, v) for k, v in groups[width]]
    if layout.nx:
        parts.append(_U16.pack(len(nx)))
        for key, raw in nx:
            parts += [_NX_ITEM.pack(key, len(raw)), raw]
    return b"".join(parts)


def encode_avl_packet(records: Sequence[AvlRecord], *, codec: int = CODEC_8) -> bytes:
    """The frame a device sends for `records` (Codec 8, 8 Extended or 16), CRC included; for the
    simulator and the tests. A value that does not fit the codec raises ValueError."""
    layout = _LAYOUTS.get(codec)
    if layout is None:
        raise ValueError(f"codec {codec:#04x} carries no AVL records")
    if not 0 <= len(records) <= 255:
        raise ValueError(f"{len(records)} records: a packet holds at most 255")
    try:
        body = b"".join(_encode_record(r, codec, layout) for r in records)
    except struct.error as exc:
        raise ValueError(f"a record does not fit codec {codec:#04x}: {exc}") from exc
    n = _U8.pack(len(records))
    return encode_frame(bytes([codec]) + n + body + n)


def encode_command(text: bytes, *, message_type: int = COMMAND) -> bytes:
    """A Codec 12 frame: a command for the device (e.g. b"getinfo"), or a device's response."""
    size = len(text).to_bytes(4, "big")
    return encode_frame(bytes([CODEC_12, 1, message_type]) + size + text + b"\x01")


# --------------------------------------------------------------------------- the TCP stream


class TeltonikaStream:
    """Cuts one connection's bytes into frames: first the IMEI, then packets, whatever the reads'
    boundaries. `feed` returns the frames completed by the bytes it is given, and in their place a
    `TeltonikaFrameError` for each frame that cannot be used; the stream goes on after one that is
    not `fatal` (its length was sound, so the next frame starts where it ends). After a fatal one,
    the last item returned, the stream holds nothing and any further `feed` raises it again.

    What one device can make the server hold is bounded: a data field announced longer than
    `max_data_bytes`, or an IMEI length other than 15, is refused as soon as its length is read,
    before any of its bytes are buffered."""

    __slots__ = ("_buf", "_imei", "check_luhn", "error", "max_data_bytes")

    def __init__(
        self, *, max_data_bytes: int = MAX_DATA_BYTES, imei: str | None = None, check_luhn: bool = False
    ) -> None:
        self._buf = bytearray()
        self._imei = imei  # given: the handshake happened before (a stream resumed)
        self.max_data_bytes = max_data_bytes
        self.check_luhn = check_luhn
        self.error: TeltonikaFrameError | None = None

    @property
    def imei(self) -> str | None:
        return self._imei

    @property
    def buffered(self) -> int:
        """Bytes of a frame not complete yet."""
        return len(self._buf)

    def feed(self, data: bytes) -> list[Frame | TeltonikaFrameError]:
        if self.error is not None:
            raise self.error
        buf = self._buf
        buf += data
        out: list[Frame | TeltonikaFrameError] = []
        pos = 0
        try:
            while True:
                size = self._next_size(buf, pos)
                if size is None or len(buf) - pos < size:
                    break
                frame = bytes(buf[pos : pos + size])
                pos += size
                if self._imei is None:
                    self._imei = decode_imei(frame, check_luhn=self.check_luhn)
                    out.append(ImeiFrame(self._imei))
                    continue
                try:
                    out.append(decode_packet(frame))
                except TeltonikaFrameError as exc:
                    out.append(exc)
        except TeltonikaFrameError as exc:
            self.error = exc
            out.append(exc)
            pos = len(buf)
        del buf[:pos]
        return out

    def _next_size(self, buf: bytearray, pos: int) -> int | None:
        """The size of the frame at `pos` once its length is readable (None before); refuses a
        length the stream will not buffer."""
        if self._imei is None:
            if len(buf) - pos < 2:
                return None
            n = int.from_bytes(buf[pos : pos + 2], "big")
            if n != IMEI_LENGTH:
                raise TeltonikaFrameError("bad_imei", f"IMEI length {n}, expected {IMEI_LENGTH}")
            return 2 + n
        if len(buf) - pos < _HEADER.size:
            return None
        preamble, length = _HEADER.unpack_from(buf, pos)
        if preamble != 0:
            raise TeltonikaFrameError("bad_preamble", f"preamble {preamble:#010x}, expected 0")
        if length > self.max_data_bytes:
            raise TeltonikaFrameError("too_large", f"data field of {length} bytes over {self.max_data_bytes}")
        return int(_HEADER.size + length + 4)

    def close(self) -> TeltonikaFrameError | None:
        """At the end of the connection: `truncated` when a frame was cut short, else None."""
        if self._buf and self.error is None:
            detail = f"connection ended {len(self._buf)} bytes into a frame"
            self.error = TeltonikaFrameError("truncated", detail)
            self._buf.clear()
            return self.error
        return None


# --------------------------------------------------------------------------- into FleetFence

# The FMB family's common permanent IO elements (Teltonika's "FMB AVL ID" list), by name; every
# other id is kept as io<id>. Values stay raw: voltages in mV, odometer in m, HDOP/PDOP in 0.1.
IO_NAMES = {
    16: "total_odometer_m",
    21: "gsm_signal",
    66: "external_voltage_mv",
    67: "battery_voltage_mv",
    69: "gnss_status",
    181: "pdop_x10",
    182: "hdop_x10",
    239: "ignition",
    240: "movement",
}


def io_attributes(record: AvlRecord) -> dict[str, str]:
    """A record's priority, satellites, altitude, event and IO elements as text attributes."""
    attrs = {
        "priority": str(record.priority),
        "satellites": str(record.satellites),
        "altitude_m": str(record.altitude_m),
        "event_io_id": str(record.event_io_id),
    }
    for key, value in record.io.items():
        attrs[IO_NAMES.get(key, f"io{key}")] = value.hex() if isinstance(value, bytes) else str(value)
    return attrs


def to_telemetry(record: AvlRecord, *, vehicle_id: str, received_ms: int) -> Telemetry:
    """The record as FleetFence's telemetry for the vehicle its device is registered to; `seq` is
    the record's time (`gateway.protocols.telemetry_of`), so a packet sent again gives the same
    fixes. A record without a position (all GPS fields zero: the wiki's "0x0000 if GPS data is
    invalid"; latitude and longitude exactly 0 is never a vehicle) raises `no_fix` rather than
    putting the vehicle at 0°, 0°; other faults raise the contract's `DlqReason`."""
    if record.lat == 0 and record.lon == 0:
        raise TeltonikaFrameError("no_fix", f"record at {record.timestamp_ms} ms has no GPS position")
    return telemetry_of(
        vehicle_id=vehicle_id,
        ts_ms=record.timestamp_ms,
        lat=record.lat,
        lon=record.lon,
        speed_kmh=float(record.speed_kmh),
        heading_deg=float(record.angle_deg),
        accuracy_m=None,
        received_ms=received_ms,
        error=TeltonikaFrameError,
    )
