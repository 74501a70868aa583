"""The embedded infrastructure: Apache Kafka (a single KRaft node, or a cluster of 3 or 5 with
FLEETFENCE_KAFKA_BROKERS), Mosquitto and Redis.

Each service is a real server process bound to loopback, with its data under one state folder,
started only when no external endpoint is configured for it. Kafka runs from the official jars on
Maven Central (`fleetfence.jars`), broker and controller in one JVM: the same broker a production
installation runs, so an acknowledged record is in the broker's log (the OS page cache) before the
producer hears about it and survives a SIGKILL of the broker process. `up` waits for a real protocol
round trip (Kafka metadata, MQTT publish/receive, Redis PING), records pid files, and creates the
topics; `down` stops exactly the processes whose pid files it wrote, after checking that the pid
still belongs to the binary it started (pids get recycled). A Kafka cluster's nodes are services
of their own (`kafka-1`, `kafka-2`, ...: a pid file, a status row, a restart each).
"""

from __future__ import annotations

import getpass
import logging
import subprocess
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

from confluent_kafka.admin import AdminClient

from embedded.kafka_node import kafka_nodes, start_kafka
from embedded.processes import alive, check_port, read_pid, spawn, stop_one, system_binary
from fleetfence.errors import ConfigError, InfraError, MissingBinaryError, ServiceUnavailableError
from fleetfence.kafka import ensure_topics, topic_specs
from fleetfence.mqtt import DYNSEC_FILE, DynSec, embedded_accounts, service_account, write_bootstrap
from fleetfence.pki import CA_CERT, SERVER_CERT, SERVER_KEY
from fleetfence.probes import kafka_ping, mqtt_ping, redis_ping, service_ports, wait_until
from fleetfence.settings import Settings

logger = logging.getLogger(__name__)

SERVICES = ("kafka", "mqtt", "redis")


@dataclass(frozen=True)
class ServiceStatus:
    name: str
    address: str
    managed: bool  # started by us (embedded) rather than external
    pid: int | None
    healthy: bool
    detail: str


def kafka_service_names(settings: Settings) -> list[str]:
    """The embedded Kafka's services: `kafka`, or a cluster's `kafka-1` ... `kafka-N`."""
    return [node.name for node in kafka_nodes(settings)]


def service_names(settings: Settings) -> list[str]:
    """Every embedded service of these settings, each with its own pid file."""
    return [*kafka_service_names(settings), "mqtt", "redis"]


def private_fields(state_dir: Path, kafka_brokers: int = 1) -> dict[str, Any]:
    """Settings fields for an embedded broker (or a cluster of `kafka_brokers`), Mosquitto and Redis
    of one's own, on free ports with their data under `state_dir`: tests and benchmarks never touch
    the machine's shared instances on the standard ports, nor any external endpoint from the
    environment."""
    return {
        "state_dir": state_dir,
        **({"kafka_brokers": kafka_brokers} if kafka_brokers != 1 else {}),
        # Below the ephemeral range: the tests kill and restart these on their ports.
        "kafka_port": service_ports(kafka_brokers),
        "mqtt_port": service_ports(),
        "redis_port": service_ports(),
        "kafka_bootstrap": None,
        "mqtt_url": None,
        "redis_url": None,
    }


def dynsec_plugin() -> Path:
    """Mosquitto's dynamic-security plugin, as Debian's `mosquitto` package (or a local build)
    installs it."""
    for pattern in (
        "/usr/lib/*/mosquitto_dynamic_security.so",
        "/usr/lib/mosquitto_dynamic_security.so",
        "/usr/local/lib/mosquitto_dynamic_security.so",
        "/usr/lib/mosquitto/*.so",
    ):
        for found in sorted(Path("/").glob(pattern.lstrip("/"))):
            if found.name == "mosquitto_dynamic_security.so":
                return found
    raise MissingBinaryError(
        "Mosquitto's dynamic-security plugin (mosquitto_dynamic_security.so, in the mosquitto "
        "package) is not installed; FLEETFENCE_MQTT_AUTH=false runs the broker without authentication"
    )


