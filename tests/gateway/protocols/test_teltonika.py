"""Teltonika's codecs (gateway.protocols.teltonika), without a network: the packets Teltonika
publishes with their decoded values, encode -> decode round trips, any split of a TCP stream into
reads, and each malformed input answered with its reason."""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from fleetfence.contracts import DlqReason, Telemetry
from gateway.errors import TeltonikaFrameError
from gateway.protocols import teltonika as t

# Teltonika's published examples, with the values its page decodes them to, from
# https://wiki.teltonika-gps.com/view/Teltonika_Data_Sending_Protocols (formerly
# https://wiki.teltonika-gps.com/view/Codec): the IMEI handshake, Codec 8 examples 1 to 3, the
# Codec 8 Extended example, the Codec 16 example, and the Codec 12 "getinfo" command and response.
WIKI_IMEI = "000F333536333037303432343431303133"
WIKI_CODEC8_1 = (
    "000000000000003608010000016B40D8EA30010000000000000000000000000000000105021503010101425E0F01F1"
    "0000601A014E0000000000000000010000C7CF"
)
WIKI_CODEC8_2 = (
    "000000000000002808010000016B40D9AD80010000000000000000000000000000000103021503010101425E100000010000F22A"
)
WIKI_CODEC8_3 = (
    "000000000000004308020000016B40D57B480100000000000000000000000000000001010101000000000000016B"
    "40D5C198010000000000000000000000000000000101010101000000020000252C"
)
WIKI_CODEC8E = (
    "000000000000004A8E010000016B412CEE000100000000000000000000000000000000010005000100010100010011"
    "001D00010010015E2C880002000B000000003544C87A000E000000001DD7E06A00000100002994"
)
WIKI_CODEC16 = (
    "000000000000005F10020000016BDBC7833000000000000000000000000000000000000B05040200010000030002"
    "000B00270042563A00000000016BDBC7871800000000000000000000000000000000000B05040200010000030002"
    "000B00260042563A00000200005FB3"
)
WIKI_CODEC12_GETINFO = "000000000000000F0C010500000007676574696E666F0100004312"
WIKI_CODEC12_RESPONSE = (
    "00000000000000900C010600000088494E493A323031392F372F323220373A3232205254433A323031392F372F32"
    "3220373A3533205253543A32204552523A312053523A302042523A302043463A302046473A3020464C3A30205455"
    "3A302F302055543A3020534D533A30204E4F4750533A303A3330204750533A31205341543A302052533A33205246"
    "3A36352053463A31204D443A30010000C78F"
)
WIKI_AVL = [WIKI_CODEC8_1, WIKI_CODEC8_2, WIKI_CODEC8_3, WIKI_CODEC8E, WIKI_CODEC16]


def raw(hex_text: str) -> bytes:
    return bytes.fromhex(hex_text)


def avl(hex_text: str) -> t.AvlPacket:
    packet = t.decode_packet(raw(hex_text))
    assert isinstance(packet, t.AvlPacket)
    return packet


def zero_gps(record: t.AvlRecord) -> bool:
    gps = (record.lon, record.lat, record.altitude_m, record.angle_deg, record.satellites)
    return gps == (0.0, 0.0, 0, 0, 0) and record.speed_kmh == 0


def reason_of(call: Callable[[], object]) -> str:
    with pytest.raises(TeltonikaFrameError) as err:
        call()
    return err.value.reason


# --------------------------------------------------------------------------- conformance


def test_the_published_imei_handshake() -> None:
    assert t.decode_imei(raw(WIKI_IMEI)) == "356307042441013"
    assert t.encode_imei("356307042441013") == raw(WIKI_IMEI)
    assert t.luhn_valid("356307042441013")
    assert t.imei_answer(accepted=True) == b"\x01"
    assert t.imei_answer(accepted=False) == b"\x00"


def test_codec8_first_example() -> None:
    packet = avl(WIKI_CODEC8_1)
    assert packet.codec == t.CODEC_8
    (record,) = packet.records
    assert record.timestamp_ms == 1_560_161_086_000  # 0x16B40D8EA30: 2019-06-10 10:04:46 UTC
    assert record.priority == 1
    assert zero_gps(record)
    assert record.event_io_id == 1
    # N1: id 21 = 3, id 1 = 1; N2: id 66 = 0x5E0F; N4: id 241 = 0x601A; N8: id 78 = 0
    assert record.io == {21: 3, 1: 1, 66: 24079, 241: 24602, 78: 0}
    assert packet.ack == b"\x00\x00\x00\x01"


