"""Produce, retry, replace: every held message reaches Kafka, however long Kafka is away.

Produce never waits: `produce()` hands the record to librdkafka and returns, and the delivery
callback (run by `poll`, on the gateway's I/O thread) reports it stored. A failed delivery is
produced again after a backoff rather than given up, because its MQTT message stays unacknowledged
until Kafka has it; the Receive Maximum bounds how many can be held meanwhile. A fatal error
(the idempotent producer's sequence state is broken) cannot be retried on the same producer, so it
is replaced by a new one from `fleetfence.kafka`'s factory and everything unconfirmed is produced
again. A copy may then be stored twice; downstream drops duplicates by the fix's `seq`.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable
from functools import partial
from typing import NamedTuple

from confluent_kafka import KafkaError, KafkaException, Message, Producer

from fleetfence.kafka import idempotent_producer
from gateway.inflight import Pending
from gateway.metrics import GatewayStats
from gateway.settings import GatewaySettings

logger = logging.getLogger(__name__)


class Retry(NamedTuple):
    """A failed record waiting for its next attempt."""

    due_mono_s: float
    entry: Pending


class Forwarder:
    """The gateway's Kafka side: one idempotent producer at a time, its retries and its stats.

    `on_stored` is called for each record Kafka confirmed (acknowledgement follows from it);
    `unconfirmed` lists what a replacement producer must send again.
    """

    def __init__(
        self,
        settings: GatewaySettings,
        client_id: str,
        stats: GatewayStats,
        on_stored: Callable[[Pending], None],
        unconfirmed: Callable[[], list[Pending]],
    ) -> None:
        self._settings = settings
        self._client_id = client_id
        self._stats = stats
        self._on_stored = on_stored
        self._unconfirmed = unconfirmed
        self._backoff_s = settings.gateway_retry_backoff_ms / 1000
        self._retries: deque[Retry] = deque()
        self.failed = False  # a fatal error: the producer must be replaced
        self._producer = self._new_producer()

    def _new_producer(self) -> Producer:
        return idempotent_producer(
            self._settings.bootstrap_servers,
            **{
                "client.id": self._client_id,
                "linger.ms": self._settings.gateway_kafka_linger_ms,
                "message.timeout.ms": self._settings.gateway_kafka_message_timeout_ms,
                "error_cb": self._on_kafka_error,
                # Back within a second of the broker's return, not librdkafka's default 10 s.
                "reconnect.backoff.max.ms": 1000,
            },
        )

    @property
    def retrying(self) -> bool:
        """Some failed record waits for its next attempt."""
        return bool(self._retries)

    def poll(self, timeout_s: float) -> None:
        """Serve delivery callbacks (and wait up to `timeout_s` for one)."""
        self._producer.poll(timeout_s)

    def flush(self, timeout_s: float) -> int:
        """Wait for what the producer holds; the number of records still unconfirmed."""
        left: int = self._producer.flush(timeout_s)
        return left

    def produce(self, e: Pending) -> None:
        e.attempt += 1
        e.produced_mono_s = time.monotonic()
        r = e.record
        assert r is not None, "another shard's message is acknowledged on receipt, never produced"
        cb = partial(self._on_delivery, e, e.attempt)
        while True:
            try:
                self._producer.produce(r.topic, r.value, r.key, headers=r.headers, on_delivery=cb)
                return
            except BufferError:  # local queue full: let Kafka catch up (bounded by Receive Maximum)
                self._producer.poll(0.05)
            except KafkaException as exc:
                self._failed(e, exc.args[0] if exc.args else None)
                return

    def _on_delivery(self, e: Pending, attempt: int, err: KafkaError | None, _msg: Message) -> None:
        if attempt != e.attempt:
            return  # superseded by a newer attempt (a replaced producer)
        if err is not None:
            self._failed(e, err)
            return
        self._stats.observe_latency(time.monotonic() - e.produced_mono_s)
        reason = e.record.reason if e.record is not None else None
        if reason is None:
            self._stats.forwarded += 1
        else:
            self._stats.dead_lettered[reason] += 1
        self._on_stored(e)

    def _failed(self, e: Pending, err: KafkaError | None) -> None:
        name = err.name() if isinstance(err, KafkaError) else "unknown"
        errors = self._stats.kafka_errors
        errors[name] += 1
        if isinstance(err, KafkaError) and err.fatal():
            logger.error("Kafka producer fatal error=%s: replacing the producer", err)
            self.failed = True
            return  # the replacement produces `e` again, with everything else unconfirmed
        if errors[name] in (1, 10, 100, 1000) or errors[name] % 10000 == 0:
            logger.warning("Kafka delivery failed, will produce again error=%s count=%s", err, errors[name])
        self._retries.append(Retry(time.monotonic() + self._backoff_s, e))

    def _on_kafka_error(self, err: KafkaError) -> None:
        self._stats.kafka_errors[err.name()] += 1
        if err.fatal():
            self.failed = True
        logger.warning("Kafka client error=%s", err)

    def retry_due(self, now_mono_s: float) -> None:
        """Produce again the failed records whose backoff is over (unless confirmed meanwhile)."""
        while self._retries and self._retries[0].due_mono_s <= now_mono_s:
            e = self._retries.popleft().entry
            if not e.confirmed:
                self._stats.produce_retries += 1
                self.produce(e)

    def replace(self) -> None:
        """Replace a producer that hit a fatal (idempotence) error and re-send what it held."""
        self.failed = False
        old = self._producer
        self._producer = self._new_producer()
        self._stats.producer_restarts += 1
        self._retries.clear()
        pending = self._unconfirmed()
        try:
            old.purge()
        except KafkaException:
            logger.warning("purge of the failed producer failed", exc_info=True)
        for e in pending:
            self._stats.produce_retries += 1
            self.produce(e)
        logger.info("producer replaced records_resent=%s", len(pending))
