"""Which protocol each vehicle last spoke on the device edge (a read model, like
`fleetfence.readmodels`'s), for the people who run the fleet:
the API (`GET /api/v1/vehicles/{id}/heard`), the map and `fleetfence status` read it. A fleet
moving from one tracker to another (a phone app while a Teltonika unit is fitted) wants to see
which one a vehicle is actually heard through.

The edge notes every fix it hands to Kafka (`note`, on its loop thread: a dictionary lookup) and
writes a vehicle again once `REWRITE_S` passed, or at once when its protocol changed, in one
pipeline from a worker thread (`write`) each time the edge's sweep runs (every half second): Redis
sees a vehicle at most once a sweep whatever the fleet's rate, and once every `REWRITE_S` while
it keeps to one protocol (one heard on two at once is written every sweep). What
it writes is a read model, not a record: a crash loses at most the last `REWRITE_S` of it, and the
next fix writes it again. Vehicles not heard for `FORGET_AFTER_MS` leave it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import orjson
import redis

from fleetfence.readmodels import ReadKeys

REWRITE_S = 30.0  # a vehicle heard on the same protocol is written again after this long
MQTT = "mqtt"  # FleetFence's own JSON over MQTT (a tracker protocol names itself)
PROTOCOLS = ("mqtt", "teltonika", "osmand", "owntracks")
FORGET_AFTER_MS = 30 * 86_400_000  # a vehicle not heard for 30 days leaves the per-protocol sets


@dataclass(frozen=True, slots=True)
class Heard:
    """How the edge last heard one vehicle."""

    protocol: str
    at_ms: int
    replica: str

    def to_json(self) -> bytes:
        return orjson.dumps({"protocol": self.protocol, "at_ms": self.at_ms, "replica": self.replica})

    @staticmethod
    def from_json(raw: bytes | str) -> Heard:
        d = orjson.loads(raw)
        return Heard(protocol=str(d["protocol"]), at_ms=int(d["at_ms"]), replica=str(d.get("replica", "")))


class HeardLog:
    """The vehicles heard since the last `take`, each at most every `rewrite_s` per protocol."""

    def __init__(self, replica: str, rewrite_s: float = REWRITE_S) -> None:
        self.replica = replica
        self.rewrite_s = rewrite_s
        self._written: dict[bytes, tuple[str, float]] = {}  # vehicle -> (protocol, when noted)
        self._pending: dict[bytes, Heard] = {}
        self._pruned_mono_s = 0.0

    def note(self, vehicle_key: bytes, protocol: str, now_mono_s: float) -> None:
        last = self._written.get(vehicle_key)
        if last is not None and last[0] == protocol and now_mono_s - last[1] < self.rewrite_s:
            return
        self._written[vehicle_key] = (protocol, now_mono_s)
        self._pending[vehicle_key] = Heard(protocol, time.time_ns() // 1_000_000, self.replica)

    def take(self, now_mono_s: float) -> dict[bytes, Heard]:
        """What to write now; vehicles whose last write is older than `rewrite_s` are forgotten
        here (their next fix is written anyway), so the edge keeps only its recent vehicles."""
        out, self._pending = self._pending, {}
        if now_mono_s - self._pruned_mono_s >= self.rewrite_s:  # one pass over the fleet each period
            self._pruned_mono_s = now_mono_s
            self._written = {k: v for k, v in self._written.items() if now_mono_s - v[1] < self.rewrite_s}
        return out

    def __len__(self) -> int:
        return len(self._pending)


def write(r: redis.Redis, keys: ReadKeys, heard: dict[bytes, Heard]) -> None:
    """One pipeline: each vehicle's record, and its place in its protocol's set (out of the others)."""
    pipe = r.pipeline(transaction=False)
    newest = 0
    for vehicle, h in heard.items():
        pipe.hset(keys.heard, vehicle, h.to_json())
        pipe.zadd(keys.heard_by(h.protocol), {vehicle: h.at_ms})
        for other in PROTOCOLS:
            if other != h.protocol:
                pipe.zrem(keys.heard_by(other), vehicle)
        newest = max(newest, h.at_ms)
    pipe.execute()
    forget(r, keys, newest - FORGET_AFTER_MS)


def forget(r: redis.Redis, keys: ReadKeys, before_ms: int) -> None:
    """Vehicles last heard before `before_ms` leave the read model."""
    for p in PROTOCOLS:
        old = r.zrangebyscore(keys.heard_by(p), "-inf", before_ms, start=0, num=10_000)
        if old:
            pipe = r.pipeline(transaction=False)
            pipe.hdel(keys.heard, *old)
            pipe.zrem(keys.heard_by(p), *old)
            pipe.execute()


def drop(r: redis.Redis, keys: ReadKeys, vehicle_id: str) -> None:
    """A deleted vehicle leaves the read model with it."""
    pipe = r.pipeline(transaction=False)
    pipe.hdel(keys.heard, vehicle_id)
    for p in PROTOCOLS:
        pipe.zrem(keys.heard_by(p), vehicle_id)
    pipe.execute()


def heard_of(r: redis.Redis, keys: ReadKeys, vehicle_id: str) -> Heard | None:
    raw = r.hget(keys.heard, vehicle_id)
    return None if raw is None else Heard.from_json(raw)


def heard_counts(r: redis.Redis, keys: ReadKeys, since_ms: int) -> dict[str, int]:
    """Per protocol, the vehicles last heard on it since `since_ms`."""
    pipe = r.pipeline(transaction=False)
    for p in PROTOCOLS:
        pipe.zcount(keys.heard_by(p), since_ms, "+inf")
    return dict(zip(PROTOCOLS, (int(n) for n in pipe.execute()), strict=True))
