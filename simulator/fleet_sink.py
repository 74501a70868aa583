"""Publishing as a fleet does: one MQTT connection per vehicle, each logged in with the vehicle's
own credentials, so the broker checks every vehicle as it would a real tracker (its own topic only).

Thousands of connections in one process: every client's socket is watched by one selector in one
I/O thread, which does all of paho's reading and writing (`loop_read`, `loop_write`, `loop_misc`);
the simulator's thread only queues messages (`publish`) and wakes it. No thread per vehicle, and
never two threads writing one socket.

`PubackClock` is the PUBACK latency measurement both MQTT sinks share (a load test drains it).
"""

from __future__ import annotations

import contextlib
import logging
import resource
import selectors
import socket
import ssl
import threading
import time
from collections.abc import Hashable, Mapping, Sequence
from pathlib import Path
from typing import Any

import orjson
import paho.mqtt.client as mqtt
from paho.mqtt.enums import CallbackAPIVersion
from paho.mqtt.reasoncodes import ReasonCode

from fleetfence.contracts import telemetry_topic
from fleetfence.errors import InfraError
from simulator.scenario import TickBatch

logger = logging.getLogger(__name__)

MISC_EVERY_S = 1.0  # keep-alive pings, reconnects
RECONNECT_EVERY_S = 2.0


class PubackClock:
    """PUBACK latency: publish time by message key, and the latencies since the last `take`.

    Off unless a reader asked (`track`): nothing else drains it. A PUBACK may arrive before the
    publishing call has returned (the I/O thread is faster): it is then kept until the publish
    time is known. Its own lock, never held while calling paho."""

    def __init__(self) -> None:
        self.tracking = False
        self._lock = threading.Lock()
        self._published_at: dict[Hashable, float] = {}
        self._early_ack: dict[Hashable, float] = {}
        self._ms: list[float] = []

    def published(self, key: Hashable, t: float) -> None:
        with self._lock:
            acked_at = self._early_ack.pop(key, None)
            if acked_at is None:
                self._published_at[key] = t
            elif acked_at >= t:
                self._ms.append((acked_at - t) * 1000.0)

    def acked(self, key: Hashable) -> None:
        now = time.monotonic()
        with self._lock:
            t = self._published_at.pop(key, None)
            if t is None:
                self._early_ack[key] = now
            elif now >= t:
                self._ms.append((now - t) * 1000.0)

    def take(self) -> list[float]:
        with self._lock:
            out, self._ms = self._ms, []
        return out


