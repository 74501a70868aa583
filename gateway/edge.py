"""The device edge: vehicles connect here over MQTT, and a PUBACK means Kafka has the fix.

Why FleetFence owns this listener instead of sitting behind Mosquitto: a broker acknowledges a
vehicle's QoS 1 PUBLISH as soon as it has the message in memory, whatever happens to it next, so
a broker killed while Kafka was unreachable lost every fix it had acknowledged and queued for the
gateways since its last snapshot (issue #58: 11% on the embedded stack, half on the deployment).
Here the acknowledgement is the gateway's own and is sent only when Kafka has confirmed the record
(acks=all): whatever dies before that (this process, the machine, Kafka), the vehicle still holds
the fix and sends it again on its next connection, so an acknowledged fix is never lost and an
unacknowledged one is the device's to resend (docs/contracts.md, "What a PUBACK means").

The edge needs no session state of its own for that: a device's unacknowledged QoS 1 and 2
messages are held by the device, and a copy that reaches Kafka twice (sent, stored, connection lost
before the PUBACK) is dropped downstream by the fix's `seq`. So a replica may die at any moment and
any replica may take any device's next connection.

Who may send: every device logs in with its vehicle id and secret, checked against the credential
record in the vehicle master (`fleetfence.devices`), read again every `gateway_edge_recheck_s` so a
disabled, revoked or rotated device is disconnected; a device publishes only its own
`fleet/<vehicle>/telemetry` (anything else is dead-lettered as `forbidden_topic`, and an MQTT 5
device is told "not authorized" in its PUBACK). Subscriptions are refused: vehicles read their
alerts from the alert broker, not from the edge.

Threads: one asyncio loop in a thread of its own owns every connection and the Kafka producer, as
the broker-side gateway's I/O thread does (`gateway.service`): PUBLISHes are routed and produced as
they are read, and a pump task polls the producer, whose delivery callbacks release the PUBACKs in
each connection's receive order. Only the Redis reads of a login run in worker threads.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import ssl
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any, cast

import redis

from fleetfence import heard
from fleetfence.contracts import VEHICLE_ID_RE, DlqReason
from fleetfence.devices import (
    SECRET_HASH_FIELD,
    STATUS_FIELD,
    LoginVerdict,
    TrackerProtocol,
    check_login,
    credentials_key,
    tracker_key,
    tracker_verdict,
)
from fleetfence.errors import ConfigError, ContractError, ServiceUnavailableError
from fleetfence.readmodels import ReadKeys
from fleetfence.settings import TopicNames
from gateway import mqtt_wire as w
from gateway.core import Record, dead_letter, route
from gateway.errors import MqttProtocolError
from gateway.held import HeldConnection
from gateway.http_edge import Identity, PhoneConnection, PhoneProtocol
from gateway.inflight import Pending
from gateway.metrics import GatewayCollector, GatewayStats, log_stats, log_stopped
from gateway.producer import Forwarder
from gateway.protocols import owntracks
from gateway.replica import Replica
from gateway.settings import GatewaySettings
from gateway.teltonika_edge import TeltonikaConnection

logger = logging.getLogger(__name__)

PUMP_BUSY_S = 0.001  # how often the producer is polled while something waits for Kafka
PUMP_IDLE_S = 0.02
SWEEP_S = 0.5  # keep-alive, CONNECT deadline and credential re-check
STATS_LOG_INTERVAL_S = 10.0
TLS_FILES = ("server.crt", "server.key")


def _telemetry_topic_bytes(vehicle_id: str) -> bytes:
    return f"fleet/{vehicle_id}/telemetry".encode()


OWNTRACKS_TOPIC_HEAD = owntracks.TOPIC_PREFIX.encode() + b"/"


def owntracks_route(
    topics: TopicNames, mqtt_topic: bytes, payload: bytes, login: str | None, now_ms: int
) -> tuple[Record | None, int]:
    """An OwnTracks app's message on the MQTT edge (`owntracks/<user>/<device>[/...]`): the Kafka
    record it becomes and the reason code of its acknowledgement. The app's MQTT username is the
    vehicle id it logged in with, so `<user>` must be that login (a device publishes only under its
    own topic, as the broker's ACL had it); without logins, `<user>` names the vehicle. A location
    becomes the vehicle's telemetry, a malformed one a dead letter with its reason; any other
    message (`_type` transition, lwt, card..., or a sub-topic) carries no fix: None, counted as
    ignored and acknowledged."""
    try:
        topic = mqtt_topic.decode()
        parsed = owntracks.parse_topic(topic)
        if login is not None and parsed.user != login:
            detail = f"device {login!r} may publish only owntracks/{login}/<device>"
            record = dead_letter(
                topics, mqtt_topic, payload, reason=DlqReason.FORBIDDEN_TOPIC, detail=detail, now_ms=now_ms
            )
            return record, w.RC_NOT_AUTHORIZED
        vehicle_id = parsed.user if login is None else login
        if not VEHICLE_ID_RE.match(vehicle_id):
            raise ContractError(DlqReason.BAD_VEHICLE_ID, f"vehicle id {vehicle_id[:80]!r} is not allowed")
        message = owntracks.decode_mqtt(topic, payload)
        if not isinstance(message, owntracks.OwnTracksFix):
            return None, w.RC_SUCCESS
        fix = owntracks.to_telemetry(message, vehicle_id=vehicle_id, received_ms=now_ms)
        return Record(topics.telemetry, vehicle_id.encode(), fix.to_json(), None, None), w.RC_SUCCESS
    except UnicodeDecodeError:
        reason, detail = str(DlqReason.BAD_TOPIC), "topic is not valid UTF-8"
    except ContractError as exc:
        reason, detail = str(exc.reason), str(getattr(exc, "detail", exc))
    except Exception as exc:  # a bug costs one dead letter, as in `gateway.core.route`, not the edge
        logger.exception("OwnTracks decoder failed unexpectedly topic=%r size=%s", mqtt_topic, len(payload))
        reason, detail = str(DlqReason.INTERNAL_ERROR), f"{type(exc).__name__}: {exc}"
    return dead_letter(topics, mqtt_topic, payload, reason=reason, detail=detail, now_ms=now_ms), w.RC_SUCCESS


class DeviceConnection(HeldConnection):
    """One device's MQTT connection: its protocol state, its messages held for Kafka, its PUBACKs."""

    def __init__(self, edge: EdgeGateway) -> None:
        super().__init__(edge)
        self.edge = edge
        self.reader = w.FrameReader(edge.settings.gateway_edge_max_packet_bytes)
        self.connect: w.Connect | None = None
        self.version = w.MQTT_311
        self.identity = ""  # the vehicle id when logged in (or the client id without auth)
        self.allowed_topic: bytes | None = None  # None: any telemetry topic (no auth)
        self.login_hash: tuple[str, str] | None = None  # (status, secret hash) seen at login
        self.logged_in = False
        self._waiting: list[tuple[int, bytes]] = []  # frames that arrived while the login is checked
        self._checking = False

    # ------------------------------------------------------------------ asyncio callbacks

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)
        self.edge.opened(self)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.edge.lost(self)

    def data_received(self, data: bytes) -> None:
        self.last_rx_mono_s = time.monotonic()
        try:
            frames = self.reader.feed(data)
        except MqttProtocolError as exc:
            self.refuse(exc)
            return
        if self._checking:
            self._waiting.extend(frames)
            return
        if not frames and self.connect is None and self.reader.first_byte not in (None, w.CONNECT << 4):
            # Not MQTT at all (a port scan, an HTTP request): refused now, not after the CONNECT
            # deadline, however long the frame the first byte seems to announce.
            self.refuse(MqttProtocolError("the first packet is not CONNECT", w.RC_PROTOCOL_ERROR))
            return
        self._handle(frames)

    # ------------------------------------------------------------------ packets

    def _handle(self, frames: list[tuple[int, bytes]]) -> None:
        for i, (first, body) in enumerate(frames):
            if self.closed:
                return
            try:
                if self.connect is None:
                    self._on_connect(first, body)
                    if self._checking:  # the rest waits for the login's verdict
                        self._waiting.extend(frames[i + 1 :])
                        return
                    continue
                self._on_packet(w.decode(first, body, self.version))
            except MqttProtocolError as exc:
                self.refuse(exc)
                return

    def _on_connect(self, first: int, body: bytes) -> None:
        if first >> 4 != w.CONNECT:
            raise MqttProtocolError("the first packet is not CONNECT", w.RC_PROTOCOL_ERROR)
        try:
            c = w.decode_connect(body)
        except MqttProtocolError as exc:
            if exc.code == w.RC_UNSUPPORTED_VERSION:  # answered before the close (3.1.1 section 3.1.2.2)
                self.write(w.connack(w.MQTT_311, w.RC_UNSUPPORTED_VERSION))
            raise
        self.connect, self.version = c, c.version
        if c.auth_method is not None:
            self.deny(w.RC_BAD_AUTH_METHOD, LoginVerdict.NO_CREDENTIALS_GIVEN, "enhanced authentication")
            return
        if not self.edge.settings.mqtt_auth:
            self.identity = c.client_id or f"anonymous-{uuid.uuid4().hex[:12]}"
            self.accept()
            return
        if not c.username:
            self.deny(w.RC_BAD_LOGIN, LoginVerdict.NO_CREDENTIALS_GIVEN, "no user name")
            return
        self._checking = True
        self.edge.check_login(self, c.username, c.password)

    def login_checked(self, verdict: LoginVerdict, seen: tuple[str, str] | None) -> None:
        """The login's verdict (on the loop thread), then whatever the device sent meanwhile."""
        self._checking = False
        if self.closed:
            return
        assert self.connect is not None
        assert self.connect.username is not None
        if verdict is not LoginVerdict.ACCEPTED:
            code = w.RC_NOT_AUTHORIZED if verdict is LoginVerdict.NOT_ACTIVE else w.RC_BAD_LOGIN
            self.deny(code, verdict, "")
            return
        self.identity = self.connect.username
        self.allowed_topic = _telemetry_topic_bytes(self.identity)
        self.login_hash = seen
        self.accept()
        waiting, self._waiting = self._waiting, []
        self._handle(waiting)

    def login_unavailable(self) -> None:
        """The credential store did not answer: "server unavailable", the device tries again."""
        self._checking = False
        self.edge.stats.logins_refused["credential_store_unavailable"] += 1
        self.write(w.connack(self.version, w.RC_SERVER_UNAVAILABLE))
        self.close()

    def accept(self) -> None:
        c = self.connect
        assert c is not None
        s = self.edge.settings
        self.edge.logged_in(self)
        self.logged_in = True
        self.write(
            w.connack(
                self.version,
                w.RC_SUCCESS,
                # The edge keeps no state a device's session needs (its unacknowledged messages
                # are the device's), so a session the device asks to keep always exists here:
                # answering "none" would tell an MQTT 5 device to discard unacknowledged fixes.
                session_present=not c.clean_start,
                receive_maximum=s.gateway_edge_receive_maximum,
                max_packet_bytes=s.gateway_edge_max_packet_bytes,
                assigned_client_id=self.identity if not c.client_id else None,
            )
        )

    def deny(self, code: int, verdict: LoginVerdict, detail: str) -> None:
        self.edge.stats.logins_refused[verdict.value] += 1
        logger.warning(
            "device login refused user=%r client_id=%r reason=%s%s",
            self.connect.username if self.connect else None,
            self.connect.client_id if self.connect else None,
            verdict.value,
            f" detail={detail}" if detail else "",
        )
        self.write(w.connack(self.version, code))
        self.close()

    def _on_packet(self, p: w.Packet) -> None:
        if isinstance(p, w.Publish):
            self._on_publish(p)
        elif isinstance(p, w.PingReq):
            self.write(w.PINGRESP_BYTES)
        elif isinstance(p, w.PubRel):
            self.write(w.pubcomp(p.packet_id))
        elif isinstance(p, w.Subscribe):
            self.write(w.suback(p.packet_id, self.version, len(p.filters)))
        elif isinstance(p, w.Unsubscribe):
            self.write(w.unsuback(p.packet_id, self.version, len(p.filters)))
        elif isinstance(p, w.Disconnect):
            self.close()

    def _on_publish(self, p: w.Publish) -> None:
        if p.topic_alias is not None:  # the CONNACK allowed none (Topic Alias Maximum absent = 0)
            raise MqttProtocolError("topic alias used, none was allowed", w.RC_PROTOCOL_ERROR)
        edge = self.edge
        stats = edge.stats
        if edge.draining:
            stats.deferred += 1  # not taken: unacknowledged, the device sends it again
            return
        now_ms = time.time_ns() // 1_000_000
        allowed = self.allowed_topic
        reason = w.RC_SUCCESS
        record: Record | None
        protocol = None
        if p.topic.startswith(OWNTRACKS_TOPIC_HEAD):
            protocol = PhoneProtocol.OWNTRACKS.value
            login = None if allowed is None else self.identity
            record, reason = owntracks_route(edge.topics, p.topic, p.payload, login, now_ms)
        elif allowed is not None and p.topic != allowed:
            reason = w.RC_NOT_AUTHORIZED
            record = dead_letter(
                edge.topics,
                p.topic,
                p.payload,
                reason=DlqReason.FORBIDDEN_TOPIC,
                detail=f"device {self.identity!r} may publish only {allowed.decode()}",
                now_ms=now_ms,
            )
        else:
            try:
                topic: str | bytes = p.topic.decode()
            except UnicodeDecodeError:
                topic = p.topic
            record = route(edge.topics, topic, p.payload, now_ms)
        if record is not None:  # a message that carries no fix is counted as ignored (`counted`)
            stats.received += 1
            if p.dup:
                stats.redelivered += 1
            if protocol is not None:
                stats.tracker_records[(protocol, "received")] += 1
        e = self.inflight.add(p.packet_id, 0, record, time.monotonic())
        e.owner = self
        e.protocol = protocol
        if p.qos == 1:
            e.reply = w.puback(p.packet_id, self.version, reason)
        elif p.qos == 2:
            e.reply = w.pubrec(p.packet_id, self.version, reason)
        if record is None:
            # Nothing for Kafka: settled now, acknowledged in its turn after what came before it.
            self.stored(e)
            self.flush()
        else:
            edge.produce(e)
        self.hold_back()

    # ------------------------------------------------------------------ plumbing

    def refuse(self, exc: MqttProtocolError) -> None:
        self.edge.stats.protocol_errors[f"0x{exc.code:02x}"] += 1
        logger.warning(
            "device connection closed for a protocol breach identity=%r peer=%s code=0x%02x detail=%s",
            self.identity or None,
            self.peer,
            exc.code,
            exc,
        )
        self.close(exc.code)

    def close(self, reason: int | None = None) -> None:
        """Close (with an MQTT 5 DISCONNECT carrying `reason` once the device is connected)."""
        if self.closed or self.transport is None:
            return
        self.flush()
        if reason is not None and self.logged_in:
            self.write(w.disconnect(self.version, reason))
        self.transport.close()
        self.closed = True


