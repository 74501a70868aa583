"""The service registry in Redis: which FleetFence services are running, and where to ask them.

Every long-running service process (the admin API, each gateway replica, the processor driver,
each `alerts run` process, the archive writer) announces itself while it runs: one key per
instance, `{prefix}services:{kind}:{instance}` (`ReadKeys.service`), holding a JSON record (kind,
instance, host, pid, started_at in UTC ISO 8601, metrics_url, health_url or null, version, ttl_s)
with a TTL (`FLEETFENCE_REGISTRY_TTL_S`, 15 s) that a daemon thread refreshes every third of it.
A clean stop deletes the key, and only if it still holds this process's record (a newer process
with the same instance id keeps its own); a killed process's key expires with its TTL, and until
then `fleetfence status` reports it as not answering.

Redis is shared infrastructure every deployment has, but the registry is only for operators: a
Redis failure never reaches a service's data path. The heartbeat logs one warning when Redis stops
answering (and one line when it answers again) and keeps trying.

`announce` and `presence` are the writing side (a service's `with` block); `registered` and
`check` the reading side (`fleetfence status`).
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from http.client import HTTPException
from typing import Any

import orjson
import redis
from prometheus_client import REGISTRY
from prometheus_client.registry import CollectorRegistry

from fleetfence import __version__
from fleetfence.errors import ServiceUnavailableError
from fleetfence.metrics import MetricsServer, Scrape, http_get, parse_exposition, serve_metrics
from fleetfence.readmodels import ReadKeys
from fleetfence.settings import Settings

logger = logging.getLogger(__name__)

KINDS = ("api", "gateway", "processor", "alerts", "archive")
REDIS_TIMEOUT_S = 2.0
# Delete the key only while it still holds our own record: a newer process announcing the same
# instance (a restarted replica) must not vanish because the old one stopped after it.
_DELETE_IF_OURS = (
    "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0"
)


@dataclass(frozen=True)
class ServiceRecord:
    """What a running service says about itself (the JSON value of its registry key)."""

    kind: str
    instance: str
    host: str
    pid: int
    started_at: str
    metrics_url: str | None
    health_url: str | None
    version: str
    ttl_s: float
    # A device edge's (gateway.edge): where vehicles connect to it, mqtt://host:port.
    device_url: str | None = None

    def to_json(self) -> bytes:
        return orjson.dumps(asdict(self))

    @classmethod
    def from_json(cls, raw: bytes | str) -> ServiceRecord:
        d = orjson.loads(raw)
        return cls(
            kind=str(d["kind"]),
            instance=str(d["instance"]),
            host=str(d.get("host", "")),
            pid=int(d.get("pid", 0)),
            started_at=str(d["started_at"]),
            metrics_url=d.get("metrics_url"),
            health_url=d.get("health_url"),
            version=str(d.get("version", "")),
            ttl_s=float(d.get("ttl_s", 0.0)),
            device_url=d.get("device_url"),
        )

    @property
    def uptime_s(self) -> float:
        return max(0.0, (datetime.now(UTC) - datetime.fromisoformat(self.started_at)).total_seconds())


def new_record(
    kind: str,
    instance: str,
    *,
    metrics_url: str | None,
    health_url: str | None = None,
    ttl_s: float = 15.0,
    device_url: str | None = None,
) -> ServiceRecord:
    """This process's record, started now."""
    return ServiceRecord(
        kind=kind,
        instance=instance,
        host=socket.gethostname(),
        pid=os.getpid(),
        started_at=datetime.now(UTC).isoformat(timespec="milliseconds"),
        metrics_url=metrics_url,
        health_url=health_url,
        version=__version__,
        ttl_s=ttl_s,
        device_url=device_url,
    )