def mqtt_auth_lines(settings: Settings, d: Path) -> list[str]:
    """The broker's authentication: anonymous clients refused, every account and role in the
    dynamic-security plugin's file (fleetfence.mqtt), created with the admin account on first start."""
    if not settings.mqtt_auth:
        return ["allow_anonymous true"]
    plugin = dynsec_plugin()
    accounts = embedded_accounts(settings, create=True)
    write_bootstrap(d / DYNSEC_FILE, accounts["admin"])
    return [
        "per_listener_settings false",
        "allow_anonymous false",
        f"plugin {plugin}",
        f"plugin_opt_config_file {d / DYNSEC_FILE}",
    ]


def ensure_mqtt_accounts(settings: Settings) -> None:
    """The gateway's and the alert fan-out's accounts and roles in the running broker (idempotent)."""
    accounts = {k: a for k in ("gateway", "alerts") if (a := service_account(settings, k)) is not None}
    control = DynSec.from_settings(settings)
    try:
        control.ensure_service_accounts(accounts)
    finally:
        control.close()


def mqtt_tls_lines(settings: Settings) -> list[str]:
    """The vehicles' TLS listener (FLEETFENCE_MQTT_TLS_PORT): the same accounts as the plain one
    (per_listener_settings false); its files from `fleetfence mqtt bootstrap --certs-dir`. Last in
    the file: Mosquitto applies cafile/certfile/keyfile to the listener just above them."""
    if settings.mqtt_tls_port is None:
        return []
    if not settings.mqtt_auth:
        raise ConfigError("FLEETFENCE_MQTT_TLS_PORT needs MQTT authentication (FLEETFENCE_MQTT_AUTH=true)")
    d = (settings.mqtt_tls_dir or settings.mqtt_dir / "certs").resolve()
    files = {"cafile": d / CA_CERT, "certfile": d / SERVER_CERT, "keyfile": d / SERVER_KEY}
    missing = [str(p) for p in files.values() if not p.is_file()]
    if missing:
        raise ConfigError(
            f"the MQTT TLS listener lacks {', '.join(missing)}: run `fleetfence mqtt bootstrap "
            f"--certs-dir {d} --hostname <name vehicles use>`"
        )
    return [
        f"listener {settings.mqtt_tls_port} {settings.mqtt_tls_host}",
        *(f"{option} {path}" for option, path in files.items()),
        "tls_version tlsv1.2",
    ]


def start_mqtt(settings: Settings) -> subprocess.Popen[bytes] | None:
    running = read_pid(settings, "mqtt")
    if running and alive(*running):
        return None
    check_port(settings, "mqtt", settings.mqtt_port)
    if settings.mqtt_tls_port is not None:
        check_port(settings, "mqtt_tls", settings.mqtt_tls_port)
    binary = system_binary("mosquitto", "mosquitto")
    d = settings.mqtt_dir.resolve()
    d.mkdir(parents=True, exist_ok=True)
    conf = d / "mosquitto.conf"
    # Persistent sessions keep QoS 1 messages for an offline gateway: no queue limit by count,
    # a generous one by bytes, so a restarting gateway loses nothing. Mosquitto started as root
    # switches to the `mosquitto` user, which cannot write the state folder (its persistence file,
    # the plugin's file): it runs as the user who started it, like the embedded Kafka and Redis.
    conf.write_text(
        "\n".join(
            [
                f"listener {settings.mqtt_port} {settings.host}",
                f"user {getpass.getuser()}",
                *mqtt_auth_lines(settings, d),
                "persistence true",
                f"persistence_location {d}/",
                "autosave_interval 5",
                "max_queued_messages 0",
                "max_queued_bytes 0",
                "max_inflight_messages 0",
                "set_tcp_nodelay true",
                "log_dest stdout",
                "log_type error",
                "log_type warning",
                "log_type notice",
                *mqtt_tls_lines(settings),
                "",
            ]
        )
    )
    return spawn(settings, "mqtt", [str(binary), "-c", str(conf)], d / "mosquitto.log")


