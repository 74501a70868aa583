"""The production deployment files agree with each other and with the code (no Docker needed).

docker-compose.yml, Dockerfile, deploy/prometheus.yml, the Grafana dashboard, the receivers file and
the Mosquitto config are parsed and cross-checked: pinned images, health checks, dependency
conditions, volumes, gateway replicas, the Spark master URL and the shared checkpoint, every
FLEETFENCE_* variable against the pydantic settings, scrape targets against the services, and the
dashboard's metric names against the metrics the code really exposes. MQTT identities: the broker
refuses anonymous clients and loads the dynamic-security plugin, vehicles get TLS only, the
bootstrap writes the plugin's file and the certificates where the broker reads them before it
starts, and each service gets its own secret from the environment, never a literal one.
(tests/cli/test_mqtt_cli.py runs deploy/mosquitto.conf itself.)
"""

from __future__ import annotations

import importlib
import json
import re
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client import REGISTRY, CollectorRegistry
from pydantic_settings import BaseSettings

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "docker-compose.yml"
DOCKERFILE = ROOT / "Dockerfile"
DEPLOY = ROOT / "deploy"

KAFKA_NODES = ("kafka-1", "kafka-2", "kafka-3")
EXPECTED_SERVICES = {
    *KAFKA_NODES,
    "mosquitto",
    "redis",
    "spark-master",
    "spark-worker",
    "init",
    "mqtt-bootstrap",
    "processor",
    "api",
    "alerts",
    "prometheus",
    "grafana",
}
ONE_SHOT = {"init", "mqtt-bootstrap"}
SETTINGS_MODULES = (
    "fleetfence.settings",
    "processor.spark.job",
    "gateway.settings",
    "admin_api.settings",
    "alerts.config",
    "simulator.settings",
    "vehicle_master.settings",
)
METRIC_SUFFIXES = {"counter": ("_total", "_created"), "histogram": ("_bucket", "_sum", "_count", "_created")}
METRIC_SOURCE_RE = re.compile(r"(?:Counter|Gauge|Histogram|Summary)\(\s*\"(fleetfence_\w+)\"")
GATEWAY_METRIC_RE = re.compile(r"p \+ \"(\w+)\"")


@cache
def compose() -> dict[str, Any]:
    data = yaml.safe_load(COMPOSE.read_text())
    assert isinstance(data, dict)
    return data


def services() -> dict[str, dict[str, Any]]:
    svcs = compose()["services"]
    assert isinstance(svcs, dict)
    return svcs


def env_of(svc: dict[str, Any]) -> dict[str, str]:
    env = svc.get("environment") or {}
    if isinstance(env, list):
        return dict(item.split("=", 1) for item in env)
    return {str(k): str(v) for k, v in env.items()}


def target_of(svc: dict[str, Any]) -> str | None:
    build = svc.get("build")
    return build.get("target") if isinstance(build, dict) else None


def services_with_target(target: str) -> dict[str, dict[str, Any]]:
    return {name: s for name, s in services().items() if target_of(s) == target}


IMAGE_VAR_RE = re.compile(r"\$\{(FLEETFENCE_[A-Z]+_IMAGE):-([^}]+)\}")


def image_default(image: str) -> str:
    """The image a user pulls: the default of `${FLEETFENCE_<NAME>_IMAGE:-default}` (every public
    image can be overridden, e.g. by the local stand-ins of deploy/images/build-local.sh)."""
    m = IMAGE_VAR_RE.fullmatch(image)
    assert m, f"image {image} is not overridable as ${{FLEETFENCE_<NAME>_IMAGE:-<default>}}"
    return m.group(2)


@cache
def dockerfile_instructions() -> dict[str, list[str]]:
    """Stage name -> its instructions, each on one line (backslash continuations joined)."""
    stages: dict[str, list[str]] = {}
    current: list[str] | None = None
    for raw in re.sub(r"\\\n", " ", DOCKERFILE.read_text()).splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        m = re.match(r"(?i)^FROM\s+\S+\s+AS\s+(\S+)\s*$", line)
        if m:
            current = stages[m.group(1)] = []
        elif current is not None:
            current.append(re.sub(r"\s+", " ", line))
    return stages


@cache
def dockerfile_stages() -> dict[str, dict[str, Any]]:
    """Stage name -> {parent, users}: the FROM ... AS name lines and the USER lines after each."""
    stages: dict[str, dict[str, Any]] = {}
    current: dict[str, Any] | None = None
    for raw in DOCKERFILE.read_text().splitlines():
        line = raw.strip()
        m = re.match(r"(?i)^FROM\s+(\S+)(?:\s+AS\s+(\S+))?\s*$", line)
        if m:
            assert m.group(2), f"unnamed stage in the Dockerfile: {line}"
            current = stages[m.group(2)] = {"parent": m.group(1), "users": []}
        elif current is not None and re.match(r"(?i)^USER\s+", line):
            current["users"].append(line.split()[1])
    return stages


def effective_user(stage: str) -> str:
    stages = dockerfile_stages()
    info = stages[stage]
    if info["users"]:
        return str(info["users"][-1])
    if info["parent"] in stages:
        return effective_user(info["parent"])
    return "root"


def setting_env_names() -> set[str]:
    names: set[str] = set()
    for mod_name in SETTINGS_MODULES:
        mod = importlib.import_module(mod_name)
        for obj in vars(mod).values():
            if isinstance(obj, type) and issubclass(obj, BaseSettings) and obj is not BaseSettings:
                names |= {"FLEETFENCE_" + field.upper() for field in obj.model_fields}
    return names


