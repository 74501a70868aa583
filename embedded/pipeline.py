"""The whole pipeline on this machine, every service in a process of its own: the embedded Kafka,
Mosquitto and Redis, then the admin API, the Spark processor, N gateway replicas and the alert
receivers (`fleetfence alerts run`), each started through the CLI exactly as an operator would.

One home for "start everything and wait until it works", used by `fleetfence demo` and
`fleetfence loadtest`. Separate processes, so a load test can measure each one's CPU and memory
and a crash of one is seen (`check_alive`) instead of hanging the run. Each gets a free metrics
port, so the caller can scrape every replica; logs go to `run_dir/<name>.log`.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import SecretStr

from embedded import infra
from embedded.processes import read_pid
from fleetfence import probes
from fleetfence.errors import ServiceExitedError, ServiceUnavailableError
from fleetfence.metrics import http_get, scrape
from fleetfence.rules import ProximityRule
from fleetfence.service import stop_process_group
from fleetfence.settings import ProcessorRulesSettings, Settings

logger = logging.getLogger(__name__)

# The demo's receivers: the alert history (Redis, what the API and the map read) and the MQTT
# fan-out (what a dispatcher's screen subscribes to).
HISTORY_AND_MQTT = (
    '[[receivers]]\nname = "history"\nkind = "history"\n\n[[receivers]]\nname = "mqtt"\nkind = "mqtt"\n'
)


@dataclass(frozen=True)
class PipelineSpec:
    gateway_replicas: int = 1
    receivers_toml: str = HISTORY_AND_MQTT
    spark_master: str = "local[2]"
    processor_trigger_ms: int = 200
    api_port: int | None = None  # None: 8000 if free, else any free port
    # More FLEETFENCE_* variables for every service (e.g. a processor knob of a load test).
    env: dict[str, str] = field(default_factory=dict)
    # Vehicle proximity's rules for the processor (none: off), and whether its query reads the
    # telemetry topic from its start (a run on fresh servers) or from its end (servers with data).
    proximity: tuple[ProximityRule, ...] = ()
    proximity_from_start: bool = False
    # The gateways are the device edge (gateway.edge): vehicles connect to them, each replica on a
    # port of its own (`Pipeline.device_urls`), and a PUBACK means Kafka has the fix. False: they
    # read the vehicles' messages from Mosquitto, each its shard.
    device_edge: bool = True


# How much of a service's log an error about it carries: enough for the end of a traceback or a
# server's last complaint (`[Errno 98] ... address already in use`), little enough for a terminal.
LOG_TAIL_LINES = 20
# Read from the log's end: a soak run's processor log grows to hundreds of MiB.
_LOG_TAIL_BYTES = 64 * 1024


def log_tail(path: Path, lines: int = LOG_TAIL_LINES) -> list[str]:
    """The last `lines` lines of a log file ([] when it is missing or empty)."""
    try:
        with path.open("rb") as f:
            size = f.seek(0, os.SEEK_END)
            f.seek(max(0, size - _LOG_TAIL_BYTES))
            data = f.read()
    except OSError:
        return []
    out = data.decode("utf-8", errors="replace").splitlines()
    if size > _LOG_TAIL_BYTES:
        out = out[1:]  # cut by the read's start
    return out[-lines:]


def log_excerpt(log: Path) -> str:
    """A log's path and last lines, indented, for an error message: the reason a service gives for
    failing is in its own log, and the run folder is often not at hand where the error is read."""
    tail = log_tail(log)
    if not tail:
        return f"its log {log} is empty"
    body = "\n".join(f"  {line}" for line in tail)
    return f"the last {len(tail)} lines of its log {log}:\n{body}"


def how_it_ended(returncode: int) -> str:
    """How a process ended, in words: "exited with code 3", or "was killed by SIGKILL" for
    Popen's negative return code (a signal's number is not what a reader knows it by)."""
    if returncode >= 0:
        return f"exited with code {returncode}"
    try:
        name = signal.Signals(-returncode).name
    except ValueError:
        name = f"signal {-returncode}"
    return f"was killed by {name} (return code {returncode})"


@dataclass
class Service:
    name: str  # "api", "processor", "gateway-1", ..., "receivers"
    proc: subprocess.Popen[bytes]
    metrics_url: str | None
    log: Path
    argv: list[str]
    env: dict[str, str]


def _popen(argv: list[str], env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    with log.open("ab") as f:
        return subprocess.Popen(argv, env=env, stdout=f, stderr=subprocess.STDOUT, start_new_session=True)


def exited_error(svc: Service, also: Sequence[Service] = ()) -> ServiceExitedError:
    """The one message for a pipeline service that has exited, wherever that is noticed (while the
    pipeline starts, while waiting for it to be ready, during a run): which service, how it ended,
    its log's last lines and path; `also`: services found exited with it, named after it."""
    code = svc.proc.returncode
    message = f"{svc.name} {how_it_ended(code)}; {log_excerpt(svc.log)}"
    if also:
        others = ", ".join(f"{o.name} {how_it_ended(o.proc.returncode)} (log: {o.log})" for o in also)
        message += f"\nalso: {others}"
    return ServiceExitedError(message, service=svc.name, returncode=code, log=svc.log)


