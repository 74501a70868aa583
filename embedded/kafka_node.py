"""The embedded Apache Kafka: a single KRaft node (broker and controller in one JVM) from the
official jars on Maven Central (`fleetfence.jars`).

The same broker a production installation runs, so an acknowledged record is in the broker's log
(the OS page cache) before the producer hears about it and survives a SIGKILL of the broker process.
"""

from __future__ import annotations

import logging
import os
import subprocess
import uuid
from base64 import urlsafe_b64encode
from pathlib import Path

from embedded.processes import alive, check_port, read_pid, spawn, system_binary
from fleetfence.errors import InfraError
from fleetfence.jars import ensure_jars
from fleetfence.probes import free_port
from fleetfence.settings import Settings

logger = logging.getLogger(__name__)


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


def new_cluster_id() -> str:
    """A random cluster id as Kafka writes them (a UUID in URL-safe base64, unpadded), never
    starting with "-": the storage tool's argument parser would read such an id as an option and
    refuse to format (it failed one start in 64; Kafka's own Uuid.randomUuid draws again too)."""
    while True:
        cid = urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        if not cid.startswith("-"):
            return cid


def _format_kafka_storage(settings: Settings, java: Path, classpath: str, props: Path) -> None:
    """Format the log folder once (what `kafka-storage.sh format --standalone` does)."""
    if (settings.kafka_dir / "data" / "meta.properties").exists():
        return
    cluster_id = new_cluster_id()
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


def start_kafka(settings: Settings) -> subprocess.Popen[bytes] | None:
    running = read_pid(settings, "kafka")
    if running and alive(*running):
        return None
    check_port(settings, "kafka", settings.kafka_port)
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
    return spawn(settings, "kafka", argv, d / "broker.log", marker=str(props))
