"""The streaming job: Kafka telemetry + master data in, alerts (exactly once) and live state out.

    Spark's Kafka source (telemetry + master) -> mapInArrow(parse into bucket chunks)
      -> watermark on event time -> groupBy(bucket)
      -> transformWithStateInPandas(GeofenceProcessor, EventTime) -> sink (fleetfence_alerts)

Runs on `local[*]` by default and unchanged under `spark-submit --master spark://...`: the source,
the stateful operator and the sink are plain Spark plan nodes, the checkpoint is a Hadoop path.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from typing import Any

from fleetfence.errors import ConfigError
from fleetfence.rules import ProximityRule
from processor.core.proximity import rules_resolution
from processor.settings import ProcessorSettings
from processor.spark.checkpoint_files import HadoopCheckpointFiles, sink_id_for
from processor.spark.hot_sink import HotOptions
from processor.spark.layout import LAYOUT_FILE, checkpoint_layout
from processor.spark.rebucket import Seed, read_seed, refuse_incomplete, refuse_retired, seed_state

logger = logging.getLogger(__name__)


def register_sink(spark: Any) -> None:
    from processor.spark.kafka_sink import AlertSinkDataSource

    spark.dataSource.register(AlertSinkDataSource)


def checkpoint_sink_id(spark: Any, s: ProcessorSettings) -> str:
    """The sink id of this driver's checkpoint (created with the checkpoint, the same for every
    restart): the key of its commit markers."""
    return sink_id_for(HadoopCheckpointFiles(spark, s.driver_checkpoint))


@dataclass(frozen=True)
class JobInput:
    """The job up to its stateful operator: the input rows (processor.spark.rows) with the event-time
    watermark, grouped by bucket; the checkpoint they belong to; and the re-bucket seed that
    checkpoint starts from (None for any other checkpoint). The job is composed of three public
    parts (`job_input`, `geofence_rows`, `start_output`) so that another operator can be run on the
    same input and sink without a hook in the job itself."""

    grouped: Any
    checkpoint: str
    files: HadoopCheckpointFiles
    seed: Seed | None


def job_input(spark: Any, s: ProcessorSettings, checkpoint: str, starting_offsets: str) -> JobInput:
    """The job's input on `checkpoint`: Spark's Kafka source, the parse into bucket chunks and the
    watermark. A re-bucketed checkpoint (`processor.spark.rebucket`) starts Kafka at the old checkpoint's
    end offsets."""
    from processor.spark.source import processor_input

    t = s.topics
    files = HadoopCheckpointFiles(spark, checkpoint)
    refuse_retired(files)
    seed = read_seed(files)
    refuse_incomplete(files, seed)
    keys = checkpoint_layout(files, s.processor_buckets, int(spark.conf.get("spark.sql.shuffle.partitions")))
    buckets = len(keys)
    src = processor_input(
        spark,
        bootstrap=s.bootstrap_servers,
        telemetry_topic=t.telemetry,
        master_topic=t.master,
        buckets=buckets,
        bucket_keys=keys,
        starting_offsets=seed.starting_offsets(t.telemetry) if seed else starting_offsets,
        master_starting_offsets=seed.starting_offsets(t.master) if seed else "earliest",
        max_events_per_batch=s.processor_max_events_per_batch,
    )
    lateness = f"{int(s.processor_lateness_s * 1000)} milliseconds"
    return JobInput(src.withWatermark("ts", lateness).groupBy("bucket"), checkpoint, files, seed)


def geofence_rows(spark: Any, s: ProcessorSettings, inp: JobInput) -> Any:
    """The job's stateful operator (`GeofenceProcessor` under `transformWithStateInPandas`) over
    `inp`: the rows for the sink (processor.spark.rows.OUTPUT_DDL). A re-bucketed checkpoint's seed is
    its initial state."""
    from processor.spark.rows import OUTPUT_DDL
    from processor.spark.stateful import GeofenceProcessor

    seed = inp.seed
    return inp.grouped.transformWithStateInPandas(
        statefulProcessor=GeofenceProcessor(
            s.engine_config(), seed.watermark_ms if seed else 0, parking=s.processor_parking
        ),
        outputStructType=OUTPUT_DDL,
        outputMode="Append",
        timeMode="EventTime",
        # Spark applies an initial state in a checkpoint's first batch only; passed on every
        # start so the plan is the same whichever batch a restart resumes at.
        initialState=seed_state(spark, inp.checkpoint) if seed else None,
    )


def warm_up_query(spark: Any, s: ProcessorSettings, scratch_checkpoint: str) -> None:
    """Run the job once, on a scratch checkpoint, from the latest telemetry (so it reads only the
    master data), into the alert sink in its dry-run mode: a standby's JVM then has the job's plan
    compiled, the Kafka source, RocksDB and the stateful operator's Python runners loaded, and the
    sink's own Python processes (the driver's writer planner and commit runner, each a Python
    daemon of its own) started and left idle for the real query, and it writes nothing."""
    register_sink(spark)
    out = geofence_rows(spark, s, job_input(spark, s, scratch_checkpoint, "latest"))
    q = (
        _sink(out.writeStream, s, "warm-up", dry_run=True)
        .queryName("fleetfence-processor-warm-up")
        .option("checkpointLocation", scratch_checkpoint)
        .trigger(availableNow=True)
        .start()
    )
    q.awaitTermination()
    logger.info("warm-up query done batches=%d", len(q.recentProgress))


def _sink(
    writer: Any, s: ProcessorSettings, sink_id: str, *, dry_run: bool = False, hot: HotOptions | None = None
) -> Any:
    """`writer` pointed at the exactly-once alert sink (processor.spark.kafka_sink) with its options."""
    from processor.spark.kafka_sink import SINK_NAME

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
    if hot is not None:
        writer = writer.options(**hot.options())
    if s.processor_live_state:
        writer = writer.option("redisUrl", s.redis_dsn)
    return writer


def start_output(
    spark: Any,
    out: Any,
    s: ProcessorSettings,
    inp: JobInput,
    query_name: str,
    *,
    available_now: bool = False,
    hot: HotOptions | None = None,
) -> Any:
    """Start the streaming query writing `out` (rows of processor.spark.rows.OUTPUT_DDL, computed over
    `inp`) to the exactly-once sink on `inp`'s checkpoint (a hot driver's sink with `hot`); returns
    the StreamingQuery."""
    register_sink(spark)
    writer = (
        _sink(out.writeStream, s, sink_id_for(inp.files), hot=hot)
        .queryName(query_name)
        .option("checkpointLocation", inp.checkpoint)
    )
    if available_now:
        writer = writer.trigger(availableNow=True)
    elif s.processor_trigger_ms > 0:
        writer = writer.trigger(processingTime=f"{s.processor_trigger_ms} milliseconds")
    q = writer.start()
    logger.info("processor started query=%s checkpoint=%s", q.id, inp.checkpoint)
    return q


def start_query(
    spark: Any,
    s: ProcessorSettings,
    query_name: str = "fleetfence-processor",
    *,
    available_now: bool = False,
    hot: HotOptions | None = None,
) -> Any:
    """Build and start the streaming query on this driver's checkpoint; returns the StreamingQuery.
    `available_now` processes what Kafka holds at the start and then stops, its last batch
    committed (`processor.spark.rebucket`); `hot` makes it a hot driver (processor.spark.hot_sink)."""
    inp = job_input(spark, s, s.driver_checkpoint, s.processor_starting_offsets)
    rows = geofence_rows(spark, s, inp)
    return start_output(spark, rows, s, inp, query_name, available_now=available_now, hot=hot)


def proximity_sink_id(spark: Any, s: ProcessorSettings) -> str:
    """The proximity query's sink id (created with its checkpoint): the key of its markers."""
    return sink_id_for(HadoopCheckpointFiles(spark, s.proximity_checkpoint))