def start_redis(settings: Settings) -> subprocess.Popen[bytes] | None:
    running = read_pid(settings, "redis")
    if running and alive(*running):
        return None
    check_port(settings, "redis", settings.redis_port)
    binary = system_binary("redis-server", "redis-server")
    d = settings.redis_dir.resolve()
    d.mkdir(parents=True, exist_ok=True)
    argv = [
        str(binary),
        "--bind",
        settings.host,
        "--port",
        str(settings.redis_port),
        "--dir",
        str(d),
        "--appendonly",
        "yes",
        "--appendfsync",
        "everysec",
        "--save",
        "60 1",
        "--daemonize",
        "no",
        "--protected-mode",
        "yes",
    ]
    return spawn(settings, "redis", argv, d / "redis.log")


def wait_for_kafka(settings: Settings, procs: dict[str, subprocess.Popen[bytes] | None]) -> str:
    """Wait until every embedded Kafka node answers a metadata round trip (failing fast when one
    started here exits) and, in a cluster, until the metadata lists every broker: a topic with
    three replicas cannot be created while one of three is still registering."""
    nodes = kafka_nodes(settings)
    for node in nodes:
        wait_until(
            partial(kafka_ping, node.bootstrap),
            settings.startup_timeout_s,
            f"Kafka broker {node.name}" if len(nodes) > 1 else "Kafka broker",
            procs.get(node.name),
            node.dir / "broker.log",
        )

    def all_registered() -> str:
        found = kafka_brokers_registered(settings.bootstrap_servers)
        if found < len(nodes):
            raise ServiceUnavailableError(f"{found} of {len(nodes)} brokers registered")
        return f"{found} broker(s)"

    return wait_until(all_registered, settings.startup_timeout_s, "every Kafka broker", None, None)


def kafka_brokers_registered(bootstrap: str, timeout_s: float = 2.0) -> int:
    """How many brokers the cluster's metadata lists (registered with the controller, unfenced)."""
    admin = AdminClient(
        {"bootstrap.servers": bootstrap, "socket.timeout.ms": int(timeout_s * 1000), "log_level": 0}
    )
    return len(admin.list_topics(timeout=timeout_s).brokers)


def up(
    settings: Settings, *, create_topics: bool = True, only: tuple[str, ...] = SERVICES
) -> list[ServiceStatus]:
    """Start every service without an external endpoint (of `only`: "kafka", "mqtt", "redis"),
    wait for each, create the topics. Already running ones are left as they are: after a cluster
    node died, `up` starts that node alone."""
    procs: dict[str, subprocess.Popen[bytes] | None] = {}
    try:
        if "kafka" in only and not settings.kafka_external:
            procs.update(start_kafka(settings))
        if "mqtt" in only and not settings.mqtt_external:
            procs["mqtt"] = start_mqtt(settings)
        if "redis" in only and not settings.redis_external:
            procs["redis"] = start_redis(settings)
        host, port = settings.mqtt_host_port
        if "kafka" in only:
            if settings.kafka_external:
                wait_until(
                    lambda: kafka_ping(settings.bootstrap_servers),
                    settings.startup_timeout_s,
                    "Kafka broker",
                    None,
                    None,
                )
            else:
                wait_for_kafka(settings, procs)
        if "mqtt" in only:
            wait_until(
                lambda: mqtt_ping(host, port, account=service_account(settings, "admin")),
                settings.startup_timeout_s,
                "Mosquitto",
                procs.get("mqtt"),
                settings.mqtt_dir / "mosquitto.log",
            )
            if settings.mqtt_auth:
                ensure_mqtt_accounts(settings)
        if "redis" in only:
            wait_until(
                lambda: redis_ping(settings.redis_dsn),
                settings.startup_timeout_s,
                "Redis",
                procs.get("redis"),
                settings.redis_dir / "redis.log",
            )
        if create_topics and "kafka" in only:
            ensure_topics(settings.bootstrap_servers, topic_specs(settings))
    except BaseException:
        # Leave nothing half-started behind.
        for name, proc in procs.items():
            if proc is not None:
                stop_one(settings, name)
        raise
    return status(settings)


