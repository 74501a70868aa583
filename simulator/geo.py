"""Metric geometry of the simulated city: arc-length maths on polylines (the projection is
`fleetfence.geo.LocalProjection`, shared with the processor).

Pure functions, no I/O. The simulator plans in metres (kinematics, corridor margins, zone edges)
and only converts to lon/lat at the end. The projection is equirectangular, i.e. an affine map of
lon/lat: straight lines stay straight and "inside a polygon" does not change between the two frames,
so a rectangle drawn in metres is tested identically by anyone who tests it in lon/lat.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]


@dataclass(frozen=True)
class Polyline:
    """A route in metres with its cumulative arc length, for vectorized position look-ups."""

    x: FloatArray
    y: FloatArray
    cum_m: FloatArray  # arc length at each vertex, cum_m[0] == 0
    ux: FloatArray  # unit direction of each segment
    uy: FloatArray

    @staticmethod
    def of(x: FloatArray, y: FloatArray) -> Polyline:
        dx, dy = np.diff(x), np.diff(y)
        seg = np.hypot(dx, dy)
        keep = np.concatenate([[True], seg > 1e-6])  # drop repeated vertices
        x, y = x[keep], y[keep]
        dx, dy = np.diff(x), np.diff(y)
        seg = np.hypot(dx, dy)
        return Polyline(x, y, np.concatenate([[0.0], np.cumsum(seg)]), dx / seg, dy / seg)

    @property
    def length_m(self) -> float:
        return float(self.cum_m[-1])

    def segment_of(self, s: FloatArray) -> IntArray:
        idx = np.searchsorted(self.cum_m, s, side="right") - 1
        return np.clip(idx, 0, len(self.ux) - 1).astype(np.int64)

    def at(self, s: FloatArray) -> tuple[FloatArray, FloatArray, FloatArray, FloatArray]:
        """Position and unit tangent at arc lengths `s` (clipped to the line)."""
        s = np.clip(s, 0.0, self.length_m)
        seg = self.segment_of(s)
        return np.interp(s, self.cum_m, self.x), np.interp(s, self.cum_m, self.y), self.ux[seg], self.uy[seg]


def clip_radius(dx: FloatArray, dy: FloatArray, bound_m: float) -> tuple[FloatArray, FloatArray]:
    """Scale vectors longer than `bound_m` back onto the circle: GPS noise with a hard bound."""
    r = np.hypot(dx, dy)
    scale = np.where(r > bound_m, bound_m / np.maximum(r, 1e-12), 1.0)
    return dx * scale, dy * scale
