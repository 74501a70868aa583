"""What a scenario hands out per tick: the messages in publish order with the truth published
alongside, and the counts of what it injected. Apart from the fleet model so that the planning,
the kinematics and the sinks share them without importing one another."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from simulator.geo import FloatArray, IntArray
from simulator.truth import TruthAlert

# One message: (vehicle index, seq, ts_ms, lat, lon, speed_kmh, heading_deg).
Message = tuple[int, int, int, float, float, float, float]


@dataclass
class TickBatch:
    """The messages of one tick in publish order, and the truth published with them."""

    tick: int
    ts_ms: int
    vehicle: IntArray
    seq: IntArray
    ts: IntArray
    lat: FloatArray
    lon: FloatArray
    speed_kmh: FloatArray
    heading_deg: FloatArray
    truth: list[TruthAlert]

    def __len__(self) -> int:
        return len(self.vehicle)


@dataclass
class ScenarioStats:
    messages: int = 0
    duplicates: int = 0
    out_of_order: int = 0
    late: int = 0
    deviations: int = 0
    overspeeds: int = 0
    dwells: int = 0
    silences: int = 0
    wrong_ways: int = 0
    schedules: int = 0
    skipped: int = 0
    truth: dict[str, int] = field(default_factory=dict)


def make_batch(k: int, ts_ms: int, msgs: list[Message], truth: list[TruthAlert]) -> TickBatch:
    """A tick's messages as columns (the sinks publish arrays, not tuples)."""
    cols = list(zip(*msgs, strict=True)) if msgs else [()] * 7
    return TickBatch(
        k,
        ts_ms,
        np.asarray(cols[0], dtype=np.int64),
        np.asarray(cols[1], dtype=np.int64),
        np.asarray(cols[2], dtype=np.int64),
        np.asarray(cols[3], dtype=np.float64),
        np.asarray(cols[4], dtype=np.float64),
        np.asarray(cols[5], dtype=np.float64),
        np.asarray(cols[6], dtype=np.float64),
        truth,
    )
