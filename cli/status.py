"""`fleetfence status`: the infrastructure and every FleetFence service running on it.

The infrastructure part is `fleetfence infra status` (embedded.infra.status); the services come
from the service registry in Redis (fleetfence.registry), where each running service process
announces itself with a heartbeat, and each is asked at its endpoints: its health endpoint (the
admin API's /healthz) and its Prometheus endpoint, whose main counters are shown. The exit code
is 0 only when the infrastructure is healthy and every registered service with an endpoint
answered, so an operator or a deploy script can gate on it.
"""

from __future__ import annotations

import sys
import time
from dataclasses import asdict, dataclass
from typing import Annotated, Any
from urllib.parse import urlsplit, urlunsplit

import orjson
import redis
import typer
from rich.console import Console
from rich.table import Table

from cli.common import app, friendly_errors, settings_from_env
from cli.infra import print_status
from embedded import infra
from fleetfence.errors import ServiceUnavailableError
from fleetfence.heard import heard_counts
from fleetfence.metrics import Scrape
from fleetfence.readmodels import ReadKeys
from fleetfence.registry import ServiceCheck, check_all, registered
from fleetfence.settings import Settings
from gateway.core import shard_coverage

# The main counters of each kind of service: (name shown, Prometheus sample, label to split by).
# A labelled one shows its total and, in --json, one value per label value.
MAIN_COUNTERS: dict[str, tuple[tuple[str, str, str | None], ...]] = {
    "api": (
        ("requests", "fleetfence_api_requests_total", "status"),
        ("relay_published", "fleetfence_master_relay_published_total", None),
    ),
    "gateway": (
        ("received", "fleetfence_gateway_received_total", None),
        ("forwarded", "fleetfence_gateway_forwarded_total", None),
        ("dead_lettered", "fleetfence_gateway_dead_lettered_total", None),
        ("in_flight", "fleetfence_gateway_in_flight", None),
        ("mqtt_connected", "fleetfence_gateway_mqtt_connected", None),
    ),
    "processor": (
        ("committed_batches", "fleetfence_processor_committed_batches_total", None),
        ("records", "fleetfence_processor_records_total", "outcome"),
        ("alerts", "fleetfence_processor_alerts_total", None),
        ("held_fixes", "fleetfence_processor_held_fixes", None),
    ),
    "alerts": (
        ("consumed", "fleetfence_alert_receiver_consumed_total", None),
        ("delivered", "fleetfence_alert_receiver_delivered_total", "receiver"),
        ("failed", "fleetfence_alert_receiver_dead_lettered_total", "receiver"),
        ("retried", "fleetfence_alert_receiver_retried_total", None),
        ("lag", "fleetfence_alert_receiver_lag_messages", None),
    ),
    "archive": (
        ("batches", "fleetfence_archive_batches_total", None),
        ("rows", "fleetfence_archive_rows_total", "table"),
    ),
}

Counters = dict[str, float | dict[str, float]]


def main_counters(kind: str, scrape: Scrape) -> Counters:
    """The kind's main counters from one scrape (integers where they are whole; 0 when absent)."""
    out: Counters = {}
    for name, sample, label in MAIN_COUNTERS.get(kind, ()):
        if label is None:
            out[name] = _num(scrape.total(sample))  # 0 also for a labelled family with no child yet
        else:
            out[name] = {k: _num(v) for k, v in sorted(scrape.by_label(sample, label).items())}
    return out


def _num(v: float) -> float:
    return int(v) if float(v).is_integer() else round(v, 3)


@dataclass
class Report:
    """What `fleetfence status` found: the infrastructure, the registered services as asked just
    now (`registry_error` when the registry could not be read)."""

    infrastructure: list[infra.ServiceStatus]
    services: list[dict[str, Any]]
    registry_redis: str
    registry_keys: str
    registry_error: str | None
    gateway_shards: dict[str, tuple[int, int]]  # replica -> (index, count), as its metrics say
    # Vehicles the device edge heard in the last HEARD_WINDOW_S, by the protocol they last spoke
    # (fleetfence.heard); None when Redis could not be read.
    heard: dict[str, int] | None = None

    @property
    def shard_problems(self) -> list[str]:
        return shard_coverage(self.gateway_shards)

    @property
    def ok(self) -> bool:
        """The exit code's verdict: healthy infrastructure, a readable registry, every registered
        service with an endpoint answered, and every gateway shard served."""
        return (
            all(s.healthy for s in self.infrastructure)
            and self.registry_error is None
            and all(s["answered"] is not False for s in self.services)
            and not self.shard_problems
        )

    def as_json(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "infrastructure": [
                {**asdict(s), "mode": "embedded" if s.managed else "external"} for s in self.infrastructure
            ],
            "registry": {
                "redis": self.registry_redis,
                "keys": self.registry_keys,
                "error": self.registry_error,
            },
            "services": self.services,
            "gateway_shards": {
                "served": {k: {"index": i, "count": n} for k, (i, n) in sorted(self.gateway_shards.items())},
                "problems": self.shard_problems,
            },
            "vehicles_heard": {"window_s": HEARD_WINDOW_S, "by_protocol": self.heard},
        }


