"""Helpers shared by the simulator's tests: a small faulty scenario, and the processor's pure engine
run over its messages micro-batch by micro-batch."""

from __future__ import annotations

from typing import Any

import pandas as pd

from processor.core.columns import empty_states
from processor.core.domain import EngineConfig, RawFix
from processor.core.engine import process_bucket
from processor.core.master import Catalog, MasterState
from processor.core.proximity import BucketedStages, HomedFixes, Position
from processor.core.proximity_members import Members
from simulator.config import Injections, ScenarioConfig
from simulator.fleet_sink import tick_rows
from simulator.register import scenario_entities
from simulator.rules import simulated_rules
from simulator.scenario import Scenario, TickBatch
from simulator.truth import TruthAlert
from simulator.verify import ObservedAlert
from vehicle_master.models import entity_id, entity_of, to_wire

FAULTY = Injections(
    deviation=0.5, overspeed=0.5, dwell=0.5, silent=0.2, duplicate=0.03, out_of_order=0.03, late=0.03
)


def small(**kw: Any) -> ScenarioConfig:
    base: dict[str, Any] = {
        "vehicles": 24,
        "duration_s": 420,
        "seed": 11,
        "routes": 3,
        "route_length_m": 2500,
        "inject": FAULTY,
        "rules": simulated_rules(
            silent_after_s=60, overspeed_min_s=5, deviation_min_fixes=3, deviation_min_s=2
        ),
    }
    base.update(kw)
    return ScenarioConfig(**base)


def run(cfg: ScenarioConfig) -> tuple[Scenario, list[TickBatch], list[TruthAlert]]:
    sc = Scenario(cfg)
    batches = list(sc.ticks())
    return sc, batches, [a for b in batches for a in b.truth]


def positions(sc: Scenario, batches: list[TickBatch]) -> dict[tuple[str, int], tuple[float, float]]:
    """(vehicle id, seq) -> (lon, lat) of every fix the scenario published."""
    out: dict[tuple[str, int], tuple[float, float]] = {}
    vids = sc.vehicle_ids()
    for b in batches:
        for v, seq, lat, lon in zip(
            b.vehicle.tolist(), b.seq.tolist(), b.lat.tolist(), b.lon.tolist(), strict=True
        ):
            out[(vids[v], seq)] = (lon, lat)
    return out


def master_of(sc: Scenario) -> MasterState:
    m = MasterState()
    for e in scenario_entities(sc):
        m.apply(
            {
                "entity": entity_of(e).value,
                "id": entity_id(e),
                "version": 1,
                "op": "upsert",
                "data": to_wire(e),
            }
        )
    return m


def engine_alerts(
    sc: Scenario, batches: list[TickBatch], ticks_per_batch: int, fast_path: bool = True
) -> list[ObservedAlert]:
    """The processor's pure engine over the published messages, micro-batch by micro-batch
    (without the `fast_path`: every vehicle through the reference fold, `domain.step`)."""
    cfg = EngineConfig.of(sc.cfg.assume, fast_path=fast_path)
    master, catalog, states = master_of(sc), Catalog(cfg), empty_states()
    held: dict[str, list[RawFix]] = {}
    vids = sc.vehicle_ids()
    out: list[ObservedAlert] = []
    max_ts = -1
    groups = [batches[i : i + ticks_per_batch] for i in range(0, len(batches), ticks_per_batch)]
    groups += [[]] * 3  # idle batches: the watermark catches up with the last data
    for group in groups:
        rows = [r for b in group for r in tick_rows(b, vids)]
        df = pd.DataFrame(rows, columns=["vehicle_id", "seq", "ts_ms", "lat", "lon", "speed_kmh", "heading"])
        df["received_ms"] = df["ts_ms"]
        wm = max(max_ts - cfg.lateness_ms, 0)
        res = process_bucket(states, held, master, df.drop(columns="heading"), wm, cfg, catalog)
        states, held = res.states, res.held
        for a in res.alerts:
            out.append(
                ObservedAlert(a.alert_id, a.vehicle_id, a.type.value, a.subject or None, a.seq, a.ts_ms)
            )
        if len(df):
            max_ts = max(max_ts, int(df["ts_ms"].max()))
    return out


def proximity_alerts(
    sc: Scenario, batches: list[TickBatch], ticks_per_batch: int, buckets: int = 3
) -> list[ObservedAlert]:
    """The processor's proximity stages (`BucketedStages`, every rule of the scenario) over the
    published messages, micro-batch by micro-batch: the watermark the batch before's latest event
    time less the lateness, idle batches at the end for it to catch up."""
    assert sc.cfg.proximity, "a scenario with proximity rules"
    # The vehicle master's data as registered (groups, assignments), which the rules' scopes read.
    stages = BucketedStages(sc.cfg.proximity, buckets, Members(master_of(sc)))
    vids = sc.vehicle_ids()
    out: list[ObservedAlert] = []
    max_ts = -1
    groups = [batches[i : i + ticks_per_batch] for i in range(0, len(batches), ticks_per_batch)]
    groups += [[]] * 3
    for group in groups:
        rows = [r for b in group for r in tick_rows(b, vids)]
        wm = max(max_ts - sc.cfg.assume.lateness_ms, 0)
        fixes = HomedFixes.from_positions((Position(*r[:6]) for r in rows), stages.resolution)
        _meetings, _rules, events = stages.step(fixes, wm)
        for e in events:
            for a in e.alerts():
                out.append(
                    ObservedAlert(
                        a["alert_id"],
                        a["vehicle_id"],
                        a["type"].value,
                        None,
                        a["seq"],
                        a["ts_ms"],
                        None,
                        a["lat"],
                        a["lon"],
                        a["details"]["other_vehicle_id"],
                        a["details"]["rule_id"],
                    )
                )
        if rows:
            max_ts = max(max_ts, *(r[2] for r in rows))
    return out
