"""The parameters of the stops and trips reports: when a vehicle counts as stopped, how long a stop
lasts at least, and how long a silence ends a trip or a stop.

Kept apart from history/reports.py (SedonaDB, pandas) so the CLI can show the defaults in its help
without importing the engines; the CLI options and the API's query parameters take their defaults
from `MotionParams()`, and every caller validates through its constructor.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields

from history.errors import ReportError


@dataclass(frozen=True)
class MotionParams:
    """What divides a vehicle's fixes into stops and trips (definitions in docs/reports.md).

    - `stop_speed_kmh`: a fix is stationary when its `speed_kmh` is at most this (GPS speed is
      rarely exactly 0 when parked);
    - `min_stop_s`: a run of stationary fixes is a stop when it lasts at least this long (a shorter
      one, a traffic light, stays part of the trip);
    - `max_gap_s`: two consecutive fixes further apart than this (a tracker off overnight) end the
      trip or the stop between them.
    """

    stop_speed_kmh: float = 5.0
    min_stop_s: float = 300.0
    max_gap_s: float = 600.0

    def __post_init__(self) -> None:
        for f in fields(self):
            v = getattr(self, f.name)
            if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
                raise ReportError(f"{f.name} must be a finite number, not {v!r}")
            object.__setattr__(self, f.name, float(v))
        if self.stop_speed_kmh < 0:
            raise ReportError(f"stop_speed_kmh must be >= 0, not {self.stop_speed_kmh:g}")
        # Both > 0: a stop then always has a duration, so no two trips of a vehicle share a start.
        if self.min_stop_s <= 0:
            raise ReportError(f"min_stop_s must be > 0, not {self.min_stop_s:g}")
        if self.max_gap_s <= 0:
            raise ReportError(f"max_gap_s must be > 0, not {self.max_gap_s:g}")

    @property
    def min_stop_ms(self) -> float:
        return self.min_stop_s * 1000.0

    @property
    def max_gap_ms(self) -> float:
        return self.max_gap_s * 1000.0


DEFAULT_MOTION = MotionParams()
