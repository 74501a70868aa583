"""`fleetfence demo`: the README's main command — the whole live pipeline on embedded servers.

    embedded broker + Mosquitto + Redis
    -> admin API (with the outbox relay), processor (PySpark, local[2]), gateway, alert receivers
       (history and MQTT fan-out): each a process of its own (embedded.pipeline)
    -> live view of the committed alerts      [this process]
    -> simulator: a handful of vehicles driving in real time over MQTT, some deviating,
       speeding, dwelling in depots, going silent — with ground truth
    -> verify: precision, recall, duplicates and detection delay against the ground truth

Ctrl-C stops everything it started, in reverse order. The exit code is verify's (0 = all alerts
right), so the demo doubles as an end-to-end check.
"""

from __future__ import annotations

import logging
import os
import shutil
import threading
import time
import uuid
from contextlib import ExitStack
from typing import Annotated, Any

import orjson
import redis
import typer
from confluent_kafka import KafkaError
from rich.console import Console

from cli.common import app, friendly_errors, settings_from_env
from cli.infra import print_status
from embedded import infra
from embedded.pipeline import Pipeline, PipelineSpec
from fleetfence.contracts import AlertType
from fleetfence.errors import FleetFenceError
from fleetfence.kafka import committed_reader
from fleetfence.logs import configure_logging
from fleetfence.settings import Settings

logger = logging.getLogger(__name__)


class LiveAlerts:
    """Prints committed alerts as they arrive (read_committed), until stopped."""

    def __init__(self, settings: Settings, console: Console) -> None:
        self.settings, self.console = settings, console
        self.stop_event = threading.Event()
        self.count = 0
        self.thread = threading.Thread(target=self._run, name="demo-alerts", daemon=True)

    def __enter__(self) -> LiveAlerts:
        self.thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.stop_event.set()
        self.thread.join(10)

    def _run(self) -> None:
        s = self.settings
        c = committed_reader(
            s.bootstrap_servers, f"demo-view-{uuid.uuid4().hex[:8]}", **{"auto.offset.reset": "latest"}
        )
        c.subscribe([s.topics.alerts])
        try:
            while not self.stop_event.is_set():
                m = c.poll(0.5)
                if m is None or (m.error() is not None and m.error().code() == KafkaError._PARTITION_EOF):
                    continue
                if m.error() is not None:
                    continue
                a = orjson.loads(m.value())
                self.count += 1
                kind = a.get("type")
                style = AlertType[kind].meta.style if kind in AlertType.__members__ else "white"
                zone = f" zone={a['zone_id']}" if a.get("zone_id") else ""
                details = ", ".join(f"{k}={v}" for k, v in (a.get("details") or {}).items())
                self.console.print(
                    f"[dim]{a.get('ts', '')}[/] [{style}]{a.get('type'):<16}[/] "
                    f"{a.get('vehicle_id')} route={a.get('route_id')} seq={a.get('seq')}{zone} "
                    f"[dim]{details}[/]"
                )
        finally:
            c.close()


