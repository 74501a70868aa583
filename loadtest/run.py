"""Where the load test runs. By default the whole pipeline is started here on the embedded
infrastructure and stopped at the end (`embedded.pipeline`); with `attach` the run measures an
installation that is already running, found through the endpoint settings and its service registry
(`loadtest.installation.RunningInstallation`): nothing is started or stopped, the counts are the
run's own (what reached Kafka's telemetry topics and the processor's commit markers from the run's
start), the run's vehicles, routes and zones are deleted from the vehicle master at the
end, and only the processes on this machine are measured.
"""

from __future__ import annotations

import logging
import re
import shutil
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

from rich.console import Console

from alerts.config import AlertsSettings
from alerts.service import group_id
from embedded.pipeline import Pipeline, PipelineSpec
from fleetfence.contracts import MasterEntity
from fleetfence.settings import Settings
from loadtest.driver import LoadOptions, LoadTest, proximity_rules, step_bbox
from loadtest.errors import LoadtestError
from loadtest.installation import RunningInstallation, receiver_groups
from loadtest.model import LoadRun
from simulator.errors import RegistrationError
from simulator.register import unregister_prefix
from simulator.settings import SimulatorSettings

logger = logging.getLogger(__name__)


def run_loadtest(
    settings: Settings,
    opts: LoadOptions,
    console: Console | None = None,
    *,
    report: Callable[[LoadRun, Path], Path] | None = None,
) -> tuple[LoadRun, Path]:
    """Run the load test and write its report folder; return (the run, its folder). By default
    on the embedded pipeline, started here with fresh state and stopped at the end; with
    `opts.attach` on the running installation the settings point at, starting nothing."""
    from loadtest.report import write_report

    console = console or Console()
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    out = (opts.report_dir or settings.state_dir.resolve() / "loadtest" / f"{opts.mode}-{stamp}").resolve()
    out.mkdir(parents=True, exist_ok=True)
    run_in = _run_attached if opts.attach else _run_embedded
    run = run_in(settings, opts, console, out)
    folder = (report or write_report)(run, out)
    return run, folder


def _run_embedded(settings: Settings, opts: LoadOptions, console: Console, out: Path) -> LoadRun:
    fresh = not (settings.kafka_external or settings.mqtt_external or settings.redis_external)
    if fresh:
        # Fresh embedded servers every run (as the demo's): an earlier run's routes, zones and
        # vehicles would raise alerts this run's ground truth does not know. Their data stays
        # until the next run, outside the report folder.
        state = settings.state_dir.resolve() / "loadtest" / "state"
        shutil.rmtree(state, ignore_errors=True)
        settings = settings.model_copy(update={"state_dir": state})
    # Fresh servers: the proximity query reads the run's telemetry from its start.
    spec = PipelineSpec(
        gateway_replicas=opts.gateway_replicas, proximity=proximity_rules(opts), proximity_from_start=fresh
    )
    pipeline = Pipeline(settings, out / "logs", spec)
    try:
        with console.status(
            "starting the pipeline: Kafka, Mosquitto, Redis, API, processor, gateways, receivers…"
        ):
            pipeline.start()
            pipeline.wait_ready()
        # The receivers the pipeline runs (embedded.pipeline.HISTORY_AND_MQTT), by their groups.
        alerts = AlertsSettings.from_base(settings)
        groups = [group_id(alerts, n) for n in ("history", "mqtt")]
        lt = LoadTest(settings, pipeline, opts, console, out, groups)
        try:
            return lt.run()
        finally:
            lt.close()
    finally:
        with console.status("stopping everything the load test started…"):
            pipeline.stop()


# The prefix of every id one load test registers (`LoadTest.prefix`: "lt", the run id, "s").
RUN_PREFIX_RE = re.compile(r"lt[0-9a-f]{6}s")