def settings_env(settings: Settings, **extra: Any) -> dict[str, str]:
    """The environment that gives a child process these settings (FLEETFENCE_*)."""
    env = dict(os.environ)
    for k, v in settings.model_dump(exclude={"topics"}).items():
        if v is not None:
            env[f"FLEETFENCE_{k.upper()}"] = str(v.get_secret_value() if isinstance(v, SecretStr) else v)
    env.update({k: str(v) for k, v in extra.items()})
    env.setdefault("PYSPARK_PYTHON", sys.executable)
    return env


# The processor's counts of its committed batches (processor.ops.markers), and whether it started on
# a checkpoint that already held offsets (processor.ops.service): the job's, and the proximity query's.
JOB_BATCHES = "fleetfence_processor_committed_batches_total"
PROXIMITY_BATCHES = "fleetfence_processor_proximity_committed_batches_total"
JOB_RESTORED = "fleetfence_processor_checkpoint_restored"
PROXIMITY_RESTORED = "fleetfence_processor_proximity_checkpoint_restored"


def counted(url: str, wanted: Sequence[tuple[str, ...]]) -> bool:
    """Whether the metrics at `url` count something for every group of `wanted`, in any one of a
    group's names."""
    try:
        s = scrape(url)
    except (OSError, ValueError):
        return False
    return all(any(s.total(n) > 0 for n in names) for names in wanted)


def http_ok(url: str) -> bool:
    try:
        return http_get(url, 2.0)[0] == 200
    except (OSError, ValueError):
        return False