class Announcer:
    """Keeps one record in the registry while it runs: `start()`, `stop()`, or `with`.

    The heartbeat is `SET key record PX ttl GET` every `ttl / 3`: the old value it returns tells a
    second process announcing the same instance id apart (logged once, a misconfiguration)."""

    def __init__(self, redis_dsn: str, keys: ReadKeys, record: ServiceRecord) -> None:
        self.record = record
        self.key = keys.service(record.kind, record.instance)
        self.interval_s = record.ttl_s / 3
        self.beats = 0
        self.failures = 0
        self._value = record.to_json()
        self._redis: redis.Redis | None = None
        try:
            self._redis = redis.Redis.from_url(
                redis_dsn, socket_timeout=REDIS_TIMEOUT_S, socket_connect_timeout=REDIS_TIMEOUT_S
            )
        except ValueError as exc:  # a malformed URL must not stop the service it would announce
            logger.warning("service registry disabled: bad Redis URL key=%s error=%s", self.key, exc)
        self._reachable: bool | None = None
        self._duplicate_logged = False
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> Announcer:
        self._thread = threading.Thread(
            target=self._run, name=f"registry-{self.record.kind}-{self.record.instance}", daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop the heartbeat and delete the key if it still holds this record (never raises)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(REDIS_TIMEOUT_S * 3)
        if self._redis is None:
            return
        try:
            self._redis.eval(_DELETE_IF_OURS, 1, self.key, self._value)
        except redis.RedisError as exc:
            logger.warning(
                "service registry unreachable on stop, the key expires by itself key=%s ttl_s=%s error=%s",
                self.key,
                self.record.ttl_s,
                exc,
            )
        finally:
            self._redis.close()

    def __enter__(self) -> Announcer:
        return self.start()

    def __exit__(self, *_exc: object) -> None:
        self.stop()

    def _run(self) -> None:
        delay = 0.0
        while not self._stop.wait(delay):
            self.beat()
            delay = self.interval_s

    def _newer(self, old: Any) -> bool:
        """Whether the record this beat replaced belongs to a process that started after this one:
        a second live process with the same instance id. A predecessor's record (a replica
        restarted within the TTL after a kill) started before, and is no misconfiguration."""
        try:
            return ServiceRecord.from_json(old).started_at > self.record.started_at
        except (ValueError, KeyError, TypeError):
            return True

    def beat(self) -> bool:
        """One heartbeat; False (logged, counted) when Redis did not take it."""
        if self._redis is None:
            self.failures += 1
            return False
        try:
            old = self._redis.set(self.key, self._value, px=int(self.record.ttl_s * 1000), get=True)
        except redis.RedisError as exc:
            self.failures += 1
            if self._reachable is not False:
                logger.warning(
                    "service registry unreachable, the service runs on and keeps trying key=%s error=%s",
                    self.key,
                    exc,
                )
            self._reachable = False
            return False
        if self._reachable is False:
            logger.info("service registry reachable again key=%s", self.key)
        elif self._reachable is None:
            logger.info("service announced key=%s metrics_url=%s", self.key, self.record.metrics_url)
        self._reachable = True
        self.beats += 1
        if old is not None and old != self._value and not self._duplicate_logged and self._newer(old):
            self._duplicate_logged = True
            logger.warning(
                "another process announces the same service instance: give each its own id key=%s other=%r",
                self.key,
                old,
            )
        return True


@contextmanager
def announce(
    settings: Settings, kind: str, instance: str, *, metrics_url: str | None, health_url: str | None = None
) -> Iterator[Announcer]:
    """Announce this process as `kind`/`instance` in the registry of `settings`' Redis while the
    block runs."""
    record = new_record(
        kind, instance, metrics_url=metrics_url, health_url=health_url, ttl_s=settings.registry_ttl_s
    )
    with Announcer(settings.redis_dsn, ReadKeys(settings.redis_prefix), record) as announcer:
        yield announcer


@dataclass
class Presence:
    """A service's metrics endpoint (None when turned off) and its registry announcement."""

    metrics: MetricsServer | None
    announcer: Announcer


@contextmanager
def presence(
    settings: Settings,
    kind: str,
    instance: str,
    *,
    metrics_port: int,
    default_port: int,
    registry: CollectorRegistry = REGISTRY,
) -> Iterator[Presence]:
    """What every service process does around its run loop: serve its metrics
    (`fleetfence.metrics.serve_metrics`) and announce itself with their real URL; both end with
    the block (the announcement first, so status never sends anyone to a closed port)."""
    server = serve_metrics(kind, settings.host, metrics_port, default_port=default_port, registry=registry)
    try:
        with announce(settings, kind, instance, metrics_url=server.url if server else None) as a:
            yield Presence(server, a)
    finally:
        if server is not None:
            server.close()


# --------------------------------------------------------------------------- reading (status)


@dataclass(frozen=True)
class Registered:
    """A registry entry as read: the record and how long until its key expires."""

    key: str
    record: ServiceRecord
    expires_in_s: float

    @property
    def last_heartbeat_s(self) -> float:
        """Seconds since the last heartbeat (the TTL minus what is left of it)."""
        return max(0.0, self.record.ttl_s - self.expires_in_s)


def registered(settings: Settings) -> list[Registered]:
    """Every announced service, ordered by kind (`KINDS`) and instance. Raises
    ServiceUnavailableError when Redis does not answer."""
    keys = ReadKeys(settings.redis_prefix)
    r = redis.Redis.from_url(
        settings.redis_dsn, socket_timeout=REDIS_TIMEOUT_S, socket_connect_timeout=REDIS_TIMEOUT_S
    )
    try:
        names = sorted({k.decode() for k in r.scan_iter(match=keys.services_pattern, count=1000)})
        if not names:
            return []
        pipe = r.pipeline(transaction=False)
        for k in names:
            pipe.get(k)
            pipe.pttl(k)
        replies = pipe.execute()
    except redis.RedisError as exc:
        raise ServiceUnavailableError(f"service registry: Redis {settings.redis_dsn}: {exc}") from exc
    finally:
        r.close()
    out: list[Registered] = []
    for i, key in enumerate(names):
        raw, pttl = replies[2 * i], replies[2 * i + 1]
        if raw is None:  # expired between SCAN and GET
            continue
        try:
            rec = ServiceRecord.from_json(raw)
        except (ValueError, KeyError, TypeError) as exc:
            logger.warning("unreadable service registry entry key=%s error=%s", key, exc)
            continue
        out.append(Registered(key, rec, max(pttl, 0) / 1000))
    order = {k: i for i, k in enumerate(KINDS)}
    out.sort(key=lambda e: (order.get(e.record.kind, len(KINDS)), e.record.kind, e.record.instance))
    return out


@dataclass(frozen=True)
class ServiceCheck:
    """One registered service, asked: `answered` is None when it has no endpoint to ask (its
    heartbeat is then all there is)."""

    entry: Registered
    answered: bool | None
    detail: str
    metrics: Scrape | None

    def as_dict(self) -> dict[str, Any]:
        rec = self.entry.record
        return {
            **asdict(rec),
            "uptime_s": round(rec.uptime_s, 1),
            "last_heartbeat_s": round(self.entry.last_heartbeat_s, 1),
            "answered": self.answered,
            "detail": self.detail,
        }


def check(entry: Registered, timeout_s: float = 2.0) -> ServiceCheck:
    """Ask a registered service: its health endpoint (when it has one) must answer 200 and its
    metrics endpoint (when it has one) must answer with an exposition."""
    rec = entry.record
    if rec.health_url is None and rec.metrics_url is None:
        return ServiceCheck(entry, None, "no endpoint (metrics off): heartbeat only", None)
    details: list[str] = []
    if rec.health_url is not None:
        try:
            status, _ = http_get(rec.health_url, timeout_s)
        except OSError as exc:
            return ServiceCheck(entry, False, f"health: {_reason(exc)}", None)
        except (HTTPException, ValueError) as exc:  # something else answers on that port, or a bad URL
            return ServiceCheck(entry, False, f"health: not an HTTP answer: {exc!r}", None)
        details.append(f"health {status}")
    scraped: Scrape | None = None
    if rec.metrics_url is not None:
        started = time.monotonic()
        try:
            _, body = http_get(rec.metrics_url, timeout_s)
            scraped = parse_exposition(body)
        except OSError as exc:
            return ServiceCheck(entry, False, f"metrics: {_reason(exc)}", None)
        except (HTTPException, ValueError) as exc:
            return ServiceCheck(entry, False, f"metrics: not a Prometheus exposition: {exc}", None)
        details.append(f"metrics {int((time.monotonic() - started) * 1000)} ms")
    return ServiceCheck(entry, True, ", ".join(details), scraped)


def _reason(exc: OSError) -> str:
    reason = getattr(exc, "reason", None)
    return str(reason if reason is not None else exc) or type(exc).__name__


def check_all(entries: list[Registered], timeout_s: float = 2.0) -> list[ServiceCheck]:
    """`check` every entry, in parallel (one slow replica costs one timeout, not one each)."""
    if not entries:
        return []
    with ThreadPoolExecutor(max_workers=min(16, len(entries))) as pool:
        return list(pool.map(lambda e: check(e, timeout_s), entries))
