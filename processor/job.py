"""The streaming job: Kafka telemetry + master data in, alerts (exactly once) and live state out.

    Spark's Kafka source (telemetry + master) -> mapInArrow(parse into bucket chunks)
      -> watermark on event time -> groupBy(bucket)
      -> transformWithStateInPandas(GeofenceProcessor, EventTime) -> sink (fleetfence_alerts)

Runs on `local[*]` by default and unchanged under `spark-submit --master spark://...`: the source,
the stateful operator and the sink are plain Spark plan nodes, the checkpoint is a Hadoop path.
"""

from __future__ import annotations

import logging
import uuid
from typing import Any

from pydantic import Field
from pydantic_settings import SettingsConfigDict

from fleetfence.errors import ConfigError
from fleetfence.settings import Settings
from processor.checkpoint_files import CheckpointFiles, HadoopCheckpointFiles
from processor.domain import EngineConfig
from processor.layout import checkpoint_layout

logger = logging.getLogger(__name__)


class ProcessorSettings(Settings):
    """`FLEETFENCE_PROCESSOR_*` knobs on top of the shared settings."""

    model_config = SettingsConfigDict(env_prefix="FLEETFENCE_", extra="ignore")

    processor_checkpoint: str | None = Field(
        default=None,
        description="Checkpoint location (any Hadoop path); default <state_dir>/checkpoints/processor",
    )
    processor_buckets: int = Field(default=16, ge=1, le=4096, description="State buckets (vehicle groups).")
    # A micro-batch has ~1 s of fixed cost here (docs/architecture.md), so the cap decides how fast a
    # backlog drains: 44k events/s at 100k, ~60k at 200k, ~113k at 400k (docs/benchmarks.md). Live
    # batches hold what arrived during the previous one and stay far below it.
    processor_max_events_per_batch: int = Field(default=400_000, ge=0, description="0 = no cap.")
    processor_trigger_ms: int = Field(default=200, ge=0)
    processor_lateness_s: float = Field(default=10.0, ge=0, description="Allowed event-time lateness.")
    processor_hysteresis_m: float = Field(default=15.0, ge=0)
    processor_return_min_fixes: int = Field(default=2, ge=1)
    processor_overspeed_hysteresis_kmh: float = Field(default=5.0, ge=0)
    processor_silent_after_s: float = Field(default=120.0, gt=0, description="Default when a route has none.")
    processor_spark_master: str | None = Field(default=None, description="e.g. local[2] or spark://host:7077")
    processor_shuffle_partitions: int | None = Field(default=None, ge=1)
    processor_starting_offsets: str = Field(default="earliest", pattern="^(earliest|latest)$")
    processor_live_state: bool = Field(default=True, description="Write the live read model to Redis.")
    processor_metrics_port: int = Field(default=0, ge=0, le=65535, description="Prometheus port, 0 = off.")

    @property
    def checkpoint(self) -> str:
        return self.processor_checkpoint or str((self.state_dir / "checkpoints" / "processor").resolve())

    def engine_config(self) -> EngineConfig:
        return EngineConfig(
            hysteresis_m=self.processor_hysteresis_m,
            return_min_fixes=self.processor_return_min_fixes,
            overspeed_hysteresis_kmh=self.processor_overspeed_hysteresis_kmh,
            default_silent_after_s=self.processor_silent_after_s,
            allowed_lateness_ms=int(self.processor_lateness_s * 1000),
        )


SINK_ID_FILE = "fleetfence-sink-id"


def sink_id_for(files: CheckpointFiles) -> str:
    """A stable id per checkpoint: a reset checkpoint gets a new id, so its batches are not skipped
    against the markers of the old one. Kept in the checkpoint itself, through the same FileSystem
    as Spark's logs: a driver restarted elsewhere must find the same id, or it could commit its last
    micro-batch to Kafka a second time (docs/exactly-once.md)."""
    files.create(SINK_ID_FILE, uuid.uuid4().hex[:16])
    text = files.read(SINK_ID_FILE)
    if not text or not text.strip():
        raise ConfigError(f"the checkpoint {files.location} has an empty {SINK_ID_FILE}")
    return text.strip()


def register_sink(spark: Any) -> None:
    from processor.kafka_sink import AlertSinkDataSource

    spark.dataSource.register(AlertSinkDataSource)


def start_query(spark: Any, s: ProcessorSettings, query_name: str = "fleetfence-processor") -> Any:
    """Build and start the streaming query; returns the StreamingQuery."""
    from processor.kafka_sink import SINK_NAME
    from processor.rows import OUTPUT_DDL
    from processor.source import processor_input
    from processor.stateful import GeofenceProcessor

    register_sink(spark)
    t = s.topics
    checkpoint = s.checkpoint
    files = HadoopCheckpointFiles(spark, checkpoint)
    keys = checkpoint_layout(files, s.processor_buckets, int(spark.conf.get("spark.sql.shuffle.partitions")))
    src = processor_input(
        spark,
        bootstrap=s.bootstrap_servers,
        telemetry_topic=t.telemetry,
        master_topic=t.master,
        buckets=s.processor_buckets,
        bucket_keys=keys,
        starting_offsets=s.processor_starting_offsets,
        max_events_per_batch=s.processor_max_events_per_batch,
    )
    lateness = f"{int(s.processor_lateness_s * 1000)} milliseconds"
    out = (
        src.withWatermark("ts", lateness)
        .groupBy("bucket")
        .transformWithStateInPandas(
            statefulProcessor=GeofenceProcessor(s.engine_config()),
            outputStructType=OUTPUT_DDL,
            outputMode="Append",
            timeMode="EventTime",
        )
    )
    writer = (
        out.writeStream.format(SINK_NAME)
        .queryName(query_name)
        .option("checkpointLocation", checkpoint)
        .option("bootstrap", s.bootstrap_servers)
        .option("alertsTopic", t.alerts)
        .option("dlqTopic", t.telemetry_dlq)
        .option("markersTopic", t.processor_commits)
        .option("sinkId", sink_id_for(files))
        .option("redisPrefix", s.redis_prefix)
    )
    if s.processor_live_state:
        writer = writer.option("redisUrl", s.redis_dsn)
    if s.processor_trigger_ms > 0:
        writer = writer.trigger(processingTime=f"{s.processor_trigger_ms} milliseconds")
    q = writer.start()
    logger.info("processor started query=%s checkpoint=%s", q.id, checkpoint)
    return q
