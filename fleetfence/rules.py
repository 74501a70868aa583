"""The geofencing rules: the one definition of their fields and defaults.

`RouteRules` are per route (master data); `ProcessorRules` are processor-wide
(`FLEETFENCE_PROCESSOR_*`), and the simulator's ground truth must assume the same ones; so is
`ProximityRule`, vehicle proximity's rules (`FLEETFENCE_PROCESSOR_PROXIMITY_*`, applied by
processor.core.proximity, assumed by simulator.truth_proximity), each for the fleet, a route or a
fleet group (`ProximityScope`).

The admin API validates them (`vehicle_master.models.RouteProps` is built from `RouteRules`' fields
and their `RuleSpec`), the processor applies them (`processor.core.geometry.compile_route` reads master
data through `RouteRules.from_master`), the simulator's ground truth predicts with them, and the
map's route form offers them (it reads the rules, their words and defaults from the API's OpenAPI
schema). A default changed here changes for all of
them at once; a default spelled in two places would let the truth and the processor disagree.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import MISSING, Field, dataclass, field, fields
from typing import Any

# Zone kinds where stopping is the plan unless the zone says otherwise (its `planned_stop`): no
# UNPLANNED_STOP inside them. Read by the processor and by the simulator's ground truth.
STOP_ZONE_KINDS = frozenset({"depot", "customer", "rest_area"})


def _off_or(value: Any) -> float:
    """A threshold that a route may switch off with null: off is infinity, which no fact reaches."""
    if value is None:
        return math.inf
    return float(value)


# A rule's value from master data by its field's annotation (the module's annotations are strings).
_KINDS: dict[Any, type[int] | type[float]] = {"int": int, "float": float}


@dataclass(frozen=True)
class RuleSpec:
    """What a route rule's value may be, and its words: the bounds the admin API validates
    (`gt`/`ge` and `le`, sanity caps that keep absurd numbers out of the processor), whether null
    switches it off (`off`: stored here as infinity), whether it belongs to the trip along the
    route (`trip`: the route form groups them), the route form's label (`title`) and the API
    schema's explanation (`about`)."""

    title: str
    le: float
    gt: float | None = None
    ge: float | None = None
    off: bool = False
    trip: bool = False
    about: str | None = None


def _spec(title: str, *, le: float, **kw: Any) -> dict[str, RuleSpec]:
    return {"spec": RuleSpec(title, le, **kw)}


def spec_of(f: Field[Any]) -> RuleSpec:
    """The `RuleSpec` of one of `RouteRules`' fields."""
    spec: RuleSpec = f.metadata["spec"]
    return spec


