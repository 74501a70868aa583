"""Embedded infrastructure: Apache Kafka (a single KRaft node), Mosquitto and Redis.

Each service is a real server process bound to loopback, with its data under one state folder,
started only when no external endpoint is configured for it. Kafka runs from the official jars on
Maven Central (`fleetfence.jars`), broker and controller in one JVM: the same broker a production
installation runs, so an acknowledged record is in the broker's log (the OS page cache) before the
producer hears about it and survives a SIGKILL of the broker process. `up` waits for a real protocol
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
from base64 import urlsafe_b64encode
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import paho.mqtt.client as mqtt
import redis
from confluent_kafka.admin import AdminClient
from paho.mqtt.enums import CallbackAPIVersion

from fleetfence.errors import InfraError, MissingBinaryError, ServiceUnavailableError
from fleetfence.jars import ensure_jars
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


def _read_pid(settings: Settings, name: str) -> tuple[int, str, str] | None:
    """(pid, binary, marker) from a pid file; the marker is the last argument of the command line
    (the config file), which tells our JVM from any other `java` on a recycled pid."""
    pf = _pid_file(settings, name)
    if not pf.exists():
        return None
    try:
        lines = pf.read_text().splitlines()
        return int(lines[0]), lines[1].strip(), (lines[2].strip() if len(lines) > 2 else "")
    except (ValueError, IndexError):
        return None


def _alive(pid: int, exe: str, marker: str = "") -> bool:
    """True when `pid` runs and is the process we started (not a recycled pid)."""
    try:
        running = os.readlink(f"/proc/{pid}/exe")
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes() if marker else b""
    except OSError:  # gone, a zombie, or not ours to inspect
        return False
    if Path(running.removesuffix(" (deleted)")).name != Path(exe).name:
        return False
    return not marker or marker.encode() in cmdline.split(b"\0")


def _spawn(
    settings: Settings, name: str, argv: list[str], log: Path, marker: str = ""
) -> subprocess.Popen[bytes]:
    """Start a service in its own session; `marker` (an argument of its command line) tells it
    apart from other processes of the same binary (every JVM is `java`). Redis rewrites its process
    title, so it goes without."""
    settings.run_dir.mkdir(parents=True, exist_ok=True)
    logf = log.open("ab")
    proc = subprocess.Popen(
        argv, stdout=logf, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True
    )
    logf.close()
    # The resolved path: /usr/bin/redis-server is a symlink to redis-check-rdb, which is what
    # /proc/<pid>/exe shows.
    _pid_file(settings, name).write_text(f"{proc.pid}\n{Path(argv[0]).resolve()}\n{marker}\n")
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


KAFKA_HEAP = ("-Xms128m", "-Xmx512m")
KAFKA_LOG4J = """status = warn
appender.out.type = Console
appender.out.name = out
appender.out.layout.type = PatternLayout
appender.out.layout.pattern = [%d{yyyy-MM-dd'T'HH:mm:ss.SSS'Z'}{UTC}] %p %m (%c)%n
rootLogger.level = INFO
rootLogger.appenderRef.out.ref = out
logger.state.name = state.change.logger
logger.state.level = WARN
logger.request.name = kafka.request.logger
logger.request.level = WARN
"""


def _controller_port(settings: Settings) -> int:
    """The KRaft controller's port: chosen free once and kept, because a standalone quorum records
    its voter's endpoint in the metadata log when the storage is formatted."""
    f = settings.kafka_dir / "controller.port"
    if f.exists():
        return int(f.read_text().strip())
    port = free_port(settings.host)
    f.write_text(f"{port}\n")
    return port


def kafka_server_properties(settings: Settings, controller_port: int) -> str:
    """A single-node KRaft broker+controller on loopback, with data under the state folder.

    Internal topics get replication 1 (one node) and few partitions (a small machine: 50 offset
    partitions cost seconds at the first consumer group); the log cleaner looks for work every
    second so `fleet.master` is compacted soon after it is dirty. Kafka writes acknowledged records
    to the page cache before answering: a SIGKILL of the broker loses none of them."""
    d = settings.kafka_dir.resolve()
    h = settings.host
    return "\n".join(
        [
            "process.roles=broker,controller",
            "node.id=1",
            f"controller.quorum.bootstrap.servers={h}:{controller_port}",
            f"listeners=PLAINTEXT://{h}:{settings.kafka_port},CONTROLLER://{h}:{controller_port}",
            f"advertised.listeners=PLAINTEXT://{h}:{settings.kafka_port}",
            "controller.listener.names=CONTROLLER",
            "inter.broker.listener.name=PLAINTEXT",
            "listener.security.protocol.map=CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT",
            f"log.dirs={d / 'data'}",
            "num.partitions=1",
            "num.network.threads=2",
            "num.io.threads=4",
            "offsets.topic.replication.factor=1",
            "offsets.topic.num.partitions=8",
            "transaction.state.log.replication.factor=1",
            "transaction.state.log.min.isr=1",
            "transaction.state.log.num.partitions=8",
            "share.coordinator.state.topic.replication.factor=1",
            "share.coordinator.state.topic.min.isr=1",
            "group.initial.rebalance.delay.ms=0",
            "log.cleaner.backoff.ms=1000",
            "",
        ]
    )


