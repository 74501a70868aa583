"""The embedded Apache Kafka: KRaft nodes (broker and controller in one JVM each) from the official
jars on Maven Central (`fleetfence.jars`).

The same broker a production installation runs, so an acknowledged record is in the broker's log
(the OS page cache) before the producer hears about it and survives a SIGKILL of the broker process.

One node by default. `FLEETFENCE_KAFKA_BROKERS=3` (or 5) runs a cluster configured as
docker-compose.yml's: every node a broker and a voter of one static controller quorum
(`controller.quorum.voters`), one cluster id, internal topics with three replicas and two in sync
for a write; for fault tests (kill a leader, two nodes) without Docker. Node i listens on
FLEETFENCE_KAFKA_PORT + i - 1, has its folder `<state>/kafka/node-<i>` and its pid file `kafka-<i>`;
the single node keeps `<state>/kafka` and `kafka`.
"""

from __future__ import annotations

import logging
import os
import subprocess
import uuid
from base64 import urlsafe_b64encode
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path

from embedded.processes import alive, check_port, read_pid, spawn, system_binary
from fleetfence.errors import ConfigError, InfraError
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


@dataclass(frozen=True)
class KafkaNode:
    """One embedded KRaft node: its id, pid-file name, client address and folder."""

    node_id: int
    name: str
    host: str
    port: int
    dir: Path

    @property
    def bootstrap(self) -> str:
        return f"{self.host}:{self.port}"


def kafka_nodes(settings: Settings) -> list[KafkaNode]:
    """The nodes FLEETFENCE_KAFKA_BROKERS asks for; a single node keeps the folder and pid-file name
    it always had, so an existing state folder starts as before."""
    if settings.kafka_brokers == 1:
        return [KafkaNode(1, "kafka", settings.host, settings.kafka_port, settings.kafka_dir)]
    return [
        KafkaNode(i + 1, f"kafka-{i + 1}", settings.host, port, settings.kafka_dir / f"node-{i + 1}")
        for i, port in enumerate(settings.kafka_ports)
    ]


def _controller_port(settings: Settings, node: KafkaNode) -> int:
    """A KRaft controller's port: chosen free once and kept, because the quorum's voters and their
    endpoints are recorded when the storage is formatted (a standalone quorum's in the metadata log,
    a static one's in every node's configuration)."""
    f = node.dir / "controller.port"
    if f.exists():
        return int(f.read_text().strip())
    node.dir.mkdir(parents=True, exist_ok=True)
    port = free_port(settings.host)
    f.write_text(f"{port}\n")
    return port


