"""The processor's sink against real servers: its live read model writer on Redis (only a newer
(seq, silent) state replaces a stored one, across script calls and for states written before the
version hash), its dry run, and a batch bigger than its producer's queue on Kafka."""

from __future__ import annotations

import uuid
from collections import Counter

import orjson
import pyarrow as pa
import pytest
import redis
from pyspark.sql.datasource import WriterCommitMessage

from fleetfence.kafka import ensure_topics, topic_specs
from fleetfence.settings import Settings
from fleetfence.testing import read_all, wait_for
from processor.spark.kafka_sink import AlertCommitMessage, AlertStreamWriter
from processor.spark.live_store import LIVE_PER_CALL
from processor.spark.rows import OutputKind, OutputRow, output_frame, pack_live, unpack_live
from processor.spark.sink_commits import SINK_QUEUE_MESSAGES


def state(vid: str, seq: int, silent: bool = False) -> dict[str, object]:
    return {"vehicle_id": vid, "seq": seq, "ts_ms": 1_795_000_000_000 + seq, "silent": silent, "lat": 1.0}


def writer(s: Settings, prefix: str, **extra: str) -> AlertStreamWriter:
    opts = {"bootstrap": "unused", "alertstopic": "a", "dlqtopic": "d", "markerstopic": "m", "sinkid": "x"}
    return AlertStreamWriter({**opts, "redisurl": s.redis_dsn, "redisprefix": prefix, **extra})


def test_only_newer_states_replace_and_counts_are_exact(settings: Settings) -> None:
    prefix = f"{settings.redis_prefix}livetest:"
    r = redis.Redis.from_url(settings.redis_dsn)
    w = writer(settings, prefix)
    n = LIVE_PER_CALL * 2 + 7  # several script calls in one pipeline
    first = [state(f"v{i}", 10) for i in range(n)]
    assert w._write_live(unpack_live(pack_live(first))) == n
    # Replayed batch: nothing written. Mixed batch: older, equal, silent-at-same-seq, newer.
    assert w._write_live(unpack_live(pack_live(first))) == 0
    mixed = [state("v0", 9), state("v1", 10), state("v2", 10, silent=True), state("v3", 11)]
    assert w._write_live(unpack_live(pack_live(mixed))) == 2
    got = {v: orjson.loads(r.get(f"{prefix}live:{v}") or b"{}") for v in ("v0", "v1", "v2", "v3")}
    assert [(g["seq"], g["silent"]) for g in got.values()] == [
        (10, False),
        (10, False),
        (10, True),
        (11, False),
    ]
    assert r.zcard(f"{prefix}live:index") == n
    assert r.zscore(f"{prefix}live:index", "v3") == 1_795_000_000_011
    assert int(r.hget(f"{prefix}live:version", "v2") or 0) == 21


def test_state_written_before_the_version_hash_is_judged_by_its_json(settings: Settings) -> None:
    prefix = f"{settings.redis_prefix}livelegacy:"
    r = redis.Redis.from_url(settings.redis_dsn)
    r.set(f"{prefix}live:old", orjson.dumps(state("old", 50)))
    w = writer(settings, prefix)
    assert w._write_live(unpack_live(pack_live([state("old", 49)]))) == 0
    assert orjson.loads(r.get(f"{prefix}live:old") or b"{}")["seq"] == 50
    assert w._write_live(unpack_live(pack_live([state("old", 51)]))) == 1
    assert orjson.loads(r.get(f"{prefix}live:old") or b"{}")["seq"] == 51


def test_a_dry_run_sink_writes_nothing(settings: Settings) -> None:
    """A standby's warm-up query runs through the sink in dry-run mode (processor.spark.job.warm_up_query)
    to start its Python processes: it must neither write live states nor produce. The bootstrap
    here names no broker, so a commit that tried to produce would fail instead of returning."""
    prefix = f"{settings.redis_prefix}livedry:"
    r = redis.Redis.from_url(settings.redis_dsn)
    w = writer(settings, prefix, dryrun="true")
    rows = [
        OutputRow(OutputKind.ALERT, b'{"type": "ROUTE_DEVIATION"}', vehicle_id="v1", seq=1),
        OutputRow(OutputKind.LIVE_STATES, pack_live([state("v1", 1)]), seq=1),
        OutputRow(OutputKind.STATS, orjson.dumps({"received": 1})),
    ]
    batch = pa.RecordBatch.from_pandas(output_frame(rows), preserve_index=False)
    msg = w.write(iter([batch]))
    assert (msg.alerts, msg.dlq, msg.stats, msg.live_written) == ([], [], {}, 0)
    assert r.get(f"{prefix}live:v1") is None
    w.commit([msg], 0)  # returns: nothing produced, no transaction begun


