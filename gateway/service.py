"""The gateway service: MQTT in, its shard's vehicles to Kafka, PUBACK only after Kafka has it.

This module is the lifecycle and the wiring: start, the I/O loop, drain and stop. What it wires:
`gateway.core.route` decides each message's record, `gateway.producer.Forwarder` gets it into
Kafka (retries, producer replacement), `gateway.acks.AckOrder` releases its PUBACK once Kafka has
it, and `gateway.mqtt_client.BufferedClient` is paho with a faster read path.

One I/O thread owns both clients. It selects on the MQTT socket, lets paho parse what arrived
(each message is routed and handed to the idempotent producer without waiting), then polls the
producer, whose delivery callbacks release PUBACKs. Keeping paho and the producer on one thread
makes acknowledging thread-safe without locks and lets the PUBACKs be written straight away.

Backpressure: the CONNECT carries a Receive Maximum, and the gateway also stops reading its socket
when that many messages are unacknowledged (Mosquitto 2.0.11 overshoots the Receive Maximum), so
while Kafka is unreachable nothing is acknowledged and the rest waits in Mosquitto's persistent
session, not in our memory.
"""

from __future__ import annotations

import logging
import select
import threading
import time
from typing import Any

import paho.mqtt.client as mqtt
from paho.mqtt.enums import CallbackAPIVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties
from paho.mqtt.reasoncodes import ReasonCode

from fleetfence.errors import ServiceUnavailableError
from fleetfence.mqtt import login, service_account
from gateway.acks import AckOrder, DrainBarrier
from gateway.core import route
from gateway.metrics import GatewayCollector, GatewayStats, log_stats, log_stopped
from gateway.mqtt_client import MAX_PACKETS_PER_READ, BufferedClient, topic_bytes
from gateway.producer import Forwarder
from gateway.replica import Replica
from gateway.settings import GatewaySettings

logger = logging.getLogger(__name__)

STATS_LOG_INTERVAL_S = 10.0
RECONNECT_BACKOFF_S = 1.0