def exposed_metric_names() -> set[str]:
    """Every sample name the services expose, from their real metric objects."""
    for mod in (
        "processor.ops.service",
        "admin_api.middleware",
        "vehicle_master.relay",
        "vehicle_master.store",
    ):
        importlib.import_module(mod)
    from alerts.metrics import families
    from gateway.metrics import GatewayCollector, GatewayStats

    alerts_registry = CollectorRegistry()
    families(alerts_registry)
    metrics = [
        *REGISTRY.collect(),
        *alerts_registry.collect(),
        *GatewayCollector(GatewayStats(), lambda: 0, lambda: True).collect(),
        # A device edge's (gateway.edge) collector adds its own families.
        *GatewayCollector(
            GatewayStats(), lambda: 0, lambda: True, shard=None, devices_connected=lambda: 0
        ).collect(),
    ]
    names: set[str] = set()
    for m in metrics:
        if not m.name.startswith("fleetfence_"):
            continue
        suffixes = METRIC_SUFFIXES.get(m.type, ("",))
        names |= {m.name + s for s in suffixes}
    return names


def source_metric_names() -> set[str]:
    """The metric names written in the source (grep), without the counter's _total."""
    found: set[str] = set()
    for pkg in ("fleetfence", "gateway", "processor", "vehicle_master", "alerts", "admin_api", "simulator"):
        for path in (ROOT / pkg).rglob("*.py"):
            text = path.read_text()
            found |= {n.removesuffix("_total") for n in METRIC_SOURCE_RE.findall(text)}
            if path.name == "metrics.py" and pkg == "gateway":
                found |= {"fleetfence_gateway_" + n for n in GATEWAY_METRIC_RE.findall(text)}
    return found


def container_ports(svc: dict[str, Any]) -> set[int]:
    ports = {int(str(p).split("/")[0]) for p in svc.get("expose", [])}
    for p in svc.get("ports", []):
        ports.add(int(str(p).split(":")[-1].split("/")[0]))
    return ports


# --------------------------------------------------------------------------- compose structure


def test_expected_services_exist() -> None:
    missing = EXPECTED_SERVICES - set(services())
    assert not missing, f"missing services: {sorted(missing)}"
    assert services_with_target("gateway"), "no gateway service"


def test_every_long_running_service_has_a_healthcheck() -> None:
    for name, svc in services().items():
        if name in ONE_SHOT:
            assert svc.get("restart") == "no", f"{name}: a one-shot service must not restart"
            continue
        hc = svc.get("healthcheck")
        assert hc, f"{name} has no healthcheck"
        assert not hc.get("disable"), f"{name}: healthcheck disabled"
        test = hc.get("test")
        assert test, f"{name}: empty healthcheck"
        assert test != ["NONE"], f"{name}: healthcheck disabled"
        for key in ("interval", "timeout", "retries"):
            assert key in hc, f"{name}: healthcheck without {key}"


def test_every_dependency_uses_a_condition() -> None:
    svcs = services()
    for name, svc in svcs.items():
        deps = svc.get("depends_on", {})
        assert isinstance(deps, dict), f"{name}: depends_on must be a map with conditions"
        for dep, spec in deps.items():
            assert dep in svcs, f"{name} depends on unknown service {dep}"
            cond = (spec or {}).get("condition")
            if dep in ONE_SHOT:
                assert cond == "service_completed_successfully", f"{name} -> {dep}: {cond}"
            else:
                assert cond == "service_healthy", f"{name} -> {dep}: {cond}"
                assert "healthcheck" in svcs[dep], f"{name} waits for {dep}, which has no healthcheck"
    # Everything that talks to Kafka waits for the topics.
    for name in ("processor", "api", "alerts", *services_with_target("gateway")):
        assert "init" in svcs[name].get("depends_on", {}), f"{name} does not wait for init"


def test_images_are_pinned_or_built_from_our_dockerfile() -> None:
    stages = dockerfile_stages()
    for name, svc in services().items():
        image, build = svc.get("image"), svc.get("build")
        assert image or build, f"{name}: neither image nor build"
        if build is not None:
            assert isinstance(build, dict), f"{name}: build must name a target"
            assert build.get("context", ".") == "."
            assert build.get("dockerfile", "Dockerfile") == "Dockerfile"
            assert build.get("target") in stages, f"{name}: target {build.get('target')} not in Dockerfile"
        if image is not None:
            image = image_default(image)
            assert "$" not in image, f"{name}: image from a variable cannot be checked: {image}"
            repo, sep, tag = image.rpartition(":")
            assert sep, f"{name}: image {image} has no tag"
            assert "/" not in tag, f"{name}: image {image} has no tag"
            assert tag != "latest", f"{name}: image {image} is not pinned"
            assert re.search(r"\d", tag), f"{name}: image {image} is not pinned to a version"
            assert repo


def test_dockerfile_targets_base_java_and_user() -> None:
    stages = dockerfile_stages()
    for target in ("gateway", "processor", "api", "alerts", "spark"):
        assert target in stages, f"Dockerfile has no {target} target"
        assert effective_user(target) not in {"root", "0"}, f"{target} runs as root"
    text = DOCKERFILE.read_text()
    assert "python:3.11-slim-bookworm" in text
    assert "openjdk-17-jre-headless" in text
    assert re.search(r"pip install (--no-deps )?\.", text)

    def ancestry(stage: str) -> list[str]:
        chain = [stage]
        while stages[chain[-1]]["parent"] in stages:
            chain.append(stages[chain[-1]]["parent"])
        return chain

    for target in ("processor", "spark"):
        assert "jvm" in ancestry(target), f"{target} lacks the Java stage"
    for target in ("gateway", "api", "alerts"):
        assert "jvm" not in ancestry(target), f"{target} carries a JVM it does not need"


