"""A paho-mqtt 2.2 client that reads the socket in 64 KiB chunks.

Stock paho reads every packet with three or more `recv` calls (1 byte of command, 1 byte per
length byte, then the body) and `loop_read` handles one packet per `select`. At tens of thousands
of messages per second that is most of the gateway's CPU. Overriding the two private read
methods below (paho is pinned to ==2.2.0 in pyproject.toml) serves those small reads from a
user-space buffer and drains everything already received in one `loop_read`.

Plain PUBLISH packets (QoS 0/1, no MQTT 5 properties: what Mosquitto forwards for telemetry) that
sit complete in the buffer skip paho's generic decoder, whose per-message `Properties` object and
topic matching cost more than validating and producing the message. Anything else (other
packets, properties, a packet split across reads) goes through paho unchanged, so session
handling stays paho's.

This is the gateway's one module that touches paho's private members; everything else uses the
public API plus what this module exposes: the raw topic bytes of a message (`topic_bytes`) and
batched PUBACK bytes written between paho's own packets (`BufferedClient.write_raw`).
"""

from __future__ import annotations

import enum
import logging
import select
import time
from collections.abc import Callable
from typing import Any

import paho.mqtt.client as mqtt
from paho.mqtt.enums import MQTTErrorCode

logger = logging.getLogger(__name__)

READ_CHUNK_BYTES = 65536
MAX_PACKETS_PER_READ = 2000
# A raw write that cannot finish in this long leaves a partial packet on the wire: give up the
# connection rather than let paho's next packet follow it.
RAW_WRITE_STALL_S = 5.0

# (topic bytes, payload, packet id, qos, dup) for a PUBLISH taken by the fast path.
FastPublish = Callable[[bytes, bytes, int, int, bool], None]


class RawWrite(enum.Enum):
    """What `BufferedClient.write_raw` did with the bytes it was given."""

    WRITTEN = "written"
    NO_CONNECTION = "no_connection"  # no socket: dropped, their connection is gone
    FAILED = "failed"  # the socket broke mid-write; paho notices on its next read
    CLOSED = "closed"  # stalled mid-packet: the connection was closed so nothing follows it


def topic_bytes(msg: mqtt.MQTTMessage) -> bytes:
    """The topic as received. paho's public `topic` decodes it and raises on invalid UTF-8, and
    such a message must still reach the dead-letter topic, keyed by its raw topic."""
    return bytes(msg._topic)


class BufferedClient(mqtt.Client):
    """`mqtt.Client` with buffered socket reads; use only with your own loop (no loop_start)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._rbuf = b""
        self._rpos = 0
        self._rsock: object | None = None
        self.fast_publish: FastPublish | None = None

    def _sock_recv(self, bufsize: int) -> bytes:
        if self._sock is not self._rsock:  # a new connection: bytes of the old one are void
            self._rbuf, self._rpos, self._rsock = b"", 0, self._sock
        avail = len(self._rbuf) - self._rpos
        if avail <= 0:
            data = super()._sock_recv(READ_CHUNK_BYTES)
            if not data:
                return data  # EOF: paho turns it into "connection lost"
            self._rbuf, self._rpos, avail = data, 0, len(data)
        n = bufsize if bufsize < avail else avail
        out = self._rbuf[self._rpos : self._rpos + n]
        self._rpos += n
        return out

    @property
    def buffered(self) -> bool:
        """Bytes already received but not parsed (select() cannot see them)."""
        return self._sock is not None and self._sock is self._rsock and self._rpos < len(self._rbuf)

    def loop_read(self, max_packets: int = MAX_PACKETS_PER_READ) -> MQTTErrorCode:
        if self._sock is None:
            return MQTTErrorCode.MQTT_ERR_NO_CONN
        fast = self.fast_publish
        took_fast = False
        for _ in range(max(max_packets, 1)):
            if self._sock is None:
                return MQTTErrorCode.MQTT_ERR_NO_CONN
            if fast is not None and self._in_packet["command"] == 0 and self._take_publish(fast):
                took_fast = True
                continue
            rc = self._packet_read()
            if rc > 0:
                return self._loop_rc_handle(rc)
            if rc == MQTTErrorCode.MQTT_ERR_AGAIN:
                break
        if took_fast:
            with self._msgtime_mutex:
                self._last_bytes_received = mqtt.time_func()
        return MQTTErrorCode.MQTT_ERR_SUCCESS

    def _take_publish(self, fast: FastPublish) -> bool:
        """Hand one complete, property-less QoS 0/1 PUBLISH from the buffer to `fast`."""
        if self._sock is not self._rsock:
            return False
        buf, pos = self._rbuf, self._rpos
        end = len(buf)
        if end - pos < 2:
            return False
        b0 = buf[pos]
        qos = (b0 >> 1) & 3
        if b0 & 0xF0 != 0x30 or qos == 2:
            return False
        remaining, mult, i = 0, 1, pos + 1
        while True:
            if i >= end or i - pos > 4:
                return False
            b = buf[i]
            remaining += (b & 0x7F) * mult
            mult *= 128
            i += 1
            if not b & 0x80:
                break
        body_end = i + remaining
        if body_end > end or remaining < 3:
            return False
        t0 = i + 2
        t1 = t0 + ((buf[i] << 8) | buf[i + 1])
        j = t1
        mid = 0
        if qos:
            if j + 2 > body_end:
                return False
            mid = (buf[j] << 8) | buf[j + 1]
            j += 2
        if j >= body_end or buf[j] != 0:  # properties present (e.g. a topic alias): paho's job
            return False
        self._rpos = body_end
        fast(buf[t0:t1], buf[j + 1 : body_end], mid, qos, bool(b0 & 0x08))
        return True

    def writes_pending(self) -> bool:
        """Write what paho has queued; True while some of it is still unsent.

        Raw bytes may go out only when this is False: paho writes its packets in pieces, and
        bytes of ours in between would corrupt the stream.
        """
        if self.want_write():
            self.loop_write()
        return self.want_write()

    def write_raw(self, data: bytes) -> RawWrite:
        """Send complete MQTT packets straight to the socket, in one `send` where possible.

        Call only when `writes_pending()` is False. Used for PUBACKs: paho's `ack()` queues one
        packet and makes one `send` per message, which at tens of thousands of messages per second
        costs more than the rest of the acknowledgement path.
        """
        sock = self.socket()
        if sock is None:
            return RawWrite.NO_CONNECTION
        deadline = time.monotonic() + RAW_WRITE_STALL_S
        while data:
            try:
                data = data[sock.send(data) :]
            except BlockingIOError:
                if time.monotonic() > deadline:
                    # A half-written packet must not be followed by paho's bytes: drop the
                    # connection (its unacknowledged messages are redelivered to the next one).
                    logger.warning("MQTT socket not writable for %g s: reconnecting", RAW_WRITE_STALL_S)
                    self._sock_close()
                    return RawWrite.CLOSED
                select.select([], [sock], [], 0.1)
            except OSError as exc:  # the connection broke: paho notices on its next read
                logger.warning("PUBACK write failed error=%s", exc)
                return RawWrite.FAILED
        return RawWrite.WRITTEN