def run_demo(
    settings: Settings,
    *,
    vehicles: int = 12,
    duration_s: float = 150.0,
    seed: int = 7,
    api_port: int | None = None,
) -> int:
    """Run the live demo; returns verify's exit code."""
    from fleetfence.rules import ProximityRule, ProximityScope, RouteRules
    from fleetfence.settings import FLEET_PROXIMITY_RULE_ID
    from simulator.commands import simulate, start_ms_for, verify
    from simulator.config import Injections, ScenarioConfig
    from simulator.publish import SimulationOptions
    from simulator.scenario import SIM_GROUPS
    from simulator.settings import SimulatorSettings

    console = Console()
    run_dir = settings.state_dir.resolve() / "demo"
    run_dir.mkdir(parents=True, exist_ok=True)
    fresh = not (settings.kafka_external or settings.mqtt_external or settings.redis_external)
    if fresh:
        # The demo's own servers start from empty data every run: the previous run's routes, zones
        # and vehicles would otherwise still be in the master data (Redis, the compacted topic),
        # and this run's vehicles crossing an old zone would raise alerts its ground truth does
        # not know. The last run's data stays under demo/state until the next run; logs and truth
        # files stay beside it.
        state = run_dir / "state"
        shutil.rmtree(state, ignore_errors=True)
        settings = settings.model_copy(update={"state_dir": state})
    truth = run_dir / f"truth-{int(time.time())}.jsonl"
    # Vehicle proximity on: for the fleet (`fleet`), and for one fleet group (the vehicle attribute
    # `group`: the simulator's vehicles alternate between two) with distances of its own. The
    # convoys below meet and drift apart, and vehicles overtaking or stopping near each other meet too.
    proximity = (
        ProximityRule(
            FLEET_PROXIMITY_RULE_ID,
            enter_m=40.0,
            exit_m=80.0,
            min_duration_ms=15_000,
            tolerance_ms=500,
            lost_after_ms=30_000,
        ),
        ProximityRule(
            "north-close",
            enter_m=60.0,
            exit_m=120.0,
            min_duration_ms=10_000,
            tolerance_ms=500,
            lost_after_ms=30_000,
            scope=ProximityScope(group=SIM_GROUPS[0]),
        ),
    )
    # On its own, empty broker the proximity query reads this run's telemetry from its start.
    spec = PipelineSpec(
        gateway_replicas=1, api_port=api_port, proximity=proximity, proximity_from_start=fresh
    )
    with ExitStack() as stack:
        pipeline = Pipeline(settings, run_dir, spec)
        stack.callback(pipeline.stop)
        with console.status("starting the embedded broker, Mosquitto, Redis and the services…"):
            pipeline.start()
        print_status(infra.status(settings))
        with console.status("waiting for the admin API and the Spark processor (first batch ~30 s)…"):
            pipeline.wait_ready()
        api_url = pipeline.api_url
        # The map and the API need a key; a fresh admin key per demo run, printed once (stored hashed).
        from admin_api.security import Role, create_api_key

        rkey = redis.Redis.from_url(settings.redis_dsn)
        try:
            demo_key = create_api_key(rkey, settings.redis_prefix, f"demo-{int(time.time())}", Role.ADMIN)
        finally:
            rkey.close()
        console.print(
            f"[bold]live map[/] {api_url}/map (API key [bold]{demo_key}[/])   "
            f"[bold]admin API[/] {api_url}/docs   [bold]metrics[/] {api_url}/metrics   "
            f"[bold]logs[/] {run_dir}"
        )
        console.print("[bold]live alerts[/] (Ctrl-C stops the demo):")
        with LiveAlerts(settings, console) as view:
            # Short thresholds so a two-and-a-half-minute drive shows every alert type: a stop of
            # 30 s outside a stop zone, 40 m the wrong way, an ETA 2 minutes late.
            rules = RouteRules(
                corridor_width_m=60.0,
                speed_limit_kmh=50.0,
                overspeed_min_s=5.0,
                silent_after_s=60.0,
                wrong_way_min_m=40.0,
                stop_min_s=30.0,
                arrival_risk_s=120.0,
            )
            inject = Injections(
                deviation=0.4,
                overspeed=0.3,
                dwell=0.3,
                silent=0.15,
                late=0.0,
                wrong_way=0.1,
                schedule=0.1,
                convoy=0.25,
            )
            cfg = ScenarioConfig(
                vehicles=vehicles,
                duration_s=duration_s,
                seed=seed,
                route_length_m=3000.0,  # short enough that some vehicles reach the end (ROUTE_COMPLETED)
                rules=rules,
                inject=inject,
                proximity=proximity,
                start_ms=start_ms_for(None, True, duration_s, 1000),
                vehicle_prefix=f"demo{int(time.time()) % 100000}-",
            )
            # As an operator would: the fleet registered and each vehicle's MQTT credentials
            # issued through the admin API; each vehicle then logs in with its own secret.
            opts = SimulationOptions(
                realtime=True,
                truth_path=truth,
                register=True,
                start_now=True,
                api_url=api_url,
                api_key=demo_key,
            )
            # The vehicles connect where the pipeline's gateways take them: the device edge.
            sim = SimulatorSettings().model_copy(
                update={"simulator_mqtt_url": ",".join(pipeline.device_urls)}
            )
            # A service that died during the drive is the reason the simulator failed or verify
            # found alerts missing: then its error (which service, how it ended, its log's last
            # lines) is the demo's, not the symptom.
            try:
                simulate(cfg, opts, settings=sim, console=console)
                console.print(
                    "[dim]simulation done; waiting for the last alerts (silence needs the watermark)…[/]"
                )
                code = verify(
                    settings=SimulatorSettings(),
                    truth_path=truth,
                    timeout_s=90.0,
                    seq_tolerance=0,
                    min_precision=1.0,
                    min_recall=1.0,
                    max_duplicates=0,
                    as_json=False,
                )
            except Exception:
                pipeline.check_alive()
                raise
            if code:
                pipeline.check_alive()
        console.print(f"{view.count} alerts shown live; ground truth in {truth}")
        console.print("[dim]stopping everything…[/]")
    return code


def main_demo(settings: Settings, **kw: Any) -> int:
    try:
        return run_demo(settings, **kw)
    except KeyboardInterrupt:
        Console().print("[yellow]interrupted: everything the demo started was stopped[/]")
        return 130
    except FleetFenceError:
        raise


@app.command()
@friendly_errors
def demo(
    vehicles: Annotated[int, typer.Option(min=1, max=500, help="Simulated vehicles.")] = 12,
    duration_s: Annotated[float, typer.Option(min=30, help="Simulated driving time, real time.")] = 150.0,
    seed: Annotated[int, typer.Option(help="Scenario seed.")] = 7,
) -> None:
    """Run the live demo: embedded infra, gateway, processor, API, receivers, simulator, verify."""

    s = settings_from_env()
    if "FLEETFENCE_LOG_LEVEL" not in os.environ:
        # The terminal is for the live alerts; the services' logs go to files under the state folder.
        os.environ["FLEETFENCE_LOG_LEVEL"] = "WARNING"
        configure_logging("WARNING", s.log_json)
    raise typer.Exit(main_demo(s, vehicles=vehicles, duration_s=duration_s, seed=seed))


# --------------------------------------------------------------------------- alerts