def test_volumes_are_declared_and_bind_mounts_exist() -> None:
    declared = set(compose().get("volumes") or {})
    used: set[str] = set()
    for name, svc in services().items():
        for vol in svc.get("volumes", []):
            source = vol["source"] if isinstance(vol, dict) else str(vol).split(":")[0]
            if source.startswith((".", "/")):
                assert (ROOT / source).resolve().exists(), f"{name}: bind mount {source} does not exist"
            else:
                assert source in declared, f"{name}: volume {source} is not declared"
                used.add(source)
    for vol in (*(f"{k}-data" for k in KAFKA_NODES), "redis-data", "spark-checkpoints"):
        assert vol in used, f"named volume {vol} is not used"
    assert not declared - used, f"declared but unused volumes: {sorted(declared - used)}"


# --------------------------------------------------------------------------- FleetFence services


def test_two_device_edge_replicas_each_on_its_own_published_tls_port() -> None:
    """The gateways are the device edge (issue #58): each listens for vehicles over TLS with the
    broker's server pair (copied for its user by mqtt-bootstrap) and publishes its own host port,
    so a tracker can be given both (and publishes its listeners for phones, over HTTPS only, and
    Teltonika units); none reads Mosquitto, so none has a shard or an MQTT secret."""
    gateways = services_with_target("gateway")
    boot = services()["mqtt-bootstrap"]
    edge_dir = boot["command"][boot["command"].index("--edge-certs-dir") + 1]
    edge_volume = next(v.split(":")[0] for v in boot["volumes"] if v.split(":")[1] == edge_dir)
    client_ids: list[str | None] = []
    host_ports: list[str] = []
    for name, svc in gateways.items():
        n = int((svc.get("deploy") or {}).get("replicas", 1))
        assert n == 1, f"{name}: replicas of one service would share one published port"
        env = env_of(svc)
        client_ids.append(env.get("FLEETFENCE_GATEWAY_CLIENT_ID"))
        assert not {k for k in env if "SHARD" in k}, f"{name}: an edge has no shard"
        tls_port = env.get("FLEETFENCE_GATEWAY_EDGE_TLS_PORT")
        assert tls_port, f"{name}: not the device edge (no FLEETFENCE_GATEWAY_EDGE_TLS_PORT)"
        assert env.get("FLEETFENCE_GATEWAY_EDGE_HOST") == "0.0.0.0", f"{name}: bind every address"
        tls_dir = env.get("FLEETFENCE_MQTT_TLS_DIR")
        assert f"{edge_volume}:{tls_dir}:ro" in svc.get("volumes", []), f"{name}: no server pair at {tls_dir}"
        assert tls_dir == edge_dir
        listeners = {
            env.get(k)
            for k in ("FLEETFENCE_GATEWAY_HTTPS_PORT", "FLEETFENCE_GATEWAY_TELTONIKA_PORT")
            if env.get(k)
        }
        assert "FLEETFENCE_GATEWAY_HTTP_PORT" not in env, f"{name}: phones' secrets travel over TLS only"
        ports = [str(p) for p in svc.get("ports", [])]
        published = {p.rsplit(":", 1)[1] for p in ports}
        assert published == {tls_port, *listeners}, f"{name}: publishes {ports}"
        host_ports.extend(p.rsplit(":", 1)[0] for p in ports)
        assert "mosquitto" not in (svc.get("depends_on") or {}), f"{name}: the edge does not use Mosquitto"
        assert "redis" in (svc.get("depends_on") or {}), f"{name}: logins are checked in Redis"
        assert "container_name" not in svc
    assert len(gateways) >= 2
    assert all(client_ids), f"a gateway without FLEETFENCE_GATEWAY_CLIENT_ID: {client_ids}"
    assert len(set(client_ids)) == len(client_ids), f"client ids repeat: {client_ids}"
    assert len(set(host_ports)) == len(host_ports), f"host ports repeat: {host_ports}"
    owner = boot["command"][boot["command"].index("--edge-owner") + 1]
    assert owner == "10001:10001", "the images' user (Dockerfile: useradd --uid 10001) must own the copy"


def test_processor_runs_on_the_spark_master_with_a_shared_checkpoint() -> None:
    svcs = services()
    proc = svcs["processor"]
    env = env_of(proc)
    m = re.fullmatch(r"spark://([\w.-]+):(\d+)", env["FLEETFENCE_PROCESSOR_SPARK_MASTER"])
    assert m, env["FLEETFENCE_PROCESSOR_SPARK_MASTER"]
    master_name, port = m.group(1), m.group(2)
    assert master_name in svcs
    assert target_of(svcs[master_name]) == "spark"
    master_cmd = svcs[master_name]["command"]
    assert "org.apache.spark.deploy.master.Master" in master_cmd
    assert master_cmd[master_cmd.index("--port") + 1] == port
    assert master_cmd[master_cmd.index("--host") + 1] == master_name
    assert target_of(proc) == "processor"
    assert "command" not in proc
    assert 'CMD ["fleetfence", "processor"]' in DOCKERFILE.read_text()
    assert "spark-master" in proc["depends_on"]
    assert "spark-worker" in proc["depends_on"]

    worker = svcs["spark-worker"]
    assert target_of(worker) == "spark"
    worker_cmd = worker["command"]
    assert "org.apache.spark.deploy.worker.Worker" in worker_cmd
    assert f"spark://{master_name}:{port}" in worker_cmd
    worker_cores = int(worker_cmd[worker_cmd.index("--cores") + 1])
    # Each driver's application takes at most its cores, so the worker has room for the active
    # driver's executor and the standby's; shuffle partitions = an application's executor cores;
    # buckets >= shuffle partitions (docs/deploy.md).
    cores = int(env["FLEETFENCE_PROCESSOR_CORES_MAX"])
    drivers = [name for name in svcs if name == "processor" or name.startswith("processor-")]
    assert worker_cores >= cores * len(drivers), (worker_cores, cores, drivers)
    shuffle = int(env["FLEETFENCE_PROCESSOR_SHUFFLE_PARTITIONS"])
    assert shuffle == cores
    assert int(env["FLEETFENCE_PROCESSOR_BUCKETS"]) >= shuffle
    assert int(env_of(svcs["init"]).get("FLEETFENCE_TELEMETRY_PARTITIONS", "4")) >= cores

    checkpoint = env["FLEETFENCE_PROCESSOR_CHECKPOINT"]

    def named_mounts(svc: dict[str, Any]) -> dict[str, str]:
        out = {}
        for vol in svc.get("volumes", []):
            source, target = str(vol).split(":")[:2]
            if not source.startswith((".", "/")):
                out[target] = source
        return out

    pm, wm = named_mounts(proc), named_mounts(worker)
    holder = [t for t in pm if checkpoint == t or checkpoint.startswith(t.rstrip("/") + "/")]
    assert holder, f"checkpoint {checkpoint} is not on a named volume of the processor"
    assert wm.get(holder[0]) == pm[holder[0]], (
        "the worker does not mount the checkpoint volume at the same path"
    )


