"""Wiring: receivers from config to running runners, in-process (`AlertService`) or as the CLI.

The service owns the shared clients (one Redis pool, one idempotent producer for dead letters)
and one runner thread per receiver. Tests, the demo and `fleetfence alerts run` all use it.
"""

from __future__ import annotations

import logging
import socket
import threading
import time
import uuid
from contextlib import AbstractContextManager
from typing import TextIO

import redis
from confluent_kafka import Producer
from prometheus_client import CollectorRegistry

from alerts.config import (
    ALERTS_METRICS_PORT,
    AlertsSettings,
    AnyReceiver,
    HistoryConfig,
    MqttConfig,
    ReceiversFile,
    WebhookConfig,
)
from alerts.dead_letters import DeadLetters
from alerts.dedup import MemoryDedup, RedisDedup
from alerts.email import EmailSink
from alerts.errors import ReceiverCrashedError
from alerts.history import HistorySink
from alerts.metrics import ReceiverMetrics, Snapshot
from alerts.model import AlertFilter
from alerts.mqtt_fanout import MqttFanoutSink
from alerts.runner import ReceiverRunner, RunnerOptions
from alerts.sink import Sink
from alerts.tail import TailSink
from alerts.webhook import WebhookSink
from fleetfence.errors import ServiceUnavailableError
from fleetfence.kafka import idempotent_producer
from fleetfence.mqtt import service_account
from fleetfence.registry import Presence, presence
from fleetfence.service import run_until_stopped, stop_on_signals

logger = logging.getLogger(__name__)


def group_id(settings: AlertsSettings, receiver: str) -> str:
    """Groups carry the topic prefix so installations (and tests) sharing a broker never mix."""
    return f"{settings.topic_prefix}fleetfence.alerts.{receiver}"