def test_a_batch_with_more_alerts_than_the_producers_queue_commits_whole(settings: Settings) -> None:
    """A mass silence (a region's trackers all out of coverage) puts more alerts in one batch than
    the sink's producer holds unacknowledged: the commit waits for room instead of failing the
    batch, which Spark would retry, and fail, for ever."""
    ensure_topics(settings.bootstrap_servers, topic_specs(settings))
    t = settings.topics
    sink_id = uuid.uuid4().hex[:12]
    w = AlertStreamWriter(
        {
            "bootstrap": settings.bootstrap_servers,
            "alertstopic": t.alerts,
            "dlqtopic": t.telemetry_dlq,
            "markerstopic": t.processor_commits,
            "sinkid": sink_id,
        }
    )
    n = SINK_QUEUE_MESSAGES + 5_000
    alerts = [(f"v{i % 97}", b'{"n": %d}' % i) for i in range(n)]
    w.commit([AlertCommitMessage(alerts=alerts, stats={"received": n})], 0)
    # The transaction's markers reach the partitions just after the commit returns.
    got = wait_for(
        lambda: len(a := read_all(settings, t.alerts, settings.alerts_partitions)) >= n and a,
        60,
        "the batch's alerts to be readable",
    )
    assert len(got) == n
    assert {orjson.loads(m.value())["n"] for m in got} == set(range(n))
    (marker,) = [
        orjson.loads(m.value())
        for m in read_all(settings, t.processor_commits, 1)
        if orjson.loads(m.value())["sink_id"] == sink_id
    ]
    assert (marker["batch_id"], marker["alerts"]) == (0, n)


def test_commits_moving_between_python_workers_fence_and_recover_each_batch_once(
    settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Spark runs a query's commits in whichever of the driver's idle Python workers is free (two
    queries share them), and each worker keeps its own producer for the sink: the second worker's
    producer fences the first one's. Each commit still goes through once: a fenced worker takes the
    transactional id back, reads the markers again, and retries the batch unless it was committed.
    Batches of many alerts: the fence then also shows while the batch is produced (a fatal error
    of a produce call, not only of the commit)."""
    from processor.spark import kafka_sink

    ensure_topics(settings.bootstrap_servers, topic_specs(settings))
    t = settings.topics
    sink_id = uuid.uuid4().hex[:12]
    w = AlertStreamWriter(
        {
            "bootstrap": settings.bootstrap_servers,
            "alertstopic": t.alerts,
            "dlqtopic": t.telemetry_dlq,
            "markerstopic": t.processor_commits,
            "sinkid": sink_id,
        }
    )
    workers: list[dict[tuple[str, str], object]] = [{}, {}]  # each Python worker's own producers
    order = [0, 1, 0, 0, 1]  # batch 2 goes back to the fenced worker 0, batch 4 to the fenced 1
    per_batch = 3_000

    def batch(n: int) -> list[WriterCommitMessage | None]:
        return [AlertCommitMessage(alerts=[(f"v{i % 7}", b'{"batch": %d}' % n) for i in range(per_batch)])]

    for batch_id, worker in enumerate(order):
        monkeypatch.setattr(kafka_sink, "_SINKS", workers[worker])
        w.commit(batch(batch_id), batch_id)
    # A batch Spark hands again (a retry after a failure elsewhere) to the worker that did not commit
    # it: that worker is fenced, reads the markers, and skips it.
    monkeypatch.setattr(kafka_sink, "_SINKS", workers[0])
    w.commit(batch(4), 4)
    got = wait_for(
        lambda: len(a := read_all(settings, t.alerts, settings.alerts_partitions)) >= 5 * per_batch and a,
        60,
        "the batches' alerts",
    )
    assert Counter(orjson.loads(m.value())["batch"] for m in got) == dict.fromkeys(range(5), per_batch)
    marks = [
        orjson.loads(m.value())["batch_id"]
        for m in read_all(settings, t.processor_commits, 1)
        if orjson.loads(m.value())["sink_id"] == sink_id
    ]
    assert marks == [0, 1, 2, 3, 4]


def test_a_produce_calls_fatal_error_counts_as_a_producer_to_replace() -> None:
    """librdkafka reports a fence to a produce call in flight as `_FATAL`, without the fatal flag
    the transactional calls' errors carry: both make the sink replace its producer and retry."""
    from confluent_kafka import KafkaError, KafkaException

    from processor.spark.kafka_sink import _fatal

    assert _fatal(KafkaException(KafkaError(KafkaError._FATAL)))
    assert _fatal(KafkaException(KafkaError(KafkaError._FENCED)))
    assert _fatal(KafkaException(KafkaError(KafkaError.INVALID_TXN_STATE, fatal=True)))
    assert not _fatal(KafkaException(KafkaError(KafkaError._MSG_TIMED_OUT)))
    assert not _fatal(ValueError("not Kafka's"))