def test_codec8_second_example() -> None:
    (record,) = avl(WIKI_CODEC8_2).records
    assert record.timestamp_ms == 1_560_161_136_000  # 2019-06-10 10:05:36 UTC
    assert record.priority == 1
    assert zero_gps(record)
    assert record.event_io_id == 1
    assert record.io == {21: 3, 1: 1, 66: 24080}


def test_codec8_third_example_has_two_records() -> None:
    packet = avl(WIKI_CODEC8_3)
    assert [r.timestamp_ms for r in packet.records] == [1_560_160_861_000, 1_560_160_879_000]
    assert [r.io for r in packet.records] == [{1: 0}, {1: 1}]
    assert all(r.priority == 1 and r.event_io_id == 1 and zero_gps(r) for r in packet.records)
    assert packet.ack == b"\x00\x00\x00\x02"


def test_codec8_extended_example() -> None:
    packet = avl(WIKI_CODEC8E)
    assert packet.codec == t.CODEC_8E
    (record,) = packet.records
    assert record.timestamp_ms == 1_560_166_592_000  # 2019-06-10 11:36:32 UTC
    assert record.priority == 1
    assert zero_gps(record)
    assert record.event_io_id == 1
    # N1: id 1 = 1; N2: id 17 = 0x1D; N4: id 16 = 0x015E2C88; N8: id 11, id 14; NX: none
    assert record.io == {1: 1, 17: 29, 16: 22_949_000, 11: 893_700_218, 14: 500_686_954}


def test_codec16_example() -> None:
    packet = avl(WIKI_CODEC16)
    assert packet.codec == t.CODEC_16
    first, second = packet.records
    assert (first.timestamp_ms, second.timestamp_ms) == (1_562_760_414_000, 1_562_760_415_000)
    for record in packet.records:
        assert record.priority == 0
        assert zero_gps(record)
        assert record.event_io_id == 11
        assert record.generation_type == 5  # "On Change"
    assert first.io == {1: 0, 3: 0, 11: 39, 66: 22074}
    assert second.io == {1: 0, 3: 0, 11: 38, 66: 22074}
    assert packet.ack == b"\x00\x00\x00\x02"


def test_codec12_command_and_response() -> None:
    assert t.decode_packet(raw(WIKI_CODEC12_GETINFO)) == t.CommandPacket(
        message_type=t.COMMAND, text=b"getinfo"
    )
    assert t.encode_command(b"getinfo") == raw(WIKI_CODEC12_GETINFO)
    response = t.decode_packet(raw(WIKI_CODEC12_RESPONSE))
    assert isinstance(response, t.CommandPacket)
    assert response.message_type == t.RESPONSE
    assert response.text.startswith(b"INI:2019/7/22 7:22 RTC:2019/7/22 7:53")
    assert response.text.endswith(b"SF:1 MD:0")


@pytest.mark.parametrize("hex_text", WIKI_AVL)
def test_the_encoder_writes_the_published_bytes(hex_text: str) -> None:
    packet = avl(hex_text)
    assert t.encode_avl_packet(packet.records, codec=packet.codec) == raw(hex_text)


def test_crc16_ibm() -> None:
    assert t.crc16_ibm(b"123456789") == 0xBB3D  # the CRC catalogue's check value for CRC-16/ARC
    frame = raw(WIKI_CODEC8_1)
    assert t.crc16_ibm(frame[8:-4]) == 0xC7CF
    assert t.crc16_ibm(b"") == 0


def test_signed_coordinates_altitude_and_gps_fields() -> None:
    """Built by hand, not by the encoder: south-west coordinates are two's complement, altitude is
    signed, angle and speed unsigned."""
    gps = (
        (1_700_000_000_000).to_bytes(8, "big")
        + b"\x02"  # panic priority
        + (-739_857_000).to_bytes(4, "big", signed=True)  # lon -73.9857
        + (-338_688_000).to_bytes(4, "big", signed=True)  # lat -33.8688
        + (-28).to_bytes(2, "big", signed=True)
        + (359).to_bytes(2, "big")
        + b"\x0c"
        + (87).to_bytes(2, "big")
    )
    io = b"\xf0\x01\x01\xf0\x01\x00\x00\x00"  # event 240, one element: 240 (movement) = 1
    packet = avl(t.encode_frame(b"\x08\x01" + gps + io + b"\x01").hex())
    (record,) = packet.records
    assert (record.lon, record.lat) == (-73.9857, -33.8688)
    assert (record.altitude_m, record.angle_deg, record.satellites, record.speed_kmh) == (-28, 359, 12, 87)
    assert (record.priority, record.event_io_id, record.io) == (2, 240, {240: 1})


