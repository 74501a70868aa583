"""Settings of the archive writer and restatement (`FLEETFENCE_HISTORY_*`)."""

from __future__ import annotations

from pydantic import Field
from pydantic_settings import SettingsConfigDict

from fleetfence.settings import Settings


class HistorySettings(Settings):
    """Archive location and policies on top of the shared settings.

    Field names carry no `history_` prefix: the env prefix `FLEETFENCE_HISTORY_` provides it
    (e.g. `FLEETFENCE_HISTORY_ARCHIVE_PATH`). The shared settings are read with the same prefix, so
    `FLEETFENCE_HISTORY_STATE_DIR` would be the state dir here; the CLI builds these settings from
    the shared ones (`from_settings`) so `FLEETFENCE_STATE_DIR` etc. keep working.
    """

    model_config = SettingsConfigDict(env_prefix="FLEETFENCE_HISTORY_", extra="ignore")

    archive_path: str | None = Field(
        default=None,
        description="Archive root: a local folder or a Hadoop-compatible URI; default <state_dir>/archive",
    )
    retention_days: int = Field(default=90, ge=1, description="Date partitions older than this are deleted.")
    buckets: int = Field(default=16, ge=1, le=100, description="Vehicle buckets of telemetry partitions.")
    checkpoint: str | None = Field(
        default=None, description="Archive query checkpoint; default <state_dir>/checkpoints/archive"
    )
    dedup_window_s: float = Field(
        default=600.0,
        gt=0,
        description="How long (processing time) a (vehicle_id, seq) is remembered to drop re-deliveries.",
    )
    trigger_ms: int = Field(
        default=1000, ge=0, description="Micro-batch trigger interval, 0 = as fast as possible."
    )
    max_events_per_batch: int = Field(default=200_000, ge=0, description="Telemetry cap per batch, 0 = none.")
    max_rows_per_file: int = Field(
        default=1_000_000, ge=1, description="Split a partition's batch file above this."
    )
    spark_master: str | None = Field(default=None, description="e.g. local[2] or spark://host:7077")
    metrics_port: int = Field(
        default=0, ge=0, le=65535, description="Prometheus port of `archive run`, 0 = off."
    )

    @property
    def archive_root(self) -> str:
        return self.archive_path or str((self.state_dir / "archive").resolve())

    @property
    def checkpoint_location(self) -> str:
        return self.checkpoint or str((self.state_dir / "checkpoints" / "archive").resolve())

    @classmethod
    def from_settings(cls, base: Settings, **overrides: object) -> HistorySettings:
        """The shared settings (FLEETFENCE_*) plus the FLEETFENCE_HISTORY_* ones from the environment."""
        own = cls()
        fields = {k: getattr(own, k) for k in cls.model_fields if k not in Settings.model_fields}
        return cls(**{**base.model_dump(exclude={"topics"}), **fields, **overrides})