def restart(settings: Settings, name: str) -> list[ServiceStatus]:
    """Stop one embedded service (SIGTERM, as `down` does) and start it again with its data; in a
    cluster `kafka` is every node, `kafka-<i>` one of them."""
    nodes = kafka_service_names(settings)
    known = [*SERVICES, *(n for n in nodes if n != "kafka")]
    if name not in known:
        raise InfraError(f"unknown service {name!r}; one of: {', '.join(known)}")
    external = {
        "kafka": settings.kafka_external,
        "mqtt": settings.mqtt_external,
        "redis": settings.redis_external,
    }
    if external[name.partition("-")[0]]:
        raise InfraError(f"{name} is an external endpoint here: restart it where it runs")
    if name.startswith("kafka"):
        stop_kafka(settings, nodes if name == "kafka" else [name])
    else:
        stop_one(settings, name)
    return up(settings, create_topics=False)


def _kafka_pid_names(settings: Settings) -> list[str]:
    """The configured nodes' pid-file names, and any other Kafka node's pid file in the state
    folder (a cluster started with another FLEETFENCE_KAFKA_BROKERS): `down` stops them all."""
    found = {p.stem for p in settings.run_dir.glob("kafka*.pid")} if settings.run_dir.is_dir() else set()
    configured = kafka_service_names(settings)
    return [*configured, *sorted(found - set(configured))]


def stop_kafka(settings: Settings, names: list[str] | None = None) -> list[str]:
    """Stop Kafka nodes (default: every one with a pid file), all at once: stopped one after the
    other, the last of a cluster would wait for a controller that the quorum, two voters gone, no
    longer elects, and be killed after the timeout."""
    names = _kafka_pid_names(settings) if names is None else names
    with ThreadPoolExecutor(max_workers=max(1, len(names))) as pool:
        stopped = list(pool.map(lambda name: stop_one(settings, name), names))
    return [name for name, ok in zip(names, stopped, strict=True) if ok]


def down(settings: Settings) -> list[str]:
    """Stop exactly the processes `up` started; returns the names stopped."""
    return [*stop_kafka(settings), *(name for name in ("mqtt", "redis") if stop_one(settings, name))]


def _recorded_address(settings: Settings, name: str) -> str:
    """The client address a Kafka node was started with (its server.properties)."""
    folder = (
        settings.kafka_dir if name == "kafka" else settings.kafka_dir / f"node-{name.removeprefix('kafka-')}"
    )
    props = folder / "server.properties"
    for line in props.read_text().splitlines() if props.is_file() else []:
        if line.startswith("advertised.listeners=PLAINTEXT://"):
            return line.removeprefix("advertised.listeners=PLAINTEXT://")
    return "?"


def _stray_ping(addr: str) -> str:
    return f"{kafka_ping(addr)}; export FLEETFENCE_KAFKA_BROKERS as at `infra up`"


def status(settings: Settings) -> list[ServiceStatus]:
    """A row per service, a cluster's Kafka nodes each in a row of its own (probed alone: a node that
    is down shows DOWN while the others answer)."""
    host, port = settings.mqtt_host_port
    checks: list[tuple[str, str, bool, Callable[[], str]]] = []
    if settings.kafka_external:
        checks.append(
            ("kafka", settings.bootstrap_servers, True, partial(kafka_ping, settings.bootstrap_servers))
        )
    else:
        configured = kafka_nodes(settings)
        strays = [n for n in _kafka_pid_names(settings) if n not in {c.name for c in configured}]
        for node in configured:
            if not strays or read_pid(settings, node.name) is not None:
                checks.append((node.name, node.bootstrap, False, partial(kafka_ping, node.bootstrap)))
        for name in strays:  # started with another FLEETFENCE_KAFKA_BROKERS
            addr = _recorded_address(settings, name)
            checks.append((name, addr, False, partial(_stray_ping, addr)))
    checks += [
        (
            "mqtt",
            f"mqtt://{host}:{port}",
            settings.mqtt_external,
            lambda: mqtt_ping(host, port, account=service_account(settings, "admin")),
        ),
        ("redis", settings.redis_dsn, settings.redis_external, lambda: redis_ping(settings.redis_dsn)),
    ]
    out = []
    for name, addr, external, check in checks:
        rec = read_pid(settings, name)
        pid = rec[0] if rec and alive(*rec) else None
        try:
            detail, healthy = check(), True
        except Exception as exc:  # report, don't raise: status must show every service
            detail, healthy = f"unreachable: {exc}", False
        out.append(ServiceStatus(name, addr, not external, pid, healthy, detail))
    return out