@dataclass(frozen=True)
class RouteRules:
    """The per-route rules of the state machine (processor-wide ones are `ProcessorRules`).

    corridor_width_m is the full width (half each side of the line); a deviation is confirmed after
    `deviation_min_fixes` fixes outside spanning at least `deviation_min_s`; overspeed after
    `overspeed_min_s` above `speed_limit_kmh`; a vehicle is silent after `silent_after_s` without a
    fix. Read as class attributes, the defaulted fields give their defaults. Each field carries its
    `RuleSpec` (bounds, the route form's words): `vehicle_master.models.RouteProps`, and through
    the API's schema the map's route form, are built from these fields, so a rule is added here only.

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

    corridor_width_m: float = field(
        metadata=_spec(
            "Corridor width (m, full width)", gt=0, le=100_000, about="Full corridor width (half each side)."
        )
    )
    speed_limit_kmh: float = field(metadata=_spec("Speed limit (km/h)", gt=0, le=1000))
    deviation_min_fixes: int = field(
        default=3, metadata=_spec("Deviation after N fixes outside", ge=1, le=100_000)
    )
    deviation_min_s: float = field(default=0.0, metadata=_spec("…and at least (s)", ge=0, le=86_400))
    overspeed_min_s: float = field(default=10.0, metadata=_spec("Speeding alert after (s)", ge=0, le=86_400))
    silent_after_s: float = field(default=120.0, metadata=_spec("Silent after (s)", gt=0, le=7 * 86_400))
    wrong_way_min_m: float = field(
        default=100.0,
        metadata=_spec(
            "Wrong way after going back (m, empty: off)",
            gt=0,
            le=100_000,
            off=True,
            trip=True,
            about="Progress lost from its highest point before WRONG_DIRECTION (null: off).",
        ),
    )
    wrong_way_min_fixes: int = field(
        default=3,
        metadata=_spec(
            "Wrong way over at least N fixes",
            ge=1,
            le=100_000,
            trip=True,
            about="Fixes going back before WRONG_DIRECTION.",
        ),
    )
    wrong_way_min_s: float = field(
        default=5.0,
        metadata=_spec(
            "Wrong way over at least (s)",
            ge=0,
            le=86_400,
            trip=True,
            about="Seconds going back before WRONG_DIRECTION.",
        ),
    )
    stop_min_s: float = field(
        default=300.0,
        metadata=_spec(
            "Unplanned stop after (s, empty: off)",
            gt=0,
            le=7 * 86_400,
            off=True,
            trip=True,
            about="Standing still this long outside a stop zone raises UNPLANNED_STOP (null: off).",
        ),
    )
    stop_speed_kmh: float = field(
        default=3.0,
        metadata=_spec(
            "Stopped below (km/h)",
            ge=0,
            le=50,
            trip=True,
            about="At or below this speed (km/h) a vehicle stands.",
        ),
    )
    stop_radius_m: float = field(
        default=50.0,
        metadata=_spec(
            "Stopped within (m)", gt=0, le=10_000, trip=True, about="A stop stays within this many metres."
        ),
    )
    arrival_risk_s: float = field(
        default=600.0,
        metadata=_spec(
            "Arrival at risk when late by (s, empty: off)",
            ge=0,
            le=7 * 86_400,
            off=True,
            trip=True,
            about="ETA later than planned arrival by more than this: ARRIVAL_AT_RISK (null: off).",
        ),
    )
    planned_duration_s: float = field(
        default=math.inf,
        metadata=_spec(
            "Planned trip time (s, optional)",
            gt=0,
            le=30 * 86_400,
            off=True,
            trip=True,
            about="Planned trip time: the planned arrival of an assignment that gives none.",
        ),
    )
    completion_radius_m: float = field(
        default=50.0,
        metadata=_spec(
            "Completed within (m of the end)",
            gt=0,
            le=100_000,
            trip=True,
            about="Within this many metres of the route's end (past half of it): ROUTE_COMPLETED.",
        ),
    )

    @classmethod
    def from_master(cls, data: Mapping[str, Any]) -> RouteRules:
        """The rules of a route's master-data record (`fleet.master`, entity `route`); fields an
        older record lacks take today's defaults, and a rule that may be off is off when null."""
        values: dict[str, Any] = {}
        for f in fields(cls):
            raw = data[f.name] if f.default is MISSING else data.get(f.name, f.default)
            values[f.name] = _off_or(raw) if spec_of(f).off else _KINDS[f.type](raw)
        return cls(**values)

    def to_master(self) -> dict[str, Any]:
        """The rule fields of a route's master-data record: `from_master`'s inverse (a rule that is
        off, stored as infinity, is written as null)."""
        return {k: (None if isinstance(v, float) and math.isinf(v) else v) for k, v in self.__dict__.items()}