def test_a_warm_standby_runs_the_same_job_on_the_same_checkpoint() -> None:
    svcs = services()
    active, standby = env_of(svcs["processor"]), env_of(svcs["processor-standby"])
    # Both warm: a fenced or killed driver comes back as a standby that has run the job once.
    assert active["FLEETFENCE_PROCESSOR_STANDBY"] == standby["FLEETFENCE_PROCESSOR_STANDBY"] == "true"
    # Executors connect back to each driver under its own host name; everything else is the same.
    assert svcs["processor-standby"]["hostname"] == standby.pop("SPARK_LOCAL_HOSTNAME") == "processor-standby"
    assert svcs["processor"]["hostname"] == active.pop("SPARK_LOCAL_HOSTNAME") == "processor"
    assert standby == active
    assert svcs["processor-standby"]["volumes"] == svcs["processor"]["volumes"]
    assert svcs["processor-standby"]["restart"] == svcs["processor"]["restart"] == "unless-stopped"


def test_every_fleetfence_variable_is_a_setting() -> None:
    known = setting_env_names()
    # Read from the environment by fleetfence.jars (the jar cache is needed before any settings).
    assert 'os.environ.get("FLEETFENCE_JAR_CACHE")' in (ROOT / "fleetfence" / "jars.py").read_text()
    known.add("FLEETFENCE_JAR_CACHE")
    assert "FLEETFENCE_PROCESSOR_SPARK_MASTER" in known
    assert "FLEETFENCE_RELAY_BATCH_SIZE" in known
    used: dict[str, str] = {}
    for name, svc in services().items():
        for var in env_of(svc):
            if var.startswith("FLEETFENCE_"):
                used[var] = name
    for var in re.findall(r"\b(FLEETFENCE_\w+)=", DOCKERFILE.read_text()):
        used[var] = "Dockerfile"
    unknown = {v: where for v, where in used.items() if v not in known}
    assert not unknown, f"not settings: {unknown}"
    for name in ("processor", "api", "alerts", "init", *services_with_target("gateway")):
        env = env_of(services()[name])
        for var in ("FLEETFENCE_KAFKA_BOOTSTRAP", "FLEETFENCE_MQTT_URL", "FLEETFENCE_REDIS_URL"):
            assert var in env, f"{name}: {var} unset, it would start embedded infrastructure"


def test_alerts_receivers_config_is_valid_and_mounted() -> None:
    from alerts.config import load_config

    svc = services()["alerts"]
    cmd = svc["command"]
    config_path = cmd[cmd.index("--config") + 1]
    mounts = {str(v).split(":")[1]: str(v).split(":")[0] for v in svc["volumes"]}
    assert config_path in mounts, f"{config_path} is not mounted into alerts"
    cfg = load_config(ROOT / mounts[config_path])
    assert cfg.enabled
    # The history is a read model in Redis: without a retention it grows with every alert raised.
    history = [r for r in cfg.enabled if r.kind == "history"]
    assert history
    assert all(r.retention_days is not None for r in history)


def test_mosquitto_config_keeps_gateway_sessions() -> None:
    conf = (DEPLOY / "mosquitto.conf").read_text()
    lines = {line.strip() for line in conf.splitlines() if line.strip() and not line.startswith("#")}
    for wanted in ("persistence true", "max_queued_messages 0", "max_queued_bytes 0"):
        assert wanted in lines, wanted
    assert any(re.fullmatch(r"listener 1883( \S+)?", line) for line in lines)
    mounts = [str(v) for v in services()["mosquitto"]["volumes"]]
    assert "./deploy/mosquitto.conf:/mosquitto/config/mosquitto.conf:ro" in mounts


# --------------------------------------------------------------------------- MQTT identities and TLS

MOSQUITTO_UID = "1883:1883"  # the mosquitto user of the eclipse-mosquitto image (docker/2.0*/Dockerfile)
SECRET_VARS = {kind: f"FLEETFENCE_MQTT_{kind.upper()}_PASSWORD" for kind in ("admin", "gateway", "alerts")}
# Which account's secret each service needs, and no other: the services log in with their own; the
# admin API manages vehicles' credentials; `infra up` (init) creates the service accounts as admin.
SECRETS_OF = {
    "mosquitto": {"admin"},  # its health check logs in
    "mqtt-bootstrap": {"admin"},
    "init": {"admin", "gateway", "alerts"},
    "api": {"admin"},
    "alerts": {"alerts"},
    "processor": set(),
}


def conf_lines() -> list[str]:
    text = (DEPLOY / "mosquitto.conf").read_text()
    return [line.strip() for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]


