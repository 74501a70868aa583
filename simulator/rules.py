"""The rules registered on every simulated route, apart from `simulator.config` so that the CLI can
show them as its options' defaults without loading the simulator's geometry (numpy, shapely)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from fleetfence.rules import RouteRules

# A 100 m corridor at 50 km/h, a stop confirmed after 45 s (so the dwells of a ten-minute run show
# both planned and unplanned stops) and a wrong way after 60 m; the rest at `RouteRules`' own defaults.
SIMULATED_RULES = RouteRules(
    corridor_width_m=100.0, speed_limit_kmh=50.0, stop_min_s=45.0, wrong_way_min_m=60.0
)


def simulated_rules(**overrides: Any) -> RouteRules:
    """The rules registered on every simulated route (docs/contracts.md, fleet.master):
    `SIMULATED_RULES` with `overrides`."""
    return replace(SIMULATED_RULES, **overrides) if overrides else SIMULATED_RULES
