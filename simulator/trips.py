"""Planning the route-awareness episodes so their ground truth is exact.

The processor decides direction, completion and arrival from *progress along the route*, measured in
its own frame (a tangent plane at the route's centroid, `fleetfence.geo.LocalProjection`); a noisy
fix near a threshold could fall either way. So, as for zones and deviations, the plan keeps every
decisive fact clear of its threshold:
- a wrong-way stretch is driven with no GPS noise, backwards and forwards with a speed profile
  chosen so that no fix lies within a metre of the distance threshold (`wrong_way_profile`);
- near the route's end the noise is replaced so that a fix's distance to the end is at least
  `END_MARGIN_M` on its planned side of the completion radius (`end_nudge`);
- a scheduled trip is driven with no noise and no random event, so its whole track is known when the
  fleet is planned: its ETA per fix is computed in the processor's frame, and its planned arrival
  is chosen so that every ETA lies clear of both arrival thresholds (`plan_schedule`).
The ETA formula is the contract's (docs/contracts.md, ARRIVAL_AT_RISK), restated here rather than
imported: the truth must never be computed by the code it checks.
"""

from __future__ import annotations

import numpy as np
import shapely
from shapely.geometry import LineString

from fleetfence.geo import LocalProjection
from simulator.geo import FloatArray, IntArray, Polyline

END_MARGIN_M = 3.0  # a fix's distance to the route's end stays this far from the completion radius
ETA_MARGIN_S = 0.05  # an ETA's delay stays this far from either arrival threshold
WW_MARGIN_M = 1.0  # a wrong-way fix's distance from its turn stays this far from the threshold


def wrong_way_profile(threshold_m: float, accel_ms2: float, dt_s: float) -> FloatArray:
    """Speeds (m/s) of a wrong-way leg from standstill, one per fix: accelerating at `accel_ms2`
    up to a cruise speed chosen so that no fix's distance from the turn lies within WW_MARGIN_M of
    `threshold_m`; the leg ends two fixes past the threshold. The same profile serves the leg back
    (WRONG_DIRECTION) and the leg forward again (DIRECTION_RESTORED)."""
    for target in (8.0, 7.5, 8.5, 7.0, 9.0, 6.5, 9.5, 6.0, 10.0):
        speeds: list[float] = []
        travelled = 0.0
        while travelled < threshold_m + 2 * target * dt_s:
            speeds.append(min(target, accel_ms2 * dt_s * (len(speeds) + 1)))
            travelled += speeds[-1] * dt_s
        d = np.cumsum(np.array(speeds) * dt_s)
        if np.abs(d - threshold_m).min() >= WW_MARGIN_M:
            return np.array(speeds)
    raise ValueError(f"no wrong-way speed profile clears {threshold_m} m by {WW_MARGIN_M} m")


def end_nudge(
    x: FloatArray,
    y: FloatArray,
    nx: FloatArray,
    ny: FloatArray,
    end_x: FloatArray,
    end_y: FloatArray,
    radius_m: float,
) -> tuple[FloatArray, FloatArray]:
    """Noise for fixes planned at (x, y) such that their distance to the route's end (end_x, end_y)
    is unambiguous against the completion radius: kept where even the largest noise cannot cross
    it, zero where the planned point is clear by END_MARGIN_M, and otherwise a radial shift to
    exactly END_MARGIN_M on the planned side."""
    d0 = np.hypot(x - end_x, y - end_y)
    bound = np.hypot(nx, ny).max(initial=0.0)
    near = np.abs(d0 - radius_m) < bound + END_MARGIN_M
    target = np.where(d0 >= radius_m, radius_m + END_MARGIN_M, radius_m - END_MARGIN_M)
    shift = np.where(np.abs(d0 - radius_m) < END_MARGIN_M, target - d0, 0.0)
    ux = (x - end_x) / np.maximum(d0, 1e-9)
    uy = (y - end_y) / np.maximum(d0, 1e-9)
    return np.where(near, ux * shift, nx), np.where(near, uy * shift, ny)


