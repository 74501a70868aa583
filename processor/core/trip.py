"""A trip's schedule arithmetic: the ETA and the planned arrival. Pure, no I/O.

One definition for both of the engine's paths: `processor.core.domain.step` calls these on one fix's
numbers and the vectorized fast path (`processor.core.engine`) on whole columns. The same numpy
operations in the same order give the same float64 bits either way, which is what lets the property
test demand that the two paths agree exactly (an arrival alert decided by a last-bit difference
would otherwise fire on one path and not on the other).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np


def eta_ms(
    ts_ms: Any,
    progress_m: Any,
    trip_start_ms: Any,
    trip_start_m: Any,
    route_length_m: Any,
    warmup_s: float,
    min_speed_kmh: float,
) -> Any:
    """Expected arrival (epoch ms, float) from the remaining distance at the trip's average speed so
    far, or -1 before `warmup_s` of trip.

    The average over the trip rather than an instantaneous speed: a traffic light or a burst on a
    motorway moves an instantaneous ETA by minutes and would make an arrival alert flap; the trip's
    average moves slowly and still reflects a long stop. Floored at `min_speed_kmh` so a vehicle
    that has not moved yet has a finite ETA.
    """
    elapsed_ms = np.asarray(ts_ms, dtype=np.float64) - trip_start_ms
    speed_m_per_ms = (np.asarray(progress_m, dtype=np.float64) - trip_start_m) / np.maximum(elapsed_ms, 1.0)
    speed_m_per_ms = np.maximum(speed_m_per_ms, min_speed_kmh / 3600.0)
    eta = ts_ms + (route_length_m - np.asarray(progress_m, dtype=np.float64)) / speed_m_per_ms
    return np.where(elapsed_ms >= warmup_s * 1000.0, eta, -1.0)


def planned_arrival_ms(
    planned_arrival: int, planned_departure: int, trip_start_ms: int, planned_duration_s: float
) -> int:
    """The trip's planned arrival (epoch ms), or -1 when it has none: the assignment's own, else the
    planned departure (or the trip's actual start) plus the route's planned duration."""
    if planned_arrival >= 0:
        return planned_arrival
    if not math.isfinite(planned_duration_s):
        return -1
    base = planned_departure if planned_departure >= 0 else trip_start_ms
    return base + int(planned_duration_s * 1000) if base >= 0 else -1
