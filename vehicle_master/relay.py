"""The outbox relay: publishes the vehicle master's outbox stream to the compacted `fleet.master`.

Crash safety comes from the order of three steps. The relay reads outbox entries after the last
acknowledged stream id, produces them with an idempotent producer and waits until Kafka has acked
every one (`flush`); only then does it move the acknowledged id forward (and trim what is behind
it). A relay killed anywhere re-reads from the last acknowledged id, so a change can be published
twice but never lost; events carry their entity version, so consumers drop the repeats, and
compaction keeps only the latest per key anyway.

A lease in Redis lets several API processes each run a relay: only the lease holder publishes,
and it can only acknowledge while it still holds the lease.

Run it in-process (`OutboxRelay(settings).start()` / `.stop()`, as the API, the demo and
end-to-end tests do) or on its own with `fleetfence master-relay`.
"""

from __future__ import annotations

import logging
import threading
import uuid
from typing import Any

import redis
from confluent_kafka import KafkaError, Message
from prometheus_client import Counter

from fleetfence.errors import KafkaDeliveryError, LifecycleError
from fleetfence.kafka import idempotent_producer, produce_waiting
from vehicle_master.settings import MasterSettings
from vehicle_master.store import MasterKeys

logger = logging.getLogger(__name__)

PUBLISHED = Counter("fleetfence_master_relay_published_total", "Outbox events acked by Kafka")
FAILURES = Counter("fleetfence_master_relay_failures_total", "Relay batches that failed and will be retried")

# Renew the lease only if we still own it (a GC pause or a partition may have let it expire).
RENEW_LUA = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('PEXPIRE', KEYS[1], ARGV[2]) end
return redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) and 1 or 0
"""
# Move the acknowledged id forward and trim the outbox behind it, but only as the lease holder.
ACK_LUA = """
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
redis.call('SET', KEYS[2], ARGV[2])
redis.call('XTRIM', KEYS[3], 'MINID', ARGV[2])
return 1
"""
RELEASE_LUA = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""


def _b(v: bytes | str | None) -> bytes:
    return v if isinstance(v, bytes) else str(v).encode()


class OutboxRelay:
    """Outbox stream -> `fleet.master`, at least once, in stream order, idempotent producer."""

    def __init__(self, settings: MasterSettings, *, flush_timeout_s: float = 10.0) -> None:
        self.settings = settings
        self.keys = MasterKeys(settings.redis_prefix)
        self.topic = settings.topics.master
        self.r = redis.Redis.from_url(settings.redis_dsn)
        # linger 1 ms: master changes are rare and an admin expects to see them downstream at once.
        self.producer = idempotent_producer(settings.bootstrap_servers, **{"linger.ms": 1})
        self.token = uuid.uuid4().hex
        self.flush_timeout_s = flush_timeout_s
        self._renew = self.r.register_script(RENEW_LUA)
        self._ack = self.r.register_script(ACK_LUA)
        self._release = self.r.register_script(RELEASE_LUA)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.published = 0

    # ------------------------------------------------------------------ one step

    def acquire_lease(self) -> bool:
        return bool(self._renew([self.keys.relay_lock], [self.token, self.settings.relay_lease_ms]))

    def acked_id(self) -> str:
        raw = self.r.get(self.keys.relay_acked)
        return raw.decode() if isinstance(raw, bytes) else "0-0"

    def run_once(self) -> int:
        """Publish the next batch; returns how many events Kafka acknowledged (0: nothing to do)."""
        raw = self.r.xrange(
            self.keys.outbox, min=f"({self.acked_id()}", max="+", count=self.settings.relay_batch_size
        )
        entries = [(_b(sid), {_b(k): _b(v) for k, v in f.items()}) for sid, f in raw or [] if f is not None]
        if not entries:
            return 0
        errors: list[str] = []

        def on_delivery(err: KafkaError | None, _msg: Message) -> None:
            if err is not None:
                errors.append(str(err))

        for _sid, fields in entries:
            produce_waiting(
                self.producer, self.topic, key=fields[b"key"], value=fields[b"event"], on_delivery=on_delivery
            )
        remaining = self.producer.flush(self.flush_timeout_s)
        if remaining or errors:
            FAILURES.inc()
            raise KafkaDeliveryError(
                f"relay batch not acknowledged: {remaining} pending, errors: {errors[:3]}"
            )
        last = entries[-1][0].decode()
        if not self._ack([self.keys.relay_lock, self.keys.relay_acked, self.keys.outbox], [self.token, last]):
            logger.warning("relay lost its lease before acking; the next holder re-sends last=%s", last)
            return 0
        PUBLISHED.inc(len(entries))
        self.published += len(entries)
        logger.debug("relay batch published count=%s last_id=%s", len(entries), last)
        return len(entries)

    # ------------------------------------------------------------------ loop

    def run_forever(self, stop: threading.Event | None = None) -> None:
        """Relay until `stop` is set; errors are logged and the batch retried, never skipped."""
        stop = stop or self._stop
        logger.info("relay started topic=%s token=%s", self.topic, self.token)
        while not stop.is_set():
            try:
                if not self.acquire_lease():
                    stop.wait(self.settings.relay_lease_ms / 3000)  # another relay leads; check again
                    continue
                if self.run_once() == 0:
                    # Wake as soon as a new entry lands (or after block_ms, to renew the lease).
                    self.r.xread(
                        {self.keys.outbox: self.acked_id()}, count=1, block=self.settings.relay_block_ms
                    )
            except (KafkaDeliveryError, redis.RedisError) as exc:
                logger.warning("relay batch failed, retrying error=%s", exc)
                stop.wait(1.0)
        logger.info("relay stopped published=%s", self.published)

    def start(self) -> OutboxRelay:
        """Run in a background thread (the API process and end-to-end tests use this)."""
        if self._thread is not None:
            raise LifecycleError("relay already started")
        self._stop.clear()
        self._thread = threading.Thread(target=self.run_forever, name="outbox-relay", daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout_s: float = 10.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout_s)
            self._thread = None
        self.producer.flush(timeout_s)
        self._release([self.keys.relay_lock], [self.token])
        self.r.close()

    def __enter__(self) -> OutboxRelay:
        return self.start()

    def __exit__(self, *_exc: Any) -> None:
        self.stop()