def _java() -> Path:
    java = system_binary("java", "openjdk-17-jre-headless")
    return java.resolve()


def _format_kafka_storage(settings: Settings, java: Path, classpath: str, props: Path) -> None:
    """Format the log folder once (what `kafka-storage.sh format --standalone` does)."""
    if (settings.kafka_dir / "data" / "meta.properties").exists():
        return
    cluster_id = urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
    proc = subprocess.run(
        [
            str(java),
            "-Xmx256m",
            "-cp",
            classpath,
            "kafka.tools.StorageTool",
            "format",
            "--standalone",
            "-t",
            cluster_id,
            "-c",
            str(props),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env={**os.environ, "KAFKA_LOG4J_OPTS": ""},
    )
    if proc.returncode != 0:
        raise InfraError(f"formatting Kafka storage failed:\n{(proc.stdout + proc.stderr)[-2000:]}")
    logger.info("kafka storage formatted cluster_id=%s dir=%s", cluster_id, settings.kafka_dir)


def _start_kafka(settings: Settings) -> subprocess.Popen[bytes] | None:
    running = _read_pid(settings, "kafka")
    if running and _alive(*running):
        return None
    _check_port(settings, "kafka", settings.kafka_port)
    java = _java()
    d = settings.kafka_dir.resolve()
    d.mkdir(parents=True, exist_ok=True)
    libs = ensure_jars("kafka")
    classpath = f"{libs[0].parent}/*"
    props = d / "server.properties"
    props.write_text(kafka_server_properties(settings, _controller_port(settings)))
    log4j = d / "log4j2.properties"
    log4j.write_text(KAFKA_LOG4J)
    _format_kafka_storage(settings, java, classpath, props)
    argv = [
        str(java),
        *KAFKA_HEAP,
        "-XX:+UseG1GC",
        "-XX:MaxGCPauseMillis=20",
        "-XX:+ExitOnOutOfMemoryError",
        "-Djava.awt.headless=true",
        f"-Dlog4j2.configurationFile={log4j}",
        f"-Dkafka.logs.dir={d}",
        "-cp",
        classpath,
        "kafka.Kafka",
        str(props),
    ]
    return _spawn(settings, "kafka", argv, d / "broker.log", marker=str(props))


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


def _stop_one(settings: Settings, name: str, timeout_s: float = 30.0) -> bool:
    rec = _read_pid(settings, name)
    pf = _pid_file(settings, name)
    if rec is None:
        return False
    pid, exe, marker = rec
    stopped = False
    if _alive(pid, exe, marker):
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout_s
        while _alive(pid, exe, marker) and time.monotonic() < deadline:
            _reap(pid)
            time.sleep(0.05)
        if _alive(pid, exe, marker):
            logger.warning("service ignored SIGTERM, killing service=%s pid=%s", name, pid)
            os.kill(pid, signal.SIGKILL)
            while _alive(pid, exe, marker):
                _reap(pid)
                time.sleep(0.05)
        # A restart right after must find the port free (bounded: a recycled pid is not waited on).
        exit_deadline = time.monotonic() + 5
        while not _exited(pid) and time.monotonic() < exit_deadline:
            time.sleep(0.01)
        _reap(pid)
        stopped = True
    pf.unlink(missing_ok=True)
    return stopped


def _exited(pid: int) -> bool:
    """True once every thread of `pid` has finished exiting (gone, or only a zombie left): only then
    are its sockets closed and its ports free again. Its /proc exe link, which `_alive` reads,
    disappears earlier, and a JVM's main thread turns zombie while its other threads still exit."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        threads = len(os.listdir(f"/proc/{pid}/task"))
    except (OSError, IndexError):
        return True
    return state in ("Z", "X") and threads <= 1


def _reap(pid: int) -> None:
    """Collect the exit status when the process is our child, so it does not linger as a zombie."""
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)


def restart(settings: Settings, name: str) -> list[ServiceStatus]:
    """Stop one embedded service (SIGTERM, as `down` does) and start it again with its data."""
    if name not in SERVICES:
        raise InfraError(f"unknown service {name!r}; one of: {', '.join(SERVICES)}")
    external = {
        "kafka": settings.kafka_external,
        "mqtt": settings.mqtt_external,
        "redis": settings.redis_external,
    }
    if external[name]:
        raise InfraError(f"{name} is an external endpoint here: restart it where it runs")
    _stop_one(settings, name)
    return up(settings, create_topics=False)


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
