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

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

# Zone kinds where stopping is the plan unless the zone says otherwise (its `planned_stop`): no
# UNPLANNED_STOP inside them. Read by the processor and by the simulator's ground truth.
STOP_ZONE_KINDS = frozenset({"depot", "customer", "rest_area"})


def _off_or(value: Any) -> float:
    """A threshold that a route may switch off with null: off is infinity, which no fact reaches."""
    if value is None:
        return math.inf
    return float(value)


@dataclass(frozen=True)
class RouteRules:
    """The per-route rules of the state machine (processor-wide ones are `ProcessorRules`).

    corridor_width_m is the full width (half each side of the line); a deviation is confirmed after
    `deviation_min_fixes` fixes outside spanning at least `deviation_min_s`; overspeed after
    `overspeed_min_s` above `speed_limit_kmh`; a vehicle is silent after `silent_after_s` without a
    fix. Read as class attributes, the defaulted fields give their defaults.

    Route awareness (docs/contracts.md has each alert):
    - wrong way once progress along the route has gone back by `wrong_way_min_m` from its highest
      point, over >= `wrong_way_min_fixes` fixes and >= `wrong_way_min_s`; restored by the same
      amount forward. A distance, not a count of backward steps: GPS jitter at a standstill moves
      progress back and forth by a few metres, never by the threshold.
    - an unplanned stop after `stop_min_s` at <= `stop_speed_kmh` within `stop_radius_m` of where
      the stop began, outside any zone marked as a stop;
    - arrival at risk once the ETA is later than the planned arrival by more than `arrival_risk_s`;
      a route's `planned_duration_s` gives the planned arrival of a trip whose assignment has none;
    - completed at the first fix in the corridor within `completion_radius_m` of the route's end,
      past half its length (a loop's end is also its start).
    `wrong_way_min_m`, `stop_min_s` and `arrival_risk_s` set to null in master data switch their
    rule off (stored here as infinity, which no fact reaches).
    """

    corridor_width_m: float
    speed_limit_kmh: float
    deviation_min_fixes: int = 3
    deviation_min_s: float = 0.0
    overspeed_min_s: float = 10.0
    silent_after_s: float = 120.0
    wrong_way_min_m: float = 100.0
    wrong_way_min_fixes: int = 3
    wrong_way_min_s: float = 5.0
    stop_min_s: float = 300.0
    stop_speed_kmh: float = 3.0
    stop_radius_m: float = 50.0
    arrival_risk_s: float = 600.0
    planned_duration_s: float = math.inf
    completion_radius_m: float = 50.0

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
            wrong_way_min_m=_off_or(data.get("wrong_way_min_m", cls.wrong_way_min_m)),
            wrong_way_min_fixes=int(data.get("wrong_way_min_fixes", cls.wrong_way_min_fixes)),
            wrong_way_min_s=float(data.get("wrong_way_min_s", cls.wrong_way_min_s)),
            stop_min_s=_off_or(data.get("stop_min_s", cls.stop_min_s)),
            stop_speed_kmh=float(data.get("stop_speed_kmh", cls.stop_speed_kmh)),
            stop_radius_m=float(data.get("stop_radius_m", cls.stop_radius_m)),
            arrival_risk_s=_off_or(data.get("arrival_risk_s", cls.arrival_risk_s)),
            planned_duration_s=_off_or(data.get("planned_duration_s")),
            completion_radius_m=float(data.get("completion_radius_m", cls.completion_radius_m)),
        )

    def to_master(self) -> dict[str, Any]:
        """The rule fields of a route's master-data record: `from_master`'s inverse (a rule that is
        off, stored as infinity, is written as null)."""
        return {k: (None if isinstance(v, float) and math.isinf(v) else v) for k, v in self.__dict__.items()}


@dataclass(frozen=True)
class ProcessorRules:
    """Processor-wide rules, the defaults of `FLEETFENCE_PROCESSOR_*`: the processor's engine applies
    them under these names (`processor.domain.EngineConfig` is one of them), the variables are read
    into them in one place (`fleetfence.settings.ProcessorRulesSettings`), and the simulator's ground
    truth assumes them, as it must predict exactly what the processor will decide.

    hysteresis_m: the spatial band that stops GPS jitter from making alerts flap (a vehicle is back
    on route only inside the corridor narrowed by it; leaves a zone only outside the zone grown by
    it); return_min_fixes: fixes back inside before ROUTE_RETURN; overspeed_hysteresis_kmh: below
    the limit by this much to end an overspeed; lateness_ms: the event-time bound of waiting for a
    missing fix; late_bound_ms: how far behind the watermark a fix may arrive and still be applied
    (a tracker stores its fixes through hours without coverage and uploads them later), beyond it
    the fix is dead-lettered with reason `late`; default_silent_after_s: silence threshold of a
    vehicle without a route; stop_hysteresis_kmh: a confirmed stop ends only above the route's stop
    speed plus this (or once the vehicle leaves the stop radius grown by hysteresis_m);
    arrival_hysteresis_s: a trip at risk is back on time only once the ETA's delay is this much
    below the route's threshold; eta_warmup_s: no ETA (and no arrival alert) before a trip has run
    this long, when its average speed says nothing yet; eta_min_speed_kmh: the floor of the speed an
    ETA assumes (a vehicle standing still would otherwise arrive never).
    """

    hysteresis_m: float = 15.0
    return_min_fixes: int = 2
    overspeed_hysteresis_kmh: float = 5.0
    lateness_ms: int = 10_000
    late_bound_ms: int = 6 * 3600 * 1000
    default_silent_after_s: float = 120.0
    stop_hysteresis_kmh: float = 5.0
    arrival_hysteresis_s: float = 120.0
    eta_warmup_s: float = 60.0
    eta_min_speed_kmh: float = 5.0
