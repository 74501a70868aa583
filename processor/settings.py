"""The processor's settings (`FLEETFENCE_PROCESSOR_*`) on top of the shared ones."""

from __future__ import annotations

from pydantic import Field

from fleetfence.rules import ProcessorRules
from fleetfence.settings import Settings
from processor.domain import EngineConfig

# The driver's Prometheus endpoint; when this default is busy it serves on an ephemeral port and
# announces that one (fleetfence.metrics, fleetfence.registry).
PROCESSOR_METRICS_PORT = 9465


class ProcessorSettings(Settings):
    """`FLEETFENCE_PROCESSOR_*` knobs on top of the shared settings."""

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
    processor_lateness_s: float = Field(
        default=ProcessorRules.lateness_ms / 1000, ge=0, description="Allowed event-time lateness."
    )
    processor_late_bound_s: float = Field(
        default=ProcessorRules.late_bound_ms / 1000,
        gt=0,
        description="How far behind the watermark a fix may arrive and still be applied (stored and "
        "forwarded by a tracker out of coverage); beyond it: a dead letter with reason `late`.",
    )
    processor_hysteresis_m: float = Field(default=ProcessorRules.hysteresis_m, ge=0)
    processor_return_min_fixes: int = Field(default=ProcessorRules.return_min_fixes, ge=1)
    processor_overspeed_hysteresis_kmh: float = Field(default=ProcessorRules.overspeed_hysteresis_kmh, ge=0)
    processor_silent_after_s: float = Field(
        default=ProcessorRules.default_silent_after_s, gt=0, description="Default when a route has none."
    )
    processor_stop_hysteresis_kmh: float = Field(
        default=ProcessorRules.stop_hysteresis_kmh,
        ge=0,
        description="A confirmed stop ends this far above the stop speed.",
    )
    processor_arrival_hysteresis_s: float = Field(
        default=ProcessorRules.arrival_hysteresis_s,
        ge=0,
        description="A trip at risk is back on time this far below the route's arrival threshold.",
    )
    processor_eta_warmup_s: float = Field(
        default=ProcessorRules.eta_warmup_s, ge=0, description="No ETA before a trip has run this long."
    )
    processor_eta_min_speed_kmh: float = Field(
        default=ProcessorRules.eta_min_speed_kmh,
        gt=0,
        description="The slowest average speed an ETA assumes.",
    )
    processor_lease_ttl_ms: int = Field(
        default=2000,
        ge=0,
        description="The checkpoint lease in Redis (processor.lease): a standby takes over this long after "
        "the active driver died; 0 = no lease (one driver per checkpoint is then the operator's promise).",
    )
    processor_standby: bool = Field(
        default=False, description="Start as a warm standby: Spark up, then wait for the checkpoint's lease."
    )
    processor_spark_master: str | None = Field(default=None, description="e.g. local[2] or spark://host:7077")
    processor_shuffle_partitions: int | None = Field(default=None, ge=1)
    processor_starting_offsets: str = Field(default="earliest", pattern="^(earliest|latest)$")
    processor_live_state: bool = Field(default=True, description="Write the live read model to Redis.")
    processor_metrics_port: int = Field(
        default=PROCESSOR_METRICS_PORT,
        ge=0,
        le=65535,
        description="Prometheus port, 0 = off; the default, when busy, falls back to an ephemeral port.",
    )

    @property
    def checkpoint(self) -> str:
        return self.processor_checkpoint or str((self.state_dir / "checkpoints" / "processor").resolve())

    def engine_config(self) -> EngineConfig:
        return EngineConfig(
            hysteresis_m=self.processor_hysteresis_m,
            return_min_fixes=self.processor_return_min_fixes,
            overspeed_hysteresis_kmh=self.processor_overspeed_hysteresis_kmh,
            default_silent_after_s=self.processor_silent_after_s,
            lateness_ms=int(self.processor_lateness_s * 1000),
            late_bound_ms=int(self.processor_late_bound_s * 1000),
            stop_hysteresis_kmh=self.processor_stop_hysteresis_kmh,
            arrival_hysteresis_s=self.processor_arrival_hysteresis_s,
            eta_warmup_s=self.processor_eta_warmup_s,
            eta_min_speed_kmh=self.processor_eta_min_speed_kmh,
        )