class EdgeGateway(Replica):
    """One device-edge replica; `start()`/`stop()` in-process, or `python -m gateway` with
    FLEETFENCE_GATEWAY_EDGE_PORT set."""

    def __init__(self, settings: GatewaySettings) -> None:
        if not settings.gateway_edge_listens:
            raise ConfigError(
                "the device edge needs one of FLEETFENCE_GATEWAY_EDGE_PORT, _EDGE_TLS_PORT, "
                "_TELTONIKA_PORT, _HTTP_PORT, _HTTPS_PORT"
            )
        super().__init__(settings)
        self.topics = settings.topics
        self.stats = GatewayStats()
        self.draining = False
        self.all_paused = False
        self.port: int | None = None
        self.tls_port: int | None = None
        self._unconfirmed: dict[int, Pending] = {}
        self._connections: set[DeviceConnection] = set()
        self._trackers: set[TeltonikaConnection] = set()  # gateway.teltonika_edge
        self.teltonika_port: int | None = None
        self._phones: set[PhoneConnection] = set()  # gateway.http_edge
        self._rechecking: asyncio.Future[None] | None = None
        self._resumed_mono_s = 0.0  # when the edge last read again after pausing every connection
        self.http_port: int | None = None
        self.https_port: int | None = None
        self._by_identity: dict[str, DeviceConnection] = {}
        self._dirty: set[DeviceConnection | TeltonikaConnection | PhoneConnection] = set()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._ready = threading.Event()
        self._start_error: BaseException | None = None
        self._stop_requested: asyncio.Event | None = None
        # A bounded wait: a Redis that stops answering without refusing must not hold a login.
        timeout_s = settings.gateway_edge_connect_timeout_s
        self._redis = (
            redis.Redis.from_url(
                settings.redis_dsn, socket_timeout=timeout_s, socket_connect_timeout=timeout_s
            )
            if settings.mqtt_auth
            else None
        )
        self._out = Forwarder(settings, self.client_id, self.stats, self._stored, self._pending)
        # Which protocol each vehicle last spoke (fleetfence.heard), kept where the logins are read.
        self._heard = heard.HeardLog(self.client_id) if self._redis is not None else None
        self._writing_heard: asyncio.Future[None] | None = None

    # ------------------------------------------------------------------ public API

    @property
    def in_flight(self) -> int:
        return len(self._unconfirmed)

    @property
    def devices_connected(self) -> int:
        return len(self._by_identity)

    @property
    def device_url(self) -> str | None:
        """Where vehicles reach this replica (plain MQTT first), as the service registry says it:
        a load test attached to the installation sends its vehicles there. A replica bound to
        every address announces its host name."""
        s = self.settings
        host = s.gateway_edge_host or s.host
        if host in ("0.0.0.0", "::", ""):
            host = socket.gethostname()
        if self.port is not None:
            return f"mqtt://{host}:{self.port}"
        return f"mqtts://{host}:{self.tls_port}" if self.tls_port is not None else None

    def start(self, timeout_s: float | None = None) -> None:
        """Bind the listeners and start the loop; return once devices can connect."""
        timeout_s = timeout_s if timeout_s is not None else self.settings.startup_timeout_s
        self._thread = threading.Thread(target=self._run, name=f"edge-{self.client_id}", daemon=True)
        self._thread.start()
        if not self._ready.wait(timeout_s):
            self.request_stop()
            raise ServiceUnavailableError(f"device edge did not start listening within {timeout_s} s")
        if self._start_error is not None:
            self.wait(5)
            raise self._start_error
        self._expose(
            GatewayCollector(
                self.stats,
                lambda: self.in_flight,
                lambda: self.running and not self.draining,
                shard=None,
                devices_connected=lambda: self.devices_connected,
            ),
            device_url=self.device_url,
        )
        logger.info(
            "device edge started client_id=%s port=%s tls_port=%s teltonika_port=%s http_port=%s "
            "https_port=%s auth=%s receive_maximum=%s max_in_flight=%s metrics_port=%s",
            self.client_id,
            self.port,
            self.tls_port,
            self.teltonika_port,
            self.http_port,
            self.https_port,
            self.settings.mqtt_auth,
            self.settings.gateway_edge_receive_maximum,
            self.settings.gateway_edge_max_in_flight,
            self.metrics_port,
        )

    def request_stop(self) -> None:
        """Ask the loop to drain and exit (safe from a signal handler and any thread)."""
        loop, ev = self._loop, self._stop_requested
        if loop is not None and ev is not None and not loop.is_closed():
            with contextlib.suppress(RuntimeError):  # the loop has just closed
                loop.call_soon_threadsafe(ev.set)

    # ------------------------------------------------------------------ connections (loop thread)

    def opened(self, conn: DeviceConnection) -> None:
        self._connections.add(conn)
        self._opened(conn)

    def _opened(self, conn: DeviceConnection | TeltonikaConnection | PhoneConnection) -> None:
        """A new connection while draining is closed; while every connection is paused for Kafka,
        it is not read until `_resume_all` (its own `paused` stays False: that flag is its window's,
        and a connection with nothing in flight would never clear it)."""
        if self.draining:
            conn.close()
        elif self.all_paused and conn.transport is not None:
            conn.transport.pause_reading()

    def lost(self, conn: DeviceConnection) -> None:
        self._connections.discard(conn)
        if conn.logged_in and self._by_identity.get(conn.identity) is conn:
            del self._by_identity[conn.identity]

    def logged_in(self, conn: DeviceConnection) -> None:
        """One connection per device: a newer one takes over (MQTT's rule for a client id)."""
        self.stats.mqtt_connects += 1
        old = self._by_identity.get(conn.identity)
        if old is not None and old is not conn:
            self.stats.sessions_taken_over += 1
            old.close(w.RC_SESSION_TAKEN_OVER)
        self._by_identity[conn.identity] = conn

    def tracker_opened(self, conn: TeltonikaConnection) -> None:
        self._trackers.add(conn)
        self._opened(conn)

    def tracker_lost(self, conn: TeltonikaConnection) -> None:
        self._trackers.discard(conn)

    def tracker_admitted(self, conn: TeltonikaConnection) -> None:
        logger.info("tracker admitted protocol=teltonika imei=%s vehicle_id=%s", conn.imei, conn.vehicle_id)

    def _bound(self, protocol: TrackerProtocol, tracker_id: str) -> tuple[str | None, dict[Any, Any]]:
        """The vehicle a tracker is bound to and that vehicle's credential record (a worker
        thread's read; logins on)."""
        r, prefix = self._redis, self.settings.redis_prefix
        assert r is not None
        raw = r.get(tracker_key(prefix, protocol, tracker_id))
        vehicle_id = None if raw is None else _text(raw)
        creds = r.hgetall(credentials_key(prefix, vehicle_id)) if vehicle_id is not None else {}
        return vehicle_id, dict(creds)

    def _binding(
        self, protocol: TrackerProtocol, tracker_id: str
    ) -> tuple[LoginVerdict, str | None, tuple[str | None, str]]:
        """A tracker's verdict by its binding alone (an id without a secret: Teltonika), the
        vehicle, and what a re-check compares."""
        if self._redis is None:  # logins off: the tracker's id names the vehicle (tests, a closed network)
            return LoginVerdict.ACCEPTED, tracker_id, (tracker_id, "")
        vehicle_id, creds = self._bound(protocol, tracker_id)
        status = {_text(k): _text(v) for k, v in creds.items()}.get(STATUS_FIELD, "")
        return tracker_verdict(vehicle_id, creds), vehicle_id, (vehicle_id, status)

    def check_tracker(self, conn: TeltonikaConnection, protocol: TrackerProtocol, tracker_id: str) -> None:
        """Read the tracker's binding and its vehicle's credential status (worker thread), then
        answer it on the loop."""
        assert self._loop is not None
        fut = self._loop.run_in_executor(None, self._binding, protocol, tracker_id)

        def done(f: asyncio.Future[tuple[LoginVerdict, str | None, tuple[str | None, str]]]) -> None:
            try:
                verdict, vehicle_id, seen = f.result()
            except redis.RedisError as exc:
                logger.warning("tracker not admitted: Redis error=%s tracker_id=%s", exc, tracker_id)
                conn.unavailable()
                return
            conn.admitted(verdict, vehicle_id, seen)

        fut.add_done_callback(done)

    def phone_opened(self, conn: PhoneConnection) -> None:
        self._phones.add(conn)
        self._opened(conn)

    def phone_lost(self, conn: PhoneConnection) -> None:
        self._phones.discard(conn)

    def admit(self, conn: PhoneConnection, who: Identity) -> None:
        """Read who a phone's request says it is (worker thread): the vehicle (an OsmAnd id's
        binding, an OwnTracks login's user) and the secret against that vehicle's device
        credentials; then go on with the request on the loop."""
        assert self._loop is not None
        r, prefix = self._redis, self.settings.redis_prefix

        def read() -> tuple[LoginVerdict, str | None]:
            if r is None:  # logins off: the id names the vehicle (tests, a closed network)
                return LoginVerdict.ACCEPTED, who.name
            if who.protocol is PhoneProtocol.OSMAND:
                vehicle_id, creds = self._bound(TrackerProtocol.OSMAND, who.name)
                if vehicle_id is None:
                    return LoginVerdict.UNKNOWN_DEVICE, None
                return check_login(creds, who.secret), vehicle_id
            return check_login(r.hgetall(credentials_key(prefix, who.name)), who.secret), who.name

        fut = self._loop.run_in_executor(None, read)
        recheck_s = self.settings.gateway_edge_recheck_s

        def done(f: asyncio.Future[tuple[LoginVerdict, str | None]]) -> None:
            try:
                verdict, vehicle_id = f.result()
            except Exception as exc:  # Redis down or slow, a damaged record: no answer, sent again
                logger.warning("phone not admitted: error=%r protocol=%s id=%r", exc, who.protocol, who.name)
                conn.unavailable(who)
                return
            conn.admission(who, verdict, vehicle_id, recheck_s)

        fut.add_done_callback(done)

    def check_login(self, conn: DeviceConnection, username: str, password: bytes | None) -> None:
        assert self._loop is not None
        assert self._redis is not None
        r, key = self._redis, credentials_key(self.settings.redis_prefix, username)

        def read() -> tuple[LoginVerdict, tuple[str, str] | None]:
            record = r.hgetall(key)
            verdict = check_login(record, password)
            return verdict, _seen(record)

        fut = self._loop.run_in_executor(None, read)

        def done(f: asyncio.Future[tuple[LoginVerdict, tuple[str, str] | None]]) -> None:
            try:
                verdict, seen = f.result()
            except redis.RedisError as exc:
                logger.warning("device login not checked: Redis error=%s user=%r", exc, username)
                conn.login_unavailable()
                return
            conn.login_checked(verdict, seen)

        fut.add_done_callback(done)

    # ------------------------------------------------------------------ Kafka side (loop thread)

    def produce(self, e: Pending) -> None:
        rec = e.record
        if self._heard is not None and rec is not None and rec.reason is None:
            self._heard.note(rec.key, e.protocol or heard.MQTT, e.received_mono_s)
        self._unconfirmed[id(e)] = e
        self._out.produce(e)
        if len(self._unconfirmed) >= self.settings.gateway_edge_max_in_flight and not self.all_paused:
            self._pause_all()

    def _stored(self, e: Pending) -> None:
        self._unconfirmed.pop(id(e), None)
        conn = e.owner
        if isinstance(conn, DeviceConnection | TeltonikaConnection | PhoneConnection):
            conn.stored(e)
            if conn.out:
                self._dirty.add(conn)

    def _pending(self) -> list[Pending]:
        return [e for e in self._unconfirmed.values() if not e.confirmed]

    def _all_connections(self) -> list[DeviceConnection | TeltonikaConnection | PhoneConnection]:
        return [*self._connections, *self._trackers, *self._phones]

    def _pause_all(self) -> None:
        self.all_paused = True
        logger.warning("device edge paused: %s messages wait for Kafka", len(self._unconfirmed))
        for c in self._all_connections():
            if c.transport is not None and not c.closed:
                c.transport.pause_reading()

    def _resume_all(self) -> None:
        self.all_paused = False
        self._resumed_mono_s = time.monotonic()
        logger.info("device edge reading again in_flight=%s", len(self._unconfirmed))
        for c in self._all_connections():
            if not c.paused and c.transport is not None and not c.closed:
                c.transport.resume_reading()

    # ------------------------------------------------------------------ the loop

    def _run(self) -> None:
        loop = asyncio.new_event_loop()
        self._loop = loop
        try:
            loop.run_until_complete(self._main())
        except Exception:
            logger.exception("device edge loop failed client_id=%s", self.client_id)
        finally:
            left = self._out.flush(2.0)
            loop.close()
            if self._redis is not None:
                self._redis.close()
            log_stopped("device edge", self.client_id, self._drained, self.in_flight, left, self.stats)
            self._ready.set()

    async def _main(self) -> None:
        self._stop_requested = asyncio.Event()
        servers: list[asyncio.Server] = []
        try:
            servers = await self._listen()
        except BaseException as exc:
            self._start_error = exc if isinstance(exc, Exception) else RuntimeError(str(exc))
            for s in servers:
                s.close()
            return
        self._ready.set()
        pump = asyncio.ensure_future(self._pump())
        sweep = asyncio.ensure_future(self._sweep())
        await self._stop_requested.wait()
        self.draining = True
        for s in servers:
            s.close()
        logger.info("device edge draining in_flight=%s devices=%s", self.in_flight, self.devices_connected)
        deadline = time.monotonic() + self.settings.gateway_drain_timeout_s
        while self._unconfirmed and time.monotonic() < deadline:
            await asyncio.sleep(PUMP_BUSY_S * 5)
        self._drained = not self._unconfirmed
        if not self._drained:
            logger.warning("drain timed out; devices send the rest again in_flight=%s", self.in_flight)
        sweep.cancel()
        pump.cancel()
        # The side tasks end with the loop: a task left pending is destroyed whenever the garbage
        # collector gets to it, logging from inside whatever code runs then.
        side = [t for t in (self._rechecking, self._writing_heard) if t is not None]
        for t in side:
            t.cancel()
        await asyncio.gather(sweep, pump, *side, return_exceptions=True)
        self._flush_dirty()
        for c in list(self._connections):
            c.close(w.RC_SERVER_SHUTTING_DOWN)
        for tc in list(self._trackers):
            tc.close()
        for pc in list(self._phones):
            pc.close()
        await asyncio.sleep(0)  # let the transports write what they hold before the loop ends

    async def _listen(self) -> list[asyncio.Server]:
        s = self.settings
        loop = asyncio.get_running_loop()
        host = s.gateway_edge_host or s.host
        servers: list[asyncio.Server] = []
        factory: Callable[[], DeviceConnection] = lambda: DeviceConnection(self)  # noqa: E731
        if s.gateway_edge_port is not None:
            srv = await loop.create_server(factory, host, s.gateway_edge_port, reuse_address=True)
            servers.append(srv)
            self.port = srv.sockets[0].getsockname()[1]
        if s.gateway_edge_tls_port is not None:
            srv = await loop.create_server(
                factory, host, s.gateway_edge_tls_port, ssl=self._tls_context(), reuse_address=True
            )
            servers.append(srv)
            self.tls_port = srv.sockets[0].getsockname()[1]
        if s.gateway_teltonika_port is not None:
            srv = await loop.create_server(
                lambda: TeltonikaConnection(self), host, s.gateway_teltonika_port, reuse_address=True
            )
            servers.append(srv)
            self.teltonika_port = srv.sockets[0].getsockname()[1]
        phones: Callable[[], PhoneConnection] = lambda: PhoneConnection(self, s.gateway_osmand_speed_unit)  # noqa: E731
        if s.gateway_http_port is not None:
            srv = await loop.create_server(phones, host, s.gateway_http_port, reuse_address=True)
            servers.append(srv)
            self.http_port = srv.sockets[0].getsockname()[1]
        if s.gateway_https_port is not None:
            srv = await loop.create_server(
                phones, host, s.gateway_https_port, ssl=self._tls_context(), reuse_address=True
            )
            servers.append(srv)
            self.https_port = srv.sockets[0].getsockname()[1]
        return servers

    def _tls_context(self) -> ssl.SSLContext:
        d = self.settings.mqtt_tls_dir
        if d is None:
            raise ConfigError(
                "FLEETFENCE_GATEWAY_EDGE_TLS_PORT needs FLEETFENCE_MQTT_TLS_DIR (server.crt, server.key)"
            )
        ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        try:
            ctx.load_cert_chain(str(d / TLS_FILES[0]), str(d / TLS_FILES[1]))
        except (OSError, ssl.SSLError) as exc:
            raise ConfigError(f"TLS files in {d}: {exc}") from exc
        return ctx

    async def _pump(self) -> None:
        """Serve Kafka's confirmations and write the PUBACKs they release."""
        out = self._out
        next_stats = time.monotonic() + STATS_LOG_INTERVAL_S
        resume_below = self.settings.gateway_edge_max_in_flight // 2
        while True:
            out.poll(0)
            now = time.monotonic()
            if out.retrying:
                out.retry_due(now)
            if out.failed:
                out.replace()
            self._flush_dirty()
            if self.all_paused and len(self._unconfirmed) <= resume_below and not self.draining:
                self._resume_all()
            if now >= next_stats:
                next_stats = now + STATS_LOG_INTERVAL_S
                log_stats(self.stats, self.in_flight)
            await asyncio.sleep(PUMP_BUSY_S if self._unconfirmed else PUMP_IDLE_S)

    def _flush_dirty(self) -> None:
        for c in self._dirty:
            c.flush()
        self._dirty.clear()

    async def _sweep(self) -> None:
        """Close what MQTT says to close (no CONNECT in time, keep-alive missed) and devices whose
        credentials changed since they logged in."""
        s = self.settings
        next_recheck = time.monotonic() + s.gateway_edge_recheck_s
        while True:
            await asyncio.sleep(SWEEP_S)
            now = time.monotonic()
            # A connection the edge does not read (every one paused for Kafka) owes no CONNECT or
            # IMEI meanwhile: its deadline runs from when the edge reads again.
            read_since = self._resumed_mono_s
            for c in list(self._connections):
                if c.connect is None or not c.logged_in:
                    if self.all_paused:
                        continue
                    if now - max(c.opened_mono_s, read_since) > s.gateway_edge_connect_timeout_s:
                        self.stats.protocol_errors["connect_timeout"] += 1
                        c.close()
                    continue
                ka = c.connect.keepalive_s
                # MQTT: one and a half keep-alive periods without a packet. A connection paused for
                # back-pressure is not read, so its silence is ours, not the device's.
                if ka and not (c.paused or self.all_paused) and now - c.last_rx_mono_s > 1.5 * ka:
                    self.stats.protocol_errors[f"0x{w.RC_KEEP_ALIVE_TIMEOUT:02x}"] += 1
                    logger.info("device keep-alive missed identity=%r", c.identity)
                    c.close(w.RC_KEEP_ALIVE_TIMEOUT)
            for tc in list(self._trackers):
                if tc.vehicle_id is None:
                    waited_s = now - max(tc.opened_mono_s, read_since)
                    if not self.all_paused and waited_s > s.gateway_edge_connect_timeout_s:
                        self.stats.protocol_errors["teltonika:imei_timeout"] += 1
                        tc.close()
                elif (
                    not (tc.paused or self.all_paused)
                    and now - tc.last_rx_mono_s > s.gateway_teltonika_idle_timeout_s
                ):
                    self.stats.protocol_errors["teltonika:idle_timeout"] += 1
                    tc.close()
            for pc in list(self._phones):
                # A request held for Kafka is the edge's wait, not the phone's silence.
                idle = not (pc.busy or pc.inflight or self.all_paused)
                if idle and now - pc.last_rx_mono_s > s.gateway_http_idle_timeout_s:
                    pc.close()
            # The re-check runs beside the sweep: a Redis that answers slowly (each read bounded by
            # the client's socket timeout) must not hold the deadlines above.
            rechecking = self._rechecking is not None and not self._rechecking.done()
            if self._redis is not None and now >= next_recheck and not rechecking:
                next_recheck = now + s.gateway_edge_recheck_s
                self._rechecking = asyncio.ensure_future(self._recheck())
            writing = self._writing_heard is not None and not self._writing_heard.done()
            if self._heard is not None and len(self._heard) and not writing:
                self._writing_heard = asyncio.ensure_future(self._write_heard(self._heard.take(now)))

    async def _write_heard(self, batch: dict[bytes, heard.Heard]) -> None:
        """Off the loop: a slow Redis delays the read model, never a device."""
        assert self._redis is not None
        keys = ReadKeys(self.settings.redis_prefix)
        try:
            await asyncio.get_running_loop().run_in_executor(None, heard.write, self._redis, keys, batch)
        except redis.RedisError as exc:
            logger.warning("vehicles heard not written: Redis error=%s vehicles=%s", exc, len(batch))

    async def _recheck(self) -> None:
        await self._recheck_trackers()
        conns = [c for c in self._by_identity.values() if c.login_hash is not None]
        if not conns:
            return
        r, prefix = self._redis, self.settings.redis_prefix
        assert r is not None

        def read() -> list[Any]:
            pipe = r.pipeline(transaction=False)
            for c in conns:
                pipe.hmget(credentials_key(prefix, c.identity), [STATUS_FIELD, SECRET_HASH_FIELD])
            return list(pipe.execute())

        try:
            records = await asyncio.get_running_loop().run_in_executor(None, read)
        except redis.RedisError as exc:
            logger.warning("device credentials not re-read: Redis error=%s", exc)
            return
        for c, record in zip(conns, records, strict=True):
            status, hashed = (None if v is None else _text(v) for v in record)
            now_seen = None if status is None else (status, hashed or "")
            if not c.closed and now_seen != c.login_hash:
                logger.info("device disconnected: its credentials changed identity=%r", c.identity)
                self.stats.logins_refused["credentials_changed"] += 1
                c.close(w.RC_NOT_AUTHORIZED)

    async def _recheck_trackers(self) -> None:
        """Trackers whose binding or vehicle's credential status changed since admission are cut
        off (unbound, bound elsewhere, the vehicle disabled or revoked)."""
        conns = [c for c in self._trackers if c.seen is not None and c.imei is not None]
        r, prefix = self._redis, self.settings.redis_prefix
        if not conns or r is None:
            return

        def read() -> list[tuple[str | None, str]]:
            # Two pipelined round trips for all of them: the bindings, then the vehicles' statuses.
            pipe = r.pipeline(transaction=False)
            for c in conns:
                pipe.get(tracker_key(prefix, TrackerProtocol.TELTONIKA, c.imei or ""))
            vehicles = [None if v is None else _text(v) for v in pipe.execute()]
            pipe = r.pipeline(transaction=False)
            for vid in vehicles:
                pipe.hget(credentials_key(prefix, vid or ""), STATUS_FIELD)
            statuses = pipe.execute()
            return [
                (vid, "" if vid is None or st is None else _text(st))
                for vid, st in zip(vehicles, statuses, strict=True)
            ]

        try:
            seen = await asyncio.get_running_loop().run_in_executor(None, read)
        except redis.RedisError as exc:
            logger.warning("trackers' bindings not re-read: Redis error=%s", exc)
            return
        for c, now_seen in zip(conns, seen, strict=True):
            if not c.closed and now_seen != c.seen:
                logger.info("tracker disconnected: its binding changed imei=%s", c.imei)
                self.stats.logins_refused["teltonika:binding_changed"] += 1
                c.close()


def _seen(record: Any) -> tuple[str, str] | None:
    """(status, secret hash) of a credential record: what a re-check compares."""
    if not record:
        return None
    d = {_text(k): _text(v) for k, v in record.items()}
    return d.get(STATUS_FIELD, ""), d.get(SECRET_HASH_FIELD, "")


def _text(x: Any) -> str:
    return x.decode() if isinstance(x, bytes) else str(x)
