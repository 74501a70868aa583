"""Which alerts a receiver already handled: the store the runner checks before a side effect and
marks after it (alerts/runner.py, steps 3 and 5)."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from typing import Protocol

import redis

from fleetfence.contracts import utc_now_ms


class Dedup(Protocol):
    def seen(self, alert_id: str) -> bool: ...

    def mark(self, alert_id: str) -> None: ...

    def seen_many(self, ids: Sequence[str]) -> list[bool]:
        """`seen` of each id, in one round trip where the store allows it."""
        ...

    def mark_many(self, ids: Sequence[str]) -> None:
        """`mark` of each id, in one round trip where the store allows it."""
        ...


class RedisDedup:
    """`{prefix}alerts:seen:{receiver}:{alert_id}` with an expiry: survives the receiver's crashes.

    The expiry bounds memory; it must exceed the longest replay a receiver can make (a group
    reset to the start of a 30-day topic would re-deliver alerts older than the expiry).
    """

    def __init__(self, client: redis.Redis, prefix: str, receiver: str, ttl_s: int) -> None:
        self._r = client
        self._base = f"{prefix}alerts:seen:{receiver}:"
        self._ttl_s = ttl_s

    def key(self, alert_id: str) -> str:
        return self._base + alert_id

    def seen(self, alert_id: str) -> bool:
        return bool(self._r.exists(self._base + alert_id))

    def mark(self, alert_id: str) -> None:
        self._r.set(self._base + alert_id, utc_now_ms(), ex=self._ttl_s)

    def seen_many(self, ids: Sequence[str]) -> list[bool]:
        pipe = self._r.pipeline(transaction=False)
        for i in ids:
            pipe.exists(self._base + i)
        return [bool(x) for x in pipe.execute()]

    def mark_many(self, ids: Sequence[str]) -> None:
        now = utc_now_ms()
        pipe = self._r.pipeline(transaction=False)
        for i in ids:
            pipe.set(self._base + i, now, ex=self._ttl_s)
        pipe.execute()


class MemoryDedup:
    """A bounded in-memory store for receivers without durable side effects (the terminal tail)."""

    def __init__(self, capacity: int = 100_000) -> None:
        self._ids: OrderedDict[str, None] = OrderedDict()
        self._capacity = capacity

    def seen(self, alert_id: str) -> bool:
        return alert_id in self._ids

    def mark(self, alert_id: str) -> None:
        self._ids[alert_id] = None
        if len(self._ids) > self._capacity:
            self._ids.popitem(last=False)

    def seen_many(self, ids: Sequence[str]) -> list[bool]:
        return [self.seen(i) for i in ids]

    def mark_many(self, ids: Sequence[str]) -> None:
        for i in ids:
            self.mark(i)
