"""The Kafka client presets promise what their names say, and they are the only way a client is
built: a Consumer or Producer constructed anywhere else would carry a hand-written config that no
preset vouches for. Pure: the presets are given a stand-in client that returns its config."""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException, TopicPartition

from fleetfence import kafka
from fleetfence.errors import KafkaUnavailableError

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = (
    "fleetfence",
    "gateway",
    "processor",
    "vehicle_master",
    "alerts",
    "admin_api",
    "simulator",
    "history",
    "embedded",
    "cli",
    "loadtest",
    "bench",
    "tests",
    "tests_deploy",
)
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


def client_constructions(path: Path, root: Path = ROOT) -> list[str]:
    """`Consumer(...)` and `Producer(...)` calls in a file, by name or attribute
    (`confluent_kafka.Producer(...)`)."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Call):
            f = node.func
            name = f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else ""
            if name in ("Consumer", "Producer"):
                out.append(f"{path.relative_to(root)}:{node.lineno} builds a {name}")
    return out


def test_every_client_is_built_by_a_preset() -> None:
    files = sorted(p for d in PACKAGES for p in (ROOT / d).rglob("*.py"))
    assert files, "no source found"
    bad = [c for f in files if f != ROOT / "fleetfence" / "kafka.py" for c in client_constructions(f)]
    assert bad == []


def test_the_check_sees_a_client_built_by_hand(tmp_path: Path) -> None:
    probe = tmp_path / "probe.py"
    probe.write_text(
        "import confluent_kafka\nfrom confluent_kafka import Consumer\n\n"
        "def f() -> None:\n"
        '    c = Consumer({"group.id": "g"})\n'
        "    p = confluent_kafka.Producer({})\n"
    )
    assert client_constructions(probe, root=tmp_path) == [
        "probe.py:5 builds a Consumer",
        "probe.py:6 builds a Producer",
    ]


class _Answers:
    """Stands in for a consumer whose partition's leader moves: a fault a single embedded broker
    cannot produce on demand (tests_deploy's clusters meet it for real)."""

    def __init__(self, *answers: tuple[int, int] | KafkaError) -> None:
        self.answers = list(answers)
        self.asked = 0

    def get_watermark_offsets(self, tp: TopicPartition, timeout: float, cached: bool) -> tuple[int, int]:
        assert not cached, "a cached watermark can be older than the question"
        self.asked += 1
        a = self.answers.pop(0)
        if isinstance(a, KafkaError):
            raise KafkaException(a)
        return a


def test_watermarks_are_asked_again_while_the_leader_moves(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(kafka, "BACKOFF_FIRST_S", 0.01)  # the back-off's length is not the point here
    c = _Answers(
        KafkaError(KafkaError.NOT_LEADER_FOR_PARTITION),
        KafkaError(KafkaError.LEADER_NOT_AVAILABLE),
        KafkaError(KafkaError.FENCED_LEADER_EPOCH),
        KafkaError(KafkaError.UNKNOWN_LEADER_EPOCH),
        (3, 17),
    )
    assert kafka.watermarks(c, "t", 0, timeout_s=10) == (3, 17)
    assert c.asked == 5


def test_watermarks_raise_what_is_not_a_moving_leader_and_give_up_at_the_deadline() -> None:
    c = _Answers(KafkaError(KafkaError.TOPIC_AUTHORIZATION_FAILED), (0, 1))
    with pytest.raises(KafkaException):
        kafka.watermarks(c, "t", 0, timeout_s=10)
    assert c.asked == 1
    moving = _Answers(*[KafkaError(KafkaError.NOT_LEADER_FOR_PARTITION)] * 100)
    with pytest.raises(KafkaUnavailableError) as gave_up:
        kafka.watermarks(moving, "t", 0, timeout_s=0.0)
    assert moving.asked == 1
    assert gave_up.value.error.code() == KafkaError.NOT_LEADER_FOR_PARTITION
    assert not gave_up.value.stopped