def listeners() -> dict[str, dict[str, str]]:
    """Port -> its bind address and the listener options after its `listener` line (Mosquitto gives
    such an option to the last listener above it; global options may stand anywhere)."""
    listener_options = {"cafile", "capath", "certfile", "keyfile", "tls_version", "require_certificate"}
    out: dict[str, dict[str, str]] = {}
    current: dict[str, str] | None = None
    for line in conf_lines():
        key, _, value = line.partition(" ")
        if key == "listener":
            port, *bind = value.split()
            current = out.setdefault(port, {"bind": " ".join(bind)})
        elif key in listener_options:
            assert current is not None, f"{line!r} before any listener"
            current[key] = value
    return out


def mounts(svc: dict[str, Any]) -> dict[str, tuple[str, bool]]:
    """Container path -> (source, read-only)."""
    out = {}
    for vol in svc.get("volumes", []):
        parts = str(vol).split(":")
        out[parts[1]] = (parts[0], len(parts) > 2 and "ro" in parts[2].split(","))
    return out


def option(cmd: list[str], name: str) -> str:
    assert name in cmd, f"{name} missing from {cmd}"
    return cmd[cmd.index(name) + 1]


def volume_holding(svc: dict[str, Any], path: str) -> tuple[str, str, bool]:
    """(volume, its mount point, read-only) of the named volume a path of a service lies on."""
    found = [
        (src, target, ro)
        for target, (src, ro) in mounts(svc).items()
        if path == target or path.startswith(target.rstrip("/") + "/")
    ]
    assert found, f"{path} is on no volume"
    src, target, ro = max(found, key=lambda f: len(f[1]))
    assert not src.startswith((".", "/")), f"{path} is on a bind mount, not a named volume"
    return src, target, ro


def test_mosquitto_refuses_anonymous_clients_and_loads_the_plugin() -> None:
    lines = conf_lines()
    assert "allow_anonymous false" in lines
    assert not any(re.fullmatch(r"allow_anonymous\s+true", line) for line in lines)
    assert not any(line.startswith(("password_file", "acl_file")) for line in lines)
    # Global, before any listener: the same accounts on the services' and the vehicles' listener.
    first_listener = next(i for i, line in enumerate(lines) if line.startswith("listener "))
    assert lines.index("per_listener_settings false") < first_listener
    assert lines.index("allow_anonymous false") < first_listener
    # The plugin's path in the eclipse-mosquitto 2.0 image (docker/2.0*/Dockerfile installs it there).
    assert "plugin /usr/lib/mosquitto_dynamic_security.so" in lines
    assert lines.index("plugin /usr/lib/mosquitto_dynamic_security.so") < first_listener
    configs = [line.split(maxsplit=1)[1] for line in lines if line.startswith("plugin_opt_config_file ")]
    assert len(configs) == 1
    assert image_default(services()["mosquitto"]["image"]).startswith("eclipse-mosquitto:2.")


def test_vehicles_get_tls_and_services_the_plain_listener_inside() -> None:
    ls = listeners()
    assert set(ls) == {"1883", "8883"}, ls
    assert not {"cafile", "certfile", "keyfile"} & set(ls["1883"]), "1883 is the services' plain listener"
    assert {"cafile", "certfile", "keyfile"} <= set(ls["8883"]), "8883 lacks its TLS files"
    assert ls["8883"].get("tls_version") in {"tlsv1.2", "tlsv1.3"}
    mosq = services()["mosquitto"]
    published = {str(p).split(":")[-1] for p in mosq.get("ports", [])}
    assert published == {"8883"}, f"only TLS may be published on the host: {mosq.get('ports')}"
    assert {"1883", "8883"} <= {str(p) for p in mosq.get("expose", [])}
    for name, svc in services().items():
        if "FLEETFENCE_MQTT_URL" in env_of(svc):
            assert env_of(svc)["FLEETFENCE_MQTT_URL"] == "mqtt://mosquitto:1883", name


def test_the_bootstrap_writes_what_the_broker_reads_before_it_starts() -> None:
    from typer.main import get_command

    from cli.app import app
    from fleetfence.mqtt import PERSISTENCE_FILE
    from fleetfence.pki import CA_CERT, SERVER_CERT, SERVER_KEY

    svcs = services()
    boot, mosq = svcs["mqtt-bootstrap"], svcs["mosquitto"]
    assert (mosq.get("depends_on") or {}).get("mqtt-bootstrap") == {
        "condition": "service_completed_successfully"
    }, "the broker must start after the bootstrap"
    assert target_of(boot) in dockerfile_stages()
    cmd = [str(c) for c in boot["command"]]
    assert cmd[:3] == ["fleetfence", "mqtt", "bootstrap"]
    # Every option of the command line exists (typer would refuse it at the first start).
    group = get_command(app)
    bootstrap = group.commands["mqtt"].commands["bootstrap"]  # type: ignore[attr-defined]
    known = {opt for p in bootstrap.params for opt in p.opts}
    assert {c for c in cmd if c.startswith("--")} <= known

    # The plugin's file: where the config says, on the volume both mount at the same place.
    lines = conf_lines()
    dynsec = next(line.split(maxsplit=1)[1] for line in lines if line.startswith("plugin_opt_config_file "))
    assert cmd[3] == dynsec
    vol, target, ro = volume_holding(mosq, dynsec)
    assert not ro, "the broker rewrites the plugin's file on every change"
    assert volume_holding(boot, dynsec)[:2] == (vol, target)
    persistence = next(
        line.split(maxsplit=1)[1] for line in lines if line.startswith("persistence_location ")
    )
    assert volume_holding(mosq, persistence)[0] == vol
    # The bootstrap hands the plugin file's folder to the broker and checks it can create files
    # there (fleetfence.mqtt.bootstrap_dynsec): the persistence file must be written in that folder.
    assert persistence.rstrip("/") == dynsec.rsplit("/", 1)[0], "persistence outside the handed-over folder"
    names = [line.split(maxsplit=1)[1] for line in lines if line.startswith("persistence_file ")]
    assert names in ([], [PERSISTENCE_FILE]), names

    # The TLS files: the names the command writes, in the folder it writes them to.
    certs_dir = option(cmd, "--certs-dir")
    tls = listeners()["8883"]
    assert tls["cafile"] == f"{certs_dir}/{CA_CERT}"
    assert tls["certfile"] == f"{certs_dir}/{SERVER_CERT}"
    assert tls["keyfile"] == f"{certs_dir}/{SERVER_KEY}"
    cvol, ctarget, cro = volume_holding(mosq, tls["keyfile"])
    assert cro, "the broker only reads its certificates"
    assert volume_holding(boot, tls["keyfile"])[:2] == (cvol, ctarget)
    # The CA key signs; the broker never sees it.
    ca_key = option(cmd, "--ca-key")
    ca_vol = volume_holding(boot, ca_key)[0]
    assert ca_vol not in {src for src, _ in mounts(mosq).values()}, "the broker mounts the CA key"
    assert re.fullmatch(r"\$\{MQTT_TLS_HOSTNAMES:\?[^}]+\}", option(cmd, "--hostname"))

    # Root for this one step (to hand the files over), the broker's own user for the files.
    assert option(cmd, "--owner") == MOSQUITTO_UID
    assert boot.get("user") == "0:0"
    assert boot.get("restart") == "no"
    others = {name for name, svc in svcs.items() if "user" in svc and name != "mqtt-bootstrap"}
    assert not others, f"services overriding the image's user: {sorted(others)}"


