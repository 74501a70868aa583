"""The deployment under test: docker-compose.yml as users run it, driven from the host.

`Deployment` runs `docker-compose` (the v1 tool Debian ships; `FLEETFENCE_DEPLOY_COMPOSE` names
another) on the repository's compose file plus one generated override that adds `driver`: a one-off
container of the api image on the compose network, which runs `fleetfence loadtest --attach` (the
simulator's fleet registered through the admin API on the published port 8000, each vehicle with its
own credentials over TLS on the published port 8883, reached as `host.docker.internal`) and reads
Kafka for the checks. Every wait polls a condition against a deadline (`fleetfence.testing.wait_for`).
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from fleetfence.probes import free_port
from fleetfence.testing import wait_for

ROOT = Path(__file__).resolve().parents[1]
PROJECT = os.environ.get("FLEETFENCE_DEPLOY_PROJECT", "ffdeploytest")
ONE_SHOT = ("mqtt-bootstrap", "init")
# Toxiproxy between the Spark application (driver and executor) and the brokers, for the faults on
# that link: every broker gets a second listener, advertised as the proxy's port for it, and the
# processor's bootstrap names the proxy. Without a toxic the proxy only forwards.
TOXIPROXY = "toxiproxy"
TOXIPROXY_VERSION = "2.5.0"
TOXIPROXY_PUBLIC_IMAGE = f"ghcr.io/shopify/toxiproxy:{TOXIPROXY_VERSION}"
TOXIPROXY_API_PORT = 8474
TOXIPROXY_PORT_BASE = 19090  # kafka-N through the proxy: toxiproxy:19090+N
PROXIED_LISTENER_PORT = 9094
# Names the TLS certificate of the vehicles' listener carries: the driver reaches the published
# port through the host as host.docker.internal; localhost for a client on the host.
TLS_HOSTNAMES = "localhost,127.0.0.1,mosquitto,host.docker.internal"


class DeployError(AssertionError):
    """The deployment did not do what the test needs: fails the test loudly (never a skip)."""


def run(
    argv: list[str],
    *,
    timeout_s: float,
    env: dict[str, str] | None = None,
    check: bool = True,
    input_text: str | None = None,
) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(
        argv,
        capture_output=True,
        text=True,
        timeout=timeout_s,
        env=env,
        check=False,
        input=input_text,
        cwd=ROOT,
    )
    if check and proc.returncode != 0:
        raise DeployError(
            f"{' '.join(argv[:6])} ... exited {proc.returncode}:\n{(proc.stdout + proc.stderr)[-4000:]}"
        )
    return proc


# --------------------------------------------------------------------------- the Docker daemon


@dataclass
class Daemon:
    """The Docker daemon: the running one, or one this test starts (and stops) as root with default
    settings and its data under FLEETFENCE_DEPLOY_DOCKER_DIR (kept between runs: the layer cache)."""

    started: subprocess.Popen[bytes] | None = None

    @staticmethod
    def answers() -> bool:
        return (
            subprocess.run(["docker", "info"], capture_output=True, timeout=30, check=False).returncode == 0
        )

    def ensure(self) -> None:
        if shutil.which("docker") is None or shutil.which("dockerd") is None:
            raise DeployError(
                "Docker is not installed: apt-get install -y docker.io docker-compose debootstrap"
            )
        if self.answers():
            return
        if os.geteuid() != 0:
            raise DeployError("no Docker daemon answers, and only root can start one here")
        d = Path(os.environ.get("FLEETFENCE_DEPLOY_DOCKER_DIR", "/var/tmp/fleetfence-docker"))
        d.mkdir(parents=True, exist_ok=True)
        log = (d / "dockerd.log").open("ab")
        self.started = subprocess.Popen(
            [
                "dockerd",
                "--data-root",
                str(d / "data"),
                "--exec-root",
                str(d / "exec"),
                "--pidfile",
                str(d / "dockerd.pid"),
                "-H",
                "unix:///var/run/docker.sock",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        log.close()
        try:
            wait_for(
                lambda: self.started is not None and self.started.poll() is None and self.answers(),
                90,
                "the Docker daemon this test started",
                interval_s=0.5,
            )
        except Exception:
            self.stop()
            raise DeployError(f"dockerd did not come up: {(d / 'dockerd.log').read_text()[-3000:]}") from None

    def stop(self) -> None:
        proc, self.started = self.started, None
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(signal.SIGTERM)  # stops its containerd as well
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


# --------------------------------------------------------------------------- images


def build_local_images() -> dict[str, str]:
    """The local stand-ins (deploy/images/build-local.sh) and the overrides it writes; with
    FLEETFENCE_DEPLOY_PUBLIC_IMAGES=1 the public images instead (a machine that reaches Docker Hub)."""
    if os.environ.get("FLEETFENCE_DEPLOY_PUBLIC_IMAGES") == "1":
        return {"FLEETFENCE_DEPLOY_TOXIPROXY_IMAGE": TOXIPROXY_PUBLIC_IMAGE}
    run(["bash", "deploy/images/build-local.sh"], timeout_s=1800)
    out = {}
    for line in (ROOT / "deploy" / "images" / "local.env").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            k, _, v = line.partition("=")
            out[k] = v
    out["FLEETFENCE_DEPLOY_TOXIPROXY_IMAGE"] = build_toxiproxy()
    return out


def build_toxiproxy() -> str:
    """A toxiproxy image for the suite (no public image can be pulled here): the server built from
    its Go module (`go install`, through the Go module proxy) on the debootstrapped base."""
    tag = f"local/toxiproxy:{TOXIPROXY_VERSION}"
    if run(["docker", "image", "inspect", tag], timeout_s=60, check=False).returncode == 0:
        return tag
    go = shutil.which("go") or shutil.which("go", path="/usr/local/go/bin")
    if go is None:
        raise DeployError(
            "Go is needed to build toxiproxy (go install): none on PATH or in /usr/local/go/bin"
        )
    with tempfile.TemporaryDirectory(prefix="fleetfence-toxiproxy-") as ctx:
        env = {**os.environ, "GOBIN": ctx, "CGO_ENABLED": "0"}
        run(
            [go, "install", f"github.com/Shopify/toxiproxy/v2/cmd/server@v{TOXIPROXY_VERSION}"],
            timeout_s=900,
            env=env,
        )
        (Path(ctx) / "Dockerfile").write_text(
            "ARG BASE_IMAGE=local/debian:bookworm\n"
            "FROM ${BASE_IMAGE}\n"
            "COPY server /usr/local/bin/toxiproxy-server\n"
            "USER nobody\n"
            'ENTRYPOINT ["/usr/local/bin/toxiproxy-server"]\n'
        )
        base = os.environ.get("FLEETFENCE_BASE_IMAGE", "local/debian:bookworm")  # as build-local.sh
        run(["docker", "build", "-q", "--build-arg", f"BASE_IMAGE={base}", "-t", tag, ctx], timeout_s=600)
    return tag


# --------------------------------------------------------------------------- the deployment


@dataclass
class Deployment:
    images: dict[str, str]
    work: Path
    services: list[str] = field(default_factory=list)
    api_key: str = ""
    timings: dict[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.env = {
            **os.environ,
            **self.images,
            "GRAFANA_ADMIN_PASSWORD": secrets.token_urlsafe(16),
            "FLEETFENCE_MQTT_ADMIN_PASSWORD": secrets.token_urlsafe(24),
            "FLEETFENCE_MQTT_GATEWAY_PASSWORD": secrets.token_urlsafe(24),
            "FLEETFENCE_MQTT_ALERTS_PASSWORD": secrets.token_urlsafe(24),
            "MQTT_TLS_HOSTNAMES": TLS_HOSTNAMES,
            # The host's side of the published ports: free ones (a shared machine may use 8000).
            "API_HOST_PORT": str(free_port("0.0.0.0")),
            "MQTT_TLS_HOST_PORT": str(free_port("0.0.0.0")),
            "EDGE_TLS_HOST_PORT_1": str(free_port("0.0.0.0")),
            "EDGE_TLS_HOST_PORT_2": str(free_port("0.0.0.0")),
            "PHONES_HOST_PORT_1": str(free_port("0.0.0.0")),
            "PHONES_HOST_PORT_2": str(free_port("0.0.0.0")),
            "TELTONIKA_HOST_PORT_1": str(free_port("0.0.0.0")),
            "TELTONIKA_HOST_PORT_2": str(free_port("0.0.0.0")),
            "PROMETHEUS_HOST_PORT": str(free_port()),
            "GRAFANA_HOST_PORT": str(free_port("0.0.0.0")),
        }
        self.api_port = int(self.env["API_HOST_PORT"])
        self.mqtt_tls_port = int(self.env["MQTT_TLS_HOST_PORT"])
        # The device edge's published ports, one per gateway replica: where the fleet connects.
        self.edge_tls_ports = [int(self.env[f"EDGE_TLS_HOST_PORT_{i}"]) for i in (1, 2)]
        self.phone_ports = [int(self.env[f"PHONES_HOST_PORT_{i}"]) for i in (1, 2)]
        self.teltonika_ports = [int(self.env[f"TELTONIKA_HOST_PORT_{i}"]) for i in (1, 2)]
        self.reports = self.work / "reports"
        self.reports.mkdir(parents=True, exist_ok=True)
        self.reports.chmod(0o777)  # the driver runs as the images' user (uid 10001)
        self.override = self.work / "driver.compose.yml"
        compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
        all_services = list(compose["services"])
        # Grafana has no local stand-in (deploy/images/README.md): without its image, run without it.
        public = os.environ.get("FLEETFENCE_DEPLOY_PUBLIC_IMAGES") == "1"
        self.without = [] if public or "FLEETFENCE_GRAFANA_IMAGE" in self.images else ["grafana"]
        self.services = [s for s in all_services if s not in self.without] + [TOXIPROXY]
        # Grafana is in its compose profile (docs/deploy.md, "With or without Grafana").
        self.env["COMPOSE_PROFILES"] = "" if self.without else "grafana"
        self.gateways = [s for s in all_services if s.startswith("gateway-")]
        self.kafka_nodes = [s for s in all_services if s.startswith("kafka-")]
        # The processor and its standby: every driver of the job.
        self.processors = [s for s in all_services if s == "processor" or s.startswith("processor-")]

    # ------------------------------------------------------------------ compose

    def compose(
        self, *args: str, timeout_s: float = 600, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        tool = os.environ.get("FLEETFENCE_DEPLOY_COMPOSE", "docker-compose").split()
        return run(
            [*tool, "-p", PROJECT, "-f", str(ROOT / "docker-compose.yml"), "-f", str(self.override), *args],
            timeout_s=timeout_s,
            env=self.env,
            check=check,
        )

    def write_override(self) -> None:
        build_args = {
            "PYTHON_IMAGE": self.env.get("FLEETFENCE_PYTHON_IMAGE", "python:3.11-slim-bookworm"),
            "NODE_IMAGE": self.env.get("FLEETFENCE_NODE_IMAGE", "node:20-bookworm-slim"),
        }
        kafka = ",".join(f"{k}:9092" for k in self.kafka_nodes)
        driver = {
            "build": {"context": str(ROOT), "dockerfile": "Dockerfile", "target": "api", "args": build_args},
            "restart": "no",
            "init": True,
            "extra_hosts": ["host.docker.internal:host-gateway"],
            "environment": {
                "FLEETFENCE_KAFKA_BOOTSTRAP": kafka,
                "FLEETFENCE_MQTT_URL": "mqtt://mosquitto:1883",
                "FLEETFENCE_REDIS_URL": "redis://redis:6379/0",
                "FLEETFENCE_MQTT_ADMIN_PASSWORD": self.env["FLEETFENCE_MQTT_ADMIN_PASSWORD"],
                "FLEETFENCE_STATE_DIR": "/tmp/fleetfence",
                "FLEETFENCE_LOG_LEVEL": "WARNING",
                # As an operator and a fleet would: the published ports, through the host.
                "FLEETFENCE_SIMULATOR_API_URL": f"http://host.docker.internal:{self.api_port}",
                "FLEETFENCE_SIMULATOR_API_KEY": "${FLEETFENCE_DEPLOY_API_KEY:-}",
                # Both edge replicas: each vehicle starts on one and moves to the other when it
                # cannot connect, as a tracker with a primary and a backup server does.
                "FLEETFENCE_SIMULATOR_MQTT_URL": ",".join(
                    f"mqtts://host.docker.internal:{p}" for p in self.edge_tls_ports
                ),
                "FLEETFENCE_SIMULATOR_MQTT_CA": "/certs/ca.crt",
                "COLUMNS": "160",
            },
            "volumes": ["mosquitto-certs:/certs:ro", f"{self.reports}:/reports"],
            "depends_on": {},
        }
        services: dict[str, Any] = {"driver": driver, **self.toxiproxy_services()}
        self.override.write_text(yaml.safe_dump({"services": services}, sort_keys=False))

    def toxiproxy_services(self) -> dict[str, Any]:
        """The proxy, a second listener on every broker advertised as the proxy's port for it, and
        the Spark application's bootstrap through the proxy (compose merges these into the
        services of docker-compose.yml; nothing else of them changes)."""
        proxies: list[dict[str, Any]] = []
        out: dict[str, Any] = {}
        for k in self.kafka_nodes:
            n = int(k.rsplit("-", 1)[1])
            port = TOXIPROXY_PORT_BASE + n
            proxies.append(
                {
                    "name": k,
                    "listen": f"0.0.0.0:{port}",
                    "upstream": f"{k}:{PROXIED_LISTENER_PORT}",
                    "enabled": True,
                }
            )
            out[k] = {
                "environment": {
                    "KAFKA_LISTENERS": f"PLAINTEXT://:9092,CONTROLLER://:9093,PROXIED://:{PROXIED_LISTENER_PORT}",
                    "KAFKA_LISTENER_SECURITY_PROTOCOL_MAP": (
                        "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT,PROXIED:PLAINTEXT"
                    ),
                    "KAFKA_ADVERTISED_LISTENERS": f"PLAINTEXT://{k}:9092,PROXIED://{TOXIPROXY}:{port}",
                }
            }
        config = self.work / "toxiproxy.json"
        config.write_text(json.dumps(proxies))
        config.chmod(0o644)
        out[TOXIPROXY] = {
            "image": self.env.get("FLEETFENCE_DEPLOY_TOXIPROXY_IMAGE", TOXIPROXY_PUBLIC_IMAGE),
            "restart": "unless-stopped",
            "command": [
                "-host",
                "0.0.0.0",
                "-port",
                str(TOXIPROXY_API_PORT),
                "-config",
                "/etc/toxiproxy.json",
            ],
            "volumes": [f"{config}:/etc/toxiproxy.json:ro"],
            "expose": [str(TOXIPROXY_API_PORT), *(str(p["listen"]).rsplit(":", 1)[1] for p in proxies)],
        }
        bootstrap = ",".join(
            f"{TOXIPROXY}:{TOXIPROXY_PORT_BASE + int(k.rsplit('-', 1)[1])}" for k in self.kafka_nodes
        )
        # Each driver's bootstrap: its executors read Kafka with the options the driver gives them.
        for svc in self.processors:
            out[svc] = {
                "environment": {"FLEETFENCE_KAFKA_BOOTSTRAP": bootstrap},
                "depends_on": {TOXIPROXY: {"condition": "service_started"}},
            }
        return out

    def states(self) -> dict[str, dict[str, Any]]:
        """Service -> {status, exit, health} of its container(s), from `docker inspect`."""
        ids = self.compose("ps", "-q", timeout_s=120).stdout.split()
        if not ids:
            return {}
        raw = json.loads(run(["docker", "inspect", *ids], timeout_s=60).stdout)
        out = {}
        for c in raw:
            svc = c["Config"]["Labels"].get("com.docker.compose.service", c["Name"])
            st = c["State"]
            out[svc] = {
                "status": st["Status"],
                "exit": st.get("ExitCode"),
                "health": (st.get("Health") or {}).get("Status"),
                "restarts": c.get("RestartCount", 0),
                "id": c["Id"],
                "started_at": st.get("StartedAt"),
            }
        return out

    def logs_since_start(self, service: str) -> str:
        """What the service's container has logged since it last started (a restarted container's
        `logs` has its earlier lives too)."""
        st = self.states()[service]
        argv = ["docker", "logs", "--since", str(st["started_at"]), str(st["id"])]
        out = run(argv, timeout_s=120, check=False)
        return out.stdout + out.stderr

    def stamped_logs(self) -> dict[str, str]:
        """Every container's whole log, each line with its time (`docker logs -t`: the lives of a
        restarted container, and the one-shots that exited), by service."""
        ids = self.compose("ps", "-q", timeout_s=120).stdout.split()
        if not ids:
            return {}
        out: dict[str, str] = {}
        for c in json.loads(run(["docker", "inspect", *ids], timeout_s=60).stdout):
            svc = c["Config"]["Labels"].get("com.docker.compose.service", c["Name"].lstrip("/"))
            key = svc if svc not in out else f"{svc}@{c['Id'][:12]}"
            logs = run(["docker", "logs", "-t", c["Id"]], timeout_s=300, check=False)
            out[key] = logs.stdout + logs.stderr
        return out

    def volume_path(self, service: str, target: str) -> Path:
        """Where the named volume a service mounts at `target` lives on this host (the suite runs
        beside its Docker daemon, as root)."""
        mounts = json.loads(run(["docker", "inspect", self.container(service)], timeout_s=60).stdout)[0]
        for m in mounts["Mounts"]:
            if m["Destination"] == target:
                if m["Type"] != "volume":
                    raise DeployError(f"{service}:{target} is a {m['Type']} mount, not a volume")
                return Path(m["Source"])
        raise DeployError(f"{service} mounts nothing at {target}")

    def logs(self, *services: str, tail: int = 60) -> str:
        return self.compose(
            "logs", "--no-color", f"--tail={tail}", *services, timeout_s=120, check=False
        ).stdout

    def healthy(self) -> bool:
        """Every service up and healthy, the one-shots exited 0; a failure raises at once."""
        states = self.states()
        pending = []
        for svc in self.services:
            st = states.get(svc)
            if st is None:
                pending.append(f"{svc}: no container")
                continue
            if svc in ONE_SHOT:
                if st["status"] == "exited" and st["exit"] != 0:
                    raise DeployError(f"{svc} exited {st['exit']}:\n{self.logs(svc)}")
                if st["status"] != "exited":
                    pending.append(f"{svc}: {st['status']}")
                continue
            if st["health"] is None and st["status"] == "running":
                continue  # no health check (the suite's toxiproxy): running is all it can say
            if st["health"] == "unhealthy":
                raise DeployError(f"{svc} is unhealthy:\n{self.logs(svc)}")
            if st["status"] in ("exited", "dead"):
                raise DeployError(f"{svc} {st['status']} with {st['exit']}:\n{self.logs(svc)}")
            if st["health"] != "healthy":
                pending.append(f"{svc}: {st['status']}/{st['health']}")
        self.pending = pending
        return not pending

    def wait_healthy(self, timeout_s: float = 900) -> None:
        try:
            wait_for(self.healthy, timeout_s, "every service healthy", interval_s=2.0)
        except Exception as exc:
            if isinstance(exc, DeployError):
                raise
            raise DeployError(
                f"not healthy after {timeout_s} s: {getattr(self, 'pending', [])}\n"
                f"{self.logs(*[p.split(':')[0] for p in getattr(self, 'pending', [])])}"
            ) from exc

    def up(self) -> None:
        self.write_override()
        self.down()  # an earlier run's leftovers, volumes included
        t = time.monotonic()
        self.compose(
            "build",
            *[
                s
                for s in self.services
                if s not in self.kafka_nodes
                and not s.startswith(("mosquitto", "redis", "prometheus", TOXIPROXY))
            ],
            "driver",
            timeout_s=3600,
        )
        self.timings["build_s"] = time.monotonic() - t
        t = time.monotonic()
        self.compose("up", "-d", "--no-build", *self.services, timeout_s=1200)
        self.wait_healthy()
        self.timings["up_healthy_s"] = time.monotonic() - t
        out = self.compose(
            "exec",
            "-T",
            "api",
            "fleetfence",
            "apikey",
            "create",
            "deploytest",
            "--role",
            "admin",
            timeout_s=120,
        ).stdout
        key = out.strip().splitlines()[-1].strip()  # printed once, last (cli/services.py)
        self.api_key = key
        self.env["FLEETFENCE_DEPLOY_API_KEY"] = key

    def down(self) -> None:
        t = time.monotonic()
        self.compose("down", "-v", "--remove-orphans", "-t", "20", timeout_s=600, check=False)
        self.timings["down_s"] = time.monotonic() - t

    def leftovers(self) -> list[str]:
        """Containers, networks and volumes of the project still there."""
        label = f"label=com.docker.compose.project={PROJECT}"
        found = []
        for kind in ("ps -a", "network ls", "volume ls"):
            out = run(["docker", *kind.split(), "-q", "--filter", label], timeout_s=60).stdout.split()
            found += [f"{kind.split()[0]} {i}" for i in out]
        return found

    # ------------------------------------------------------------------ inside the network

    def driver(
        self, *argv: str, timeout_s: float = 900, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        """A one-off command in the driver container (the api image on the compose network)."""
        return self.compose("run", "--rm", "-T", "driver", *argv, timeout_s=timeout_s, check=check)

    def driver_popen(self, *argv: str, log: Path) -> subprocess.Popen[bytes]:
        tool = os.environ.get("FLEETFENCE_DEPLOY_COMPOSE", "docker-compose").split()
        with log.open("wb") as out:
            return subprocess.Popen(
                [
                    *tool,
                    "-p",
                    PROJECT,
                    "-f",
                    str(ROOT / "docker-compose.yml"),
                    "-f",
                    str(self.override),
                    "run",
                    "--rm",
                    "-T",
                    "driver",
                    *argv,
                ],
                stdout=out,
                stderr=subprocess.STDOUT,
                env=self.env,
                cwd=ROOT,
            )

    def loadtest_argv(
        self, name: str, *, vehicles: int, duration_s: float, settle_s: float = 180
    ) -> list[str]:
        return [
            "fleetfence",
            "loadtest",
            "--attach",
            "--vehicles",
            str(vehicles),
            "--duration-s",
            str(duration_s),
            "--settle-s",
            str(settle_s),
            "--min-recall",
            "1.0",
            "--report-dir",
            f"/reports/{name}",
        ]

    def report(self, name: str) -> dict[str, Any]:
        data = json.loads((self.reports / name / "report.json").read_text())
        assert isinstance(data, dict)
        return data

    def py(self, code: str, timeout_s: float = 120) -> Any:
        """Python in the api container (on the compose network); its last stdout line as JSON."""
        out = self.compose("exec", "-T", "api", "python", "-c", code, timeout_s=timeout_s).stdout
        return json.loads(out.strip().splitlines()[-1])

    def container(self, service: str) -> str:
        return str(self.states()[service]["id"])


# Python run in the api container: the telemetry topic's partition leaders and end offsets.
TOPIC_PROBE = """
import json, os
from confluent_kafka import TopicPartition
from fleetfence.kafka import admin_client, plain_consumer
b = os.environ["FLEETFENCE_KAFKA_BOOTSTRAP"]
md = admin_client(b).list_topics(timeout=20)
t = md.topics["fleet.telemetry"]
c = plain_consumer(b, "deploytest-probe")
ends = {}
for p in t.partitions:
    try:  # None while the partition has no leader to answer (a broker just killed)
        ends[str(p)] = c.get_watermark_offsets(TopicPartition("fleet.telemetry", p), timeout=5)[1]
    except Exception:
        ends[str(p)] = None
c.close()
print(json.dumps({"leaders": {str(p): t.partitions[p].leader for p in t.partitions},
                  "isr": {str(p): list(t.partitions[p].isrs) for p in t.partitions},
                  "replicas": {str(p): list(t.partitions[p].replicas) for p in t.partitions},
                  "controller": md.controller_id, "ends": ends,
                  "records": None if None in ends.values() else sum(ends.values())}))
"""
