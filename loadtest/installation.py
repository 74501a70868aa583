"""The installation a load test measures: what it can see of the services, wherever they run.

Two kinds, one `Installation` protocol the driver reads:
- `embedded.pipeline.Pipeline`: the whole pipeline started by the load test on this machine (the
  default); it knows every process because it spawned them, and stops them at the end.
- `RunningInstallation` (`fleetfence loadtest --attach`): an installation that is already running,
  reached through the usual endpoint settings (FLEETFENCE_KAFKA_BOOTSTRAP, FLEETFENCE_MQTT_URL,
  FLEETFENCE_REDIS_URL, FLEETFENCE_REDIS_PREFIX); its services are found in the service registry
  (`fleetfence.registry`, what `fleetfence status` lists), and the load test starts and stops
  none of them.

The load test counts the run in Kafka (`loadtest.taps`), so a service of a running installation
that is restarted or killed during the run (a fault under test, or the installation restarted
under it) is noted, not fatal: its vehicles reconnect with their credentials and send again what
was not acknowledged, as real trackers do, and the run still verifies and reconciles. The gateways'
metrics are read too (their own counts, and the processes to measure), so every registered gateway
must serve them.
"""

from __future__ import annotations

import logging
import socket
import time
from pathlib import Path
from typing import Any, Protocol

import redis
from confluent_kafka.admin import AdminClient

from alerts.config import AlertsSettings
from alerts.service import group_id
from embedded import infra
from embedded.processes import read_pid
from fleetfence.errors import ServiceUnavailableError
from fleetfence.readmodels import ReadKeys
from fleetfence.registry import REDIS_TIMEOUT_S, Registered, ServiceRecord, check_all, registered
from fleetfence.settings import Settings
from loadtest.errors import LoadtestError

logger = logging.getLogger(__name__)

RESCAN_S = 15.0  # how often a running installation's registry is scanned for new replicas


class Installation(Protocol):
    """What the driver needs of the installation under test."""

    # Where its vehicles connect (mqtt://host:port each: the device edges); empty: the broker.
    # FLEETFENCE_SIMULATOR_MQTT_URL, when set, wins.
    device_urls: list[str]

    def check_alive(self) -> None:
        """Raise ServiceUnavailableError when a service the run needs is gone for good (the
        embedded pipeline, which has no restart policy); an installation whose services restart
        by themselves notes it instead (`RunningInstallation.events`)."""

    def pids(self) -> dict[str, int]:
        """The processes on this machine to measure (CPU, RSS), by name."""

    def metrics_urls(self, prefix: str = "") -> dict[str, str]:
        """Prometheus endpoints by service name, those whose name starts with `prefix`."""

    def describe(self) -> dict[str, Any]:
        """What the report says about the installation it measured."""


def receiver_groups(settings: Settings, timeout_s: float = 10.0) -> list[str]:
    """The alert receivers' consumer groups on this broker (`alerts.service.group_id`: the topic
    prefix, then `fleetfence.alerts.<receiver>`), whatever receivers the installation runs."""
    head = group_id(AlertsSettings.from_base(settings), "")
    admin = AdminClient({"bootstrap.servers": settings.bootstrap_servers})
    try:
        listing = admin.list_consumer_groups(request_timeout=timeout_s).result(timeout=timeout_s)
    except Exception as exc:  # KafkaException or a timeout: the broker did not answer
        raise ServiceUnavailableError(f"Kafka {settings.bootstrap_servers}: consumer groups: {exc}") from exc
    return sorted(g.group_id for g in listing.valid if g.group_id.startswith(head))


def _name(rec: ServiceRecord) -> str:
    """A service's name in the report: its kind, then its instance (a gateway replica's client id)."""
    return f"{rec.kind}-{rec.instance}"


def _identity(rec: ServiceRecord) -> tuple[str, int, str]:
    return rec.host, rec.pid, rec.started_at


