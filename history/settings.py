"""Settings of the archive writer, the reports and restatement (`FLEETFENCE_HISTORY_*`)."""

from __future__ import annotations

from pydantic import Field

from fleetfence.settings import Settings

# The archive writer's Prometheus endpoint; when this default is busy it serves on an ephemeral
# port and announces that one (fleetfence.metrics, fleetfence.registry).
HISTORY_METRICS_PORT = 9467


class HistorySettings(Settings):
    """Archive location and policies on top of the shared settings (`FLEETFENCE_HISTORY_*`)."""

    history_archive_path: str | None = Field(
        default=None,
        description="Archive root: a local folder or a Hadoop-compatible URI; default <state_dir>/archive",
    )
    history_retention_days: int = Field(
        default=90, ge=1, description="Date partitions older than this are deleted."
    )
    history_buckets: int = Field(
        default=16, ge=1, le=100, description="Vehicle buckets of telemetry partitions."
    )
    history_checkpoint: str | None = Field(
        default=None, description="Archive query checkpoint; default <state_dir>/checkpoints/archive"
    )
    history_dedup_window_s: float = Field(
        default=600.0,
        gt=0,
        description="How long (processing time) a (vehicle_id, seq) is remembered to drop re-deliveries.",
    )
    history_trigger_ms: int = Field(
        default=1000, ge=0, description="Micro-batch trigger interval, 0 = as fast as possible."
    )
    history_max_events_per_batch: int = Field(
        default=200_000, ge=0, description="Telemetry cap per batch, 0 = none."
    )
    history_max_rows_per_file: int = Field(
        default=1_000_000, ge=1, description="Split a partition's batch file above this."
    )
    history_spark_master: str | None = Field(default=None, description="e.g. local[2] or spark://host:7077")
    history_metrics_port: int = Field(
        default=HISTORY_METRICS_PORT,
        ge=0,
        le=65535,
        description="Prometheus port of `archive run`, 0 = off; the default, when busy, falls back to "
        "an ephemeral port.",
    )

    @property
    def archive_root(self) -> str:
        return self.history_archive_path or str((self.state_dir / "archive").resolve())

    @property
    def checkpoint_location(self) -> str:
        return self.history_checkpoint or str((self.state_dir / "checkpoints" / "archive").resolve())