def test_acknowledgement_is_four_bytes_big_endian() -> None:
    assert t.encode_ack(0) == b"\x00\x00\x00\x00"
    assert t.encode_ack(255) == b"\x00\x00\x00\xff"


# --------------------------------------------------------------------------- round trips

_COORD = 10**7


@st.composite
def avl_records(draw: st.DrawFn, codec: int) -> t.AvlRecord:
    id_max = 0xFF if codec == t.CODEC_8 else 0xFFFF
    value: st.SearchStrategy[int | bytes] = st.integers(0, 2**64 - 1)
    if codec == t.CODEC_8E:
        value = value | st.binary(max_size=12)
    return t.AvlRecord(
        timestamp_ms=draw(st.integers(0, 2**64 - 1)),
        priority=draw(st.integers(0, 2)),
        lon=draw(st.integers(-180 * _COORD, 180 * _COORD)) / 1e7,
        lat=draw(st.integers(-90 * _COORD, 90 * _COORD)) / 1e7,
        altitude_m=draw(st.integers(-(2**15), 2**15 - 1)),
        angle_deg=draw(st.integers(0, 2**16 - 1)),
        satellites=draw(st.integers(0, 255)),
        speed_kmh=draw(st.integers(0, 2**16 - 1)),
        event_io_id=draw(st.integers(0, id_max)),
        io=draw(st.dictionaries(st.integers(0, id_max), value, max_size=8)),
        generation_type=draw(st.integers(0, 7)) if codec == t.CODEC_16 else None,
    )


@st.composite
def avl_packets(draw: st.DrawFn) -> tuple[int, list[t.AvlRecord]]:
    codec = draw(st.sampled_from([t.CODEC_8, t.CODEC_8E, t.CODEC_16]))
    return codec, draw(st.lists(avl_records(codec), max_size=4))


@hsettings(max_examples=60, deadline=None)
@given(avl_packets())
def test_encode_decode_round_trip(packet: tuple[int, list[t.AvlRecord]]) -> None:
    codec, records = packet
    frame = t.encode_avl_packet(records, codec=codec)
    decoded = t.decode_packet(frame)
    assert isinstance(decoded, t.AvlPacket)
    assert decoded == t.AvlPacket(codec=codec, records=tuple(records))
    # and the decoded records, which keep their values' widths, encode to the very same bytes
    assert t.encode_avl_packet(decoded.records, codec=codec) == frame


@hsettings(max_examples=30, deadline=None)
@given(st.text(alphabet="0123456789", min_size=15, max_size=15))
def test_imei_round_trip(imei: str) -> None:
    assert t.decode_imei(t.encode_imei(imei)) == imei
    assert t.TeltonikaStream().feed(t.encode_imei(imei)) == [t.ImeiFrame(imei)]


def test_the_encoder_refuses_what_a_codec_cannot_carry() -> None:
    record = avl(WIKI_CODEC8_1).records[0]
    with pytest.raises(ValueError, match="variable-length"):
        t.encode_avl_packet([dataclasses.replace(record, io={1: b"\x01"})], codec=t.CODEC_8)
    with pytest.raises(ValueError, match="generation_type"):
        t.encode_avl_packet([record], codec=t.CODEC_16)
    with pytest.raises(ValueError, match="does not fit"):
        t.encode_avl_packet([dataclasses.replace(record, io={300: 1})], codec=t.CODEC_8)
    with pytest.raises(ValueError, match="does not fit"):  # wider than the width it was read with
        t.encode_avl_packet([dataclasses.replace(record, io={1: 256})], codec=t.CODEC_8)
    with pytest.raises(ValueError, match="does not fit"):
        t.encode_avl_packet([dataclasses.replace(record, io={1000: 2**64})], codec=t.CODEC_8E)
    with pytest.raises(ValueError, match="carries no AVL"):
        t.encode_avl_packet([record], codec=t.CODEC_12)


