"""The geofencing rules: the one definition of their fields and defaults.

`RouteRules` are per route (master data); `ProcessorRules` are processor-wide
(`FLEETFENCE_PROCESSOR_*`), and the simulator's ground truth must assume the same ones.

The admin API validates them (`vehicle_master.models.RouteProps` takes its defaults from here), the
processor applies them (`processor.geometry.compile_route` reads master data through
`RouteRules.from_master`), the simulator's ground truth predicts with them, and the map shows them
(it reads the defaults from the API's OpenAPI schema). A default changed here changes for all of
them at once; a default spelled in two places would let the truth and the processor disagree.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class RouteRules:
    """The per-route rules of the state machine (processor-wide ones live in its EngineConfig).

    corridor_width_m is the full width (half each side of the line); a deviation is confirmed after
    `deviation_min_fixes` fixes outside spanning at least `deviation_min_s`; overspeed after
    `overspeed_min_s` above `speed_limit_kmh`; a vehicle is silent after `silent_after_s` without a
    fix. Read as class attributes, the defaulted fields give their defaults.
    """

    corridor_width_m: float
    speed_limit_kmh: float
    deviation_min_fixes: int = 3
    deviation_min_s: float = 0.0
    overspeed_min_s: float = 10.0
    silent_after_s: float = 120.0

    @classmethod
    def from_master(cls, data: Mapping[str, Any]) -> RouteRules:
        """The rules of a route's master-data record (`fleet.master`, entity `route`); fields an
        older record lacks take today's defaults."""
        return cls(
            corridor_width_m=float(data["corridor_width_m"]),
            speed_limit_kmh=float(data["speed_limit_kmh"]),
            deviation_min_fixes=int(data.get("deviation_min_fixes", cls.deviation_min_fixes)),
            deviation_min_s=float(data.get("deviation_min_s", cls.deviation_min_s)),
            overspeed_min_s=float(data.get("overspeed_min_s", cls.overspeed_min_s)),
            silent_after_s=float(data.get("silent_after_s", cls.silent_after_s)),
        )


@dataclass(frozen=True)
class ProcessorRules:
    """Processor-wide rules, the defaults of `FLEETFENCE_PROCESSOR_*`: the processor's settings and
    its engine take them from here, and so does the simulator's ground truth, which must predict
    exactly what the processor will decide.

    hysteresis_m: the spatial band that stops GPS jitter from making alerts flap (a vehicle is back
    on route only inside the corridor narrowed by it; leaves a zone only outside the zone grown by
    it); return_min_fixes: fixes back inside before ROUTE_RETURN; overspeed_hysteresis_kmh: below
    the limit by this much to end an overspeed; lateness_ms: the event-time bound of waiting for a
    missing fix; late_bound_ms: how far behind the watermark a fix may arrive and still be applied
    (a tracker stores its fixes through hours without coverage and uploads them later), beyond it
    the fix is dead-lettered with reason `late`; default_silent_after_s: silence threshold of a
    vehicle without a route.
    """

    hysteresis_m: float = 15.0
    return_min_fixes: int = 2
    overspeed_hysteresis_kmh: float = 5.0
    lateness_ms: int = 10_000
    late_bound_ms: int = 6 * 3600 * 1000
    default_silent_after_s: float = 120.0
