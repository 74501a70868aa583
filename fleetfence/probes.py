"""Health probes and ports: is a Kafka broker, an MQTT broker or a Redis server answering, and which
local port is free.

A probe is a real protocol round trip (Kafka metadata, an MQTT publish received back, a Redis PING),
never "the port is open": a server that accepts connections but cannot serve is not ready. The
admin API's `/readyz`, `fleetfence status` and the embedded-infrastructure launcher (`embedded`)
all ask through these.
"""

from __future__ import annotations

import random
import socket
import subprocess
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import paho.mqtt.client as mqtt
import redis
from confluent_kafka.admin import AdminClient
from paho.mqtt.enums import CallbackAPIVersion

from fleetfence.errors import InfraError, ServiceUnavailableError
from fleetfence.mqtt import Account, login


def kafka_ping(bootstrap: str, timeout_s: float = 2.0) -> str:
    """A metadata round trip; returns a short description of the cluster."""
    # log_level 0: a broker still starting refuses connections, which librdkafka would print to
    # stderr on every attempt; the caller reports a probe that keeps failing.
    md = AdminClient(
        {"bootstrap.servers": bootstrap, "socket.timeout.ms": int(timeout_s * 1000), "log_level": 0}
    ).list_topics(timeout=timeout_s)
    return f"{len(md.brokers)} broker(s), {len(md.topics)} topic(s)"


def mqtt_ping(host: str, port: int, timeout_s: float = 2.0, account: Account | None = None) -> str:
    """Publish a message at QoS 1 to a private topic and receive it back, logged in as `account`
    (the admin account, whose role allows `fleetfence/health/#`; None: anonymously)."""
    topic = f"fleetfence/health/{uuid.uuid4().hex}"
    got = threading.Event()
    subscribed = threading.Event()
    refused: list[str] = []
    client = mqtt.Client(CallbackAPIVersion.VERSION2, protocol=mqtt.MQTTv5)
    login(client, account)
    client.on_connect = lambda _c, _u, _f, rc, _p=None: refused.append(str(rc)) if rc.is_failure else None
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
            if refused:
                raise ServiceUnavailableError(f"MQTT {host}:{port} refused the login: {refused[0]}")
            raise ServiceUnavailableError("MQTT subscribe not acknowledged")
        client.publish(topic, b"ping", qos=1)
        if not got.wait(timeout_s):
            raise ServiceUnavailableError("MQTT round trip timed out")
    finally:
        client.loop_stop()
        client.disconnect()
    return "publish/subscribe round trip ok"


def redis_ping(dsn: str, timeout_s: float = 2.0) -> str:
    """The version and the memory used against its limit: Redis holds FleetFence's read models, and
    one without `maxmemory` grows until the host runs out (the alert history is bounded only by its
    retention), so an operator's first look (`infra status`, `fleetfence status`) shows both."""
    r = redis.Redis.from_url(dsn, socket_timeout=timeout_s, socket_connect_timeout=timeout_s)
    try:
        r.ping()
        version = r.info("server")["redis_version"]
        return f"redis {version}, {redis_memory_text(r.info('memory'))}"
    finally:
        r.close()


REDIS_MEMORY_WARN_FRACTION = 0.9


def redis_memory_text(info: dict[str, Any]) -> str:
    """`INFO memory` as one line: used of the limit, and a warning near the limit or without one."""
    used = int(info.get("used_memory", 0))
    limit = int(info.get("maxmemory", 0))
    if limit <= 0:
        return f"memory {_mib(used)} used, no maxmemory: it grows until the host's memory is full"
    policy = info.get("maxmemory_policy")
    text = f"memory {_mib(used)} of {_mib(limit)} ({used / limit:.0%}, maxmemory-policy {policy})"
    return text + (" NEAR ITS LIMIT" if used >= REDIS_MEMORY_WARN_FRACTION * limit else "")


def _mib(n: int) -> str:
    return f"{n / 2**20:.1f} MiB"


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


def ephemeral_ports() -> tuple[int, int]:
    """The kernel's range for the local ports of outgoing connections (Linux's default otherwise)."""
    try:
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(low), int(high)
    except (OSError, ValueError):
        return 32768, 60999


def service_ports(n: int = 1, host: str = "127.0.0.1") -> int:
    """The first of `n` consecutive free ports for private services that tests stop and start again
    on the same port: chosen below the kernel's ephemeral range, because a port in it that is free
    while its service is down can be handed to a client's outgoing connection, and the service then
    cannot bind it again (an embedded cluster's node, SIGKILLed and restarted, once found its port
    taken by a connection to another node)."""
    low, _high = ephemeral_ports()
    rng = random.SystemRandom()
    for _ in range(1000):
        first = rng.randrange(10_000, max(low - n, 10_001))
        if all(port_free(host, first + i) for i in range(n)):
            return first
    raise InfraError(f"no {n} consecutive free ports between 10000 and {low} on {host}")


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])
