"""The processor's input through Spark's own Kafka connector, against the real broker.

Telemetry written in committed and aborted transactions (their markers leave holes in the
offsets), a record that is not telemetry, and master events on the compacted master topic: the
parsed stream holds every committed fix once, in Kafka order per bucket, no aborted one, a dead
letter row for the bad record, a route change for every bucket and an assignment for its
vehicle's bucket only.
"""

from __future__ import annotations

import uuid
from typing import Any

import orjson
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from confluent_kafka import TopicPartition
from confluent_kafka.admin import AdminClient

from fleetfence.contracts import Telemetry, bucket_of
from fleetfence.kafka import TopicSpec, ensure_topics, idempotent_producer, transactional_producer
from fleetfence.settings import Settings
from fleetfence.testing import read_all
from processor.errors import LateReadBackError
from processor.spark import parse
from processor.spark.kafka_sink import original_records
from processor.spark.rows import InputKind
from processor.spark.source import processor_input

pytestmark = [pytest.mark.services, pytest.mark.spark]

T0 = 1_795_000_000_000
BUCKETS = 3
KEYS = [10, 20, 30]  # state keys differ from bucket numbers, as processor.spark.layout makes them


def fix(n: int) -> bytes:
    return Telemetry(f"v{n % 5}", n, T0 + n, 52.5, 13.4, 30.0, received_ms=T0 + n).to_json()


def produce_with_holes(bootstrap: str, topic: str) -> list[int]:
    """Committed and aborted transactions in turn, plus one bad record; the committed seqs."""
    p = transactional_producer(bootstrap, f"src-{uuid.uuid4().hex}")
    p.init_transactions(15)
    committed: list[int] = []
    n = 0
    for round_ in range(6):
        p.begin_transaction()
        size = 7 + round_ * 3
        for _ in range(size):
            p.produce(topic, key=f"v{n % 5}".encode(), value=fix(n), partition=0)
            n += 1
        if round_ == 2:
            p.produce(topic, key=b"junk", value=b"{not json", partition=0)
        if round_ % 3 == 1:
            # The aborted records reach the log first (what the connector must skip), and an
            # abort racing its own AddPartitionsToTxn fails fatally (librdkafka #4849).
            assert p.flush(15) == 0
            p.abort_transaction(15)
        else:
            p.commit_transaction(15)
            committed.extend(range(n - size, n))
    return committed


def test_connector_gives_every_committed_record_once(spark: Any, settings: Settings) -> None:
    t = settings.topics
    ensure_topics(
        settings.bootstrap_servers,
        [TopicSpec(t.telemetry, 1), TopicSpec(t.master, 1, {"cleanup.policy": "compact"})],
    )
    committed = produce_with_holes(settings.bootstrap_servers, t.telemetry)
    mp = idempotent_producer(settings.bootstrap_servers)
    route = {"entity": "route", "id": "r1", "version": 1}
    assignment = {"entity": "assignment", "id": "v3", "version": 1}
    for ev in (route, assignment):
        mp.produce(t.master, key=f"{ev['entity']}:{ev['id']}".encode(), value=orjson.dumps(ev))
    assert mp.flush(15) == 0

    name = f"src_{uuid.uuid4().hex[:8]}"
    df = processor_input(
        spark,
        bootstrap=settings.bootstrap_servers,
        telemetry_topic=t.telemetry,
        master_topic=t.master,
        buckets=BUCKETS,
        bucket_keys=KEYS,
        starting_offsets="earliest",
        max_events_per_batch=0,
    )
    q = df.writeStream.format("memory").queryName(name).trigger(availableNow=True).start()
    try:
        q.awaitTermination(120)
        assert q.exception() is None, q.exception()
    finally:
        q.stop()
    rows = spark.sql(f"SELECT * FROM {name}").toArrow()

    kinds = rows.column("kind").to_pylist()
    seqs_by_bucket: dict[int, list[int]] = {}
    for kind, key, payload in zip(
        kinds, rows.column("bucket").to_pylist(), rows.column("payload").to_pylist(), strict=True
    ):
        if kind == InputKind.FIXES:
            chunk = pa.ipc.open_stream(payload).read_all()
            vids = set(chunk.column("vehicle_id").to_pylist())
            assert {KEYS[bucket_of(v, BUCKETS)] for v in vids} == {key}, "a chunk holds one bucket"
            seqs_by_bucket.setdefault(key, []).extend(chunk.column("seq").to_pylist())
    got = sorted(s for seqs in seqs_by_bucket.values() for s in seqs)
    assert got == committed, "every committed fix once, no aborted one"
    for key, seqs in seqs_by_bucket.items():
        assert seqs == sorted(seqs), f"bucket {key}: Kafka order kept"

    invalid = [
        p
        for k, p in zip(kinds, rows.column("payload").to_pylist(), strict=True)
        if k == InputKind.INVALID_RECORD
    ]
    assert invalid == [b"{not json"], "the bad record is a dead-letter row, once"

    master = [
        (key, orjson.loads(p)["entity"])
        for k, key, p in zip(
            kinds, rows.column("bucket").to_pylist(), rows.column("payload").to_pylist(), strict=True
        )
        if k == InputKind.MASTER_EVENT
    ]
    assert sorted(m for m in master if m[1] == "route") == [(k, "route") for k in KEYS]
    assert [m for m in master if m[1] == "assignment"] == [(KEYS[bucket_of("v3", BUCKETS)], "assignment")]


