"""The processor's settings (`FLEETFENCE_PROCESSOR_*`) on top of the shared ones."""

from __future__ import annotations

import socket

from pydantic import Field

from fleetfence.settings import ProcessorRulesSettings
from processor.core.domain import EngineConfig

# The driver's Prometheus endpoint; when this default is busy it serves on an ephemeral port and
# announces that one (fleetfence.metrics, fleetfence.registry).
PROCESSOR_METRICS_PORT = 9465


class ProcessorSettings(ProcessorRulesSettings):
    """`FLEETFENCE_PROCESSOR_*` knobs on top of the shared settings and the processor-wide rules."""

    processor_checkpoint: str | None = Field(
        default=None,
        description="Checkpoint location (any Hadoop path); default <state_dir>/checkpoints/processor",
    )
    processor_buckets: int | None = Field(
        default=None,
        ge=1,
        le=4096,
        description="State buckets (vehicle groups). Unset: an existing checkpoint's own count, and for a "
        "new checkpoint four per shuffle partition (docs/deploy.md, Parallelism).",
    )
    # A micro-batch has a fixed cost of its own (planning, the state commit, the sink's transaction;
    # docs/architecture.md), so the cap decides how fast a backlog drains: the larger the batches,
    # the fewer pay it. Live batches hold what arrived during the previous one and stay far below it.
    processor_max_events_per_batch: int = Field(default=400_000, ge=0, description="0 = no cap.")
    processor_trigger_ms: int = Field(default=200, ge=0)
    processor_lease_ttl_ms: int = Field(
        default=2000,
        ge=0,
        description="The checkpoint lease in Redis (processor.ops.lease): a standby takes over this long "
        "after the active driver died; 0 = no lease (one driver per checkpoint is then the "
        "operator's promise).",
    )
    processor_standby: bool = Field(
        default=False, description="Start as a warm standby: Spark up, then wait for the checkpoint's lease."
    )
    processor_hot: bool = Field(
        default=False,
        description="Hot drivers (processor.spark.hot_sink): every driver runs the query on a checkpoint "
        "of its own (<checkpoint>-<driver name>) all the time, and only the lease holder commits to "
        "fleet.alerts; a standby takes over at its next batch. Every driver of a job in the same mode.",
    )
    processor_driver_name: str = Field(
        default_factory=socket.gethostname,
        pattern=r"^[A-Za-z0-9._-]+$",
        description="A hot driver's name: its own checkpoint's suffix (default: the host name).",
    )
    processor_hot_horizon_s: int = Field(
        default=900,
        ge=1,
        description="A restarted hot driver reads what was committed from its own last commit less this: "
        "must exceed how far one driver can run ahead of another (docs/exactly-once.md, Hot drivers).",
    )
    processor_stall_timeout_s: float = Field(
        default=300.0,
        ge=0,
        description="A micro-batch still running after this long means the query is stuck (e.g. its "
        "tasks wait for executors the cluster does not give back): the driver exits (status 3) without "
        "waiting for the query to stop, for its supervisor to start it again on the checkpoint; the "
        "first batch of a run gets three times this; 0 = never.",
    )
    processor_spark_master: str | None = Field(default=None, description="e.g. local[2] or spark://host:7077")
    processor_cores_max: int | None = Field(
        default=None,
        ge=1,
        description="spark.cores.max: the most cores this driver's application takes from a standalone "
        "cluster. Unset, an application takes every free core, so a standby started beside it gets none "
        "and cannot run when it takes over (docs/deploy.md, A warm standby).",
    )
    processor_shuffle_partitions: int | None = Field(
        default=None,
        ge=1,
        description="spark.sql.shuffle.partitions for a new checkpoint (Spark keeps a checkpoint's own). "
        "Unset: half the driver's cores, at least 1 (docs/deploy.md, Parallelism).",
    )
    processor_starting_offsets: str = Field(default="earliest", pattern="^(earliest|latest)$")
    processor_live_state: bool = Field(default=True, description="Write the live read model to Redis.")
    processor_parking: bool = Field(
        default=True,
        description="Park vehicles with nothing pending (silent, no fix held) out of their bucket's state "
        "blob, one state value each (processor.core.parking), so that a micro-batch rewrites only the active "
        "vehicles. Off keeps every vehicle in the blob: no state call when a vehicle goes silent or "
        "reports again, but every batch rewrites the whole bucket; only worth it for a small fleet that "
        "goes silent and resumes often. Vehicles parked before it was turned off are still woken.",
    )
    processor_proximity_checkpoint: str | None = Field(
        default=None,
        description="The proximity query's checkpoint; default `proximity` beside the job's checkpoint "
        "(in the same folder, so on the same storage), where it stays when the job's checkpoint moves to "
        "another name (a re-bucketing).",
    )
    processor_proximity_starting_offsets: str = Field(
        default="latest",
        pattern="^(earliest|latest)$",
        description="Where a new proximity checkpoint starts reading telemetry: latest, so that a rule "
        "turned on in a running deployment raises no alerts about the retained past.",
    )
    processor_metrics_port: int = Field(
        default=PROCESSOR_METRICS_PORT,
        ge=0,
        le=65535,
        description="Prometheus port, 0 = off; the default, when busy, falls back to an ephemeral port.",
    )

    @property
    def checkpoint(self) -> str:
        """The job's checkpoint: the one its drivers run on, and the name of its lease. A hot
        driver runs on its own (`driver_checkpoint`)."""
        return self.processor_checkpoint or str((self.state_dir / "checkpoints" / "processor").resolve())

    @property
    def driver_checkpoint(self) -> str:
        """Where this driver's query keeps its offsets and state."""
        if not self.processor_hot:
            return self.checkpoint
        return f"{self.checkpoint.rstrip('/')}-{self.processor_driver_name}"

    @property
    def proximity_checkpoint(self) -> str:
        """The proximity query's checkpoint: a query of its own, with its own sink id and markers."""
        if self.processor_proximity_checkpoint:
            return self.processor_proximity_checkpoint
        folder = self.checkpoint.rstrip("/").rsplit("/", 1)[0]
        return f"{folder}/proximity"

    def engine_config(self) -> EngineConfig:
        return EngineConfig.of(self.processor_rules())
