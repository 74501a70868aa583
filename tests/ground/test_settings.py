"""The one settings convention: a component's settings derive from shared ones with `from_base`."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from fleetfence.settings import Settings
from gateway.settings import GatewaySettings
from history.settings import HistorySettings


def test_from_base_takes_shared_fields_from_base_own_from_env_then_overrides(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("FLEETFENCE_TOPIC_PREFIX", "from-env.")
    monkeypatch.setenv("FLEETFENCE_HISTORY_BUCKETS", "7")
    monkeypatch.setenv("FLEETFENCE_HISTORY_RETENTION_DAYS", "30")
    base = Settings(topic_prefix="fixture.", state_dir=tmp_path)
    hs = HistorySettings.from_base(base, history_retention_days=5)
    assert hs.topic_prefix == "fixture."  # shared: from base, not from the environment
    assert hs.state_dir == tmp_path
    assert hs.history_buckets == 7  # own: from the environment
    assert hs.history_retention_days == 5  # overrides win
    assert hs.archive_root == str((tmp_path / "archive").resolve())


def test_every_component_field_is_named_for_its_component() -> None:
    """One prefix scheme: FLEETFENCE_<FIELD>, where a component's own field starts with its name."""
    from admin_api.settings import ApiSettings
    from alerts.config import AlertsSettings
    from processor.settings import ProcessorSettings
    from simulator.settings import SimulatorSettings
    from vehicle_master.settings import MasterSettings

    prefixes: dict[type[Settings], tuple[str, ...]] = {
        ApiSettings: ("api_", "relay_"),  # the API runs the vehicle master's outbox relay
        AlertsSettings: ("alerts_",),
        GatewaySettings: ("gateway_",),
        HistorySettings: ("history_",),
        MasterSettings: ("relay_",),
        ProcessorSettings: ("processor_",),
        SimulatorSettings: ("simulator_", "processor_"),  # the truth assumes the processor's rules
    }
    for cls, allowed in prefixes.items():
        own = [f for f in cls.model_fields if f not in Settings.model_fields]
        assert own, cls
        assert [f for f in own if not f.startswith(allowed)] == [], cls
        assert cls.model_config.get("env_prefix") == "FLEETFENCE_", cls


