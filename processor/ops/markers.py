"""The processor's exact batch accounting: its counters and its one log line per committed batch come
from the commit markers themselves, the same numbers a reconciliation reads.

Every micro-batch the exactly-once sink commits writes one marker to `fleet.processor.commits` in
the same Kafka transaction as its alerts (`processor.spark.kafka_sink`): `{sink_id, batch_id,
committed_ms, received, invalid, accepted, duplicates, held, alerts, master_events, ...}`. An
aborted batch's marker is never visible (read_committed) and a replayed batch is skipped by the sink,
so one visible marker is one committed batch. The service (`processor.ops.service`) tails the markers of
its own sink id from where the topic ended when it started, and joins each with Spark's progress
report of the same batch for what the marker cannot know (the batch's duration and watermark).

Counting from the markers rather than from Spark's progress reports (sampled) or from the sink's
Python worker (whose logs never reach the service's log) makes `metrics = markers = records` hold
exactly, batch by batch.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

import orjson
from confluent_kafka import OFFSET_END, KafkaError, TopicPartition
from prometheus_client import Counter, Gauge

from fleetfence.kafka import group_consumer, partitions_of, watermarks
from processor.core.proximity import ProximityCount
from processor.spark.hot_sink import SHADOW_SUFFIX

logger = logging.getLogger(__name__)

COMMITTED_BATCHES = Counter(
    "fleetfence_processor_committed_batches_total", "Micro-batches whose alerts were committed"
)
RECORDS = Counter(
    "fleetfence_processor_records_total",
    "Telemetry records by outcome, from the committed batches' markers",
    ["outcome"],
)
ALERTS = Counter("fleetfence_processor_alerts_total", "Alerts committed to fleet.alerts")
MASTER_EVENTS = Counter("fleetfence_processor_master_events_total", "Master-data events applied")
UNASSIGNED = Counter(
    "fleetfence_processor_unassigned_fixes_total",
    "Accepted fixes with no assignment valid at their event time (no route alerts for them)",
)
PARKING = Counter(
    "fleetfence_processor_vehicle_parking_total",
    "Vehicles moved out of their bucket's blob (parked: silent, nothing pending) and back (woken: "
    "reporting again); see processor.core.parking",
    ["move"],
)
HELD = Gauge("fleetfence_processor_held_fixes", "Fixes held in reorder buffers after the last batch")
PROXIMITY_BATCHES = Counter(
    "fleetfence_processor_proximity_committed_batches_total",
    "Micro-batches of the proximity query (processor.spark.job.start_proximity_query) committed",
)
PROXIMITY_COUNTS = Counter(
    "fleetfence_processor_proximity_counted_total",
    "What the proximity stages counted besides meetings and alerts: fixes a bucket of cells already "
    "had (repeated), fixes behind the watermark (met with what was still kept), meetings the pair "
    "stage ignored as late",
    ["outcome"],
)

# Marker field -> `outcome` label. `received` (valid telemetry rows) = accepted + duplicates + late
# + the change in `held`; records in `fleet.telemetry` = received + invalid.
OUTCOMES = {
    "received": "received",
    "accepted": "accepted",
    "duplicates": "duplicate",
    "late": "late",
    "invalid": "invalid",
}
# What a job's batch line says of its marker, in this order.
JOB_COUNTS = (
    *("received", "accepted", "duplicates", "late", "invalid"),
    *("unassigned", "held", "alerts", "master_events", "parked", "woken"),
)
# A marker whose progress report does not come within this long is logged without it.
JOIN_TIMEOUT_S = 30.0


@dataclass
class BatchLedger:
    """Joins markers with progress reports by batch id; counts each marker once, logs each batch
    once. Pure apart from the Prometheus counters it increments."""

    sink_id: str
    # The proximity query's ledger: its markers count alerts and batches of their own, and none of
    # the job's telemetry outcomes or gauges (it reads the same records the job counts).
    proximity: bool = False
    _markers: dict[int, tuple[float, dict[str, Any]]] = field(default_factory=dict)
    _progress: dict[int, dict[str, Any]] = field(default_factory=dict)
    lines: list[dict[str, Any]] = field(default_factory=list)

    def marker(self, m: dict[str, Any], now: float | None = None) -> bool:
        """Count one committed batch's marker; False for another sink's. A hot driver's shadow
        marker (processor.spark.hot_sink) counts its records, not its alerts: they were not
        committed to fleet.alerts."""
        shadow = m.get("sink_id") == self.sink_id + SHADOW_SUFFIX
        if m.get("sink_id") != self.sink_id and not shadow:
            return False
        counts: dict[str, Any] = m["shadow"] if shadow else m
        if self.proximity:
            ALERTS.inc(int(m.get("alerts", 0)))
            PROXIMITY_BATCHES.inc()
            for count in ProximityCount:
                PROXIMITY_COUNTS.labels(count.outcome).inc(int(m.get(count, 0)))
            self._markers[int(m["batch_id"])] = (
                time.monotonic() if now is None else now,
                {**counts, "role": "proximity"},
            )
            return True
        for key, outcome in OUTCOMES.items():
            RECORDS.labels(outcome).inc(int(counts.get(key, 0)))
        if not shadow:
            ALERTS.inc(int(m.get("alerts", 0)))
        MASTER_EVENTS.inc(int(counts.get("master_events", 0)))
        UNASSIGNED.inc(int(counts.get("unassigned", 0)))
        HELD.set(int(counts.get("held", 0)))
        for move in ("parked", "woken"):
            PARKING.labels(move).inc(int(counts.get(move, 0)))
        COMMITTED_BATCHES.inc()
        role = "shadow" if shadow else "live"
        self._markers[int(m["batch_id"])] = (
            time.monotonic() if now is None else now,
            {**counts, "role": role},
        )
        return True

    def progress(self, p: dict[str, Any]) -> None:
        """Remember what Spark's progress report says of a batch (only what the marker lacks)."""
        self._progress[int(p["batchId"])] = {
            "duration_ms": (p.get("durationMs") or {}).get("triggerExecution"),
            "watermark": (p.get("eventTime") or {}).get("watermark"),
        }
        # Reports of batches that committed nothing (no marker will come) must not pile up.
        for b in sorted(self._progress)[:-200]:
            del self._progress[b]

    def flush(self, now: float | None = None) -> list[dict[str, Any]]:
        """Log every batch whose marker and progress are both known (or whose progress is late)."""
        now = time.monotonic() if now is None else now
        out = []
        for b in sorted(self._markers):
            seen, m = self._markers[b]
            p = self._progress.get(b)
            if p is None and now - seen < JOIN_TIMEOUT_S:
                continue
            del self._markers[b]
            self._progress.pop(b, None)
            counted = ("alerts", *map(str, ProximityCount)) if self.proximity else JOB_COUNTS
            line: dict[str, Any] = {
                "batch_id": b,
                **{k: int(m.get(k, 0)) for k in counted},
                "role": m.get("role", "live"),
                **{k: int(m[k]) for k in ("hot_released", "hot_deduplicated", "hot_went_live_ms") if k in m},
                "duration_ms": p and p["duration_ms"],
                "watermark": p and p["watermark"],
            }
            logger.info(
                "batch committed sink_id=%s %s", self.sink_id, " ".join(f"{k}={v}" for k, v in line.items())
            )
            out.append(line)
        self.lines.extend(out)
        del self.lines[:-1000]
        return out