PROXIMITY_CELLS_FILE = "fleetfence-proximity-cells.json"


def refuse_other_cells(files: HadoopCheckpointFiles, rules: tuple[ProximityRule, ...]) -> None:
    """The H3 resolution a proximity checkpoint's state is in, recorded at its first start: the
    fixes its buckets keep are placed by their home cells at that resolution, which follows from
    the rules' largest exit distance. Another exit distance with other cells would meet new fixes
    with old ones in the wrong cells, so a change of resolution is refused. So is a checkpoint from
    before the query read the vehicle master's data (`master`: its plan has one source fewer, and
    its buckets know no vehicle's route or group)."""
    resolution = rules_resolution(rules)
    wanted = json.dumps({"resolution": resolution, "master": True})
    if files.read(PROXIMITY_CELLS_FILE) is None and files.has_entries("offsets"):
        had: dict[str, Any] = {}  # a checkpoint older than the file: it read no master data either
    elif files.create(PROXIMITY_CELLS_FILE, wanted):
        return
    else:
        had = json.loads(files.read(PROXIMITY_CELLS_FILE) or wanted)
    if not had.get("master"):
        raise ConfigError(
            f"proximity checkpoint {files.location} was started before the proximity query read the "
            "vehicle master's data (rules per route or group): start from a new checkpoint "
            "(FLEETFENCE_PROCESSOR_PROXIMITY_CHECKPOINT)"
        )
    if had["resolution"] != resolution:
        widest = max(r.exit_m for r in rules)
        raise ConfigError(
            f"proximity checkpoint {files.location} keeps fixes in H3 cells of resolution "
            f"{had['resolution']}, but a largest exit distance of {widest:g} m needs resolution "
            f"{resolution}: keep the distances or start from a new checkpoint "
            "(FLEETFENCE_PROCESSOR_PROXIMITY_CHECKPOINT)"
        )