class RunningInstallation:
    """An installation that runs without the load test: its services as the registry lists them.

    Raises LoadtestError when what a load test needs is not there: no gateway, a gateway without
    a metrics endpoint (its counts are reported beside the run's), no processor, or a registered service
    that does not answer."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.keys = ReadKeys(settings.redis_prefix)
        self.hostname = socket.gethostname()
        entries = registered(settings)
        self._check_needed(entries)
        bad = [c for c in check_all(entries) if c.answered is False]
        if bad:
            raise LoadtestError(
                "registered services do not answer: "
                + "; ".join(f"{_name(c.entry.record)}: {c.detail}" for c in bad)
                + " (fleetfence status shows the installation)"
            )
        self.known: dict[str, Registered] = {e.key: e for e in entries}
        # The device edges' own word on where vehicles connect (gateways that read Mosquitto have none).
        self.device_urls = sorted(
            e.record.device_url for e in entries if e.record.kind == "gateway" and e.record.device_url
        )
        self._missing_since: dict[str, float] = {}
        self.events: list[str] = []  # restarts seen during the run, for its report
        self._scanned = time.monotonic()
        self._redis = redis.Redis.from_url(
            settings.redis_dsn, socket_timeout=REDIS_TIMEOUT_S, socket_connect_timeout=REDIS_TIMEOUT_S
        )
        logger.info("loadtest attached services=%s", ",".join(_name(e.record) for e in self.known.values()))

    def _check_needed(self, entries: list[Registered]) -> None:
        s = self.settings
        where = f"in the service registry of Redis {s.redis_dsn} (prefix {s.redis_prefix!r})"
        kinds = {e.record.kind for e in entries}
        if "gateway" not in kinds:
            raise LoadtestError(
                f"no gateway is registered {where}: is the installation running, and do "
                "FLEETFENCE_REDIS_URL and FLEETFENCE_REDIS_PREFIX point at it?"
            )
        if "processor" not in kinds:
            raise LoadtestError(f"no processor is registered {where}: nothing would turn fixes into alerts")
        blind = [
            e.record.instance for e in entries if e.record.kind == "gateway" and not e.record.metrics_url
        ]
        if blind:
            raise LoadtestError(
                f"gateway replicas {', '.join(blind)} serve no metrics (FLEETFENCE_GATEWAY_METRICS_PORT=0): "
                "the load test counts what each replica received, forwarded and dead-lettered there"
            )

    # ------------------------------------------------------------------ Installation

    def check_alive(self) -> None:
        """Note which services left the registry, came back or were restarted since the last
        call (`events`), and add a replica that joined (counted from zero). Never raises: the run
        is counted in Kafka, which every process of a service continues."""
        keys = list(self.known)
        try:
            raws = self._redis.mget(keys) if keys else []
        except redis.RedisError as exc:
            # Redis itself restarting (a fault under test): the registry cannot be read this
            # second; the services' identities are checked again at the next sample.
            logger.warning(
                "loadtest service registry unreadable redis=%s error=%s", self.settings.redis_dsn, exc
            )
            return
        now_s = time.monotonic()
        for key, raw in zip(keys, raws, strict=True):
            rec = self.known[key].record
            if raw is None:
                # Stopped, killed, frozen past its key's expiry, or Redis restarted (its keys
                # expired while it was down) and the service not yet announced again.
                if key not in self._missing_since:
                    self._missing_since[key] = now_s
                    logger.warning("loadtest a service left the registry name=%s", _name(rec))
                continue
            if self._missing_since.pop(key, None) is not None:
                logger.info("loadtest a service is in the registry again name=%s", _name(rec))
            now = ServiceRecord.from_json(raw)
            if _identity(now) != _identity(rec):
                logger.warning(
                    "loadtest a service restarted name=%s pid=%s->%s", _name(rec), rec.pid, now.pid
                )
                self.events.append(f"{_name(rec)} restarted during the run (pid {rec.pid} -> {now.pid})")
                self.known[key] = Registered(key, now, self.known[key].expires_in_s)
        if time.monotonic() - self._scanned >= RESCAN_S:
            self._scanned = time.monotonic()
            try:
                entries = registered(self.settings)
            except ServiceUnavailableError as exc:
                logger.warning("loadtest service registry unreadable error=%s", exc)
                return
            for e in entries:
                if e.key not in self.known:
                    logger.info("loadtest a service joined during the run name=%s", _name(e.record))
                    self.known[e.key] = e

    def pids(self) -> dict[str, int]:
        """The registered services that run on this machine, and the embedded Kafka, Mosquitto and
        Redis when this machine's state folder started them (`fleetfence infra up`)."""
        out = {_name(e.record): e.record.pid for e in self.known.values() if e.record.host == self.hostname}
        for name in infra.service_names(self.settings):
            running = read_pid(self.settings, name)
            if running is not None and Path(f"/proc/{running[0]}").exists():
                out[name] = running[0]
        return out

    def metrics_urls(self, prefix: str = "") -> dict[str, str]:
        return {
            _name(e.record): e.record.metrics_url
            for e in self.known.values()
            if e.record.metrics_url and _name(e.record).startswith(prefix)
        }

    def describe(self) -> dict[str, Any]:
        """What the report says about the installation it measured."""
        return {
            "attached": True,
            "bootstrap_servers": self.settings.bootstrap_servers,
            "gateway_replicas": len(self.metrics_urls("gateway")),
            "services": sorted(_name(e.record) for e in self.known.values()),
            "remote_services": sorted(
                _name(e.record) for e in self.known.values() if e.record.host != self.hostname
            ),
        }

    def close(self) -> None:
        self._redis.close()
