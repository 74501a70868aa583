"""What `fleetfence simulate` and `fleetfence verify` do, behind their typer option lists.

Kept out of the `cli` package so its modules stay a list of thin adapters and these
functions can be called (and tested) with plain arguments.
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson
from rich.console import Console

from fleetfence.contracts import parse_ts_ms, utc_now_ms
from fleetfence.errors import ConfigError
from fleetfence.logs import configure_logging
from fleetfence.rules import RouteRules
from simulator.publish import SimulationOptions, SimulationReport, report_table, run_simulation
from simulator.routes import DEFAULT_BBOX, parse_bbox
from simulator.scenario import Injections, ScenarioConfig
from simulator.settings import SimulatorSettings
from simulator.truth import read_truth
from simulator.verify import compare, in_scope, read_alerts, result_table

logger = logging.getLogger(__name__)


def start_ms_for(start_time: str | None, realtime: bool, duration_s: float, period_ms: int) -> int:
    """Event time of the first fix: given, or "now" in real time, or so that a fast run ends now
    (the gateway refuses fixes more than 5 minutes in the future)."""
    if start_time is not None and start_time != "now":
        return parse_ts_ms(int(start_time) if start_time.isdigit() else start_time)
    now = utc_now_ms()
    start = now if realtime or start_time == "now" else now - int(duration_s * 1000)
    return start - start % period_ms


def simulate(
    *,
    settings: SimulatorSettings | None = None,
    vehicles: int,
    duration_s: float,
    rate_hz: float,
    seed: int,
    noise_m: float,
    routes: int,
    routes_geojson: Path | None,
    route_length_m: float,
    zones_per_route: int,
    bbox: str | None,
    corridor_width_m: float,
    speed_limit_kmh: float,
    deviation_min_fixes: int,
    deviation_min_s: float,
    overspeed_min_s: float,
    silent_after_s: float,
    injections: Injections,
    direct: bool,
    realtime: bool,
    start_time: str | None,
    truth_path: Path,
    register: bool,
    api_url: str | None,
    api_key: str | None,
    vehicle_prefix: str,
    as_json: bool = False,
    console: Console | None = None,
) -> SimulationReport:
    s = settings or SimulatorSettings()
    configure_logging(s.log_level, s.log_json)
    period_ms = round(1000 / rate_hz) if rate_hz > 0 else 1000
    geo: Any | None = None
    if routes_geojson is not None:
        try:
            geo = orjson.loads(routes_geojson.read_bytes())
        except (OSError, orjson.JSONDecodeError) as exc:
            raise ConfigError(f"cannot read routes from {routes_geojson}: {exc}") from exc
    cfg = ScenarioConfig(
        vehicles=vehicles,
        duration_s=duration_s,
        rate_hz=rate_hz,
        seed=seed,
        noise_sigma_m=noise_m,
        routes=routes,
        route_length_m=route_length_m,
        zones_per_route=zones_per_route,
        bbox=parse_bbox(bbox) if bbox else DEFAULT_BBOX,
        routes_geojson=geo,
        rules=RouteRules(
            corridor_width_m=corridor_width_m,
            speed_limit_kmh=speed_limit_kmh,
            deviation_min_fixes=deviation_min_fixes,
            deviation_min_s=deviation_min_s,
            overspeed_min_s=overspeed_min_s,
            silent_after_s=silent_after_s,
        ),
        assume=s.assumptions(),
        inject=injections,
        start_ms=start_ms_for(start_time, realtime, duration_s, period_ms),
        vehicle_prefix=vehicle_prefix,
    )
    console = console or Console(stderr=True)
    opts = SimulationOptions(
        direct=direct,
        realtime=realtime,
        truth_path=truth_path,
        register=register,
        api_url=api_url or s.simulator_api_url,
        api_key=api_key or s.simulator_api_key,
        show_progress=not as_json,
        start_now=realtime and start_time in (None, "now"),
    )
    logger.info(
        "simulating vehicles=%s duration_s=%s start=%s mode=%s",
        vehicles,
        duration_s,
        datetime.fromtimestamp(cfg.start_ms / 1000, UTC).isoformat(),
        "direct" if direct else "mqtt",
    )
    rep = run_simulation(s, cfg, opts, console)
    if as_json:
        print(orjson.dumps(rep.to_dict(), default=str).decode())
    else:
        Console().print(report_table(rep))
    return rep


def verify(
    *,
    settings: SimulatorSettings | None = None,
    truth_path: Path,
    timeout_s: float,
    seq_tolerance: int,
    min_precision: float,
    min_recall: float,
    max_duplicates: int,
    as_json: bool,
) -> int:
    """Compare and print; returns the exit code (0 pass, 1 below a threshold)."""
    s = settings or SimulatorSettings()
    configure_logging(s.log_level, s.log_json)
    header, truth = read_truth(truth_path)
    expected = {a.key for a in truth}
    observed = in_scope(header, read_alerts(s, timeout_s=timeout_s, expected=expected))
    res = compare(truth, observed, seq_tolerance=seq_tolerance)
    failures = res.failures(min_precision, min_recall, max_duplicates)
    if as_json:
        print(orjson.dumps({**res.to_dict(), "passed": not failures, "failures": failures}).decode())
    else:
        out = Console()
        out.print(result_table(res))
        if header.realtime is False:
            out.print("[dim]detection delay: n/a (the run was not published in real time)[/]")
        for m in res.missing[:10]:
            out.print(f"[red]missing[/] {m.type} {m.vehicle_id} seq={m.seq} zone={m.zone_id or '-'}")
        for u in res.unexpected[:10]:
            out.print(f"[yellow]unexpected[/] {u.type} {u.vehicle_id} seq={u.seq} zone={u.zone_id or '-'}")
        out.print("[green]PASS[/]" if not failures else f"[red]FAIL[/]: {'; '.join(failures)}")
    return 1 if failures else 0