def start_proximity_query(
    spark: Any,
    s: ProcessorSettings,
    rules: tuple[ProximityRule, ...],
    query_name: str = "fleetfence-proximity",
    *,
    available_now: bool = False,
) -> Any:
    """Start the vehicle-proximity query (processor.spark.proximity) of `rules` on its own checkpoint
    (`ProcessorSettings.proximity_checkpoint`): the telemetry and master topics in, PROXIMITY_ENTER/EXIT
    through the same exactly-once sink as the job's alerts, under that checkpoint's own sink id
    (its own transactional id and markers). A query of its own rather than a branch of the job's:
    its state is keyed by buckets of cells and of pairs, not of vehicles, and the job's checkpoint,
    its re-bucketing and its plan stay as they are whether proximity is on or off."""
    from processor.spark.proximity import FIXES_DDL, proximity_alerts, telemetry_fixes
    from processor.spark.source import kafka_stream

    checkpoint = s.proximity_checkpoint
    files = HadoopCheckpointFiles(spark, checkpoint)
    if files.read(LAYOUT_FILE) is None and files.has_entries("offsets"):
        raise ConfigError(
            f"proximity checkpoint {checkpoint} was started before the proximity stages were "
            "bucketed: its state is keyed by cell and pair, which this version cannot read; "
            "start from a new checkpoint (FLEETFENCE_PROCESSOR_PROXIMITY_CHECKPOINT)"
        )
    keys = checkpoint_layout(files, None, int(spark.conf.get("spark.sql.shuffle.partitions")))
    refuse_other_cells(files, rules)
    # The vehicle master's data from its start (compacted: each entity's latest version), as the job.
    master = kafka_stream(
        spark, s.bootstrap_servers, [s.topics.master], starting_offsets="earliest", compacted=True
    ).select("value")
    fixes = kafka_stream(
        spark,
        s.bootstrap_servers,
        [s.topics.telemetry],
        starting_offsets=s.processor_proximity_starting_offsets,
        max_offsets_per_trigger=s.processor_max_events_per_batch,
    ).select("value")
    rows = proximity_alerts(
        fixes.mapInPandas(telemetry_fixes, FIXES_DDL),
        master,
        rules,
        round(s.processor_lateness_s * 1000),
        keys,
    )
    register_sink(spark)
    writer = (
        _sink(rows.writeStream, s, proximity_sink_id(spark, s))
        .queryName(query_name)
        .option("checkpointLocation", checkpoint)
    )
    if available_now:
        writer = writer.trigger(availableNow=True)
    elif s.processor_trigger_ms > 0:
        writer = writer.trigger(processingTime=f"{s.processor_trigger_ms} milliseconds")
    q = writer.start()
    logger.info(
        "proximity started query=%s checkpoint=%s rules=%s",
        q.id,
        checkpoint,
        ",".join(f"{r.rule_id}({r.scope})" for r in rules),
    )
    return q