class AlertService:
    """All configured receivers of one process; `start()`, `stop()`, or `with service:`."""

    def __init__(
        self,
        settings: AlertsSettings,
        config: ReceiversFile,
        registry: CollectorRegistry | None = None,
    ) -> None:
        self.settings = settings
        self.config = config
        self.registry = registry
        self.runners: dict[str, ReceiverRunner] = {}
        self._redis: redis.Redis | None = None
        self._producer: Producer | None = None

    def _redis_client(self) -> redis.Redis:
        if self._redis is None:
            self._redis = redis.Redis.from_url(
                self.settings.redis_dsn, socket_timeout=10, socket_connect_timeout=5, health_check_interval=30
            )
            try:
                self._redis.ping()
            except redis.RedisError as exc:
                raise ServiceUnavailableError(f"Redis {self.settings.redis_dsn} unreachable: {exc}") from exc
        return self._redis

    def _dlq_producer(self) -> Producer:
        if self._producer is None:
            self._producer = idempotent_producer(self.settings.bootstrap_servers, **{"linger.ms": 0})
        return self._producer

    def _build(self, cfg: AnyReceiver) -> ReceiverRunner:
        s = self.settings
        dedup = RedisDedup(self._redis_client(), s.redis_prefix, cfg.name, s.alerts_dedup_ttl_s)
        sink: Sink
        if isinstance(cfg, HistoryConfig):
            sink = HistorySink(
                self._redis_client(), s.redis_prefix, retention_ms=round(cfg.retention_days * 86_400_000)
            )
        elif isinstance(cfg, MqttConfig):
            host, port = s.mqtt_host_port
            sink = MqttFanoutSink(cfg, host, port, account=service_account(s, "alerts"))
        elif isinstance(cfg, WebhookConfig):
            sink = WebhookSink(cfg)
        else:
            sink = EmailSink(cfg, dedup)  # records per recipient in the receiver's own store
        options = RunnerOptions(
            bootstrap=s.bootstrap_servers,
            topic=s.topics.alerts,
            group_id=cfg.group_id or group_id(s, cfg.name),
            commit_interval_ms=s.alerts_commit_interval_ms,
            instance_id=f"{s.alerts_instance_id or socket.gethostname()}.{cfg.name}",
        )
        return ReceiverRunner(
            cfg.name,
            sink,
            alert_filter=cfg.filter.build(),
            options=options,
            dedup=dedup,
            metrics=ReceiverMetrics(cfg.name, self.registry),
            dead_letters=DeadLetters(self._dlq_producer(), s.topics.alerts_dlq, cfg.name),
        )

    def start(self) -> AlertService:
        try:
            for cfg in self.config.enabled:
                self.runners[cfg.name] = self._build(cfg)
        except BaseException:
            self.stop()
            raise
        for r in self.runners.values():
            r.start()
        logger.info("alert receivers started receivers=%s", ",".join(self.runners))
        return self

    def stop(self) -> None:
        for r in self.runners.values():
            r._stop.set()  # signal all first so they wind down in parallel
        for r in self.runners.values():
            r.stop()
        for r in self.runners.values():
            if r._thread is None:  # built but never started: release its sink
                r.sink.close()
        if self._producer is not None:
            self._producer.flush(10)
            self._producer = None
        if self._redis is not None:
            self._redis.close()
            self._redis = None

    def __enter__(self) -> AlertService:
        return self.start()

    def __exit__(self, *_exc: object) -> None:
        self.stop()

    def snapshots(self) -> dict[str, Snapshot]:
        return {name: r.metrics.snapshot() for name, r in self.runners.items()}

    def failed(self) -> dict[str, BaseException]:
        return {name: r.error for name, r in self.runners.items() if r.error is not None}

    def wait_assigned(self, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        return all(r.wait_assigned(max(0.0, deadline - time.monotonic())) for r in self.runners.values())


def run_forever(settings: AlertsSettings, config: ReceiversFile) -> None:
    """`fleetfence alerts run`: run until SIGINT/SIGTERM; raise if a receiver crashes."""
    with receivers_presence(settings):
        _run_forever(settings, config)


def receivers_presence(settings: AlertsSettings) -> AbstractContextManager[Presence]:
    """The process's metrics endpoint (every receiver's counters, label `receiver`) and its
    announcement in the service registry, as its instance id (`FLEETFENCE_ALERTS_INSTANCE_ID`)."""
    return presence(
        settings,
        "alerts",
        settings.alerts_instance_id or socket.gethostname(),
        metrics_port=settings.alerts_metrics_port,
        default_port=ALERTS_METRICS_PORT,
    )


def _run_forever(settings: AlertsSettings, config: ReceiversFile) -> None:
    service = AlertService(settings, config)

    def healthy(stop: threading.Event) -> bool:
        stop.wait(0.5)
        failed = service.failed()
        if failed:
            name, exc = next(iter(failed.items()))
            raise ReceiverCrashedError(f"receiver {name!r} crashed: {exc}")
        return False

    with stop_on_signals() as stop:
        service.start()
        try:
            run_until_stopped(lambda: healthy(stop), stop)
        finally:
            service.stop()
            for name, snap in service.snapshots().items():
                logger.info("receiver totals receiver=%s %s", name, snap)


def tail(
    settings: AlertsSettings,
    alert_filter: AlertFilter,
    *,
    as_json: bool,
    from_beginning: bool,
    limit: int | None,
    group: str | None,
    out: TextIO | None = None,
) -> int:
    """Print alerts until interrupted or `limit` alerts were shown; returns how many were shown."""
    sink = TailSink(as_json, limit, out)
    durable = group is not None
    options = RunnerOptions(
        bootstrap=settings.bootstrap_servers,
        topic=settings.topics.alerts,
        group_id=group or f"{settings.topic_prefix}fleetfence.alerts.tail-{uuid.uuid4().hex[:12]}",
        commit=durable,
        commit_interval_ms=settings.alerts_commit_interval_ms,
        from_latest=not from_beginning,
    )
    runner = ReceiverRunner(
        "tail",
        sink,
        alert_filter=alert_filter,
        options=options,
        dedup=MemoryDedup(),
        metrics=ReceiverMetrics("tail", CollectorRegistry()),
        dead_letters=None,
    )

    def ended(stop: threading.Event) -> bool:
        stop.wait(0.2)
        return sink.done.is_set() or not runner.running

    with stop_on_signals() as stop:
        runner.start()
        try:
            run_until_stopped(lambda: ended(stop), stop)
        finally:
            runner.stop()
    if runner.error is not None:
        raise ReceiverCrashedError(f"tail failed: {runner.error}")
    return sink.count
