"""`fleetfence simulate` and `verify`: the simulated fleet with its ground truth (the simulator)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from cli.common import app, friendly_errors
from simulator.rules import SIMULATED_RULES

# The route options' defaults: the simulated routes' rules.
_R = SIMULATED_RULES


@app.command("simulate")
@friendly_errors
def simulate_cmd(
    vehicles: Annotated[int, typer.Option("--vehicles", "-n", min=1, max=1_000_000, help="Fleet size.")] = 10,
    duration: Annotated[float, typer.Option(min=0.05, help="Seconds of event time.")] = 600.0,
    rate: Annotated[float, typer.Option(min=0.05, max=50, help="Fixes per second per vehicle.")] = 1.0,
    seed: Annotated[int, typer.Option(help="Same seed and start time: same scenario and truth.")] = 1,
    noise: Annotated[
        float, typer.Option(min=0, help="GPS noise sigma in metres (bounded at 3 sigma).")
    ] = 3.0,
    routes: Annotated[
        int, typer.Option(min=0, help="Synthetic routes (0: one per 25 vehicles, max 20).")
    ] = 0,
    routes_geojson: Annotated[
        str | None,
        typer.Option("--routes-geojson", help="Use the LineStrings of this GeoJSON file as routes."),
    ] = None,
    route_length: Annotated[float, typer.Option(min=200, help="Synthetic route length in metres.")] = 8000.0,
    zones_per_route: Annotated[int, typer.Option(min=0, max=10)] = 2,
    circle_zones: Annotated[
        float,
        typer.Option(min=0.0, max=1.0, help="Share of the zones laid as circles (a Point with radius_m)."),
    ] = 0.0,
    bbox: Annotated[
        str | None, typer.Option(help="City box min_lon,min_lat,max_lon,max_lat (default central Berlin).")
    ] = None,
    corridor_width: Annotated[
        float, typer.Option(min=1, help="Route corridor full width, metres.")
    ] = _R.corridor_width_m,
    speed_limit: Annotated[float, typer.Option(min=1, help="Route speed limit, km/h.")] = _R.speed_limit_kmh,
    deviation_min_fixes: Annotated[int, typer.Option(min=1)] = _R.deviation_min_fixes,
    deviation_min_s: Annotated[float, typer.Option(min=0)] = _R.deviation_min_s,
    overspeed_min_s: Annotated[float, typer.Option(min=0)] = _R.overspeed_min_s,
    silent_after: Annotated[float, typer.Option(min=1, help="Route silent_after_s.")] = _R.silent_after_s,
    wrong_way_min: Annotated[
        float, typer.Option(min=1, help="Route wrong_way_min_m: metres back before WRONG_DIRECTION.")
    ] = _R.wrong_way_min_m,
    stop_min: Annotated[
        float, typer.Option(min=10, help="Route stop_min_s: seconds standing before UNPLANNED_STOP.")
    ] = _R.stop_min_s,
    arrival_risk: Annotated[
        float, typer.Option(min=0, help="Route arrival_risk_s: ETA delay before ARRIVAL_AT_RISK.")
    ] = _R.arrival_risk_s,
    deviations: Annotated[
        float, typer.Option(min=0, max=1, help="Fraction of vehicles that leave the corridor.")
    ] = 0.1,
    overspeeds: Annotated[
        float, typer.Option(min=0, max=1, help="Fraction of vehicles with a speeding episode.")
    ] = 0.1,
    dwells: Annotated[
        float, typer.Option(min=0, max=1, help="Fraction of vehicles that stop in a zone.")
    ] = 0.1,
    silences: Annotated[
        float, typer.Option(min=0, max=1, help="Fraction of vehicles that go silent.")
    ] = 0.05,
    duplicates: Annotated[
        float, typer.Option(min=0, max=1, help="Probability a message is sent twice.")
    ] = 0.01,
    out_of_order: Annotated[
        float, typer.Option(min=0, max=1, help="Probability a fix swaps with the next.")
    ] = 0.01,
    late: Annotated[
        float, typer.Option(min=0, max=1, help="Probability a calm fix arrives after the lateness.")
    ] = 0.005,
    wrong_ways: Annotated[
        float, typer.Option(min=0, max=1, help="Fraction of vehicles that drive a stretch the wrong way.")
    ] = 0.05,
    schedules: Annotated[
        float,
        typer.Option(min=0, max=1, help="Fraction of vehicles on a schedule that start late and catch up."),
    ] = 0.05,
    convoys: Annotated[
        float,
        typer.Option(
            min=0,
            max=1,
            help="Fraction of vehicles that start close behind another and drift back (vehicle "
            "proximity: its truth follows FLEETFENCE_PROCESSOR_PROXIMITY_*).",
        ),
    ] = 0.0,
    direct: Annotated[
        bool, typer.Option("--direct", help="Write canonical records straight to Kafka instead of MQTT.")
    ] = False,
    realtime: Annotated[
        bool,
        typer.Option("--realtime/--fast", help="Pace at the rate (demos) or publish as fast as possible."),
    ] = False,
    start_time: Annotated[
        str | None, typer.Option(help="Event time of the first fix: ISO-8601, epoch ms or 'now'.")
    ] = None,
    truth: Annotated[
        str, typer.Option("--truth", help="Ground truth output (JSON lines).")
    ] = "sim-truth.jsonl",
    register: Annotated[
        bool, typer.Option("--register/--no-register", help="Register routes, zones, vehicles, assignments.")
    ] = True,
    api_url: Annotated[str | None, typer.Option(help="Register through the admin API at this URL.")] = None,
    api_key: Annotated[
        str | None, typer.Option(help="Admin API key (or FLEETFENCE_SIMULATOR_API_KEY).")
    ] = None,
    vehicle_prefix: Annotated[str, typer.Option(help="Prefix of vehicle, route and zone ids.")] = "sim-",
    as_json: Annotated[bool, typer.Option("--json", help="Print the closing report as JSON.")] = False,
) -> None:
    """Drive simulated vehicles with injected deviations, speeding, zone stops, silences and
    transport faults; publish them (MQTT or Kafka) and write the exact expected alerts."""

    from simulator.commands import read_routes_geojson, simulate, start_ms_for
    from simulator.config import Injections, ScenarioConfig
    from simulator.publish import SimulationOptions
    from simulator.routes import DEFAULT_BBOX, parse_bbox
    from simulator.rules import simulated_rules

    duration_s, period_ms = duration, (round(1000 / rate) if rate > 0 else 1000)
    cfg = ScenarioConfig(
        vehicles=vehicles,
        duration_s=duration_s,
        rate_hz=rate,
        seed=seed,
        noise_sigma_m=noise,
        routes=routes,
        route_length_m=route_length,
        zones_per_route=zones_per_route,
        circle_zones=circle_zones,
        bbox=parse_bbox(bbox) if bbox else DEFAULT_BBOX,
        routes_geojson=read_routes_geojson(Path(routes_geojson)) if routes_geojson else None,
        rules=simulated_rules(
            corridor_width_m=corridor_width,
            speed_limit_kmh=speed_limit,
            deviation_min_fixes=deviation_min_fixes,
            deviation_min_s=deviation_min_s,
            overspeed_min_s=overspeed_min_s,
            silent_after_s=silent_after,
            wrong_way_min_m=wrong_way_min,
            stop_min_s=stop_min,
            arrival_risk_s=arrival_risk,
        ),
        inject=Injections(
            deviations,
            overspeeds,
            dwells,
            silences,
            duplicates,
            out_of_order,
            late,
            wrong_ways,
            schedules,
            convoys,
        ),
        start_ms=start_ms_for(start_time, realtime, duration_s, period_ms),
        vehicle_prefix=vehicle_prefix,
    )
    opts = SimulationOptions(
        direct=direct,
        realtime=realtime,
        truth_path=Path(truth),
        register=register,
        api_url=api_url,
        api_key=api_key,
        start_now=realtime and start_time in (None, "now"),
    )
    simulate(cfg, opts, as_json=as_json)


@app.command("verify")
@friendly_errors
def verify_cmd(
    truth: Annotated[
        str, typer.Option("--truth", help="Ground truth written by `simulate`.")
    ] = "sim-truth.jsonl",
    timeout: Annotated[float, typer.Option(min=0, help="Wait up to this long for missing alerts.")] = 0.0,
    seq_tolerance: Annotated[int, typer.Option(min=0, help="Match alerts whose seq is this close.")] = 0,
    min_precision: Annotated[float, typer.Option(min=0, max=1)] = 1.0,
    min_recall: Annotated[float, typer.Option(min=0, max=1)] = 1.0,
    max_duplicates: Annotated[int, typer.Option(min=0)] = 0,
    as_json: Annotated[bool, typer.Option("--json", help="Print the figures as JSON.")] = False,
) -> None:
    """Compare committed alerts (read_committed) with a ground truth; exit 1 below the thresholds."""

    from simulator.commands import verify

    code = verify(
        truth_path=Path(truth),
        timeout_s=timeout,
        seq_tolerance=seq_tolerance,
        min_precision=min_precision,
        min_recall=min_recall,
        max_duplicates=max_duplicates,
        as_json=as_json,
    )
    if code:
        raise typer.Exit(code)


# --------------------------------------------------------------------------- history archive, restatement
