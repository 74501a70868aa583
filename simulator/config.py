"""A simulation's configuration: the fleet, its routes and their rules, the behaviour and transport
faults injected, and the processor-wide rules the ground truth assumes.

`ScenarioConfig.validate` refuses a configuration whose truth would be ambiguous (GPS noise that
could cross the inner corridor band, a speed limit too low to cruise under with the hysteresis, a
silence threshold the allowed lateness could hide): the simulator only promises exact truth where
it can keep that promise.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from fleetfence.errors import ConfigError
from fleetfence.rules import ProcessorRules, ProximityRule, RouteRules, proximity_rule_set
from simulator.routes import DEFAULT_BBOX, EDGE_MARGIN_M
from simulator.rules import simulated_rules


@dataclass(frozen=True)
class Injections:
    """Behaviour: fraction of vehicles with one episode each. Faults: probability per message."""

    deviation: float = 0.1
    overspeed: float = 0.1
    dwell: float = 0.1
    silent: float = 0.05
    duplicate: float = 0.01
    out_of_order: float = 0.01
    late: float = 0.005
    # Route awareness: a stretch driven the wrong way and back; a trip with a planned
    # arrival that starts late (at risk) and catches up (back on time). Each such vehicle has no
    # other behaviour, so its episode can use its whole timeline.
    wrong_way: float = 0.05
    schedule: float = 0.05
    # Convoys: the fraction of vehicles that start close behind another vehicle of their route and
    # drift back from it (simulator.plan.CONVOY_GAP_M, CONVOY_DRIFT_MPS); at 0 no draw is made for it.
    convoy: float = 0.0


@dataclass(frozen=True)
class ScenarioConfig:
    vehicles: int = 10
    duration_s: float = 600.0
    rate_hz: float = 1.0
    seed: int = 1
    noise_sigma_m: float = 3.0
    noise_bound_sigmas: float = 3.0
    routes: int = 0  # 0: one per 25 vehicles, 1..20
    route_length_m: float = 8000.0
    zones_per_route: int = 2
    # The share of zones laid as circles (a Point with radius_m) instead of rectangles; at 0 no draw
    # is made for it, so a seed keeps the fleet and zones it had before circles existed.
    circle_zones: float = 0.0
    bbox: tuple[float, float, float, float] = DEFAULT_BBOX
    routes_geojson: Any | None = None
    rules: RouteRules = field(default_factory=simulated_rules)
    assume: ProcessorRules = field(default_factory=ProcessorRules)
    # The processor's proximity rules, if it runs any: the truth then has the pairs' alerts under
    # each (simulator.truth_proximity), and the transport faults leave the fixes that meet in order.
    proximity: tuple[ProximityRule, ...] = ()
    inject: Injections = field(default_factory=Injections)
    start_ms: int = 1_795_000_000_000
    vehicle_prefix: str = "sim-"
    stops_per_hour: float = 6.0

    @property
    def period_ms(self) -> int:
        return round(1000 / self.rate_hz)

    @property
    def n_ticks(self) -> int:
        return int(self.duration_s * 1000 // self.period_ms)

    @property
    def noise_bound_m(self) -> float:
        return self.noise_sigma_m * self.noise_bound_sigmas

    @property
    def n_routes(self) -> int:
        return self.routes or min(20, max(1, math.ceil(self.vehicles / 25)))

    @property
    def late_ticks(self) -> int:
        """A late fix arrives this many ticks after its time: 5 s beyond the allowed lateness."""
        return math.ceil((self.assume.lateness_ms + 5000) / self.period_ms)

    @property
    def excursion_m(self) -> float:
        return 3 * self.rules.corridor_width_m / 2 + 5 * self.noise_sigma_m

    def validate(self) -> None:
        half = self.rules.corridor_width_m / 2
        inner = max(half - self.assume.hysteresis_m, half / 2)
        if not 1 <= self.vehicles <= 1_000_000:
            raise ConfigError("vehicles must be between 1 and 1,000,000")
        if not 0.05 <= self.rate_hz <= 50:
            raise ConfigError("rate must be between 0.05 and 50 Hz")
        if self.n_ticks < 1:
            raise ConfigError("duration is shorter than one fix period")
        if self.noise_sigma_m < 0 or self.noise_bound_sigmas <= 0:
            raise ConfigError("noise sigma must be >= 0 and its bound > 0 sigmas")
        if self.noise_bound_m + EDGE_MARGIN_M > inner:
            raise ConfigError(
                f"noise bound {self.noise_bound_m:.1f} m does not fit in the inner corridor band "
                f"({inner:.1f} m): the truth would be ambiguous; lower --noise or widen the corridor"
            )
        if self.rules.speed_limit_kmh - self.assume.overspeed_hysteresis_kmh < 15:
            raise ConfigError("speed limit too low to cruise below it with the hysteresis")
        late_ms = self.late_ticks * self.period_ms
        if self.rules.silent_after_s * 1000 <= 2 * (self.assume.lateness_ms + late_ms):
            raise ConfigError("silent_after_s must exceed twice (allowed lateness + late delay)")
        for name in (
            "deviation",
            "overspeed",
            "dwell",
            "silent",
            "duplicate",
            "out_of_order",
            "late",
            "wrong_way",
            "schedule",
            "convoy",
        ):
            p = getattr(self.inject, name)
            if not 0.0 <= p <= 1.0:
                raise ConfigError(f"injection {name} must be in [0, 1], got {p}")
        if not 0.0 <= self.circle_zones <= 1.0:
            raise ConfigError(f"circle_zones must be in [0, 1], got {self.circle_zones}")
        if self.inject.duplicate + self.inject.out_of_order + self.inject.late > 1.0:
            raise ConfigError("fault probabilities add up to more than 1")
        if self.inject.wrong_way + self.inject.schedule > 1.0:
            raise ConfigError("wrong_way and schedule pick disjoint vehicles: they add up to more than 1")
        try:
            proximity_rule_set(self.proximity)
        except ValueError as exc:
            raise ConfigError(str(exc)) from exc
        for rule in self.proximity:
            if rule.tolerance_ms >= self.period_ms:
                raise ConfigError(
                    f"the proximity truth needs rule {rule.rule_id}'s tolerance shorter than the fix "
                    "period (a meeting of two fixes of one tick): lower the tolerance or the rate"
                )
            if rule.watch_m > 2 * rule.exit_m:
                raise ConfigError(
                    f"the proximity truth needs rule {rule.rule_id}'s watch distance (exit + 80 m per "
                    "second of tolerance) within twice the exit distance, where the cells surely "
                    "report a meeting"
                )
            if rule.lost_after_ms > self.rules.silent_after_s * 1000:
                raise ConfigError(
                    f"the proximity truth needs rule {rule.rule_id}'s lost_after within "
                    "silent_after_s, so that a pair lost to a silence is lost within the run"
                )
        stop_s = self.rules.stop_min_s
        if math.isfinite(stop_s) and stop_s < 10:
            raise ConfigError("stop_min_s below 10 s would confirm a stop at every traffic light")