def test_processor_and_simulator_read_the_same_processor_rules(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every processor-wide rule has its variable, read once (`ProcessorRulesSettings`): the engine
    applies what the simulator's truth assumes, under `ProcessorRules`' names and defaults."""
    from fleetfence.rules import ProcessorRules, ProximityRule, ProximityScope
    from fleetfence.settings import ProcessorRulesSettings
    from processor.core.domain import EngineConfig
    from processor.settings import ProcessorSettings
    from simulator.settings import SimulatorSettings

    assert ProcessorSettings().engine_config() == EngineConfig()
    assert SimulatorSettings().processor_rules() == ProcessorRules()
    own = [
        f
        for f in ProcessorRulesSettings.model_fields
        if f not in Settings.model_fields and not f.startswith("processor_proximity_")
    ]
    for name in own:
        default = ProcessorRulesSettings.model_fields[name].default
        monkeypatch.setenv(f"FLEETFENCE_{name.upper()}", str(default + 1))
    rules = SimulatorSettings().processor_rules()
    assert [f for f, v in vars(rules).items() if v == getattr(ProcessorRules, f)] == [], "unread rules"
    assert ProcessorSettings().engine_config() == EngineConfig.of(rules)
    assert rules.lateness_ms == ProcessorRules.lateness_ms + 1000
    # The proximity rule too: off by default on both sides, the same rule once its distance is set.
    assert SimulatorSettings().proximity_rule() is None
    monkeypatch.setenv("FLEETFENCE_PROCESSOR_PROXIMITY_ENTER_M", "40")
    monkeypatch.setenv("FLEETFENCE_PROCESSOR_PROXIMITY_TOLERANCE_S", "0.5")
    rule = SimulatorSettings().proximity_rule()
    assert rule is not None
    assert (rule.enter_m, rule.exit_m, rule.tolerance_ms) == (40.0, 80.0, 500)
    assert ProcessorSettings().proximity_rule() == rule
    assert ProcessorSettings().proximity_rules() == (rule,)
    # What a launcher hands a processor gives it the rules back, whatever the rules and scopes.
    other = dataclasses.replace(rule, exit_m=150.0, min_duration_ms=7_500, lost_after_ms=45_000)
    convoy = ProximityRule("convoy-r1", 20.0, 35.0, 5_000, 500, 20_000, ProximityScope(route_id="r1"))
    north = ProximityRule("north", 60.0, 90.0, 0, 250, 10_000, ProximityScope(group="north"))
    for name, value in ProcessorRulesSettings.proximity_env((other, convoy, north)).items():
        monkeypatch.setenv(name, value)
    assert ProcessorSettings().proximity_rules() == (other, convoy, north)
    assert SimulatorSettings().proximity_rules() == (other, convoy, north)


def test_proximity_rules_are_refused_with_their_own_words(monkeypatch: pytest.MonkeyPatch) -> None:
    """A rule list that contradicts itself fails at start-up, naming the rule and what is wrong."""
    from processor.settings import ProcessorSettings

    cases = {
        '[{"rule_id": "a", "enter_m": 50, "exit_m": 40}]': "needs 0 < enter_m < exit_m",
        '[{"rule_id": "a", "enter_m": 5, "exit_m": 9, "route_id": "r", "group": "g"}]': "not both",
        '[{"rule_id": "a", "enter_m": 5, "exit_m": 9}, {"rule_id": "a", "enter_m": 5, "exit_m": 9}]': (
            "ids must differ"
        ),
        '[{"rule_id": "a:b", "enter_m": 5, "exit_m": 9}]': "proximity rule id 'a:b'",
        '[{"rule_id": "a\\n", "enter_m": 5, "exit_m": 9}]': "proximity rule id 'a\\\\n'",
        '[{"rule_id": "a", "enter_m": 5, "exit_m": 9, "radius_m": 3}]': "radius_m",
    }
    for value, words in cases.items():
        monkeypatch.setenv("FLEETFENCE_PROCESSOR_PROXIMITY_RULES", value)
        with pytest.raises(ValueError, match=words):
            ProcessorSettings()
    # The fleet's rule from its variables and a listed one named like it: refused too.
    monkeypatch.setenv("FLEETFENCE_PROCESSOR_PROXIMITY_ENTER_M", "40")
    monkeypatch.setenv(
        "FLEETFENCE_PROCESSOR_PROXIMITY_RULES", '[{"rule_id": "fleet", "enter_m": 5, "exit_m": 9}]'
    )
    with pytest.raises(ValueError, match="ids must differ"):
        ProcessorSettings()


def test_bad_setting_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FLEETFENCE_HISTORY_BUCKETS", "0")
    with pytest.raises(ValueError, match="history_buckets"):
        HistorySettings.from_base(Settings())


def test_an_embedded_kafka_cluster_replicates_as_compose_unless_told(monkeypatch: pytest.MonkeyPatch) -> None:
    """FLEETFENCE_KAFKA_BROKERS=3: the bootstrap lists every node (KAFKA_PORT and the next ones) and
    topics get 3 replicas, 2 in sync, unless the topic variables say otherwise; an external cluster
    and a single broker keep the variables' defaults; an even quorum is refused."""
    one = Settings()
    assert (one.kafka_brokers, one.topic_replication_factor, one.topic_min_insync_replicas) == (1, 1, 1)
    assert one.bootstrap_servers == f"127.0.0.1:{one.kafka_port}"
    monkeypatch.setenv("FLEETFENCE_KAFKA_BROKERS", "3")
    monkeypatch.setenv("FLEETFENCE_KAFKA_PORT", "29092")
    three = Settings()
    assert three.bootstrap_servers == "127.0.0.1:29092,127.0.0.1:29093,127.0.0.1:29094"
    assert (three.topic_replication_factor, three.topic_min_insync_replicas) == (3, 2)
    assert Settings.from_base(three).topic_replication_factor == 3
    monkeypatch.setenv("FLEETFENCE_TOPIC_MIN_INSYNC_REPLICAS", "1")
    assert Settings().topic_min_insync_replicas == 1
    assert Settings(kafka_bootstrap="k:9092").topic_replication_factor == 1
    with pytest.raises(ValueError, match="kafka_brokers=2"):
        Settings(kafka_brokers=2)