def _other_passes(
    line: Polyline, half_m: float, slack_m: float, step_m: float
) -> tuple[FloatArray, IntArray, FloatArray]:
    """Samples every `step_m` of arc length along `line`, and the pairs (sample, arc length of the
    nearest point of another stretch of the route within the corridor grown by `slack_m`)."""
    s = np.arange(0.0, line.length_m + step_m, step_m)
    x, y, _tx, _ty = line.at(s)
    ax, ay = line.x[:-1], line.y[:-1]
    dx, dy = np.diff(line.x), np.diff(line.y)
    tree = shapely.STRtree(
        shapely.linestrings(np.stack([np.c_[ax, ay], np.c_[line.x[1:], line.y[1:]]], axis=1))
    )
    pi, si = tree.query(shapely.points(x, y), predicate="dwithin", distance=half_m + slack_m)
    l2 = np.maximum(dx[si] ** 2 + dy[si] ** 2, 1e-12)
    t = np.clip(((x[pi] - ax[si]) * dx[si] + (y[pi] - ay[si]) * dy[si]) / l2, 0.0, 1.0)
    along = line.cum_m[si] + t * np.sqrt(l2)
    other = np.abs(along - s[pi]) > 2 * half_m + slack_m
    return s, pi[other], along[other]


def shared_stretches(line: Polyline, half_m: float, slack_m: float, step_m: float = 2.0) -> FloatArray:
    """Where along `line` another stretch of the same route passes within the corridor (a street
    the route drives twice, a crossing): a 0/1 array per `step_m` of arc length.

    The processor cannot place a vehicle there without knowing where it came from
    (`processor.core.domain.continue_progress`), so the plan keeps the episodes whose truth needs
    progress (a wrong-way stretch, a scheduled trip's start) off such stretches. `slack_m` widens the
    test by the noise and a margin.
    """
    s, pi, _along = _other_passes(line, half_m, slack_m, step_m)
    flag = np.zeros(len(s))
    flag[pi] = 1.0
    return flag


def unplaceable_completions(
    line: Polyline, half_m: float, slack_m: float, radius_m: float, skip_m: float, step_m: float = 2.0
) -> FloatArray:
    """Where along `line` a vehicle may not *start*: a 0/1 array per `step_m` of arc length.

    A vehicle first seen on a shared stretch cannot be placed until a fix of it lands on a stretch
    the route drives once (`processor.core.domain.continue_progress`). Its completion is still decided
    where every pass near it lies past half the route; where one pass lies before half (a route
    that crosses its own end, or ends on a street it drove early on), the processor cannot tell
    completion from the early pass. So a start is refused when, driving on from it, the vehicle
    reaches such a point within the completion radius before a stretch the route drives once that
    is long enough (`skip_m`: a fix's travel and noise) for one of its fixes to land on it."""
    s, pi, along = _other_passes(line, half_m, slack_m, step_m)
    x, y, _tx, _ty = line.at(s)
    shared = np.zeros(len(s), dtype=bool)
    shared[pi] = True
    early = np.zeros(len(s), dtype=bool)
    early[pi[along < line.length_m / 2 + slack_m]] = True
    near_end = np.hypot(x - line.x[-1], y - line.y[-1]) <= radius_m + slack_m
    ambiguous = early & near_end & (s >= line.length_m / 2 - slack_m)
    # A stretch driven once but shorter than a fix's travel may fall between two fixes.
    edges = np.flatnonzero(np.diff(np.concatenate(([1], shared.astype(np.int8), [1]))))
    for a, b in zip(edges[::2], edges[1::2], strict=True):
        if (b - a) * step_m < skip_m:
            shared[a:b] = True
    refused = np.zeros(len(s))
    later = False
    for k in range(len(s) - 1, -1, -1):
        later = bool(ambiguous[k] or (shared[k] and later))
        refused[k] = later
    return refused


