"""Embedded infrastructure: a Kafka-protocol broker (noida-db), Mosquitto and Redis.

Each service is a real server process bound to loopback, with its data under one state folder,
started only when no external endpoint is configured for it. `up` waits for a real protocol
round trip (Kafka metadata, MQTT publish/receive, Redis PING), records pid files, and creates the
topics; `down` stops exactly the processes whose pid files it wrote, after checking that the pid
still belongs to the binary it started (pids get recycled).
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import signal
import socket
import subprocess
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from importlib.resources import files
from pathlib import Path
from typing import Any

import paho.mqtt.client as mqtt
import redis
from confluent_kafka.admin import AdminClient
from paho.mqtt.enums import CallbackAPIVersion

from fleetfence.errors import InfraError, MissingBinaryError, ServiceUnavailableError
from fleetfence.kafka import ensure_topics, topic_specs
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


# --------------------------------------------------------------------------- binaries


def noida_binary() -> Path:
    """The broker binary inside the noida-db wheel (spawned directly so signals reach it)."""
    path = Path(str(files("noida_db").joinpath("noida-db")))
    if not path.is_file():
        raise MissingBinaryError(f"noida-db binary not found at {path}: run `pip install noida-db==0.2.3`")
    if not os.access(path, os.X_OK):
        path.chmod(0o755)
    return path


def system_binary(name: str, package: str) -> Path:
    found = shutil.which(name) or next(
        (str(p) for p in (Path("/usr/sbin") / name, Path("/usr/bin") / name) if p.is_file()), None
    )
    if not found:
        raise MissingBinaryError(f"{name} is not installed: run `sudo apt-get install -y {package}`")
    return Path(found)


# --------------------------------------------------------------------------- health checks


def kafka_ping(bootstrap: str, timeout_s: float = 2.0) -> str:
    """A metadata round trip; returns a short description of the cluster."""
    md = AdminClient(
        {"bootstrap.servers": bootstrap, "socket.timeout.ms": int(timeout_s * 1000)}
    ).list_topics(timeout=timeout_s)
    return f"{len(md.brokers)} broker(s), {len(md.topics)} topic(s)"


def mqtt_ping(host: str, port: int, timeout_s: float = 2.0) -> str:
    """Publish a message at QoS 1 to a private topic and receive it back."""
    topic = f"fleetfence/health/{uuid.uuid4().hex}"
    got = threading.Event()
    subscribed = threading.Event()
    client = mqtt.Client(CallbackAPIVersion.VERSION2, protocol=mqtt.MQTTv5)
    client.on_subscribe = lambda *_a: subscribed.set()
    client.on_message = lambda _c, _u, _m: got.set()
    try:
        client.connect(host, port, keepalive=10)
    except OSError as exc:
        raise ServiceUnavailableError(f"MQTT {host}:{port} refused: {exc}") from exc
    client.loop_start()
    try:
        client.subscribe(topic, qos=1)
        if not subscribed.wait(timeout_s):
            raise ServiceUnavailableError("MQTT subscribe not acknowledged")
        client.publish(topic, b"ping", qos=1)
        if not got.wait(timeout_s):
            raise ServiceUnavailableError("MQTT round trip timed out")
    finally:
        client.loop_stop()
        client.disconnect()
    return "publish/subscribe round trip ok"


def redis_ping(dsn: str, timeout_s: float = 2.0) -> str:
    r = redis.Redis.from_url(dsn, socket_timeout=timeout_s, socket_connect_timeout=timeout_s)
    try:
        r.ping()
        return f"redis {r.info('server')['redis_version']}"
    finally:
        r.close()


def wait_until(
    check: Callable[[], str],
    timeout_s: float,
    what: str,
    proc: subprocess.Popen[bytes] | None,
    log: Path | None,
) -> str:
    """Poll `check` until it succeeds or the deadline passes; fail fast if the process died."""
    deadline = time.monotonic() + timeout_s
    last: Exception | None = None
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            tail = log.read_text(errors="replace")[-2000:] if log and log.exists() else ""
            raise ServiceUnavailableError(
                f"{what} exited with code {proc.returncode} during start-up:\n{tail}"
            )
        try:
            return check()
        except Exception as exc:  # any failure of the probe means "not ready yet"
            last = exc
            time.sleep(0.1)
    raise ServiceUnavailableError(f"{what} did not answer within {timeout_s}s (last error: {last})")


def port_free(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
        return True


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def private_fields(state_dir: Path) -> dict[str, Any]:
    """Settings fields for an embedded broker, Mosquitto and Redis of one's own, on free ports with
    their data under `state_dir`: tests and benchmarks never touch the machine's shared instances on
    the standard ports, nor any external endpoint from the environment."""
    return {
        "state_dir": state_dir,
        "kafka_port": free_port(),
        "mqtt_port": free_port(),
        "redis_port": free_port(),
        "kafka_bootstrap": None,
        "mqtt_url": None,
        "redis_url": None,
    }


# --------------------------------------------------------------------------- process bookkeeping


def _pid_file(settings: Settings, name: str) -> Path:
    return settings.run_dir / f"{name}.pid"


def _read_pid(settings: Settings, name: str) -> tuple[int, str] | None:
    pf = _pid_file(settings, name)
    if not pf.exists():
        return None
    try:
        pid_s, exe = pf.read_text().split("\n", 1)
        return int(pid_s), exe.strip()
    except ValueError:
        return None


def _alive(pid: int, exe: str) -> bool:
    """True when `pid` runs and is the binary we started (not a recycled pid)."""
    try:
        running = os.readlink(f"/proc/{pid}/exe")
    except OSError:  # gone, a zombie, or not ours to inspect
        return False
    return Path(running.removesuffix(" (deleted)")).name == Path(exe).name


def _spawn(settings: Settings, name: str, argv: list[str], log: Path) -> subprocess.Popen[bytes]:
    settings.run_dir.mkdir(parents=True, exist_ok=True)
    logf = log.open("ab")
    proc = subprocess.Popen(
        argv, stdout=logf, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True
    )
    logf.close()
    # The resolved path: /usr/bin/redis-server is a symlink to redis-check-rdb, which is what
    # /proc/<pid>/exe shows.
    _pid_file(settings, name).write_text(f"{proc.pid}\n{Path(argv[0]).resolve()}\n")
    logger.info("service spawned service=%s pid=%s", name, proc.pid)
    return proc


def _check_port(settings: Settings, name: str, port: int) -> None:
    if not port_free(settings.host, port):
        raise InfraError(
            f"{name} port {settings.host}:{port} is taken by another process; set "
            f"FLEETFENCE_{name.upper()}_PORT to a free port or point FleetFence at that server with "
            "its external-endpoint variable"
        )


# --------------------------------------------------------------------------- per-service start


def _start_kafka(settings: Settings) -> subprocess.Popen[bytes] | None:
    running = _read_pid(settings, "kafka")
    if running and _alive(*running):
        return None
    _check_port(settings, "kafka", settings.kafka_port)
    binary = noida_binary()
    settings.kafka_dir.mkdir(parents=True, exist_ok=True)
    argv = [
        str(binary),
        "start",
        "--data-dir",
        str(settings.kafka_dir.resolve()),
        "--host",
        settings.host,
        "--only",
        "kafka",
        "--kafka-port",
        str(settings.kafka_port),
    ]
    return _spawn(settings, "kafka", argv, settings.kafka_dir / "broker.log")


def _start_mqtt(settings: Settings) -> subprocess.Popen[bytes] | None:
    running = _read_pid(settings, "mqtt")
    if running and _alive(*running):
        return None
    _check_port(settings, "mqtt", settings.mqtt_port)
    binary = system_binary("mosquitto", "mosquitto")
    d = settings.mqtt_dir.resolve()
    d.mkdir(parents=True, exist_ok=True)
    conf = d / "mosquitto.conf"
    # Persistent sessions keep QoS 1 messages for an offline gateway: no queue limit by count,
    # a generous one by bytes, so a restarting gateway loses nothing.
    conf.write_text(
        "\n".join(
            [
                f"listener {settings.mqtt_port} {settings.host}",
                "allow_anonymous true",
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
                "",
            ]
        )
    )
    return _spawn(settings, "mqtt", [str(binary), "-c", str(conf)], d / "mosquitto.log")


def _start_redis(settings: Settings) -> subprocess.Popen[bytes] | None:
    running = _read_pid(settings, "redis")
    if running and _alive(*running):
        return None
    _check_port(settings, "redis", settings.redis_port)
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
    return _spawn(settings, "redis", argv, d / "redis.log")


def up(settings: Settings, *, create_topics: bool = True) -> list[ServiceStatus]:
    """Start every service without an external endpoint, wait for each, create the topics."""
    procs: dict[str, subprocess.Popen[bytes] | None] = {}
    try:
        if not settings.kafka_external:
            procs["kafka"] = _start_kafka(settings)
        if not settings.mqtt_external:
            procs["mqtt"] = _start_mqtt(settings)
        if not settings.redis_external:
            procs["redis"] = _start_redis(settings)
        host, port = settings.mqtt_host_port
        wait_until(
            lambda: kafka_ping(settings.bootstrap_servers),
            settings.startup_timeout_s,
            "Kafka broker",
            procs.get("kafka"),
            settings.kafka_dir / "broker.log",
        )
        wait_until(
            lambda: mqtt_ping(host, port),
            settings.startup_timeout_s,
            "Mosquitto",
            procs.get("mqtt"),
            settings.mqtt_dir / "mosquitto.log",
        )
        wait_until(
            lambda: redis_ping(settings.redis_dsn),
            settings.startup_timeout_s,
            "Redis",
            procs.get("redis"),
            settings.redis_dir / "redis.log",
        )
        if create_topics:
            ensure_topics(settings.bootstrap_servers, topic_specs(settings))
    except BaseException:
        # Leave nothing half-started behind.
        for name, proc in procs.items():
            if proc is not None:
                _stop_one(settings, name)
        raise
    return status(settings)


def _stop_one(settings: Settings, name: str, timeout_s: float = 15.0) -> bool:
    rec = _read_pid(settings, name)
    pf = _pid_file(settings, name)
    if rec is None:
        return False
    pid, exe = rec
    stopped = False
    if _alive(pid, exe):
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout_s
        while _alive(pid, exe) and time.monotonic() < deadline:
            _reap(pid)
            time.sleep(0.05)
        if _alive(pid, exe):
            logger.warning("service ignored SIGTERM, killing service=%s pid=%s", name, pid)
            os.kill(pid, signal.SIGKILL)
            while _alive(pid, exe):
                _reap(pid)
                time.sleep(0.05)
        stopped = True
    pf.unlink(missing_ok=True)
    return stopped


def _reap(pid: int) -> None:
    """Collect the exit status when the process is our child, so it does not linger as a zombie."""
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)


def down(settings: Settings) -> list[str]:
    """Stop exactly the processes `up` started; returns the names stopped."""
    return [name for name in SERVICES if _stop_one(settings, name)]


def status(settings: Settings) -> list[ServiceStatus]:
    host, port = settings.mqtt_host_port
    checks: list[tuple[str, str, bool, Callable[[], str]]] = [
        (
            "kafka",
            settings.bootstrap_servers,
            settings.kafka_external,
            lambda: kafka_ping(settings.bootstrap_servers),
        ),
        ("mqtt", f"mqtt://{host}:{port}", settings.mqtt_external, lambda: mqtt_ping(host, port)),
        ("redis", settings.redis_dsn, settings.redis_external, lambda: redis_ping(settings.redis_dsn)),
    ]
    out = []
    for name, addr, external, check in checks:
        rec = _read_pid(settings, name)
        pid = rec[0] if rec and _alive(*rec) else None
        try:
            detail, healthy = check(), True
        except Exception as exc:  # report, don't raise: status must show every service
            detail, healthy = f"unreachable: {exc}", False
        out.append(ServiceStatus(name, addr, not external, pid, healthy, detail))
    return out
