"""The simulator against the real broker, Mosquitto and Redis: registration, MQTT, --direct, CLI."""

from __future__ import annotations

import threading
import uuid
from collections import Counter
from dataclasses import replace
from pathlib import Path
from typing import Any

import orjson
import paho.mqtt.client as mqtt
import pytest
from paho.mqtt.enums import CallbackAPIVersion
from typer.testing import CliRunner

from cli.app import app
from fleetfence.contracts import Telemetry, utc_now_ms, validate_telemetry
from fleetfence.kafka import ensure_topics, topic_specs
from fleetfence.mqtt import login
from fleetfence.settings import Settings
from fleetfence.testing import mqtt_test_account, read_all
from simulator.config import Injections, ScenarioConfig
from simulator.publish import SimulationOptions, run_simulation
from simulator.rules import simulated_rules
from simulator.scenario import Scenario
from simulator.settings import SimulatorSettings
from simulator.truth import read_truth
from tests.processor.helpers import wait_for
from vehicle_master.store import VehicleMaster

pytestmark = pytest.mark.services

FAULTS = Injections(
    deviation=0.3, overspeed=0.3, dwell=0.0, silent=0.0, duplicate=0.05, out_of_order=0.05, late=0.0
)


def sim_settings(settings: Settings) -> SimulatorSettings:
    return SimulatorSettings.from_base(settings, redis_prefix=f"{settings.topic_prefix}ff:")


def config(prefix: str, **kw: Any) -> ScenarioConfig:
    base: dict[str, Any] = {
        "vehicles": 5,
        "duration_s": 30,
        "seed": 4,
        "routes": 2,
        "route_length_m": 1500,
        "inject": FAULTS,
        "vehicle_prefix": prefix,
        "start_ms": utc_now_ms() - 60_000,
        "rules": simulated_rules(overspeed_min_s=3),
    }
    base.update(kw)
    return ScenarioConfig(**base)


def test_registration_writes_the_scenario_to_the_master_and_fleet_master(
    settings: Settings, tmp_path: Path
) -> None:
    ensure_topics(settings.bootstrap_servers, topic_specs(settings))
    s = sim_settings(settings)
    prefix = f"r{uuid.uuid4().hex[:6]}-"
    cfg = config(prefix, duration_s=5)
    rep = run_simulation(
        s, cfg, SimulationOptions(direct=True, truth_path=tmp_path / "t.jsonl", show_progress=False)
    )
    sc = Scenario(cfg)  # same seed: the same city
    assert rep.registration is not None
    n_entities = len(sc.city.routes) + len(sc.city.zones) + 2 * cfg.vehicles
    assert rep.registration.entities == rep.registration.changed == n_entities
    vm = VehicleMaster.from_settings(s)
    try:
        routes = vm.list("route", limit=100)
        assert sorted(r.id for r in routes) == sorted(r.route_id for r in sc.city.routes)
        assert all(r.data["corridor_width_m"] == cfg.rules.corridor_width_m for r in routes)
        assert routes[0].data["geometry"]["coordinates"] == sc.city.routes[0].coords_lonlat
        assert sorted(z.id for z in vm.list("zone", limit=100)) == sorted(z.zone_id for z in sc.city.zones)
        assert [v.id for v in vm.list("vehicle", limit=100)] == sc.vehicle_ids()
        assignments = {a.id: a.data["route_id"] for a in vm.list("assignment", limit=100)}
        assert assignments == {
            v: sc.city.routes[int(sc.route_idx[i])].route_id for i, v in enumerate(sc.vehicle_ids())
        }
    finally:
        vm.close()
    # The in-process relay published every change event before the first fix was sent.
    events = [orjson.loads(m.value()) for m in read_all(settings, settings.topics.master, 1)]
    assert Counter(e["entity"] for e in events) == {
        "route": len(sc.city.routes),
        "zone": len(sc.city.zones),
        "vehicle": cfg.vehicles,
        "assignment": cfg.vehicles,
    }
    # Registering the same scenario again changes nothing.
    rep2 = run_simulation(
        s, cfg, SimulationOptions(direct=True, truth_path=tmp_path / "t2.jsonl", show_progress=False)
    )
    assert rep2.registration is not None
    assert rep2.registration.changed == 0


class SetUpDoneError(Exception):
    """Raised by a test's sink observer: the run has done everything it does before its first fix."""


