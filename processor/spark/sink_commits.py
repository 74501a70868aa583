"""The Kafka side of the alert sinks' commits (processor.spark.kafka_sink, processor.spark.hot_sink):
their transactional producer, and the commit markers they read back to skip a batch committed
before a crash."""

from __future__ import annotations

import time
from typing import Any

import orjson

# Records the sink's producer holds before the broker acknowledges them (librdkafka's default); a
# batch with more alerts waits for room (fleetfence.kafka.produce_waiting) rather than failing.
SINK_QUEUE_MESSAGES = 100_000


def sink_producer(bootstrap: str, transactional_id: str, queue_messages: int = SINK_QUEUE_MESSAGES) -> Any:
    """The sink's transactional producer (its caller runs `init_transactions`)."""
    from fleetfence.kafka import transactional_producer

    return transactional_producer(
        bootstrap,
        transactional_id,
        **{
            "linger.ms": 2,
            "transaction.timeout.ms": 60000,
            "queue.buffering.max.messages": queue_messages,
        },
    )


def read_last_marker(bootstrap: str, topic: str, sink_id: str, timeout_s: float = 30.0) -> int:
    """The highest batch id committed by `sink_id` (-1 if none), read_committed, to the end."""
    m = last_marker(bootstrap, topic, sink_id, timeout_s)
    return -1 if m is None else int(m["batch_id"])


def last_marker(bootstrap: str, topic: str, sink_id: str, timeout_s: float = 30.0) -> dict[str, Any] | None:
    """The marker of the highest batch committed by `sink_id` (None if none), read_committed, to
    the end: an open transaction on the topic is waited for, up to `timeout_s`. Where the end is
    is asked through an outage (`fleetfence.kafka.watermarks`) within the same `timeout_s`: the
    sink's commit that reads it must end, with KafkaUnavailableError past it."""
    from confluent_kafka import KafkaError, TopicPartition

    from fleetfence.kafka import committed_reader, watermarks

    c = committed_reader(bootstrap, f"fleetfence-marker-{sink_id}", **{"enable.partition.eof": True})
    deadline = time.monotonic() + timeout_s
    try:
        lo, hi = watermarks(c, topic, 0, timeout_s)
        if hi <= lo:
            return None
        c.assign([TopicPartition(topic, 0, lo)])
        last: dict[str, Any] | None = None
        key = sink_id.encode()
        while time.monotonic() < deadline:
            # A short wait: `consume` returns at 1000 records or the timeout, and the log is
            # usually shorter, so a long one was paid whole by every start (0.5 s a takeover).
            for m in c.consume(1000, 0.05):
                if m.error() is not None:
                    if m.error().code() == KafkaError._PARTITION_EOF and m.offset() >= hi:
                        return last
                    continue
                if m.key() == key and m.value():
                    marker = orjson.loads(m.value())
                    if last is None or int(marker["batch_id"]) > int(last["batch_id"]):
                        last = marker
            pos = c.position([TopicPartition(topic, 0)])[0].offset
            if pos >= hi:
                return last
        raise TimeoutError(f"could not read commit markers of {sink_id} from {topic}")
    finally:
        c.close()
