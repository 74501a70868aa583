"""The Kafka client presets promise what their names say. Pure: the presets are given a stand-in
client that returns its config."""

from __future__ import annotations

from typing import Any

import pytest

from fleetfence import kafka

BS = "broker:9092"


@pytest.fixture(autouse=True)
def configs_instead_of_clients(monkeypatch: pytest.MonkeyPatch) -> None:
    def config(cfg: dict[str, Any]) -> dict[str, Any]:
        return cfg

    monkeypatch.setattr(kafka, "Producer", config)
    monkeypatch.setattr(kafka, "Consumer", config)


def test_the_idempotent_producer_is_acks_all_and_idempotent() -> None:
    cfg = kafka.idempotent_producer(BS, **{"linger.ms": 0, "client.id": "me"})
    assert cfg == {**kafka.producer_config(BS), "linger.ms": 0, "client.id": "me"}
    assert cfg["enable.idempotence"] is True
    assert cfg["acks"] == "all"


def test_the_transactional_producer_is_the_idempotent_one_with_its_id() -> None:
    cfg = kafka.transactional_producer(BS, "fleetfence-processor-a", **{"linger.ms": 2})
    assert cfg == {**kafka.producer_config(BS), "transactional.id": "fleetfence-processor-a", "linger.ms": 2}


def test_the_group_consumer_reads_committed_and_commits_by_hand() -> None:
    cfg = kafka.group_consumer(BS, "g", **{"client.id": "me"})
    assert cfg == {**kafka.consumer_config(BS, "g"), "client.id": "me"}
    assert cfg["isolation.level"] == "read_committed"
    assert cfg["enable.auto.commit"] is False
    assert cfg["partition.assignment.strategy"] == "cooperative-sticky"


def test_the_committed_reader_adds_nothing_but_read_committed_and_manual_commits() -> None:
    """Everything else stays librdkafka's default (its readers assign partitions themselves or are
    alone in their group): a group's tuning added here would change what they do."""
    assert kafka.committed_reader(BS, "r", **{"enable.partition.eof": True}) == {
        "bootstrap.servers": BS,
        "group.id": "r",
        "isolation.level": "read_committed",
        "enable.auto.commit": False,
        "enable.partition.eof": True,
    }


def test_the_plain_clients_are_librdkafka_defaults_plus_overrides() -> None:
    assert kafka.plain_producer(BS, **{"linger.ms": 5}) == {"bootstrap.servers": BS, "linger.ms": 5}
    assert kafka.plain_consumer(BS, "probe") == {"bootstrap.servers": BS, "group.id": "probe"}
