"""What `fleetfence simulate` and `fleetfence verify` do, behind their typer option lists.

Kept out of the `cli` package so its modules stay a list of thin adapters and these
functions can be called (and tested) with plain arguments.
"""

from __future__ import annotations

import logging
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson
from rich.console import Console

from fleetfence.contracts import parse_ts_ms, utc_now_ms
from fleetfence.errors import ConfigError
from fleetfence.logs import configure_logging
from simulator.config import ScenarioConfig
from simulator.publish import SimulationOptions, SimulationReport, report_table, run_simulation
from simulator.settings import SimulatorSettings
from simulator.truth import read_truth
from simulator.verify import compare, in_scope, mismatch_table, read_alerts, result_table

logger = logging.getLogger(__name__)


def start_ms_for(start_time: str | None, realtime: bool, duration_s: float, period_ms: int) -> int:
    """Event time of the first fix: given, or "now" in real time, or so that a fast run ends now
    (the gateway refuses fixes more than 5 minutes in the future)."""
    if start_time is not None and start_time != "now":
        return parse_ts_ms(int(start_time) if start_time.isdigit() else start_time)
    now = utc_now_ms()
    start = now if realtime or start_time == "now" else now - int(duration_s * 1000)
    return start - start % period_ms


def read_routes_geojson(path: Path) -> Any:
    """The routes of a GeoJSON file (its LineStrings become the scenario's routes)."""
    try:
        return orjson.loads(path.read_bytes())
    except (OSError, orjson.JSONDecodeError) as exc:
        raise ConfigError(f"cannot read routes from {path}: {exc}") from exc


def simulate(
    cfg: ScenarioConfig,
    opts: SimulationOptions,
    *,
    settings: SimulatorSettings | None = None,
    as_json: bool = False,
    console: Console | None = None,
) -> SimulationReport:
    """Run a scenario (publish its fixes, write its truth) and print the report.

    The processor-wide rules the truth assumes and the API endpoint default come from the
    settings (FLEETFENCE_PROCESSOR_*, FLEETFENCE_SIMULATOR_*): the truth must assume what the
    processor it is compared with applies; so do its proximity rules, unless the scenario names the
    ones its processor was started with (the demo's)."""
    s = settings or SimulatorSettings()
    configure_logging(s.log_level, s.log_json)
    cfg = replace(cfg, assume=s.processor_rules(), proximity=cfg.proximity or s.proximity_rules())
    opts = replace(
        opts,
        api_url=opts.api_url or s.simulator_api_url,
        api_key=opts.api_key or s.simulator_api_key,
        show_progress=opts.show_progress and not as_json,
    )
    console = console or Console(stderr=True)
    logger.info(
        "simulating vehicles=%s duration_s=%s start=%s mode=%s",
        cfg.vehicles,
        cfg.duration_s,
        datetime.fromtimestamp(cfg.start_ms / 1000, UTC).isoformat(),
        "direct" if opts.direct else "mqtt",
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
        table = mismatch_table(res)
        if table is not None:
            out.print(table)
        out.print("[green]PASS[/]" if not failures else f"[red]FAIL[/]: {'; '.join(failures)}")
    return 1 if failures else 0