def cleanup_run(settings: Settings, prefix: str) -> int:
    """Remove what a load test left in the vehicle master (its vehicles, assignments, zones and
    routes, all named after its run prefix), for a run whose own clean-up could not finish (the
    installation restarted under it, the process was killed). Through the admin API when the
    simulator's API settings name it (as the registration was), else in the vehicle master directly.
    Returns how many entities it deleted; only a load test's prefix is accepted."""
    if not RUN_PREFIX_RE.fullmatch(prefix):
        raise LoadtestError(
            f"{prefix!r} is not a load test's run prefix (lt + 6 hex digits + s, e.g. lt3f9a0cs): "
            "it is printed where the load test refuses an area, and in its report"
        )
    sim = SimulatorSettings.from_base(settings)
    removed = unregister_prefix(
        settings, prefix, api_url=sim.simulator_api_url, api_key=sim.simulator_api_key
    )
    logger.info(
        "loadtest cleanup removed entities=%s found=%s prefix=%s", removed.changed, removed.entities, prefix
    )
    return removed.changed


def refusal(clash: list[str]) -> str:
    """Why an attached run will not start in its area, and what to do: an earlier run's leftover
    zones are named by their run's prefix, with the command that removes them."""
    text = (
        f"the installation's zones {', '.join(clash[:5])}{' …' if len(clash) > 5 else ''} lie in "
        "the load test's area: its vehicles would raise alerts their ground truth does not know; "
        "choose an empty area with --bbox"
    )
    runs = sorted({m.group(0) for z in clash if (m := RUN_PREFIX_RE.match(z))})
    if runs:
        text += (
            "; the zones named lt…s are an earlier load test's, left when its clean-up could not run: "
            + "; ".join(f"`fleetfence loadtest --attach --cleanup {r}`" for r in runs)
            + " removes them"
        )
    return text


def _run_attached(settings: Settings, opts: LoadOptions, console: Console, out: Path) -> LoadRun:
    with console.status(f"attaching to the installation (registry in {settings.redis_dsn})…"):
        installation = RunningInstallation(settings)
    try:
        steps = opts.max_steps if opts.mode == "ramp" else 1
        clash = zones_in_areas(settings, [step_bbox(opts, k) for k in range(steps)])
        if clash:
            raise LoadtestError(refusal(clash))
        groups = receiver_groups(settings)
        if not groups:
            logger.warning("loadtest found no alert receivers' consumer groups: receivers' lag not measured")
        lt = LoadTest(settings, installation, opts, console, out, groups)
        try:
            return lt.run()
        finally:
            lt.close()
            with console.status("removing the run's vehicles, routes and zones from the vehicle master…"):
                try:
                    removed = unregister_prefix(
                        settings,
                        lt.prefix,
                        api_url=lt.sim.simulator_api_url,
                        api_key=lt.sim.simulator_api_key,
                    )
                except RegistrationError as exc:
                    # Not raised over the run's own outcome: said, with the command that finishes it.
                    logger.error("loadtest clean-up failed prefix=%s error=%s", lt.prefix, exc)
                    console.print(
                        f"[red]the run's vehicles, routes and zones are still registered[/] ({exc}); "
                        f"once the admin API answers: fleetfence loadtest --attach --cleanup {lt.prefix}"
                    )
                else:
                    logger.info("loadtest removed entities=%s prefix=%s", removed.changed, lt.prefix)
    finally:
        installation.close()


def zones_in_areas(settings: Settings, areas: list[tuple[float, float, float, float]]) -> list[str]:
    """Ids of the vehicle master's zones that intersect any of the areas (lon/lat boxes)."""
    from shapely import box
    from shapely.strtree import STRtree

    from vehicle_master.geometry import zone_area
    from vehicle_master.store import VehicleMaster

    tree = STRtree([box(*a) for a in areas])
    vm = VehicleMaster.from_settings(settings)
    try:
        return [
            rec.id
            for rec in vm.scan(MasterEntity.ZONE)
            if len(tree.query(zone_area(rec.data["geometry"]), predicate="intersects"))
        ]
    finally:
        vm.close()