def test_each_service_gets_only_its_own_mqtt_secret_from_the_environment() -> None:
    svcs = services()
    # The gateways are the device edge: they check vehicles' logins in Redis and log in nowhere.
    wanted = {**SECRETS_OF, **{name: set() for name in services_with_target("gateway")}}
    for name, svc in svcs.items():
        env = env_of(svc)
        given = {kind for kind, var in SECRET_VARS.items() if var in env}
        if name in wanted:
            assert given == wanted[name], (
                f"{name}: MQTT secrets {sorted(given)}, wants {sorted(wanted[name])}"
            )
        else:
            assert not given, f"{name} gets MQTT secrets {sorted(given)}"
        for var, value in env.items():
            if re.search(r"PASSWORD|SECRET|_KEY$", var):
                source = re.fullmatch(r"\$\{(\w+):\?[^}]+\}", value)
                assert source, f"{name}: {var} must come from the environment as ${{VAR:?message}}"
                if var in SECRET_VARS.values():
                    assert source.group(1) == var, f"{name}: {var} from {source.group(1)}"
    # Services that speak MQTT use the default account names, which the health check uses too.
    from fleetfence.settings import Settings

    assert not any(
        re.fullmatch(r"FLEETFENCE_MQTT_\w+_USERNAME", var) for svc in svcs.values() for var in env_of(svc)
    )
    admin = Settings.model_fields["mqtt_admin_username"].default
    kind, test = svcs["mosquitto"]["healthcheck"]["test"]
    assert kind == "CMD-SHELL"
    assert f"-u {admin} " in test
    assert '-P "$$FLEETFENCE_MQTT_ADMIN_PASSWORD"' in test, "the health check must log in"
    assert "-p 1883" in test


def test_every_required_variable_is_in_the_env_example() -> None:
    text = "\n".join(line for line in COMPOSE.read_text().splitlines() if not line.lstrip().startswith("#"))
    required = set(re.findall(r"\$\{(\w+):\?", text))
    assert {*SECRET_VARS.values(), "MQTT_TLS_HOSTNAMES", "GRAFANA_ADMIN_PASSWORD"} <= required
    example = {}
    for line in (DEPLOY / "compose.env.example").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            key, _, value = line.partition("=")
            example[key] = value
    # Compose's own settings (the profiles to run) are not the compose file's variables.
    profiles = example.pop("COMPOSE_PROFILES", None)
    assert profiles == "grafana", "the example runs the dashboard unless the operator empties the line"
    assert set(example) == required, "deploy/compose.env.example and docker-compose.yml disagree"
    assert all(v == "" for v in example.values()), "the example must not carry values"


def test_grafana_is_optional_through_its_profile() -> None:
    """Issue #64, case 4: where no Grafana image can be had, `docker-compose start` failed on it and
    nothing said how to run without it. It is in the `grafana` profile: plain `up -d` runs the rest,
    COMPOSE_PROFILES=grafana (the env example) adds it. Nothing may need it to start, and it is the
    only service in a profile (a profile on any other would leave the deployment incomplete)."""
    svcs = services()
    in_profiles = {name: svc.get("profiles") for name, svc in svcs.items() if svc.get("profiles")}
    assert in_profiles == {"grafana": ["grafana"]}
    needs_grafana = [name for name, svc in svcs.items() if "grafana" in (svc.get("depends_on") or {})]
    assert not needs_grafana
    deploy_doc = (ROOT / "docs" / "deploy.md").read_text()
    assert "COMPOSE_PROFILES=grafana" in deploy_doc
    assert "--profile grafana" in deploy_doc


def test_the_bootstrap_image_can_make_certificates() -> None:
    """`fleetfence mqtt bootstrap --certs-dir` needs `cryptography`, which only the dev tools pull
    into the virtualenv: the images install the project's own dependencies only."""
    import tomllib

    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    assert any(re.match(r"cryptography\b", d) for d in deps), (
        "add cryptography to [project].dependencies (the mqtt-bootstrap service runs the api image)"
    )


# --------------------------------------------------------------------------- observability