class Gateway(Replica):
    """One gateway replica; `start()`/`stop()` in-process, or `python -m gateway` as a service."""

    def __init__(self, settings: GatewaySettings) -> None:
        super().__init__(settings)
        # The gateways' account: the shared telemetry subscription and nothing else (fleetfence.mqtt).
        self._account = service_account(settings, "gateway")
        self.stats = GatewayStats()
        self._topics = settings.topics
        self._shard = settings.gateway_shard
        self._rm = settings.gateway_receive_maximum
        # What is held for Kafka and the PUBACKs it releases; public so tests can read the release order.
        self.acks = AckOrder(settings.gateway_ack_in_order, self.stats)
        self._subscribed = threading.Event()
        self._stop = threading.Event()
        self._draining = False
        self._barrier = DrainBarrier()
        self._out = Forwarder(settings, self.client_id, self.stats, self.acks.stored, self.acks.unconfirmed)
        self._client = self._new_client()

    # ------------------------------------------------------------------ public API

    @property
    def in_flight(self) -> int:
        return len(self.acks)

    @property
    def max_in_flight_seen(self) -> int:
        return self.acks.max_seen

    @property
    def connected(self) -> bool:
        return self.acks.connected and self._subscribed.is_set()

    def start(self, timeout_s: float | None = None) -> None:
        """Connect, subscribe and start the I/O thread; return once the subscription is active.

        Waiting for the SUBACK matters on a first start: a message published before the shared
        subscription exists has no session to be queued in.
        """
        timeout_s = timeout_s if timeout_s is not None else self.settings.startup_timeout_s
        host, port = self.settings.mqtt_host_port
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                self._client.connect(
                    host,
                    port,
                    keepalive=self.settings.gateway_keepalive_s,
                    clean_start=False,
                    properties=self._connect_properties(),
                )
                break
            except OSError as exc:
                if time.monotonic() > deadline:
                    raise ServiceUnavailableError(f"MQTT {host}:{port} unreachable: {exc}") from exc
                time.sleep(0.2)
        self._thread = threading.Thread(target=self._run, name=f"gateway-io-{self.client_id}", daemon=True)
        self._thread.start()
        if not self._subscribed.wait(max(deadline - time.monotonic(), 1.0)):
            self.stop(drain_timeout_s=1.0)
            raise ServiceUnavailableError(
                f"no SUBACK for {self.settings.gateway_subscription} from {host}:{port}"
            )
        self._expose(
            GatewayCollector(
                self.stats,
                lambda: self.in_flight,
                lambda: self.connected,
                (self._shard.index, self._shard.count),
            )
        )
        logger.info(
            "gateway started client_id=%s subscription=%s shard=%s/%s receive_maximum=%s "
            "in_order_acks=%s metrics_port=%s",
            self.client_id,
            self.settings.gateway_subscription,
            self._shard.index,
            self._shard.count,
            self._rm,
            self.settings.gateway_ack_in_order,
            self.metrics_port,
        )

    def request_stop(self) -> None:
        """Ask the I/O thread to drain and exit (safe from a signal handler)."""
        self._stop.set()

    # ------------------------------------------------------------------ construction

    def _connect_properties(self) -> Properties:
        props = Properties(PacketTypes.CONNECT)  # type: ignore[no-untyped-call]
        props.SessionExpiryInterval = self.settings.gateway_session_expiry_s
        props.ReceiveMaximum = self._rm
        return props

    def _new_client(self) -> BufferedClient:
        c = BufferedClient(
            CallbackAPIVersion.VERSION2,
            client_id=self.client_id,
            protocol=mqtt.MQTTv5,
            manual_ack=True,
        )
        c.on_connect = self._on_connect
        c.on_disconnect = self._on_disconnect
        c.on_subscribe = self._on_subscribe
        c.on_message = self._on_message
        c.on_unsubscribe = self._on_unsubscribe
        c.fast_publish = self._take
        c.suppress_exceptions = True
        login(c, self._account)
        return c

    # ------------------------------------------------------------------ paho callbacks (I/O thread)

    def _on_connect(
        self, client: mqtt.Client, _u: Any, flags: mqtt.ConnectFlags, rc: ReasonCode, _p: Any
    ) -> None:
        if rc.is_failure:
            logger.error("MQTT connect refused client_id=%s reason=%s", self.client_id, rc)
            return
        self.acks.connection_opened()
        self.stats.mqtt_connects += 1
        logger.info(
            "MQTT connected client_id=%s session_present=%s generation=%s",
            self.client_id,
            flags.session_present,
            self.acks.generation,
        )
        client.subscribe(self.settings.gateway_subscription, qos=1)

    def _on_subscribe(self, _c: mqtt.Client, _u: Any, _mid: int, rcs: list[ReasonCode], _p: Any) -> None:
        if any(rc.is_failure for rc in rcs):
            logger.error(
                "MQTT subscribe refused subscription=%s reasons=%s", self.settings.gateway_subscription, rcs
            )
            return
        self._subscribed.set()

    def _on_disconnect(self, _c: mqtt.Client, _u: Any, _f: Any, rc: ReasonCode, _p: Any) -> None:
        # PUBACKs for messages of this connection can no longer be sent: Mosquitto redelivers them
        # to the next connection of this session with the DUP flag.
        was_connected = self.acks.connected
        self.acks.connection_lost()
        if was_connected:
            logger.warning(
                "MQTT disconnected client_id=%s reason=%s unacknowledged=%s",
                self.client_id,
                rc,
                self.in_flight,
            )

    def _on_unsubscribe(self, _c: mqtt.Client, _u: Any, mid: int, _rcs: list[ReasonCode], _p: Any) -> None:
        self._barrier.unsubscribed(mid)

    def _on_message(self, _c: mqtt.Client, _u: Any, msg: mqtt.MQTTMessage) -> None:
        """paho's path (packets the fast path leaves to it): same handling."""
        payload = msg.payload if isinstance(msg.payload, bytes) else bytes(msg.payload)
        self._take(topic_bytes(msg), payload, msg.mid, msg.qos, bool(msg.dup))

    def _take(self, topic_raw: bytes, payload: bytes, mid: int, qos: int, dup: bool) -> None:
        """Every received PUBLISH: route it, hold it until Kafka has it, produce it."""
        stats = self.stats
        if self._draining:
            # Not taken: left unacknowledged, Mosquitto gives it to the next session.
            stats.deferred += 1
            return
        if not self._shard.owns(topic_raw):
            stats.other_shard += 1
            self.acks.pass_on(mid, qos, time.monotonic())
            return
        stats.received += 1
        if dup:
            stats.redelivered += 1
        try:
            topic: str | bytes = topic_raw.decode()
        except UnicodeDecodeError:
            topic = topic_raw
        record = route(self._topics, topic, payload, time.time_ns() // 1_000_000)
        self._out.produce(self.acks.hold(mid, qos, record, time.monotonic()))

    # ------------------------------------------------------------------ the I/O loop

    def _run(self) -> None:
        try:
            self._loop()
        except Exception:  # a bug: say so loudly; unacknowledged messages are redelivered
            logger.exception("gateway I/O loop failed client_id=%s", self.client_id)
        finally:
            try:
                self._client.disconnect()
                self._client.loop_write()
            except Exception:
                logger.debug("disconnect failed", exc_info=True)
            self.acks.connection_lost()
            left = self._out.flush(2.0)
            log_stopped("gateway", self.client_id, self._drained, self.in_flight, left, self.stats)

    def _loop(self) -> None:
        client = self._client
        # Our own bound, not only the broker's: Mosquitto 2.0.11 sends past the Receive Maximum
        # once PUBACKs flow. At the cap we stop reading the socket, so TCP flow control pushes
        # back and the rest waits in Mosquitto.
        read_cap = self._rm
        draining = False
        drain_deadline = 0.0
        next_reconnect = 0.0
        next_stats = time.monotonic() + STATS_LOG_INTERVAL_S
        while True:
            now = time.monotonic()
            if self._stop.is_set() and not draining:
                draining = self._draining = True
                drain_deadline = now + self.settings.gateway_drain_timeout_s
                logger.info("gateway draining in_flight=%s", self.in_flight)
            sock = client.socket()
            if sock is None:
                if draining and (not self.acks or now > drain_deadline):
                    self._drained = not self.acks
                    return
                if not draining and now >= next_reconnect and len(self.acks) < read_cap:
                    next_reconnect = now + RECONNECT_BACKOFF_S
                    try:
                        client.reconnect()
                    except OSError as exc:
                        logger.warning("MQTT reconnect failed client_id=%s error=%s", self.client_id, exc)
                self._out.poll(0.05)
                self._out.retry_due(now)
                continue
            want_read = draining or len(self.acks) < read_cap
            if want_read and client.buffered:
                timeout = 0.0
            elif self.acks:
                timeout = 0.002
            else:
                timeout = 0.05
            r: list[Any]
            if not want_read and not client.want_write():
                r = []
                self._out.poll(0.01)  # paused: wait for Kafka instead of the socket
            else:
                try:
                    r, _w, _x = select.select(
                        [sock] if want_read else [], [sock] if client.want_write() else [], [], timeout
                    )
                except (OSError, ValueError):
                    r = []
            if want_read and (r or client.buffered):
                # Never parse past the cap: every packet read may be one more message to hold.
                client.loop_read(MAX_PACKETS_PER_READ if draining else read_cap - len(self.acks))
            if client.want_write():
                client.loop_write()
            client.loop_misc()
            self._out.poll(0)
            if self.acks.unsent:
                self.acks.flush(client)
            if self._out.retrying:
                self._out.retry_due(now)
            if self._out.failed:
                self._out.replace()
            if draining:
                self._barrier.send_when_acked(client, self.acks)
                if self._barrier.done:
                    self._drained = True
                    return
                if now > drain_deadline:
                    logger.warning("drain timed out; Mosquitto will redeliver in_flight=%s", self.in_flight)
                    return
            if now >= next_stats:
                next_stats = now + STATS_LOG_INTERVAL_S
                log_stats(self.stats, self.in_flight)