class Pipeline:
    """`with Pipeline(settings, run_dir, spec) as p:` everything is up and answering; on exit
    everything it started is stopped, in reverse order, whatever happened inside."""

    def __init__(self, settings: Settings, run_dir: Path, spec: PipelineSpec | None = None) -> None:
        self.settings = settings
        self.run_dir = run_dir
        self.spec = spec or PipelineSpec()
        self.services: list[Service] = []
        self._infra_started = False
        port = self.spec.api_port
        if port is None:
            port = 8000 if probes.port_free(settings.host, 8000) else probes.free_port()
        self.api_url = f"http://{settings.host}:{port}"
        self._api_port = port
        self._processor_metrics_url = ""  # set by start()
        # Where vehicles connect (mqtt://host:port, one per gateway replica): the device edges, or
        # Mosquitto when the gateways read from it. Set by start().
        self.device_urls: list[str] = []

    # ------------------------------------------------------------------ lifecycle

    def __enter__(self) -> Pipeline:
        try:
            self.start()
            self.wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *_: object) -> None:
        self.stop()

    def start(self) -> None:
        self.run_dir.mkdir(parents=True, exist_ok=True)
        infra.up(self.settings)
        self._infra_started = True
        s, spec = self.settings, self.spec
        py = [sys.executable, "-m", "cli"]
        self._spawn("api", [*py, "api", "--port", str(self._api_port), "--host", s.host], {}, None)
        port = probes.free_port()
        proximity: dict[str, str] = {}
        if spec.proximity:
            proximity = ProcessorRulesSettings.proximity_env(spec.proximity)
            if spec.proximity_from_start:
                proximity["FLEETFENCE_PROCESSOR_PROXIMITY_STARTING_OFFSETS"] = "earliest"
        self._processor_metrics_url = f"http://{s.host}:{port}/metrics"
        self._spawn(
            "processor",
            [sys.executable, "-m", "processor"],
            {
                **proximity,
                "FLEETFENCE_PROCESSOR_SPARK_MASTER": spec.spark_master,
                "FLEETFENCE_PROCESSOR_TRIGGER_MS": str(spec.processor_trigger_ms),
                "FLEETFENCE_PROCESSOR_METRICS_PORT": str(port),
            },
            port,
            # The spec's rules are the processor's (the truth assumes them): none inherited.
            unset=ProcessorRulesSettings.PROXIMITY_RULE_VARIABLES,
        )
        self.device_urls = []
        for i in range(1, spec.gateway_replicas + 1):
            port = probes.free_port()
            edge: dict[str, str] = {}
            if spec.device_edge:
                edge_port = probes.free_port()
                edge = {"FLEETFENCE_GATEWAY_EDGE_PORT": str(edge_port)}
                self.device_urls.append(f"mqtt://{s.host}:{edge_port}")
            self._spawn(
                f"gateway-{i}",
                [*py, "gateway"],
                {
                    "FLEETFENCE_GATEWAY_CLIENT_ID": f"fleetfence-gw-{i}-{os.getpid()}",
                    "FLEETFENCE_GATEWAY_SHARD_INDEX": str(i - 1),
                    "FLEETFENCE_GATEWAY_SHARD_COUNT": str(spec.gateway_replicas),
                    "FLEETFENCE_GATEWAY_METRICS_PORT": str(port),
                    **edge,
                },
                port,
            )
        if not spec.device_edge:
            self.device_urls = ["mqtt://{}:{}".format(*s.mqtt_host_port)]
        config = self.run_dir / "receivers.toml"
        config.write_text(spec.receivers_toml)
        port = probes.free_port()
        self._spawn(
            "receivers",
            [*py, "alerts", "run", "--config", str(config)],
            {"FLEETFENCE_ALERTS_METRICS_PORT": str(port)},
            port,
        )

    def _spawn(
        self,
        name: str,
        argv: list[str],
        extra: dict[str, str],
        metrics_port: int | None,
        unset: tuple[str, ...] = (),
    ) -> None:
        """Start service `name`; `unset`: variables of this process's environment it must not see
        (unless `extra` or the spec's `env` gives them)."""
        log = self.run_dir / f"{name}.log"
        given = {**self.spec.env, **extra}
        env = {k: v for k, v in settings_env(self.settings, **given).items() if k not in unset or k in given}
        url = f"http://{self.settings.host}:{metrics_port}/metrics" if metrics_port else None
        self.services.append(Service(name, _popen(argv, env, log), url, log, argv, env))
        logger.info("pipeline started service=%s pid=%s log=%s", name, self.services[-1].proc.pid, log)

    def crash_and_restart(self, name: str) -> None:
        """SIGKILL service `name` (its whole process group: a crash, nothing flushed or closed) and
        start it again as before: the same command, environment, ports and log. What a restart
        policy does in a deployment; the fault tests' way to cause one on this machine."""
        svc = next(s for s in self.services if s.name == name)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(svc.proc.pid, signal.SIGKILL)
        svc.proc.wait(30)
        svc.proc = _popen(svc.argv, svc.env, svc.log)
        logger.info("pipeline restarted service=%s pid=%s", name, svc.proc.pid)

    def wait_ready(self, timeout_s: float = 240.0) -> None:
        """Until the API answers, every metrics endpoint answers and the processor has committed a
        batch of its job and, with a proximity rule, one of its proximity query (the first takes
        ~30 s: JVM, SparkSession, Python workers, state store). Both read what is published from
        then on: a query starting at the topic's end fixes that end in its first batch, so fixes
        published before it would be missed by it and not by the ground truth. A query restored
        from a checkpoint with offsets is ready once started: its start is the checkpoint's, and
        with nothing new published it may run no batch at all."""
        self._wait(lambda: http_ok(f"{self.api_url}/healthz"), 60, "admin API", "api")
        for svc in self.services:
            if svc.metrics_url:
                url = svc.metrics_url
                self._wait(lambda url=url: http_ok(url), timeout_s, f"{svc.name} metrics", svc.name)  # type: ignore[misc]
        wanted = [(JOB_BATCHES, JOB_RESTORED)]
        if self.spec.proximity:
            wanted.append((PROXIMITY_BATCHES, PROXIMITY_RESTORED))
        processor_url = self._processor_metrics_url
        self._wait(lambda: counted(processor_url, wanted), timeout_s, "the processor's queries", "processor")

    def _wait(self, cond: Callable[[], bool], timeout_s: float, what: str, service: str) -> None:
        """Until `cond` holds. A service that exits meanwhile ends the wait at once with its own
        error (`check_alive`), also in the last round: a death is not reported as a timeout. At
        the deadline the error carries the log of `service`, the one waited for."""
        deadline = time.monotonic() + timeout_s
        while True:
            self.check_alive()
            if cond():
                return
            if time.monotonic() >= deadline:
                break
            time.sleep(0.3)
        log = next(svc.log for svc in self.services if svc.name == service)
        raise ServiceUnavailableError(
            f"{what} not ready within {timeout_s:.0f}s (every service's log in {self.run_dir}); "
            f"{service} is running, {log_excerpt(log)}"
        )

    def check_alive(self) -> None:
        """Raise ServiceExitedError if a service exited: a run must not go on measuring (nor a demo
        showing) a pipeline with a hole, and the error must say which service and why."""
        gone = [svc for svc in self.services if svc.proc.poll() is not None]
        if gone:
            raise exited_error(gone[0], gone[1:])

    def stop(self) -> None:
        for svc in reversed(self.services):
            stop_process_group(svc.proc)
        self.services.clear()
        if self._infra_started:
            infra.down(self.settings)
            self._infra_started = False

    # ------------------------------------------------------------------ what callers read

    def pids(self) -> dict[str, int]:
        """Every process of the pipeline by name: the services, then the embedded servers this
        pipeline started (Kafka's JVM, Mosquitto, Redis; none when they are external)."""
        out = {svc.name: svc.proc.pid for svc in self.services}
        if self._infra_started:
            for name in infra.service_names(self.settings):
                running = read_pid(self.settings, name)
                if running is not None:
                    out[name] = running[0]
        return out

    def describe(self) -> dict[str, Any]:
        """What ran, for a report: the services started here and the Spark master."""
        return {
            "attached": False,
            "services": [svc.name for svc in self.services],
            "spark_master": self.spec.spark_master,
            "gateway_replicas": self.spec.gateway_replicas,
            "device_edge": self.spec.device_edge,
        }

    def metrics_urls(self, prefix: str = "") -> dict[str, str]:
        return {s.name: s.metrics_url for s in self.services if s.metrics_url and s.name.startswith(prefix)}
