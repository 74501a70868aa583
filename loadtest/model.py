"""What a load test records: one `Sample` a second, one `StepResult` per rate step, one `LoadRun`.

Plain dataclasses (JSON through `dataclasses.asdict`), so the driver, the report and a machine
reading `report.json` share one shape. Rates are per second, latencies in milliseconds, memory in
MiB, CPU in percent of one core (200 = both cores of a 2-core machine).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class ProcSample:
    """One process (with all its descendants: a Spark driver's JVM and Python workers) at one moment."""

    cpu_pct: float
    rss_mib: float


@dataclass
class Sample:
    """The pipeline at one moment of the run."""

    t_s: float  # seconds since the run started
    step: int  # index into LoadRun.steps
    target_rate: float  # fixes/s the publisher aims at
    publish_rate: float  # fixes/s acknowledged by the MQTT broker over the last interval
    puback_p50_ms: float | None  # PUBACK latency over the last interval
    puback_p99_ms: float | None
    gateway_forwarded_rate: float  # records/s written to fleet.telemetry (by the gateways)
    gateway_dead_lettered: int  # cumulative: the run's messages the gateways dead-lettered
    processor_rate: float  # telemetry records/s the processor's committed batches read
    processor_lag: int  # records written to fleet.telemetry and not yet read by a committed batch
    receivers_lag: int  # alerts on fleet.alerts not yet committed by the receivers' group
    alerts: int  # cumulative committed alerts of this run
    procs: dict[str, ProcSample] = field(default_factory=dict)


@dataclass
class Latency:
    """Event -> committed alert, in ms: from the fix's event time, and from its gateway receipt."""

    count: int
    p50_ms: float | None
    p95_ms: float | None
    p99_ms: float | None
    max_ms: float | None


@dataclass
class Accuracy:
    """Against the step's ground truth (simulator.verify): overall and per alert type."""

    expected: int
    observed: int
    matched: int
    duplicates: int
    precision: float | None
    recall: float | None
    per_type: dict[str, dict[str, Any]] = field(default_factory=dict)
    # Every disagreement with the truth (`simulator.verify.Mismatch.to_dict`), the first
    # `simulator.verify.MISMATCH_CAP` listed; `mismatch_count` counts them all.
    mismatch_count: int = 0
    mismatches: list[dict[str, Any]] = field(default_factory=list)


@dataclass
class Reconciliation:
    """Counts end to end for the run, from Kafka: every fix published was acknowledged; every
    acknowledged fix is in `fleet.telemetry` (`in_kafka`, each counted once; `sent_again`: the
    records beyond a fix's first, a device resending what it got no PUBACK for) or dead-lettered;
    the processor's committed batches read every record written to `fleet.telemetry`. The
    gateways' own counts (`gateway_*`, from their metrics) are checked when no replica restarted:
    a restart loses what it counted since the last reading."""

    published: int
    acked: int
    sent_twice: int  # of those, messages the scenario sent twice on purpose (the same fix again)
    in_kafka: int
    sent_again: int
    dead_lettered: int
    telemetry_records: int  # every record written to fleet.telemetry during the run
    gateway_received: int
    gateway_forwarded: int
    gateway_dead_lettered: int
    processor_read: int
    processor_accepted: int
    processor_duplicates: int
    processor_invalid: int
    processor_late: int
    reconciled: bool
    detail: str = ""
    gateway_redelivered: int = 0  # received with the DUP flag (a device's or a broker's resends)
    gateway_restarts: int = 0  # gateway replicas seen starting again during the run


@dataclass
class StepResult:
    step: int
    target_rate: float
    vehicles: int
    duration_s: float
    achieved_rate: float  # acknowledged fixes / duration
    sustained: bool  # no stage's lag grew over the whole step
    lag_start: int
    lag_end: int
    latency_event: Latency
    latency_receipt: Latency
    accuracy: Accuracy
    reconciliation: Reconciliation
    notes: list[str] = field(default_factory=list)


@dataclass
class LoadRun:
    mode: str  # "fixed", "ramp" or "soak"
    started_at: str  # UTC ISO 8601
    finished_at: str
    machine: dict[str, Any]  # cores, memory, python, what ran where
    options: dict[str, Any]  # the command line's options
    steps: list[StepResult] = field(default_factory=list)
    samples: list[Sample] = field(default_factory=list)
    highest_sustained_rate: float | None = None  # ramp: the best step that kept up
    rss_growth: dict[str, float] = field(default_factory=dict)  # per process, after warm-up, fraction
    verdicts: list[str] = field(default_factory=list)  # threshold failures (empty: passed)
