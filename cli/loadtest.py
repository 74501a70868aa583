"""`fleetfence loadtest`: the whole pipeline under a simulated fleet, measured (loadtest/)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from cli.common import app, friendly_errors, settings_from_env
from fleetfence.logs import configure_logging


@app.command("loadtest")
@friendly_errors
def loadtest_cmd(
    vehicles: Annotated[
        int, typer.Option("--vehicles", "-n", min=1, max=1_000_000, help="Fleet (ramp: first step's fleet).")
    ] = 200,
    rate_hz: Annotated[float, typer.Option(min=0.05, max=50, help="Fixes per second per vehicle.")] = 1.0,
    duration_s: Annotated[
        float,
        typer.Option(min=10, help="Seconds of the run (ramp: of each step); 90 s lets deviations fit."),
    ] = 90.0,
    ramp: Annotated[
        bool, typer.Option("--ramp", help="Grow the fleet step by step until a stage cannot keep up.")
    ] = False,
    soak: Annotated[
        bool, typer.Option("--soak", help="One long step; reports RSS growth per process.")
    ] = False,
    ramp_factor: Annotated[float, typer.Option(min=1.05, help="Fleet growth per ramp step.")] = 1.5,
    max_steps: Annotated[int, typer.Option(min=1, max=30, help="Ramp: at most this many steps.")] = 8,
    gateways: Annotated[int, typer.Option(min=1, max=16, help="Gateway replicas.")] = 2,
    seed: Annotated[int, typer.Option(help="Scenario seed (step k uses seed + k).")] = 11,
    warmup_s: Annotated[float, typer.Option(min=0, help="RSS growth is measured after this.")] = 60.0,
    settle_s: Annotated[
        float, typer.Option(min=10, help="After the last fix: wait for the stages to drain.")
    ] = 120.0,
    max_p99_ms: Annotated[
        float | None, typer.Option(help="Fail (exit 1) when event->alert p99 exceeds this.")
    ] = None,
    min_recall: Annotated[
        float | None, typer.Option(min=0, max=1, help="Fail (exit 1) when recall falls below this.")
    ] = None,
    max_rss_growth: Annotated[
        float | None, typer.Option(min=0, help="Fail (exit 1) when a process's RSS grows more (0.1 = 10%).")
    ] = None,
    report_dir: Annotated[
        Path | None, typer.Option(help="Report folder (default: state/loadtest/<mode>-<time>).")
    ] = None,
    attach: Annotated[
        bool,
        typer.Option(
            "--attach",
            help="Measure the installation that is already running at the endpoint settings "
            "(FLEETFENCE_KAFKA_BOOTSTRAP, _MQTT_URL, _REDIS_URL; services from its registry): start "
            "and stop nothing, remove the run's vehicles, routes and zones at the end.",
        ),
    ] = False,
    proximity_m: Annotated[
        float | None,
        typer.Option(
            min=1,
            max=2500,
            help="Vehicle proximity on: the processor's enter distance (exit twice it), with 5% of "
            "the fleet in convoys; its pairs are held to the truth too.",
        ),
    ] = None,
    bbox: Annotated[
        str | None,
        typer.Option(
            help="The first step's area min_lon,min_lat,max_lon,max_lat (default central Berlin); "
            "each later step lies 0.25 deg east. It must hold none of the installation's zones."
        ),
    ] = None,
    cleanup: Annotated[
        str | None,
        typer.Option(
            "--cleanup",
            metavar="RUN",
            help="With --attach: run nothing, remove what the earlier run RUN (its prefix, e.g. "
            "lt3f9a0cs, named where a load test refuses its area) left registered.",
        ),
    ] = None,
) -> None:
    """Load-test the whole pipeline: simulated vehicles over MQTT -> gateway replicas -> Kafka ->
    processor -> alert receivers, on the embedded infrastructure (started and stopped here) or,
    with --attach, on a running installation.
    Writes a report folder (summary.md, PNG charts, report.json); exit 1 when a threshold is missed."""
    from loadtest.driver import LoadOptions
    from loadtest.errors import LoadtestError
    from loadtest.run import run_loadtest
    from simulator.routes import DEFAULT_BBOX, parse_bbox

    if ramp and soak:
        raise LoadtestError("--ramp and --soak are different runs: choose one")
    if attach and proximity_m is not None:
        raise LoadtestError(
            "--proximity-m sets the rule of the processor a run starts; attached, the truth assumes the "
            "installation's rule: set FLEETFENCE_PROCESSOR_PROXIMITY_* as the installation does"
        )
    s = settings_from_env()
    if cleanup is not None:
        from loadtest.run import cleanup_run

        if not attach:
            raise LoadtestError(
                "--cleanup removes an earlier run's data from a running installation: add --attach"
            )
        removed = cleanup_run(s, cleanup)
        Console().print(f"removed {removed} entities of load test {cleanup} from the vehicle master")
        raise typer.Exit(0)
    if "FLEETFENCE_LOG_LEVEL" not in os.environ:
        # The terminal is for the live view; the services log to files in the report folder.
        os.environ["FLEETFENCE_LOG_LEVEL"] = "WARNING"
        configure_logging("WARNING", s.log_json)
    opts = LoadOptions(
        mode="ramp" if ramp else "soak" if soak else "fixed",
        vehicles=vehicles,
        rate_hz=rate_hz,
        duration_s=duration_s,
        ramp_factor=ramp_factor,
        max_steps=max_steps,
        gateway_replicas=gateways,
        seed=seed,
        warmup_s=warmup_s,
        settle_s=settle_s,
        max_p99_ms=max_p99_ms,
        min_recall=min_recall,
        max_rss_growth=max_rss_growth,
        report_dir=report_dir,
        attach=attach,
        bbox=parse_bbox(bbox) if bbox else DEFAULT_BBOX,
        proximity_m=proximity_m,
    )
    console = Console()
    run, folder = run_loadtest(s, opts, console)
    for st in run.steps:
        acc = st.accuracy
        console.print(
            f"step {st.step}: {st.target_rate:,.0f} fixes/s target, {st.achieved_rate:,.0f} achieved, "
            f"{'sustained' if st.sustained else '[red]not sustained[/]'}; event->alert p99 "
            f"{st.latency_event.p99_ms or 0:,.0f} ms; precision {acc.precision} recall {acc.recall}"
        )
    if run.highest_sustained_rate is not None and opts.mode == "ramp":
        console.print(f"[bold]highest sustained rate[/] {run.highest_sustained_rate:,.0f} fixes/s")
    console.print(f"report: {folder / 'summary.md'}")
    for v in run.verdicts:
        console.print(f"[red]FAIL[/] {v}")
    raise typer.Exit(1 if run.verdicts else 0)