# --------------------------------------------------------------------------- the TCP stream

Item = t.Frame | tuple[str, str]


def normal(items: list[t.Frame | TeltonikaFrameError]) -> list[Item]:
    """Errors compare by their reason (exceptions have no value equality)."""
    return [("error", i.reason) if isinstance(i, TeltonikaFrameError) else i for i in items]


def bad_crc(frame: bytes) -> bytes:
    return frame[:-1] + bytes([frame[-1] ^ 0x01])


def conversation() -> tuple[bytes, list[Item]]:
    """What a device sends on one connection, and what the server must read from it."""
    frames = [raw(h) for h in WIKI_AVL] + [raw(WIKI_CODEC12_RESPONSE)]
    stream = raw(WIKI_IMEI) + b"".join(frames[:3]) + bad_crc(frames[3]) + b"".join(frames[3:])
    expected: list[Item] = [t.ImeiFrame("356307042441013")]
    expected += [t.decode_packet(f) for f in frames[:3]]
    expected.append(("error", "bad_crc"))
    expected += [t.decode_packet(f) for f in frames[3:]]
    return stream, expected


@hsettings(max_examples=60, deadline=None)
@given(cuts=st.lists(st.integers(min_value=0, max_value=10_000), max_size=40))
def test_any_split_of_a_stream_gives_the_same_frames(cuts: list[int]) -> None:
    stream, expected = conversation()
    points = sorted({c % (len(stream) + 1) for c in cuts} | {0, len(stream)})
    reader = t.TeltonikaStream()
    items: list[t.Frame | TeltonikaFrameError] = []
    for a, b in itertools.pairwise(points):
        items += reader.feed(stream[a:b])
    assert normal(items) == expected
    assert reader.buffered == 0
    assert reader.close() is None


def test_a_byte_at_a_time() -> None:
    stream, expected = conversation()
    reader = t.TeltonikaStream()
    items = [item for i in range(len(stream)) for item in reader.feed(stream[i : i + 1])]
    assert normal(items) == expected


@hsettings(max_examples=40, deadline=None)
@given(
    packets=st.lists(avl_packets(), min_size=1, max_size=5),
    cuts=st.lists(st.integers(min_value=0, max_value=10_000), max_size=20),
)
def test_any_split_of_encoded_packets(packets: list[tuple[int, list[t.AvlRecord]]], cuts: list[int]) -> None:
    frames = [t.encode_avl_packet(records, codec=codec) for codec, records in packets]
    stream = t.encode_imei("490154203237518") + b"".join(frames)
    points = sorted({c % (len(stream) + 1) for c in cuts} | {0, len(stream)})
    reader = t.TeltonikaStream(check_luhn=True)
    items: list[t.Frame | TeltonikaFrameError] = []
    for a, b in itertools.pairwise(points):
        items += reader.feed(stream[a:b])
    assert items[0] == t.ImeiFrame("490154203237518")
    assert items[1:] == [t.AvlPacket(codec=codec, records=tuple(records)) for codec, records in packets]


# --------------------------------------------------------------------------- malformed input


def test_a_frame_cut_short() -> None:
    frame = raw(WIKI_CODEC8_1)
    assert reason_of(lambda: t.decode_packet(frame[:-1])) == "truncated"
    assert reason_of(lambda: t.decode_packet(frame[:5])) == "truncated"
    reader = t.TeltonikaStream(imei="356307042441013")
    assert reader.feed(frame[:-1]) == []
    assert reader.buffered == len(frame) - 1
    error = reader.close()
    assert error is not None
    assert (error.reason, error.fatal) == ("truncated", True)


def test_wrong_lengths() -> None:
    data = raw(WIKI_CODEC8_1)[8:-4]
    assert reason_of(lambda: t.decode_packet(raw(WIKI_CODEC8_1) + b"\x00")) == "bad_length"
    # a byte between the records and the second count, CRC correct
    assert reason_of(lambda: t.decode_packet(t.encode_frame(data[:-1] + b"\x00" + data[-1:]))) == "bad_length"
    # two records announced, one there
    assert (
        reason_of(lambda: t.decode_packet(t.encode_frame(b"\x08\x02" + data[2:-1] + b"\x02"))) == "bad_length"
    )
    assert reason_of(lambda: t.decode_packet(t.encode_frame(b"\x08\x00"))) == "bad_length"
    # an NX value longer than the data field
    # event 1, total 0, N1 N2 N4 N8 none, NX one: id 7 of 9 bytes, of which one is there
    nx = b"\x00\x01\x00\x00" + bytes(8) + b"\x00\x01\x00\x07\x00\x09\xff"
    gps = bytes(24)
    assert (
        reason_of(lambda: t.decode_packet(t.encode_frame(b"\x8e\x01" + gps + nx + b"\x01"))) == "bad_length"
    )


