"""End to end on Spark: a simulated fleet with every behaviour and fault, convoys among them, straight
to Kafka, through the real processor and its proximity query; `verify` must find exactly the ground
truth, without duplicates."""

from __future__ import annotations

import dataclasses
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from fleetfence.contracts import AlertType, utc_now_ms
from fleetfence.kafka import ensure_topics, topic_specs
from fleetfence.settings import Settings
from processor.settings import ProcessorSettings
from processor.spark.job import start_proximity_query, start_query
from simulator.config import Injections, ScenarioConfig
from simulator.publish import SimulationOptions, run_simulation
from simulator.rules import simulated_rules
from simulator.scenario import Scenario
from simulator.settings import SimulatorSettings
from simulator.truth import read_truth
from simulator.verify import compare, in_scope, read_alerts
from tests.processor.helpers import wait_for

pytestmark = [pytest.mark.spark, pytest.mark.services]


def test_processor_matches_the_simulated_ground_truth(spark: Any, settings: Settings, tmp_path: Path) -> None:
    ensure_topics(settings.bootstrap_servers, topic_specs(settings))
    redis_prefix = f"{settings.topic_prefix}ff:"
    sim = SimulatorSettings.from_base(settings, redis_prefix=redis_prefix)
    cfg = ScenarioConfig(
        vehicles=12,
        duration_s=240,
        seed=21,
        routes=3,
        route_length_m=2000,
        vehicle_prefix=f"e{uuid.uuid4().hex[:5]}-",
        start_ms=utc_now_ms() - 600_000,
        rules=simulated_rules(silent_after_s=60, overspeed_min_s=5, deviation_min_s=2),
        inject=Injections(0.5, 0.5, 0.3, 0.2, duplicate=0.02, out_of_order=0.02, late=0.02, convoy=0.25),
        assume=sim.processor_rules(),
    )
    # Proximity rules for the fleet, one route (a convoy rule, closer) and one fleet group (wider),
    # their scopes read from the vehicle master's data the run registers.
    route = Scenario(cfg).city.routes[1].route_id
    scoped = [
        {"rule_id": "convoy", "enter_m": 25, "exit_m": 50, "min_duration_s": 10, "route_id": route},
        {"rule_id": "south", "enter_m": 60, "exit_m": 110, "min_duration_s": 5, "group": "south"},
    ]
    # The job and the proximity query beside it, as a service runs them (processor.ops.service).
    ps = ProcessorSettings(
        **{
            **settings.model_dump(exclude={"topics"}),
            "processor_checkpoint": str(tmp_path / "cp"),
            "processor_buckets": 4,
            "processor_trigger_ms": 100,
            "redis_prefix": redis_prefix,
            "processor_proximity_enter_m": 40.0,
            "processor_proximity_exit_m": 80.0,
            "processor_proximity_min_duration_s": 15.0,
            "processor_proximity_tolerance_s": 0.5,
            "processor_proximity_lost_after_s": 30.0,
            "processor_proximity_starting_offsets": "earliest",
            "processor_proximity_rules": [{**r, "tolerance_s": 0.4, "lost_after_s": 20} for r in scoped],
        }
    )
    rules = ps.proximity_rules()
    assert [r.rule_id for r in rules] == ["fleet", "convoy", "south"]
    cfg = dataclasses.replace(cfg, proximity=rules)
    truth_path = tmp_path / "truth.jsonl"
    rep = run_simulation(sim, cfg, SimulationOptions(direct=True, truth_path=truth_path, show_progress=False))
    header, truth = read_truth(truth_path)
    # Every alert type the simulator plans (its silent vehicles never come back: no VEHICLE_RESUMED).
    assert {a.type for a in truth} == {t.value for t in AlertType} - {AlertType.VEHICLE_RESUMED.value}
    assert rep.scenario.duplicates > 0
    assert rep.scenario.out_of_order > 0
    assert rep.scenario.late > 0
    # Alerts under each rule, so that a rule's scope not applied would show.
    by_rule = Counter((a.subject or "").split(":", 1)[0] for a in truth if AlertType(a.type).meta.pair)
    assert all(by_rule[r.rule_id] >= 4 for r in rules), by_rule

    q = start_query(spark, ps)
    pq = start_proximity_query(spark, ps, rules)
    try:
        expected = {a.key for a in truth}

        def complete() -> Any:
            got = in_scope(header, read_alerts(settings, timeout_s=0))
            return {a.key for a in got} >= expected and got

        observed = wait_for(complete, 240, "every expected alert", interval_s=1.0)
    finally:
        q.stop()
        pq.stop()
    res = compare(truth, observed)
    # A pair's alert id also says when its nearness began, which the keys compared leave out.
    pair_types = {t.value for t in AlertType if t.meta.pair}
    assert {a.alert_id for a in truth if a.type in pair_types} == {
        o.alert_id for o in observed if o.type in pair_types
    }
    assert res.missing == []
    assert res.unexpected == []
    assert res.overall.recall == 1.0
    assert res.overall.precision == 1.0
    assert res.overall.duplicates == 0