def kafka_server_properties(settings: Settings, node: KafkaNode, controllers: dict[int, int]) -> str:
    """A KRaft broker+controller on loopback, with data under the state folder; `controllers` maps
    every voter's node id to its controller port.

    A single node: internal topics get replication 1 and the quorum is the node alone (formatted
    `--standalone`). A cluster: the static quorum of every node, and the replication of
    docker-compose.yml (three replicas, two in sync; leadership goes back to a returning broker; no
    topic auto-created). tests/cli/test_deploy.py compares them.
    Either way few internal partitions (a small machine: 50 offset partitions cost seconds at the
    first consumer group), and the log cleaner looks for work every second so `fleet.master` is
    compacted soon after it is dirty. Kafka writes acknowledged records to the page cache before
    answering: a SIGKILL of the broker loses none of them."""
    d = node.dir.resolve()
    h = settings.host
    cport = controllers[node.node_id]
    if len(controllers) == 1:
        quorum = [f"controller.quorum.bootstrap.servers={h}:{cport}"]
        rf, isr = 1, 1
        cluster: list[str] = []
    else:
        voters = ",".join(f"{i}@{h}:{port}" for i, port in sorted(controllers.items()))
        quorum = [f"controller.quorum.voters={voters}"]
        rf, isr = min(3, len(controllers)), 2
        cluster = [
            f"default.replication.factor={rf}",
            f"min.insync.replicas={isr}",
            "auto.leader.rebalance.enable=true",
            "auto.create.topics.enable=false",
        ]
    return "\n".join(
        [
            "process.roles=broker,controller",
            f"node.id={node.node_id}",
            *quorum,
            f"listeners=PLAINTEXT://{h}:{node.port},CONTROLLER://{h}:{cport}",
            f"advertised.listeners=PLAINTEXT://{h}:{node.port}",
            "controller.listener.names=CONTROLLER",
            "inter.broker.listener.name=PLAINTEXT",
            "listener.security.protocol.map=CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT",
            f"log.dirs={d / 'data'}",
            "num.partitions=1",
            *cluster,
            "num.network.threads=2",
            "num.io.threads=4",
            f"offsets.topic.replication.factor={rf}",
            "offsets.topic.num.partitions=8",
            f"transaction.state.log.replication.factor={rf}",
            f"transaction.state.log.min.isr={isr}",
            "transaction.state.log.num.partitions=8",
            f"share.coordinator.state.topic.replication.factor={rf}",
            f"share.coordinator.state.topic.min.isr={isr}",
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


def _cluster_id(settings: Settings) -> str:
    """A cluster's one id, drawn once and kept beside its nodes' folders: a node formatted later
    (its folder deleted) joins the same cluster."""
    f = settings.kafka_dir / "cluster.id"
    if f.exists():
        return f.read_text().strip()
    cid = new_cluster_id()
    f.write_text(f"{cid}\n")
    return cid


def _format_kafka_storage(
    settings: Settings, node: KafkaNode, java: Path, classpath: str, props: Path
) -> None:
    """Format a node's log folder once: `kafka-storage.sh format --standalone` for a single node, a
    plain `format` with the shared cluster id for a node of a static quorum."""
    if (node.dir / "data" / "meta.properties").exists():
        return
    if settings.kafka_brokers == 1:
        cluster_id, mode = new_cluster_id(), ["--standalone"]
    else:
        cluster_id, mode = _cluster_id(settings), []
    proc = subprocess.run(
        [
            str(java),
            "-Xmx256m",
            "-cp",
            classpath,
            "kafka.tools.StorageTool",
            "format",
            *mode,
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
    logger.info("kafka storage formatted cluster_id=%s dir=%s", cluster_id, node.dir)


def start_kafka(
    settings: Settings, names: Collection[str] | None = None
) -> dict[str, subprocess.Popen[bytes] | None]:
    """Start every node (of `names`, default all) that is not running (a cluster's others keep
    running); returns each node's process by name, None for one that was running already."""
    nodes = kafka_nodes(settings)
    started: dict[str, subprocess.Popen[bytes] | None] = {}
    down = []
    for node in nodes:
        if names is not None and node.name not in names:
            continue
        running = read_pid(settings, node.name)
        if running and alive(*running):
            started[node.name] = None
        else:
            check_port(settings, "kafka", node.port)
            down.append(node)
    if not down:
        return started
    if settings.topic_replication_factor > len(nodes):
        raise ConfigError(
            f"FLEETFENCE_TOPIC_REPLICATION_FACTOR={settings.topic_replication_factor} needs as many "
            f"brokers; the embedded Kafka has {len(nodes)} (FLEETFENCE_KAFKA_BROKERS)"
        )
    java = _java()
    libs = ensure_jars("kafka")
    classpath = f"{libs[0].parent}/*"
    settings.kafka_dir.mkdir(parents=True, exist_ok=True)
    controllers = {node.node_id: _controller_port(settings, node) for node in nodes}
    for node in down:
        d = node.dir.resolve()
        d.mkdir(parents=True, exist_ok=True)
        props = d / "server.properties"
        props.write_text(kafka_server_properties(settings, node, controllers))
        log4j = d / "log4j2.properties"
        log4j.write_text(KAFKA_LOG4J)
        _format_kafka_storage(settings, node, java, classpath, props)
    for node in down:
        d = node.dir.resolve()
        props = d / "server.properties"
        argv = [
            str(java),
            *KAFKA_HEAP,
            "-XX:+UseG1GC",
            "-XX:MaxGCPauseMillis=20",
            "-XX:+ExitOnOutOfMemoryError",
            "-Djava.awt.headless=true",
            f"-Dlog4j2.configurationFile={d / 'log4j2.properties'}",
            f"-Dkafka.logs.dir={d}",
            "-cp",
            classpath,
            "kafka.Kafka",
            str(props),
        ]
        started[node.name] = spawn(settings, node.name, argv, d / "broker.log", marker=str(props))
    return started