class PubackCounter:
    """What both MQTT sinks count: messages sent, PUBACKs received (the condition a publisher waits
    on to bound what is unacknowledged: paho scans its whole queue on every PUBACK, so never queue
    much beyond the in-flight window), and PUBACK latency (`clock`, drained by a load test)."""

    def __init__(self, max_pending: int) -> None:
        self.max_pending = max_pending
        self.sent = 0
        self.errors = 0
        self._acked = 0
        self._cond = threading.Condition()
        self.clock = PubackClock()

    @property
    def acked(self) -> int:
        """PUBACKs received (refused publishes included: the broker answered)."""
        return self._acked

    def _count_ack(self) -> None:
        with self._cond:
            self._acked += 1
            self._cond.notify_all()

    def _too_many_pending(self) -> bool:
        return self.sent - self._acked > self.max_pending

    def _wait_for_room(self) -> None:
        with self._cond:
            self._cond.wait_for(lambda: self.sent - self._acked <= self.max_pending // 2, timeout=30)

    def track_puback(self) -> None:
        """Measure PUBACK latency from now on; the caller drains it with `take_puback_ms`."""
        self.clock.tracking = True

    def take_puback_ms(self) -> list[float]:
        """The PUBACK latencies (ms) measured since the last call (a load test samples them)."""
        return self.clock.take()

    def flush(self, timeout_s: float) -> int:
        """Wait until every message sent is acknowledged; how many are not (at the deadline)."""
        with self._cond:
            self._cond.wait_for(lambda: self._acked >= self.sent, timeout=timeout_s)
        return max(self.sent - self._acked, 0)


def tick_rows(batch: TickBatch, vids: list[str]) -> list[tuple[str, int, int, float, float, float, float]]:
    """One tick's fixes as (vehicle id, seq, ts, lat, lon, speed, heading), rounded as published."""
    return [
        (vids[v], s, t, round(la, 7), round(lo, 7), sp, round(hd, 1))
        for v, s, t, la, lo, sp, hd in zip(
            batch.vehicle.tolist(),
            batch.seq.tolist(),
            batch.ts.tolist(),
            batch.lat.tolist(),
            batch.lon.tolist(),
            batch.speed_kmh.tolist(),
            batch.heading_deg.tolist(),
            strict=True,
        )
    ]


def telemetry_payload(
    vid: str, seq: int, ts: int, lat: float, lon: float, sp: float, hd: float, accuracy_m: float
) -> bytes:
    return orjson.dumps(
        {
            "vehicle_id": vid,
            "seq": seq,
            "ts": ts,
            "lat": lat,
            "lon": lon,
            "speed_kmh": sp,
            "heading_deg": hd,
            "accuracy_m": accuracy_m,
        }
    )


def _raise_fd_limit(needed: int) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft >= needed:
        return
    target = needed if hard == resource.RLIM_INFINITY else min(needed, hard)
    resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    if target < needed:
        raise InfraError(
            f"{needed} vehicle connections need {needed} file descriptors; the hard limit is {hard}"
        )


class FleetMqttSink(PubackCounter):
    """QoS 1 telemetry, each vehicle on its own connection with its own credentials; counts PUBACKs
    (a publish the broker refuses, e.g. outside the vehicle's rights, counts in `refused`)."""

    def __init__(
        self,
        endpoints: Sequence[tuple[str, int]],
        credentials: Mapping[str, str],
        *,
        inflight: int,
        accuracy_m: float,
        connect_timeout_s: float = 60.0,
        tls_ca: Path | None = None,
    ) -> None:
        _raise_fd_limit(len(credentials) + 256)
        super().__init__(inflight)
        # Vehicle i starts on endpoint i modulo their number and moves to the next one when it cannot
        # connect, as a tracker with a primary and a backup server does (the device edge's replicas).
        if not endpoints:
            raise InfraError("no MQTT endpoint for the vehicles")
        self.endpoints = list(endpoints)
        self._at: dict[mqtt.Client, int] = {}
        self.tls_ca = tls_ca  # TLS (the broker's vehicles' listener), verified with this CA
        self.accuracy_m = accuracy_m
        self.refused = 0
        self._sel = selectors.DefaultSelector()
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self._sel.register(self._wake_r, selectors.EVENT_READ, None)
        self._dirty: set[mqtt.Client] = set()
        self._dirty_lock = threading.Lock()
        self._down: dict[mqtt.Client, float] = {}  # lost connections, by when to retry
        self._socks: dict[mqtt.Client, socket.socket] = {}  # as registered (paho drops a lost one)
        self._connected: set[str] = set()
        self._refused_login: dict[str, str] = {}
        self._stop = threading.Event()
        self.clients: dict[str, mqtt.Client] = {}
        for i, (vid, secret) in enumerate(credentials.items()):
            self.clients[vid] = self._connect(vid, secret, i % len(self.endpoints))
        self._thread = threading.Thread(target=self._run, name="fleet-mqtt-io", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + connect_timeout_s
        with self._cond:
            self._cond.wait_for(
                lambda: len(self._connected) + len(self._refused_login) >= len(self.clients),
                max(deadline - time.monotonic(), 0.0),
            )
        if self._refused_login or len(self._connected) < len(self.clients):
            refused = dict(self._refused_login)
            self.close()
            first = next(iter(refused.items()), None)
            detail = f"; {len(refused)} refused, e.g. {first[0]}: {first[1]}" if first else ""
            where = ", ".join(f"{h}:{p}" for h, p in self.endpoints)
            raise InfraError(
                f"MQTT {where}: {len(self._connected)} of {len(credentials)} vehicles "
                f"logged in within {connect_timeout_s}s{detail}"
            )

    # ------------------------------------------------------------------ connections

    def _connect(self, vid: str, secret: str, at: int) -> mqtt.Client:
        c = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=vid, protocol=mqtt.MQTTv5, userdata=vid)
        c.username_pw_set(vid, secret)
        if self.tls_ca is not None:
            c.tls_set(ca_certs=str(self.tls_ca))
        c.max_queued_messages_set(0)
        c.on_connect = self._on_connect
        c.on_disconnect = self._on_disconnect
        c.on_publish = self._on_publish
        # Every write happens on the I/O thread: publish() only queues (paho writes at once
        # from the calling thread unless an external loop registers for writes).
        c.on_socket_register_write = _nothing
        self._at[c] = at
        host, port = self.endpoints[at]
        try:
            c.connect(host, port, keepalive=60)
        except OSError as exc:
            raise InfraError(f"MQTT {host}:{port} unreachable: {exc}") from exc
        c.loop_write()
        self._watch(c)
        return c

    def _watch(self, c: mqtt.Client) -> None:
        sock = c.socket()
        if isinstance(sock, socket.socket):
            try:
                stale = self._sel.get_key(sock)
            except KeyError:
                stale = None
            if stale is not None:
                # Another vehicle's socket that paho closed on its own (a keep-alive expired in
                # loop_misc) is still registered under the number the new one got: a deployment
                # run's fleet thread died of this KeyError. Forget it; that vehicle reconnects.
                self._sel.unregister(sock)
                other = stale.data
                if isinstance(other, mqtt.Client) and other is not c:
                    self._socks.pop(other, None)
                    if other.socket() is None:
                        self._down.setdefault(other, time.monotonic() + RECONNECT_EVERY_S)
            self._sel.register(sock, selectors.EVENT_READ, c)
            self._socks[c] = sock

    def _on_connect(self, _c: mqtt.Client, vid: str, _f: Any, rc: ReasonCode, _p: Any) -> None:
        with self._cond:
            if rc.is_failure:
                self._refused_login[vid] = str(rc)
            else:
                self._connected.add(vid)
            self._cond.notify_all()

    def _on_disconnect(self, c: mqtt.Client, vid: str, _f: Any, rc: ReasonCode, _p: Any) -> None:
        with self._cond:
            self._connected.discard(vid)
        if not self._stop.is_set():
            logger.warning("vehicle disconnected vehicle_id=%s reason=%s", vid, rc)

    def _on_publish(self, _c: mqtt.Client, vid: str, mid: int, rc: ReasonCode, _p: Any) -> None:
        if self.clock.tracking:
            self.clock.acked((vid, mid))
        if rc.is_failure:
            self.refused += 1
        self._count_ack()

    def _lost(self, c: mqtt.Client) -> None:
        sock = self._socks.pop(c, None)
        if sock is not None:
            with contextlib.suppress(KeyError, ValueError):
                self._sel.unregister(sock)
        self._down[c] = time.monotonic() + RECONNECT_EVERY_S

    def _reconnect(self, c: mqtt.Client) -> None:
        try:
            c.connect(*self.endpoints[self._at[c]], keepalive=60)  # keeps what is unacknowledged
        except OSError:
            self._at[c] = (self._at[c] + 1) % len(self.endpoints)  # the next endpoint, next time
            self._down[c] = time.monotonic() + RECONNECT_EVERY_S
            return
        c.loop_write()
        self._watch(c)

    # ------------------------------------------------------------------ the I/O thread

    def _run(self) -> None:
        next_misc = time.monotonic() + MISC_EVERY_S
        while not self._stop.is_set():
            for key, _ev in self._sel.select(timeout=0.2):
                c = key.data
                if c is None:
                    try:
                        while self._wake_r.recv(4096):
                            pass
                    except BlockingIOError:
                        pass
                    continue
                if c.loop_read() != mqtt.MQTT_ERR_SUCCESS:
                    self._lost(c)
                    continue
                if not self._drain_tls(c):
                    continue
                if c.want_write():  # PUBACKs freed in-flight room: queued messages go out
                    c.loop_write()
            with self._dirty_lock:
                dirty, self._dirty = self._dirty, set()
            for c in dirty:
                if c not in self._down and c.loop_write() not in (mqtt.MQTT_ERR_SUCCESS, mqtt.MQTT_ERR_AGAIN):
                    self._lost(c)
            now = time.monotonic()
            if now >= next_misc:
                next_misc = now + MISC_EVERY_S
                for c in self.clients.values():
                    if c in self._down:
                        continue
                    c.loop_misc()
                    if c.want_write():
                        c.loop_write()
                for c, when in list(self._down.items()):
                    if now >= when:
                        del self._down[c]
                        self._reconnect(c)

    def _drain_tls(self, c: mqtt.Client) -> bool:
        """TLS: what is already decrypted in the socket's buffer never wakes select(); read it.
        False when the connection was lost meanwhile."""
        sock = self._socks.get(c)
        while isinstance(sock, ssl.SSLSocket) and sock.pending():
            if c.loop_read() != mqtt.MQTT_ERR_SUCCESS:
                self._lost(c)
                return False
        return True

    def _wake(self) -> None:
        with contextlib.suppress(BlockingIOError):  # a wake-up is pending already
            self._wake_w.send(b"\0")

    # ------------------------------------------------------------------ Sink

    def send(self, batch: TickBatch, vids: list[str]) -> None:
        touched: set[mqtt.Client] = set()
        for vid, seq, ts, lat, lon, sp, hd in tick_rows(batch, vids):
            c = self.clients[vid]
            t = time.monotonic()
            payload = telemetry_payload(vid, seq, ts, lat, lon, sp, hd, self.accuracy_m)
            info = c.publish(telemetry_topic(vid), payload, qos=1)
            if info.rc not in (mqtt.MQTT_ERR_SUCCESS, mqtt.MQTT_ERR_NO_CONN):
                self.errors += 1
                continue
            if self.clock.tracking:
                self.clock.published((vid, info.mid), t)
            self.sent += 1
            touched.add(c)
            if self._too_many_pending():
                self._hand_over(touched)
                touched = set()
                self._wait_for_room()
        self._hand_over(touched)

    def _hand_over(self, touched: set[mqtt.Client]) -> None:
        if touched:
            with self._dirty_lock:
                self._dirty |= touched
            self._wake()

    def close(self) -> None:
        self._stop.set()
        self._wake()
        if self._thread.is_alive():
            self._thread.join(5)
        for c in self.clients.values():
            c.disconnect()
            c.loop_write()
            sock = c.socket()
            if sock is not None:
                sock.close()
        self._sel.close()
        self._wake_r.close()
        self._wake_w.close()


def _nothing(*_a: Any) -> None:
    return None
