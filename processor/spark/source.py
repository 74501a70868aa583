"""The processor's input: telemetry and master data through Spark's own Kafka connector.

    Kafka source (telemetry, capped per trigger)  ─┐
                                                   ├─ union ─ mapInArrow(parse) ─> bucket rows
    Kafka source (master data, from the beginning) ─┘

Two sources in one query, each with its offsets in the checkpoint's offset log: a restart re-reads
exactly the records of an unfinished micro-batch, and a replay sees the same route versions as the
first run, because master changes travel through the same checkpointed batches as telemetry. Master
data always starts at the beginning of its (compacted) topic: the processor needs every route its
vehicles refer to (a re-bucketed checkpoint, `processor.spark.rebucket`, starts both topics where the old
checkpoint ended: its seed state holds the master data read until then). Both read
`read_committed`, so aborted transactions and their markers never reach the job. The parse is one
vectorized Python pass per Kafka partition range (`processor.spark.parse`), so the JVM moves a few Arrow
chunks per bucket instead of one row per fix.
"""

from __future__ import annotations

from typing import Any

from fleetfence.errors import ConfigError
from processor.spark.parse import record_parser
from processor.spark.rows import SCHEMA_DDL

KAFKA_FORMAT = "kafka"
# A micro-batch reads offset ranges that are already in the log, so it never needs the broker to hold
# a fetch open for data still to come. But a read task's consumer does fetch past its range's end,
# and the broker holds that fetch until new records arrive or `fetch.max.wait.ms` (500 ms by default)
# passes. Under steady traffic new records end the hold at once; on a quiet topic (a small fleet,
# the first batch after a start, the tail of a backlog) every read task pays the whole half second.
FETCH_MAX_WAIT_MS = 10


def kafka_stream(
    spark: Any,
    bootstrap: str,
    topics: list[str],
    *,
    starting_offsets: str = "earliest",
    max_offsets_per_trigger: int = 0,
    compacted: bool = False,
) -> Any:
    """`spark.readStream.format("kafka")` as FleetFence reads every topic: committed records only.

    A compacted topic has holes in its offsets by design, so the connector is told not to treat
    them as lost data; on any other topic a gap means records were deleted before they were read
    (retention ran out), and the query fails loudly instead of skipping them."""
    reader = (
        spark.readStream.format(KAFKA_FORMAT)
        .option("kafka.bootstrap.servers", bootstrap)
        .option("subscribe", ",".join(topics))
        .option("startingOffsets", starting_offsets)
        .option("kafka.isolation.level", "read_committed")
        .option("kafka.fetch.max.wait.ms", str(FETCH_MAX_WAIT_MS))
        .option("failOnDataLoss", "false" if compacted else "true")
    )
    if max_offsets_per_trigger > 0:
        reader = reader.option("maxOffsetsPerTrigger", str(max_offsets_per_trigger))
    return reader.load()


def processor_input(
    spark: Any,
    *,
    bootstrap: str,
    telemetry_topic: str,
    master_topic: str,
    buckets: int,
    bucket_keys: list[int],
    starting_offsets: str,
    max_events_per_batch: int,
    master_starting_offsets: str = "earliest",
) -> Any:
    """The rows the stateful operator folds (processor.spark.parse.SCHEMA_DDL), from both topics."""
    if len(bucket_keys) != buckets:
        raise ConfigError(f"{len(bucket_keys)} bucket keys for {buckets} buckets")
    # Only what the parse reads crosses from the JVM into Arrow: every column costs per record.
    cols = ["value", "partition", "offset"]
    telemetry = kafka_stream(
        spark,
        bootstrap,
        [telemetry_topic],
        starting_offsets=starting_offsets,
        max_offsets_per_trigger=max_events_per_batch,
    ).select(*cols)
    master = kafka_stream(
        spark, bootstrap, [master_topic], starting_offsets=master_starting_offsets, compacted=True
    ).select(*cols)
    parse_telemetry = record_parser(telemetry_topic, False, buckets, bucket_keys)
    parse_master = record_parser(master_topic, True, buckets, bucket_keys)
    return telemetry.mapInArrow(parse_telemetry, SCHEMA_DDL).unionByName(
        master.mapInArrow(parse_master, SCHEMA_DDL)
    )