def test_chunks_are_cut_and_keep_order_across_batches(monkeypatch: pytest.MonkeyPatch) -> None:
    """In-process (the parse runs in Spark's workers, out of a test's reach): one task's records
    in several Arrow batches and parse slices, cut into chunks of CHUNK_FIXES."""
    values = [fix(n) for n in range(40)]
    batch = pa.RecordBatch.from_pydict(
        {
            "value": values,
            "partition": pa.array([0] * 40, pa.int32()),
            "offset": pa.array(range(100, 140), pa.int64()),
        }
    )
    monkeypatch.setattr(parse, "CHUNK_FIXES", 8)
    monkeypatch.setattr(parse, "PARSE_SLICE", 5)
    parts = iter([batch.slice(0, 25), batch.slice(25)])
    out = list(parse.parse_kafka_records(parts, topic="tele", master=False, buckets=1, keys=[0]))
    table = pa.Table.from_batches(out)
    kinds = table.column("kind").to_pylist()
    data = table.filter(pc.equal(table.column("kind"), InputKind.FIXES.value))
    chunks = [pa.ipc.open_stream(p).read_all() for p in data.column("payload").to_pylist()]
    assert len(chunks) >= 3, "several chunks were cut"
    assert [s for c in chunks for s in c.column("seq").to_pylist()] == list(range(40))
    assert data.column("kafka_offset").to_pylist()[-1] == 139
    # Only the task's one clock row carries an event time (the newest fix): Spark's watermark
    # filter drops rows by it, so no data row may have one.
    assert kinds.count(InputKind.CLOCK) == 1
    assert data.column("ts").null_count == len(data)
    newest = max(t for c in chunks for t in c.column("ts_ms").to_pylist())
    (clock_ts,) = [
        t for k, t in zip(kinds, table.column("ts").to_pylist(), strict=True) if k == InputKind.CLOCK
    ]
    assert int(clock_ts.timestamp() * 1000) == newest


@pytest.mark.parametrize("read_ahead", [5_000, 1])
def test_late_fixes_records_are_read_back_by_offset(settings: Settings, read_ahead: int) -> None:
    """The sink's read-back of late fixes' original records (`kafka_sink.original_records`): exact
    bytes for committed records, in one pass or seek by seek; a record gone by retention (deleted
    below the log start) is simply absent (the dead letter then keeps the decoded fix), but one
    that should be there and cannot be read (an aborted record's offset, an offset past the end)
    is an error, so the sink's task fails and is retried instead of quietly writing the decoded fix."""
    topic = f"{settings.topic_prefix}originals-{uuid.uuid4().hex[:8]}"
    ensure_topics(settings.bootstrap_servers, [TopicSpec(topic, 1)])
    produce_with_holes(settings.bootstrap_servers, topic)
    records = {(m.partition(), m.offset()): m.value() for m in read_all(settings, topic, 1)}
    committed = sorted(records)
    aborted = next(o for o in range(committed[0][1], committed[-1][1]) if (0, o) not in records)
    wanted = [committed[0], committed[1], committed[-1]]
    got = original_records(settings.bootstrap_servers, topic, wanted, timeout_s=20, read_ahead=read_ahead)
    assert got == {k: records[k] for k in wanted}
    for bad in ((0, aborted), (0, committed[-1][1] + 100)):
        with pytest.raises(LateReadBackError):
            original_records(
                settings.bootstrap_servers, topic, [*wanted, bad], timeout_s=5, read_ahead=read_ahead
            )
    # Retention: everything before the second record is deleted; the first is gone, not an error.
    admin = AdminClient({"bootstrap.servers": settings.bootstrap_servers})
    (fut,) = admin.delete_records([TopicPartition(topic, 0, committed[1][1])]).values()
    fut.result(timeout=30)
    got = original_records(settings.bootstrap_servers, topic, wanted, timeout_s=20, read_ahead=read_ahead)
    assert got == {k: records[k] for k in wanted[1:]}
