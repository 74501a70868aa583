"""The production deployment files agree with each other and with the code (no Docker needed).

docker-compose.yml, Dockerfile, deploy/prometheus.yml, the Grafana dashboard, the receivers file and
the Mosquitto config are parsed and cross-checked: pinned images, health checks, dependency
conditions, volumes, gateway replicas, the Spark master URL and the shared checkpoint, every
FLEETFENCE_* variable against the pydantic settings, scrape targets against the services, and the
dashboard's metric names against the metrics the code really exposes.
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

EXPECTED_SERVICES = {
    "kafka",
    "mosquitto",
    "redis",
    "spark-master",
    "spark-worker",
    "init",
    "processor",
    "api",
    "alerts",
    "prometheus",
    "grafana",
}
ONE_SHOT = {"init"}
SETTINGS_MODULES = (
    "fleetfence.settings",
    "processor.job",
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
    for mod in ("processor.service", "admin_api.middleware", "vehicle_master.relay", "vehicle_master.store"):
        importlib.import_module(mod)
    from alerts.metrics import families
    from gateway.metrics import GatewayCollector, GatewayStats

    alerts_registry = CollectorRegistry()
    families(alerts_registry)
    metrics = [
        *REGISTRY.collect(),
        *alerts_registry.collect(),
        *GatewayCollector(GatewayStats(), lambda: 0, lambda: True).collect(),
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
    assert re.search(r"pip install \.", text)

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
    for vol in ("kafka-data", "redis-data", "spark-checkpoints"):
        assert vol in used, f"named volume {vol} is not used"
    assert not declared - used, f"declared but unused volumes: {sorted(declared - used)}"


# --------------------------------------------------------------------------- FleetFence services


def test_two_gateway_replicas_with_distinct_client_ids() -> None:
    gateways = services_with_target("gateway")
    replicas = 0
    client_ids, groups = [], set()
    for name, svc in gateways.items():
        n = int((svc.get("deploy") or {}).get("replicas", 1))
        assert n == 1, f"{name}: replicas of one service would share one MQTT client id"
        replicas += n
        env = env_of(svc)
        client_ids.append(env.get("FLEETFENCE_GATEWAY_CLIENT_ID"))
        groups.add(env.get("FLEETFENCE_GATEWAY_SHARE_GROUP", "gw"))
        assert "container_name" not in svc
    assert replicas >= 2
    assert all(client_ids), f"a gateway without FLEETFENCE_GATEWAY_CLIENT_ID: {client_ids}"
    assert len(set(client_ids)) == len(client_ids), f"client ids repeat: {client_ids}"
    assert len(groups) == 1, f"gateways in different share groups: {groups}"


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
    cores = int(worker_cmd[worker_cmd.index("--cores") + 1])
    # Shuffle partitions = total executor cores; buckets >= shuffle partitions (docs/deploy.md).
    shuffle = int(env["FLEETFENCE_PROCESSOR_SHUFFLE_PARTITIONS"])
    assert shuffle == cores
    assert int(env.get("FLEETFENCE_PROCESSOR_BUCKETS", "16")) >= shuffle
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


def test_mosquitto_config_keeps_gateway_sessions() -> None:
    conf = (DEPLOY / "mosquitto.conf").read_text()
    lines = {line.strip() for line in conf.splitlines() if line.strip() and not line.startswith("#")}
    for wanted in ("persistence true", "max_queued_messages 0", "max_queued_bytes 0"):
        assert wanted in lines, wanted
    assert any(re.fullmatch(r"listener 1883( \S+)?", line) for line in lines)
    mounts = [str(v) for v in services()["mosquitto"]["volumes"]]
    assert "./deploy/mosquitto.conf:/mosquitto/config/mosquitto.conf:ro" in mounts


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
    wanted = {"processor", "alerts", "api", *services_with_target("gateway")}
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

    image = services()["kafka"]["image"]
    repo, _, tag = image.rpartition(":")
    assert repo == "apache/kafka"
    assert tag == pom_property("kafka", "kafka.version"), (
        f"docker-compose.yml runs Kafka {tag}, the embedded broker {pom_property('kafka', 'kafka.version')}"
    )


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