def test_bad_crc_count_mismatch_and_unknown_codec_leave_the_stream_going() -> None:
    frame = raw(WIKI_CODEC8_1)
    data = frame[8:-4]
    mismatch = t.encode_frame(data[:-1] + b"\x02")
    unknown = t.encode_frame(b"\x0d" + data[1:])
    reader = t.TeltonikaStream(imei="356307042441013")
    items = reader.feed(bad_crc(frame) + mismatch + unknown + frame)
    assert normal(items) == [
        ("error", "bad_crc"),
        ("error", "count_mismatch"),
        ("error", "unknown_codec"),
        t.decode_packet(frame),
    ]
    assert not any(i.fatal for i in items if isinstance(i, TeltonikaFrameError))
    assert reader.error is None


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (b"\x00\x0fABCDEFGHIJKLMNO", "bad_imei"),  # garbage of the right length
        (b"\xff\xff", "bad_imei"),  # refused from its length alone, nothing more awaited
        (b"\x00\x0e35630704244101", "bad_imei"),  # 14 digits
        (raw(WIKI_CODEC8_1), "bad_imei"),  # a packet without the handshake
        (b"GET / HTTP/1.1\r\n\r\n", "bad_imei"),  # a stranger
    ],
)
def test_an_imei_of_garbage_ends_the_stream(data: bytes, reason: str) -> None:
    reader = t.TeltonikaStream()
    items = reader.feed(data)
    assert normal(items) == [("error", reason)]
    (error,) = items
    assert isinstance(error, TeltonikaFrameError)
    assert error.fatal
    assert reader.buffered == 0
    with pytest.raises(TeltonikaFrameError) as err:
        reader.feed(raw(WIKI_CODEC8_1))
    assert err.value.reason == reason


def test_luhn_is_checked_only_when_asked() -> None:
    wrong = t.encode_imei("356307042441014")
    assert t.TeltonikaStream().feed(wrong) == [t.ImeiFrame("356307042441014")]
    assert normal(t.TeltonikaStream(check_luhn=True).feed(wrong)) == [("error", "bad_imei")]
    assert t.luhn_valid("490154203237518")
    assert not t.luhn_valid("356307042441014")
    assert not t.luhn_valid("35630704244101x")


def test_a_megabyte_frame_is_refused_before_it_is_buffered() -> None:
    assert t.MAX_DATA_BYTES == 1 << 20
    header = b"\x00\x00\x00\x00" + (t.MAX_DATA_BYTES + 1).to_bytes(4, "big")
    reader = t.TeltonikaStream(imei="356307042441013")
    assert normal(reader.feed(header)) == [("error", "too_large")]
    assert reader.buffered == 0
    # exactly the limit is waited for
    small = t.TeltonikaStream(imei="356307042441013", max_data_bytes=64)
    assert small.feed(b"\x00\x00\x00\x00" + (64).to_bytes(4, "big") + bytes(10)) == []
    assert normal(small.feed(b"")) == []
    assert small.buffered == 18


def test_a_bad_preamble_ends_the_stream() -> None:
    frame = raw(WIKI_CODEC8_1)
    reader = t.TeltonikaStream(imei="356307042441013")
    items = reader.feed(frame + b"\x00\x00\x00\x01" + frame[4:])
    assert normal(items) == [t.decode_packet(frame), ("error", "bad_preamble")]
    assert reason_of(lambda: t.decode_packet(b"\x00\x00\x00\x01" + frame[4:])) == "bad_preamble"


def test_a_codec12_frame_is_a_command_not_avl_data() -> None:
    reader = t.TeltonikaStream(imei="356307042441013")
    (item,) = reader.feed(raw(WIKI_CODEC12_RESPONSE))
    assert isinstance(item, t.CommandPacket)
    assert not isinstance(item, t.AvlPacket)
    bad = t.encode_frame(bytes([t.CODEC_12, 1, t.RESPONSE]) + (5).to_bytes(4, "big") + b"abc\x01")
    assert reason_of(lambda: t.decode_packet(bad)) == "bad_length"
    mismatch = t.encode_frame(bytes([t.CODEC_12, 1, t.RESPONSE]) + (3).to_bytes(4, "big") + b"abc\x02")
    assert reason_of(lambda: t.decode_packet(mismatch)) == "count_mismatch"