def placeable_start(refused: FloatArray, s_m: float, skip_m: float, step_m: float = 2.0) -> float:
    """`s_m`, or, when a refused start (`unplaceable_completions`) lies within a fix's travel
    (`skip_m`) ahead, where it moves back to: `skip_m` into the stretch driven once before the
    refused one, so the vehicle's first fixes land there and place it."""
    k = min(int(s_m // step_m), len(refused) - 1)
    ahead = refused[k : int((s_m + skip_m) // step_m) + 2]
    if not ahead.any():
        return s_m
    k += int(np.argmax(ahead > 0))
    while k > 0 and refused[k]:
        k -= 1
    return max(k * step_m - skip_m, 0.0)


def is_shared(flags: FloatArray, s_m: float, step_m: float = 2.0, reach_m: float = 0.0) -> bool:
    """Whether any point within `reach_m` of arc length `s_m` lies on a shared stretch."""
    lo = max(0, int((s_m - reach_m) // step_m))
    hi = min(len(flags), int((s_m + reach_m) // step_m) + 2)
    return bool(flags[lo:hi].any())


class ProcessorFrame:
    """A route as the processor measures it: its registered lon/lat line in the tangent plane at
    that line's centroid (the contract's definition of progress and length)."""

    def __init__(self, coords_lonlat: list[list[float]]) -> None:
        line = LineString(coords_lonlat)
        c = line.centroid
        self.projection = LocalProjection(c.x, c.y)
        self.line_m = self.projection.to_metric(line)
        self.length_m = float(self.line_m.length)

    def progress_m(self, lon: FloatArray, lat: FloatArray) -> FloatArray:
        x, y = self.projection.forward(lon, lat)
        return np.asarray(shapely.line_locate_point(self.line_m, shapely.points(x, y)), dtype=np.float64)


def eta_ms(
    ts_ms: FloatArray,
    progress_m: FloatArray,
    length_m: float,
    warmup_s: float,
    min_speed_kmh: float,
) -> FloatArray:
    """The contract's ETA for a trip whose first fix is the first element: now + remaining distance
    at the trip's average speed so far (floored), NaN before the warm-up."""
    t0, p0 = ts_ms[0], progress_m[0]
    elapsed = ts_ms - t0
    speed = np.maximum((progress_m - p0) / np.maximum(elapsed, 1.0), min_speed_kmh / 3600.0)
    eta = ts_ms + (length_m - progress_m) / speed
    return np.where(elapsed >= warmup_s * 1000.0, eta, np.nan)


def plan_schedule(
    eta: FloatArray, risk_s: float, hysteresis_s: float, min_drop_s: float = 60.0
) -> int | None:
    """A planned arrival that puts the trip at risk at its first ETA and back on time later, at a
    fix whose delay crosses the back-on-time threshold half a fix's change clear of it, with every
    ETA of the trip clear of both thresholds; None when the track allows no such plan.

    The trip starts late (held at its start), so its first ETAs are far too late and fall as its
    average speed recovers: the drop is what makes both alerts happen.
    """
    known = np.flatnonzero(~np.isnan(eta))
    if len(known) < 3:
        return None
    first = float(eta[known[0]])
    back = risk_s - hysteresis_s
    for j in range(1, len(known)):
        prev, cur = float(eta[known[j - 1]]), float(eta[known[j]])
        if (first - prev) / 1000 > hysteresis_s + min_drop_s and prev - cur >= 4 * ETA_MARGIN_S * 1000:
            planned = round((prev + cur) / 2 - back * 1000)
            delay_s = (eta[known] - planned) / 1000.0
            if (
                np.abs(delay_s - risk_s).min() >= ETA_MARGIN_S
                and np.abs(delay_s - back).min() >= ETA_MARGIN_S
            ):
                return int(planned)
            return None
    return None
