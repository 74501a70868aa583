"""The streaming job: Kafka telemetry + master data in, alerts (exactly once) and live state out.

    Spark's Kafka source (telemetry + master) -> mapInArrow(parse into bucket chunks)
      -> watermark on event time -> groupBy(bucket)
      -> transformWithStateInPandas(GeofenceProcessor, EventTime) -> sink (fleetfence_alerts)

Runs on `local[*]` by default and unchanged under `spark-submit --master spark://...`: the source,
the stateful operator and the sink are plain Spark plan nodes, the checkpoint is a Hadoop path.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from fleetfence.errors import ConfigError
from processor.checkpoint_files import HadoopCheckpointFiles, sink_id_for
from processor.layout import checkpoint_layout
from processor.rebucket import read_seed, refuse_incomplete, refuse_retired, seed_state
from processor.settings import ProcessorSettings

logger = logging.getLogger(__name__)

Stage = Callable[[Any, ProcessorSettings], Any]
"""A stateful operator for the job: (the input grouped by bucket, settings) -> the rows for the sink
(processor.rows.OUTPUT_DDL). The job's own is `GeofenceProcessor` under `transformWithStateInPandas`;
bench/state_api.py passes one under `applyInPandasWithState` to measure the two APIs side by side,
bench/state_scale.py the job's own with parking off (every vehicle in its bucket's blob)."""


def register_sink(spark: Any) -> None:
    from processor.kafka_sink import AlertSinkDataSource

    spark.dataSource.register(AlertSinkDataSource)


def checkpoint_sink_id(spark: Any, s: ProcessorSettings) -> str:
    """The sink id of this checkpoint (created with the checkpoint, the same for every restart):
    the key of its commit markers."""
    return sink_id_for(HadoopCheckpointFiles(spark, s.checkpoint))


def _job(
    spark: Any, s: ProcessorSettings, checkpoint: str, starting_offsets: str, stage: Stage | None = None
) -> tuple[Any, Any]:
    """The job's dataframe up to the sink (source, watermark, stateful operator), and the
    checkpoint's files. A re-bucketed checkpoint (`processor.rebucket`) starts from its seed: the
    seed state as the operator's initial state, Kafka at the old checkpoint's end offsets."""
    from processor.rows import OUTPUT_DDL
    from processor.source import processor_input
    from processor.stateful import GeofenceProcessor

    t = s.topics
    files = HadoopCheckpointFiles(spark, checkpoint)
    refuse_retired(files)
    seed = read_seed(files)
    refuse_incomplete(files, seed)
    keys = checkpoint_layout(files, s.processor_buckets, int(spark.conf.get("spark.sql.shuffle.partitions")))
    src = processor_input(
        spark,
        bootstrap=s.bootstrap_servers,
        telemetry_topic=t.telemetry,
        master_topic=t.master,
        buckets=s.processor_buckets,
        bucket_keys=keys,
        starting_offsets=seed.starting_offsets(t.telemetry) if seed else starting_offsets,
        master_starting_offsets=seed.starting_offsets(t.master) if seed else "earliest",
        max_events_per_batch=s.processor_max_events_per_batch,
    )
    lateness = f"{int(s.processor_lateness_s * 1000)} milliseconds"
    grouped = src.withWatermark("ts", lateness).groupBy("bucket")
    if stage is not None:
        if seed:
            raise ConfigError(f"{checkpoint} is re-bucketed: only the job's own operator reads its seed")
        return stage(grouped, s), files
    out = grouped.transformWithStateInPandas(
        statefulProcessor=GeofenceProcessor(s.engine_config(), seed.watermark_ms if seed else 0),
        outputStructType=OUTPUT_DDL,
        outputMode="Append",
        timeMode="EventTime",
        # Spark applies an initial state in a checkpoint's first batch only; passed on every
        # start so the plan is the same whichever batch a restart resumes at.
        initialState=seed_state(spark, checkpoint) if seed else None,
    )
    return out, files


def warm_up_query(spark: Any, s: ProcessorSettings, scratch_checkpoint: str) -> None:
    """Run the job once, on a scratch checkpoint, from the latest telemetry (so it reads only the
    master data), into the alert sink in its dry-run mode: a standby's JVM then has the job's plan
    compiled, the Kafka source, RocksDB and the stateful operator's Python runners loaded, and the
    sink's own Python processes (the driver's writer planner and commit runner, each a Python
    daemon of its own) started and left idle for the real query, and it writes nothing."""
    register_sink(spark)
    out, _files = _job(spark, s, scratch_checkpoint, "latest")
    q = (
        _sink(out.writeStream, s, "warm-up", dry_run=True)
        .queryName("fleetfence-processor-warm-up")
        .option("checkpointLocation", scratch_checkpoint)
        .trigger(availableNow=True)
        .start()
    )
    q.awaitTermination()
    logger.info("warm-up query done batches=%d", len(q.recentProgress))


def _sink(writer: Any, s: ProcessorSettings, sink_id: str, *, dry_run: bool = False) -> Any:
    """`writer` pointed at the exactly-once alert sink (processor.kafka_sink) with its options."""
    from processor.kafka_sink import SINK_NAME

    t = s.topics
    writer = (
        writer.format(SINK_NAME)
        .option("bootstrap", s.bootstrap_servers)
        .option("alertsTopic", t.alerts)
        .option("dlqTopic", t.telemetry_dlq)
        .option("telemetryTopic", t.telemetry)
        .option("markersTopic", t.processor_commits)
        .option("sinkId", sink_id)
        .option("redisPrefix", s.redis_prefix)
    )
    if dry_run:
        return writer.option("dryRun", "true")
    if s.processor_live_state:
        writer = writer.option("redisUrl", s.redis_dsn)
    return writer


def start_query(
    spark: Any,
    s: ProcessorSettings,
    query_name: str = "fleetfence-processor",
    *,
    available_now: bool = False,
    stage: Stage | None = None,
) -> Any:
    """Build and start the streaming query; returns the StreamingQuery. `available_now` processes
    what Kafka holds at the start and then stops, its last batch committed (`processor.rebucket`);
    `stage` replaces the stateful operator (benchmarks only)."""
    register_sink(spark)
    checkpoint = s.checkpoint
    out, files = _job(spark, s, checkpoint, s.processor_starting_offsets, stage)
    writer = (
        _sink(out.writeStream, s, sink_id_for(files))
        .queryName(query_name)
        .option("checkpointLocation", checkpoint)
    )
    if available_now:
        writer = writer.trigger(availableNow=True)
    elif s.processor_trigger_ms > 0:
        writer = writer.trigger(processingTime=f"{s.processor_trigger_ms} milliseconds")
    q = writer.start()
    logger.info("processor started query=%s checkpoint=%s", q.id, checkpoint)
    return q