@hsettings(max_examples=100, deadline=None)
@given(st.binary(max_size=600), st.booleans())
def test_garbage_is_only_ever_frames_or_reasons(data: bytes, handshake_done: bool) -> None:
    reader = t.TeltonikaStream(imei="356307042441013" if handshake_done else None, max_data_bytes=256)
    items = reader.feed(data)
    assert all(
        isinstance(i, t.ImeiFrame | t.AvlPacket | t.CommandPacket | TeltonikaFrameError) for i in items
    )
    fatal = [i for i in items if isinstance(i, TeltonikaFrameError) and i.fatal]
    assert not fatal or fatal == [items[-1]]
    assert reader.buffered <= 8 + 256 + 4
    refused: str | None = None
    try:
        t.decode_packet(data)
    except TeltonikaFrameError as exc:  # the only way garbage is refused
        refused = exc.reason
    assert refused in {
        None,
        "truncated",
        "bad_preamble",
        "bad_length",
        "bad_crc",
        "unknown_codec",
        "count_mismatch",
    }


# --------------------------------------------------------------------------- into FleetFence


A_FIX = t.AvlRecord(
    timestamp_ms=1_700_000_000_000,
    priority=0,
    lon=25.2797,
    lat=54.6872,
    altitude_m=112,
    angle_deg=180,
    satellites=11,
    speed_kmh=50,
    event_io_id=0,
    io={239: 1, 66: 12_800, 16: 123_456, 182: 9},
)


def fix_record(**changes: Any) -> t.AvlRecord:
    return dataclasses.replace(A_FIX, **changes)


def test_a_record_becomes_the_one_telemetry_record() -> None:
    got = t.to_telemetry(fix_record(), vehicle_id="truck-7", received_ms=1_700_000_001_000)
    assert got == Telemetry(
        vehicle_id="truck-7",
        seq=1_700_000_000_000,
        ts_ms=1_700_000_000_000,
        lat=54.6872,
        lon=25.2797,
        speed_kmh=50.0,
        heading_deg=180.0,
        accuracy_m=None,
        received_ms=1_700_000_001_000,
    )
    # the same record retransmitted is the same fix: same seq
    again = t.to_telemetry(fix_record(), vehicle_id="truck-7", received_ms=1_700_000_009_000)
    assert again.seq == got.seq


def test_records_the_contract_refuses() -> None:
    def reason(record: t.AvlRecord, received_ms: int = 1_700_000_001_000) -> str:
        return reason_of(lambda: t.to_telemetry(record, vehicle_id="truck-7", received_ms=received_ms))

    assert reason(avl(WIKI_CODEC8_1).records[0]) == "no_fix"  # the examples have no position
    assert reason(fix_record(), received_ms=1_600_000_000_000) == DlqReason.TS_IN_FUTURE
    assert reason(fix_record(timestamp_ms=0)) == DlqReason.BAD_TIMESTAMP
    assert reason(fix_record(timestamp_ms=2**64 - 1)) == DlqReason.BAD_TIMESTAMP
    assert reason(fix_record(angle_deg=400)) == DlqReason.OUT_OF_RANGE
    assert reason(fix_record(speed_kmh=5000)) == DlqReason.OUT_OF_RANGE
    wrong_vehicle = reason_of(lambda: t.to_telemetry(A_FIX, vehicle_id="a/b", received_ms=1_700_000_001_000))
    assert wrong_vehicle == DlqReason.BAD_VEHICLE_ID


def test_io_attributes_name_the_common_elements() -> None:
    attrs = t.io_attributes(fix_record(io={239: 1, 66: 12_800, 16: 123_456, 182: 9, 5000: b"\xab\xcd"}))
    assert attrs == {
        "priority": "0",
        "satellites": "11",
        "altitude_m": "112",
        "event_io_id": "0",
        "ignition": "1",
        "external_voltage_mv": "12800",
        "total_odometer_m": "123456",
        "hdop_x10": "9",
        "io5000": "abcd",
    }