def test_prometheus_scrapes_compose_services_on_their_metrics_ports() -> None:
    prom = yaml.safe_load((DEPLOY / "prometheus.yml").read_text())
    svcs = services()
    seen: set[str] = set()
    for job in prom["scrape_configs"]:
        for sc in job["static_configs"]:
            for target in sc["targets"]:
                host, port_s = target.rsplit(":", 1)
                port = int(port_s)
                assert host in svcs, f"{job['job_name']}: {host} is not a compose service"
                assert port in container_ports(svcs[host]), f"{target}: {host} does not expose {port}"
                if svcs[host].get("build"):
                    port_vars = {
                        int(v) for k, v in env_of(svcs[host]).items() if k.endswith("_PORT") and v.isdigit()
                    }
                    assert port in port_vars, f"{target}: no FLEETFENCE_*_PORT of {host} is {port}"
                    assert env_of(svcs[host]).get("FLEETFENCE_HOST") == "0.0.0.0", f"{host} binds loopback"
                seen.add(host)
    wanted = {"alerts", "api", *services_with_target("gateway"), *services_with_target("processor")}
    assert wanted <= seen, f"not scraped: {sorted(wanted - seen)}"


def test_grafana_dashboard_queries_only_real_metrics() -> None:
    exposed = exposed_metric_names()
    in_source = source_metric_names()
    bases = {n.removesuffix(s) for n in exposed for s in ("_total", "_bucket", "_sum", "_count", "_created")}
    assert in_source <= bases, f"metrics in the code the test does not collect: {sorted(in_source - bases)}"

    dashboards = sorted((DEPLOY / "grafana" / "dashboards").glob("*.json"))
    assert dashboards
    datasources = yaml.safe_load(
        (DEPLOY / "grafana" / "provisioning" / "datasources" / "prometheus.yml").read_text()
    )
    uids = {d["uid"] for d in datasources["datasources"]}
    provider = yaml.safe_load(
        (DEPLOY / "grafana" / "provisioning" / "dashboards" / "fleetfence.yml").read_text()
    )
    grafana_mounts = {str(v).split(":")[1]: str(v).split(":")[0] for v in services()["grafana"]["volumes"]}
    for p in provider["providers"]:
        assert grafana_mounts.get(p["options"]["path"]) == "./deploy/grafana/dashboards"

    queried: set[str] = set()
    for path in dashboards:
        dash = json.loads(path.read_text())
        assert dash["uid"]
        assert dash["panels"]
        for panel in dash["panels"]:
            assert panel["datasource"]["uid"] in uids
            for target in panel["targets"]:
                expr = target["expr"]
                names = set(re.findall(r"\bfleetfence_\w+", expr))
                assert names or re.match(r"^up\b", expr), f"{panel['title']}: no FleetFence metric in {expr}"
                unknown = names - exposed
                assert not unknown, f"{panel['title']}: {sorted(unknown)} are not exposed by any service"
                queried |= names
    for prefix in (
        "fleetfence_gateway_",
        "fleetfence_processor_",
        "fleetfence_alert_receiver_",
        "fleetfence_api_",
    ):
        assert any(n.startswith(prefix) for n in queried), f"the dashboard shows no {prefix}* metric"


@pytest.mark.parametrize(
    "name", ["docker-compose.yml", "deploy/prometheus.yml", "deploy/grafana/dashboards/fleetfence.json"]
)
def test_no_latest_anywhere(name: str) -> None:
    assert ":latest" not in (ROOT / name).read_text()


# --------------------------------------------------------------------------- versions and JVM jars


def test_compose_kafka_is_the_embedded_kafka_version() -> None:
    from fleetfence.jars import pom_property

    for node in KAFKA_NODES:
        image = image_default(services()[node]["image"])
        repo, _, tag = image.rpartition(":")
        assert repo == "apache/kafka"
        embedded = pom_property("kafka", "kafka.version")
        assert tag == embedded, f"docker-compose.yml runs Kafka {tag}, the embedded broker {embedded}"


def test_dockerfile_copies_every_package_the_wheel_installs() -> None:
    """`pip install .` in the build stage installs what pyproject's package list finds: a package
    left out of the COPY lines is missing from every image (the `fleetfence` command imports them)."""
    import tomllib

    found = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]["find"]
    packages = {p.rstrip("*") for p in found["include"]}
    copied = set(re.findall(r"(?m)^COPY (\w+) \./\1$", DOCKERFILE.read_text()))
    assert packages <= copied, f"not copied into the build stage: {sorted(packages - copied)}"


def test_dockerfile_base_images_are_overridable_build_arguments() -> None:
    text = DOCKERFILE.read_text()
    args = dict(re.findall(r"(?m)^ARG (\w+)=(\S+)$", text))
    assert args.get("PYTHON_IMAGE") == "python:3.11-slim-bookworm"
    assert args.get("NODE_IMAGE", "").startswith("node:")
    froms = re.findall(r"(?m)^FROM (\S+)", text)
    stages = dockerfile_stages()
    assert all(f in stages or f in {"${PYTHON_IMAGE}", "${NODE_IMAGE}"} for f in froms), froms
    for name, svc in services().items():
        if svc.get("build"):
            build_args = svc["build"].get("args") or {}
            assert image_default(build_args["PYTHON_IMAGE"]) == args["PYTHON_IMAGE"], name
            assert image_default(build_args["NODE_IMAGE"]) == args["NODE_IMAGE"], name