class MarkerReader:
    """This sink's markers as they are committed, from where the topic ended when it was opened
    (open it before the query starts, so no batch of this run is missed).

    Where the topic ends is read through an outage (`fleetfence.kafka.through_outage`): for up to
    `timeout_s`, or with None for as long as Kafka is unreachable, until `stop` is set; either way
    KafkaUnavailableError when the wait ends without an answer."""

    def __init__(
        self,
        bootstrap: str,
        topic: str,
        *,
        timeout_s: float | None = 30.0,
        stop: threading.Event | None = None,
    ) -> None:
        # A private group id: the reader assigns its partitions itself and never commits.
        self._c = group_consumer(bootstrap, f"fleetfence-markers-{uuid.uuid4().hex}")
        try:
            parts = partitions_of(self._c, topic, timeout_s=timeout_s, stop=stop)
            ends = [watermarks(self._c, topic, p, timeout_s, stop)[1] for p in parts]
        except BaseException:
            self._c.close()
            raise
        self._c.assign(
            [TopicPartition(topic, p, e if e >= 0 else OFFSET_END) for p, e in zip(parts, ends, strict=True)]
        )

    def poll(self, timeout_s: float = 0.0) -> list[dict[str, Any]]:
        out = []
        for msg in self._c.consume(num_messages=500, timeout=timeout_s):
            err = msg.error()
            if err is not None:
                if err.code() != KafkaError._PARTITION_EOF:
                    logger.warning("marker read failed: %s", err)
                continue
            value = msg.value()
            if value:
                out.append(orjson.loads(value))
        return out

    def close(self) -> None:
        self._c.close()
