"""The checkpoint lease: at most one driver runs the query on a checkpoint, and a standby knows the
moment it may take over.

Two drivers on one checkpoint would race for its offset and commit logs; exactly-once alerts would
then hang on the Kafka sink's fencing alone. So every driver holds a lease in Redis (the store the
processor already writes its live state to) before it starts the query, and renews it every
`ttl / 4`. A warm standby (`fleetfence processor --standby`) has its JVM, SparkSession and Python
workers up and polls the lease; when the active driver dies (a SIGKILL, a lost host) its lease
expires `ttl` later and the standby starts the query on the checkpoint at once.

A driver that cannot renew (Redis unreachable for longer than its margin, or the lease taken by
another because this driver stalled past `ttl`) stops its query: it fences itself. A driver that
stalled so long it does not even notice is fenced by Kafka: every driver of a checkpoint shares the
sink's transactional id (`processor.spark.kafka_sink`), so the new owner's `init_transactions` aborts the
old one's open transaction, and its next commit fails. docs/exactly-once.md has the protocol and
its failure cases.
"""

from __future__ import annotations

import hashlib
import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable

import redis

from processor.settings import ProcessorSettings

logger = logging.getLogger(__name__)

# Renew the lease only if this owner still holds it; release likewise. Atomic in Redis.
_IF_OWNER = "if redis.call('get', KEYS[1]) == ARGV[1] then return {} else return 0 end"
_RENEW = _IF_OWNER.format("redis.call('pexpire', KEYS[1], ARGV[2])")
_RELEASE = _IF_OWNER.format("redis.call('del', KEYS[1])")


def lease_key(redis_prefix: str, checkpoint: str) -> str:
    """The lease of one checkpoint, keyed by its location: taken before the driver touches the
    checkpoint at all (two drivers starting on a fresh one would otherwise each create it)."""
    digest = hashlib.blake2b(checkpoint.rstrip("/").encode(), digest_size=8).hexdigest()
    return f"{redis_prefix}processor:lease:{digest}"


def checkpoint_lease(s: ProcessorSettings) -> CheckpointLease | None:
    """The checkpoint's lease in Redis, or None when leasing is off (FLEETFENCE_PROCESSOR_LEASE_TTL_MS=0)."""
    if s.processor_lease_ttl_ms <= 0:
        return None
    client = redis.Redis.from_url(s.redis_dsn, socket_timeout=max(s.processor_lease_ttl_ms / 4000, 0.2))
    return CheckpointLease(client, lease_key(s.redis_prefix, s.checkpoint), s.processor_lease_ttl_ms)


class CheckpointLease:
    """A Redis lease with a unique owner token (host, pid, random), renewed by a daemon thread."""

    def __init__(self, client: redis.Redis, key: str, ttl_ms: int) -> None:
        if ttl_ms < 200:
            raise ValueError("a lease shorter than 200 ms cannot be renewed reliably")
        self.client = client
        self.key = key
        self.ttl_ms = ttl_ms
        self.owner = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self.lost = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._renew = client.register_script(_RENEW)
        self._release = client.register_script(_RELEASE)

    def try_acquire(self) -> bool:
        """Take the lease if nobody holds it (or its holder let it expire)."""
        return bool(self.client.set(self.key, self.owner, nx=True, px=self.ttl_ms))

    def holder(self) -> str | None:
        v = self.client.get(self.key)
        return v.decode() if isinstance(v, bytes) else v

    def wait_acquire(
        self, stop: threading.Event, poll_s: float = 0.1, on_wait: Callable[[], None] | None = None
    ) -> bool:
        """Poll until the lease is ours (True) or `stop` is set (False). A standby polls every
        `poll_s`, so it takes over at most that long after the active driver's lease expired."""
        logged = False
        while not stop.is_set():
            try:
                if self.try_acquire():
                    logger.info("lease acquired key=%s owner=%s ttl_ms=%d", self.key, self.owner, self.ttl_ms)
                    return True
                if not logged:
                    logger.info("lease held key=%s holder=%s: waiting to take over", self.key, self.holder())
                    logged = True
            except redis.RedisError as exc:
                logger.warning("lease poll failed key=%s error=%s", self.key, exc)
            if on_wait is not None:
                on_wait()
            stop.wait(poll_s)
        return False

    def start_renewing(self) -> None:
        """Renew every ttl/4 in a daemon thread; set `lost` when the lease is gone or could not be
        renewed for ttl/2 (half the lease left as the margin in which the query is stopped)."""
        self._thread = threading.Thread(target=self._renew_loop, name="processor-lease", daemon=True)
        self._thread.start()

    def _renew_loop(self) -> None:
        period_s = self.ttl_ms / 4000
        last_ok = time.monotonic()
        while not self._stop.wait(period_s):
            try:
                if self._renew(keys=[self.key], args=[self.owner, self.ttl_ms]) == 1:
                    last_ok = time.monotonic()
                    continue
                logger.error("lease lost key=%s owner=%s holder=%s", self.key, self.owner, self.holder())
                self.lost.set()
                return
            except redis.RedisError as exc:
                if time.monotonic() - last_ok > self.ttl_ms / 2000:
                    logger.error(
                        "lease not renewed for %.1f s key=%s error=%s",
                        time.monotonic() - last_ok,
                        self.key,
                        exc,
                    )
                    self.lost.set()
                    return
                logger.warning("lease renewal failed key=%s error=%s (retrying)", self.key, exc)

    def release(self) -> None:
        """Hand the lease back at a graceful stop, so a standby need not wait for it to expire."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)
        try:
            self._release(keys=[self.key], args=[self.owner])
        except redis.RedisError as exc:
            logger.warning("lease release failed key=%s error=%s (it expires by itself)", self.key, exc)