def test_a_real_time_run_registers_the_planned_arrivals_of_the_clock_it_publishes_on(
    settings: Settings, tmp_path: Path
) -> None:
    """`start_now` fixes the clock after the registration: the vehicle master, and fleet.master
    before the first fix, must then hold the planned arrivals the ground truth judges by."""
    ensure_topics(settings.bootstrap_servers, topic_specs(settings))
    s = sim_settings(settings)
    prefix = f"a{uuid.uuid4().hex[:6]}-"
    only_schedules = Injections(
        deviation=0,
        overspeed=0,
        dwell=0,
        silent=0,
        duplicate=0,
        out_of_order=0,
        late=0,
        wrong_way=0,
        schedule=0.5,
    )
    cfg = config(prefix, vehicles=10, duration_s=120, inject=only_schedules, rules=simulated_rules())
    registered = Scenario(cfg)
    scheduled = {v: int(registered.planned_arrival_ms[i]) for i, v in enumerate(registered.vehicle_ids())}
    scheduled = {v: t for v, t in scheduled.items() if t >= 0}
    assert scheduled, "the scenario must have scheduled trips"
    master_events: list[dict[str, Any]] = []

    def stop_before_the_first_fix(_sink: object) -> None:
        master_events.extend(orjson.loads(m.value()) for m in read_all(settings, settings.topics.master, 1))
        raise SetUpDoneError

    opts = SimulationOptions(
        direct=True,
        realtime=True,
        start_now=True,
        truth_path=tmp_path / "t.jsonl",
        show_progress=False,
        sink_observer=stop_before_the_first_fix,
    )
    with pytest.raises(SetUpDoneError):
        run_simulation(s, cfg, opts)
    vm = VehicleMaster.from_settings(s)
    try:
        arrivals = {a.id: a.data["planned_arrival_ms"] for a in vm.list("assignment", limit=100)}
    finally:
        vm.close()
    shift_ms = {arrivals[v] - t for v, t in scheduled.items()}
    assert len(shift_ms) == 1, shift_ms
    shift = shift_ms.pop()
    assert shift > 0
    assert (cfg.start_ms + shift) % cfg.period_ms == 0  # the clock it moved to starts on a tick
    truth = Scenario(replace(cfg, start_ms=cfg.start_ms + shift))
    assert {v: arrivals[v] for v in scheduled} == {
        v: int(truth.planned_arrival_ms[i]) for i, v in enumerate(truth.vehicle_ids()) if v in scheduled
    }
    assert all(arrivals[v] is None for v in arrivals if v not in scheduled)
    # fleet.master had the moved arrivals before the first fix could leave (the processor applies a
    # batch's master events before its fixes).
    last = {e["id"]: e["data"]["planned_arrival_ms"] for e in master_events if e["entity"] == "assignment"}
    assert {v: last[v] for v in scheduled} == {v: arrivals[v] for v in scheduled}


def test_mqtt_publishes_every_fix_at_qos1_in_the_contract_form(settings: Settings, tmp_path: Path) -> None:
    s = sim_settings(settings)
    prefix = f"m{uuid.uuid4().hex[:6]}-"
    cfg = config(prefix, duration_s=150)
    got: list[tuple[str, bytes, int]] = []
    lock = threading.Lock()
    subscribed = threading.Event()

    def on_message(_c: Any, _u: Any, msg: mqtt.MQTTMessage) -> None:
        if msg.topic.startswith(f"fleet/{prefix}"):
            with lock:
                got.append((msg.topic, bytes(msg.payload), msg.qos))

    host, port = s.mqtt_host_port
    sub = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=f"sub-{prefix}", protocol=mqtt.MQTTv5)
    login(sub, mqtt_test_account(s))
    sub.on_message = on_message
    sub.on_subscribe = lambda *_a: subscribed.set()
    sub.connect(host, port)
    sub.subscribe("fleet/+/telemetry", qos=1)
    sub.loop_start()
    try:
        assert subscribed.wait(10)
        rep = run_simulation(
            s, cfg, SimulationOptions(register=False, truth_path=tmp_path / "t.jsonl", show_progress=False)
        )
        assert rep.mode == "mqtt"
        assert rep.acked == rep.messages == rep.scenario.messages
        assert rep.errors == 0
        wait_for(lambda: len(got) >= rep.messages, 30, "every message at the subscriber")
    finally:
        sub.disconnect()
        sub.loop_stop()
    assert len(got) == rep.messages
    now = utc_now_ms()
    fixes = [validate_telemetry(topic, payload, now) for topic, payload, _q in got]
    assert {q for _t, _p, q in got} == {1}
    seqs = Counter((f.vehicle_id, f.seq) for f in fixes)
    assert sum(c - 1 for c in seqs.values()) == rep.scenario.duplicates > 0
    per_vehicle = {v: sorted({sq for (vv, sq) in seqs if vv == v}) for v in {f.vehicle_id for f in fixes}}
    assert len(per_vehicle) == cfg.vehicles
    for v, sq in per_vehicle.items():
        assert sq == list(range(sq[0], sq[0] + cfg.n_ticks)), v
    assert all(f.accuracy_m == 6.0 and f.heading_deg is not None for f in fixes)
    header, truth = read_truth(tmp_path / "t.jsonl")
    assert header.vehicle_prefix == prefix
    assert {a.type for a in truth} >= {"ROUTE_DEVIATION", "OVERSPEED"}