def collect(settings: Settings, timeout_s: float = 2.0) -> Report:
    """Ask the infrastructure and every registered service."""
    statuses = infra.status(settings)
    registry_error: str | None = None
    try:
        checks = check_all(registered(settings), timeout_s)
    except ServiceUnavailableError as exc:
        checks, registry_error = [], str(exc)
    return Report(
        heard=_heard(settings, timeout_s),
        infrastructure=statuses,
        services=[{**c.as_dict(), "counters": _counters(c)} for c in checks],
        registry_redis=_without_password(settings.redis_dsn),
        registry_keys=ReadKeys(settings.redis_prefix).service("*", "*"),
        registry_error=registry_error,
        gateway_shards=_gateway_shards(checks),
    )


HEARD_WINDOW_S = 600  # "heard lately": the last ten minutes


def _heard(settings: Settings, timeout_s: float) -> dict[str, int] | None:
    r = redis.Redis.from_url(settings.redis_dsn, socket_timeout=timeout_s, socket_connect_timeout=timeout_s)
    try:
        since_ms = time.time_ns() // 1_000_000 - HEARD_WINDOW_S * 1000
        return heard_counts(r, ReadKeys(settings.redis_prefix), since_ms)
    except redis.RedisError:
        return None
    finally:
        r.close()


def _gateway_shards(checks: list[ServiceCheck]) -> dict[str, tuple[int, int]]:
    """Each answering gateway's shard, from its `fleetfence_gateway_shard{index,count}` sample."""
    out: dict[str, tuple[int, int]] = {}
    for c in checks:
        if c.entry.record.kind != "gateway" or c.metrics is None:
            continue
        for sample in c.metrics.samples:
            if sample.name == "fleetfence_gateway_shard" and sample.value == 1:
                out[c.entry.record.instance] = (int(sample.labels["index"]), int(sample.labels["count"]))
    return out


def _without_password(dsn: str) -> str:
    parts = urlsplit(dsn)
    if parts.password is None:
        return dsn
    netloc = parts.netloc.replace(f":{parts.password}@", ":***@", 1)
    return urlunsplit(parts._replace(netloc=netloc))


def _counters(c: ServiceCheck) -> Counters:
    return main_counters(c.entry.record.kind, c.metrics) if c.metrics is not None else {}


def _uptime(seconds: float) -> str:
    s = int(seconds)
    d, s = divmod(s, 86400)
    h, s = divmod(s, 3600)
    m, s = divmod(s, 60)
    if d:
        return f"{d}d{h:02d}h"
    if h:
        return f"{h}h{m:02d}m"
    return f"{m}m{s:02d}s" if m else f"{s}s"


def _counters_text(counters: Counters) -> str:
    parts = []
    for name, v in counters.items():
        if isinstance(v, dict):
            total = _num(sum(v.values()))
            inner = " ".join(f"{k}={n}" for k, n in v.items() if k)
            parts.append(f"{name}={total}" + (f" ({inner})" if inner and len(v) > 1 else ""))
        else:
            parts.append(f"{name}={v}")
    return " ".join(parts)


def print_services(report: Report) -> None:
    table = Table(title="FleetFence services")
    for col in ("kind", "instance", "host", "pid", "endpoint", "answers", "uptime", "counters"):
        table.add_column(col, overflow="fold")
    for s in report.services:
        if s["answered"] is None:
            answers = "[yellow]heartbeat only[/]"
        elif s["answered"]:
            answers = "[green]yes[/]"
        else:
            answers = f"[red]NO[/] {s['detail']}"
        table.add_row(
            s["kind"],
            s["instance"],
            s["host"],
            str(s["pid"]),
            s["health_url"] or s["metrics_url"] or "-",
            answers,
            _uptime(s["uptime_s"]),
            _counters_text(s["counters"]),
        )
    console = Console()
    console.print(table)
    if report.registry_error:
        console.print(f"[red]service registry unreadable:[/] {report.registry_error}")
    elif not report.services:
        console.print(f"no service is registered under {report.registry_keys} in {report.registry_redis}")
    for problem in report.shard_problems:
        console.print(f"[red]gateway shards:[/] {problem}")
    if report.heard is not None and any(report.heard.values()):
        by = ", ".join(f"{p} {n:,}" for p, n in report.heard.items() if n)
        console.print(
            f"vehicles heard in the last {HEARD_WINDOW_S // 60} min, by the protocol they spoke: {by}"
        )


@app.command("status")
@friendly_errors
def status(
    as_json: Annotated[bool, typer.Option("--json", help="One JSON document instead of tables.")] = False,
    timeout_s: Annotated[
        float, typer.Option("--timeout-s", min=0.1, help="How long each service's endpoint may take.")
    ] = 2.0,
) -> None:
    """Show the infrastructure (as `infra status`) and every running FleetFence service (admin API,
    gateway replicas, processor, alert receivers, archive): instance, host, pid, endpoint, whether
    it answers, uptime and its main counters. Exit code 1 when the infrastructure is down or a
    registered service does not answer."""
    s = settings_from_env()
    report = collect(s, timeout_s)
    if as_json:
        sys.stdout.write(orjson.dumps(report.as_json(), option=orjson.OPT_INDENT_2).decode() + "\n")
    else:
        print_status(report.infrastructure)
        print_services(report)
    if not report.ok:
        raise typer.Exit(1)