def test_kafka_is_three_kraft_voters_and_topics_are_replicated() -> None:
    """Three nodes, each broker and controller, one quorum of three voters; FleetFence's topics and
    the internal ones with three replicas and min.insync.replicas=2 (producers write acks=all)."""
    from fleetfence.kafka import producer_config

    svcs = services()
    voters = set()
    for i, node in enumerate(KAFKA_NODES, start=1):
        env = env_of(svcs[node])
        assert env["KAFKA_NODE_ID"] == str(i)
        assert env["KAFKA_PROCESS_ROLES"] == "broker,controller"
        assert env["KAFKA_ADVERTISED_LISTENERS"] == f"PLAINTEXT://{node}:9092"
        voters.add(env["KAFKA_CONTROLLER_QUORUM_VOTERS"])
        assert env["KAFKA_OFFSETS_TOPIC_REPLICATION_FACTOR"] == "3"
        assert env["KAFKA_TRANSACTION_STATE_LOG_REPLICATION_FACTOR"] == "3"
        assert env["KAFKA_TRANSACTION_STATE_LOG_MIN_ISR"] == "2"
        assert env["KAFKA_MIN_INSYNC_REPLICAS"] == "2"
        assert env["CLUSTER_ID"] == env_of(svcs[KAFKA_NODES[0]])["CLUSTER_ID"]
        assert f"{node}-data:/var/lib/kafka/data" in svcs[node]["volumes"]
    assert voters == {",".join(f"{i}@{n}:9093" for i, n in enumerate(KAFKA_NODES, start=1))}
    init = env_of(svcs["init"])
    assert init["FLEETFENCE_TOPIC_REPLICATION_FACTOR"] == "3"
    assert init["FLEETFENCE_TOPIC_MIN_INSYNC_REPLICAS"] == "2"
    bootstrap = env_of(svcs["api"])["FLEETFENCE_KAFKA_BOOTSTRAP"]
    assert set(bootstrap.split(",")) == {f"{n}:9092" for n in KAFKA_NODES}
    cfg = producer_config(bootstrap)
    assert cfg["acks"] == "all"
    assert cfg["enable.idempotence"] is True


def test_embedded_cluster_is_configured_as_the_compose_kafka(tmp_path: Path) -> None:
    """`fleetfence infra up --kafka-brokers 3` runs what compose runs, but for addresses and folders:
    every KAFKA_* setting of the compose nodes is in each embedded node's server.properties, and
    one quorum of three voters, node i a broker and voter i."""
    from embedded.kafka_node import kafka_nodes, kafka_server_properties
    from fleetfence.settings import Settings

    s = Settings(state_dir=tmp_path, kafka_brokers=3)
    assert (s.topic_replication_factor, s.topic_min_insync_replicas) == (3, 2)
    nodes = kafka_nodes(s)
    controllers = {n.node_id: 30000 + n.node_id for n in nodes}
    where = {"NODE_ID", "LISTENERS", "ADVERTISED_LISTENERS", "CONTROLLER_QUORUM_VOTERS", "LOG_DIRS"}
    svcs = services()
    for node, compose_node in zip(nodes, KAFKA_NODES, strict=True):
        props = dict(
            line.split("=", 1) for line in kafka_server_properties(s, node, controllers).splitlines() if line
        )
        env = env_of(svcs[compose_node])
        for key, value in env.items():
            if key.startswith("KAFKA_") and key.removeprefix("KAFKA_") not in where:
                ours = props[key.removeprefix("KAFKA_").lower().replace("_", ".")]
                assert sorted(ours.split(",")) == sorted(value.split(",")), key  # a map's order aside
        assert props["node.id"] == env["KAFKA_NODE_ID"]
        assert props["controller.quorum.voters"] == ",".join(
            f"{i}@127.0.0.1:{port}" for i, port in controllers.items()
        )
        assert props["advertised.listeners"] == f"PLAINTEXT://{node.bootstrap}"
    assert s.bootstrap_servers == ",".join(n.bootstrap for n in nodes)


def test_pyspark_pin_is_the_spark_version_of_the_jars() -> None:
    import tomllib

    from fleetfence.jars import pom_property

    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    pins = [m.group(1) for d in deps if (m := re.fullmatch(r"pyspark(?:\[[\w,]+\])?==([\w.]+)", d))]
    assert pins == [pom_property("spark", "spark.version")], (deps, pom_property("spark", "spark.version"))


def test_java_images_carry_the_connector_jars_of_infra_jars() -> None:
    """A stage runs `fleetfence infra jars spark` into FLEETFENCE_JAR_CACHE, and the images that run
    Spark (processor, spark) copy that cache and point FLEETFENCE_JAR_CACHE at it; the others don't."""
    instructions = dockerfile_instructions()
    stages = dockerfile_stages()
    fetchers = {
        name: next(
            (m.group(1) for i in body if (m := re.match(r"ENV .*FLEETFENCE_JAR_CACHE=(\S+)", i))), None
        )
        for name, body in instructions.items()
        if any(re.match(r"RUN .*fleetfence infra jars spark\b", i) for i in body)
    }
    assert len(fetchers) == 1, fetchers
    ((fetch_stage, cache),) = fetchers.items()
    assert cache, f"{fetch_stage} runs `infra jars` without FLEETFENCE_JAR_CACHE"
    assert any(re.match(r"RUN .*apt-get install .*\bmaven\b", i) for i in instructions[fetch_stage])
    assert any(f"chmod -R a+rX {cache}" in i for i in instructions[fetch_stage]), (
        "jars unreadable as non-root"
    )

    def ancestry(stage: str) -> list[str]:
        chain = [stage]
        while stages[chain[-1]]["parent"] in stages:
            chain.append(stages[chain[-1]]["parent"])
        return chain

    def carries(target: str) -> bool:
        body = [i for s in ancestry(target) for i in instructions[s]]
        copied = f"COPY --from={fetch_stage} {cache} {cache}" in body
        pointed = any(re.match(rf"ENV .*FLEETFENCE_JAR_CACHE={re.escape(cache)}(\s|$)", i) for i in body)
        assert copied == pointed, f"{target}: copies the jar cache without pointing to it, or the reverse"
        return copied

    for target in ("processor", "spark"):
        assert carries(target), f"{target} lacks Spark's Kafka connector jars"
    for target in ("gateway", "api", "alerts"):
        assert not carries(target), f"{target} carries JVM jars it does not need"
