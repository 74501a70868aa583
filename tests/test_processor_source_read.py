"""The source's read task against the real broker: a partition range read in blocks, with aborted
transactions and commit markers inside it, gives every committed record once, in order, and leaves
the worker's consumer unassigned (it must not keep fetching while the task parses)."""

from __future__ import annotations

import uuid
from typing import Any

import pyarrow as pa
import pytest
from confluent_kafka import Producer

import processor.kafka_source as ks
from fleetfence.contracts import Telemetry
from fleetfence.kafka import TopicSpec, ensure_topics, producer_config
from fleetfence.settings import Settings

pytestmark = pytest.mark.services

T0 = 1_795_000_000_000


def fix(n: int) -> bytes:
    return Telemetry(f"v{n % 5}", n, T0 + n, 52.5, 13.4, 30.0, received_ms=T0 + n).to_json()


def produce_with_holes(bootstrap: str, topic: str) -> list[int]:
    """Committed and aborted transactions in turn; returns the seqs that were committed."""
    p = Producer(producer_config(bootstrap, **{"transactional.id": f"src-read-{uuid.uuid4().hex}"}))
    p.init_transactions(15)
    committed: list[int] = []
    n = 0
    for round_ in range(6):
        p.begin_transaction()
        size = 7 + round_ * 3
        for _ in range(size):
            p.produce(topic, key=f"v{n % 5}".encode(), value=fix(n), partition=0)
            n += 1
        if round_ % 3 == 1:
            p.abort_transaction(15)
        else:
            p.commit_transaction(15)
            committed.extend(range(n - size, n))
    return committed


def read_all(reader: ks.FleetKafkaStreamReader) -> tuple[list[int], int]:
    """Seqs of every fix the read task emits, in emission order per vehicle-bucket chunk, and the
    number of output rows."""
    start = reader.initialOffset()
    end = reader.latestOffset(start, reader.getDefaultReadLimit())
    (part,) = reader.partitions(start, end)
    seqs: list[int] = []
    rows = 0
    for batch in reader.read(part):
        rows += batch.num_rows
        for kind, payload in zip(
            batch.column("kind").to_pylist(), batch.column("payload").to_pylist(), strict=True
        ):
            assert kind == ks.KIND_TELEMETRY, kind
            seqs.extend(pa.ipc.open_stream(payload).read_all().column("seq").to_pylist())
    return seqs, rows


@pytest.mark.parametrize("block", [4, 10, 1_000_000])
def test_blocks_give_every_committed_record_once(
    settings: Settings, monkeypatch: pytest.MonkeyPatch, block: int
) -> None:
    topic = settings.topics.telemetry
    ensure_topics(settings.bootstrap_servers, [TopicSpec(topic, 1)])
    committed = produce_with_holes(settings.bootstrap_servers, topic)
    monkeypatch.setattr(ks, "DRAIN_BLOCK", block)
    monkeypatch.setattr(ks, "PARSE_SLICE", 3)
    opts: dict[str, Any] = {"bootstrap": settings.bootstrap_servers, "telemetrytopic": topic, "buckets": "1"}
    reader = ks.FleetKafkaStreamReader(opts)
    try:
        seqs, rows = read_all(reader)
    finally:
        reader.stop()
    assert sorted(seqs) == committed, "every committed fix once, no aborted one"
    assert seqs == committed, "one bucket: the chunk keeps Kafka order"
    assert rows >= 1
    consumer = ks._CONSUMERS[settings.bootstrap_servers]
    assert consumer.assignment() == [], "the read task left its consumer assigned"