@dataclass(frozen=True)
class ProcessorRules:
    """Processor-wide rules, the defaults of `FLEETFENCE_PROCESSOR_*`: the processor's engine applies
    them under these names (`processor.core.domain.EngineConfig` is one of them), the variables are read
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


# The speed (m/s, 144 km/h) of each of two vehicles driving apart within the rule's tolerance that
# the cells still report meetings for (`ProximityRule.watch_m`).
WATCH_SPEED_MPS = 40.0
MAX_EXIT_M = 5_000.0
# The vehicle attribute (vehicle master: `attributes`) that names a vehicle's fleet group.
GROUP_ATTRIBUTE = "group"
# What a proximity rule's id may be (it is in every pair alert's id and open condition).
PROXIMITY_RULE_ID_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")  # whole id: `fullmatch`


@dataclass(frozen=True, slots=True)
class ProximityScope:
    """Which vehicles a proximity rule compares: the whole fleet (neither set); those assigned to
    `route_id` (an assignment valid at the fix's event time); or a fleet group, the vehicles whose
    attribute GROUP_ATTRIBUTE is `group`. Both vehicles of a pair must be in it: a convoy rule for
    one route does not fire for a vehicle of another route passing the convoy. Read from the vehicle
    master's data as of the batch (processor.core.proximity_members)."""

    route_id: str | None = None
    group: str | None = None

    def __post_init__(self) -> None:
        if self.route_id is not None and self.group is not None:
            raise ValueError("a proximity rule is for a route or for a fleet group, not both")
        if self.route_id == "" or self.group == "":
            raise ValueError("a proximity rule's route_id or group is never empty")

    @property
    def fleet(self) -> bool:
        return self.route_id is None and self.group is None

    def __str__(self) -> str:
        if self.route_id is not None:
            return f"route {self.route_id}"
        return "the fleet" if self.group is None else f"group {self.group}"


@dataclass(frozen=True, slots=True)
class ProximityRule:
    """One proximity rule: when two vehicles count as near, and for how long.

    `enter_m` < `exit_m` is the hysteresis band; a meeting compares two fixes at most `tolerance_ms`
    apart in event time (the vehicles report at their own moments); `min_duration_ms` of continuous
    nearness before PROXIMITY_ENTER (two trucks passing each other at a junction are not a meeting);
    `lost_after_ms` without a meeting ends an open one. Deliberately no defaults: the distances are
    the operator's policy, spelled where the rule is configured. `scope`: which vehicles it
    compares (the fleet unless a route or a group is named)."""

    rule_id: str
    enter_m: float
    exit_m: float
    min_duration_ms: int
    tolerance_ms: int
    lost_after_ms: int
    scope: ProximityScope = ProximityScope()

    def __post_init__(self) -> None:
        if not PROXIMITY_RULE_ID_RE.fullmatch(self.rule_id):
            raise ValueError(
                f"proximity rule id {self.rule_id!r}: letters, digits, '_', '.', '-', at most 64 "
                "(no ':': a pair alert's id joins the rule, the other vehicle and a time with it)"
            )
        if not 0 < self.enter_m < self.exit_m <= MAX_EXIT_M:
            raise ValueError(
                f"proximity rule {self.rule_id!r}: needs 0 < enter_m < exit_m <= {MAX_EXIT_M:g} "
                f"(got {self.enter_m:g} and {self.exit_m:g})"
            )
        if self.min_duration_ms < 0 or self.tolerance_ms < 0:
            raise ValueError(f"proximity rule {self.rule_id!r}: durations are never negative")
        if self.lost_after_ms <= self.tolerance_ms:
            raise ValueError(
                f"proximity rule {self.rule_id!r}: lost_after_ms must exceed tolerance_ms, or a "
                "meeting could be lost between two fixes that still match"
            )

    @property
    def watch_m(self) -> float:
        """How far apart a meeting may be and still be reported by the cells (and be the one of its
        moment the pair stage takes): the exit distance and what two vehicles driving apart at
        WATCH_SPEED_MPS each can add within the tolerance. Farther meetings change nothing for a
        pair that is not near (most of them: vehicles in neighbouring cells); a near pair parting
        faster than that between two of its moments is not seen apart, and ends as `lost` when
        its deadline passes."""
        return self.exit_m + 2 * WATCH_SPEED_MPS * self.tolerance_ms / 1000


def proximity_rule_set(rules: tuple[ProximityRule, ...]) -> tuple[ProximityRule, ...]:
    """`rules` as a processor runs them: each id once (an id is in every alert's id and keys its
    pairs' state)."""
    ids = [r.rule_id for r in rules]
    if len(set(ids)) != len(ids):
        raise ValueError(f"proximity rule ids must differ: {ids}")
    return rules