def test_direct_writes_canonical_records_keyed_by_vehicle(settings: Settings, tmp_path: Path) -> None:
    ensure_topics(settings.bootstrap_servers, topic_specs(settings))
    s = sim_settings(settings)
    prefix = f"d{uuid.uuid4().hex[:6]}-"
    cfg = config(prefix, vehicles=8)
    t0 = utc_now_ms()
    rep = run_simulation(
        s,
        cfg,
        SimulationOptions(direct=True, register=False, truth_path=tmp_path / "t.jsonl", show_progress=False),
    )
    assert rep.acked == rep.messages
    recs = read_all(settings, settings.topics.telemetry, settings.telemetry_partitions)
    assert len(recs) == rep.messages
    partitions: dict[str, set[int]] = {}
    last_seq: dict[str, int] = {}
    inversions = 0
    for m in recs:
        fix = Telemetry.from_json(m.value())
        assert m.key() == fix.vehicle_id.encode()
        assert fix.to_json() == m.value()  # exactly the canonical form, nulls included
        assert fix.received_ms is not None
        assert fix.received_ms >= t0
        partitions.setdefault(fix.vehicle_id, set()).add(m.partition())
        if fix.seq < last_seq.get(fix.vehicle_id, -1):
            inversions += 1
        last_seq[fix.vehicle_id] = max(fix.seq, last_seq.get(fix.vehicle_id, -1))
    assert all(len(p) == 1 for p in partitions.values())  # one vehicle, one partition
    assert len(partitions) == cfg.vehicles
    assert inversions == rep.scenario.out_of_order  # the swaps arrive as injected


def test_cli_simulate_and_verify(settings: Settings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ensure_topics(settings.bootstrap_servers, topic_specs(settings))
    s = sim_settings(settings)
    for name in ("kafka_port", "mqtt_port", "redis_port", "topic_prefix", "redis_prefix", "state_dir"):
        monkeypatch.setenv(f"FLEETFENCE_{name.upper()}", str(getattr(s, name)))
    runner = CliRunner()
    assert "--direct" in runner.invoke(app, ["simulate", "--help"]).output
    assert "--min-recall" in runner.invoke(app, ["verify", "--help"]).output
    truth = tmp_path / "truth.jsonl"
    res = runner.invoke(
        app,
        [
            "simulate",
            "-n",
            "4",
            "--duration",
            "20",
            "--direct",
            "--no-register",
            "--truth",
            str(truth),
            "--route-length",
            "1500",
            "--seed",
            "9",
            "--json",
            "--vehicle-prefix",
            f"c{uuid.uuid4().hex[:5]}-",
        ],
    )
    assert res.exit_code == 0, res.output
    report = orjson.loads(res.stdout.strip().splitlines()[-1])
    assert report["messages"] == report["acked"] > 0
    assert truth.is_file()
    # No processor ran: every expected alert is missing, so the gate fails with exit code 1 ...
    _h, expected = read_truth(truth)
    res = runner.invoke(app, ["verify", "--truth", str(truth), "--json"])
    assert res.exit_code == (1 if expected else 0), res.output
    out = orjson.loads(res.stdout.strip().splitlines()[-1])
    assert out["overall"]["expected"] == len(expected)
    assert out["overall"]["matched"] == 0
    # ... and passes when the thresholds allow it.
    res = runner.invoke(app, ["verify", "--truth", str(truth), "--min-recall", "0", "--min-precision", "0"])
    assert res.exit_code == 0, res.output
