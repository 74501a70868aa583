"""Master data as the processor sees it: routes, zones, assignments and vehicles as of a batch,
and their compiled geometry. Pure, no I/O.

`MasterState` is folded from `fleet.master` change events (newest version wins, deletes leave a
tombstone) and kept in Spark's state store; `Catalog` compiles each (id, version) once per worker,
which is safe because a version never changes.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from processor.core.domain import EngineConfig
from processor.core.geometry import CompiledRoute, RouteSetIndex, compile_route
from processor.core.zones import CompiledZone, ZoneIndex, compile_zone


def takes_effect_ms(event: dict[str, Any]) -> int:
    """The event time from which a `fleet.master` change applies to fixes: its own event time, or an
    assignment's `valid_from_ms` when that is earlier (a backfill, or a day of store-and-forward
    uploads assigned afterwards: the operator means the assignment's valid time). The live processor
    applies the newest assignment to every fix it reads after the change whose event time is in the
    assignment's window, earlier ones included; the reports and the restatement apply each version
    from this moment (docs/reports.md, "Master data as of each fix"), so all three agree on the
    fixes the live processor reads after the change. A version ends where the next one takes
    effect."""
    at = int(event["event_ts_ms"])
    data = event.get("data")
    if event.get("entity") == "assignment" and event.get("op") != "delete" and isinstance(data, dict):
        valid_from = data.get("valid_from_ms")
        if isinstance(valid_from, int) and not isinstance(valid_from, bool):
            return min(at, valid_from)
    return at


@dataclass
class MasterState:
    """Routes, zones and assignments as of the current batch, with their versions.

    Deleted entities keep a tombstone (`data=None`) so a re-sent older version is still ignored.
    """

    routes: dict[str, tuple[int, dict[str, Any] | None]] = field(default_factory=dict)
    zones: dict[str, tuple[int, dict[str, Any] | None]] = field(default_factory=dict)
    assignments: dict[str, tuple[int, dict[str, Any] | None]] = field(default_factory=dict)
    vehicles: dict[str, tuple[int, dict[str, Any] | None]] = field(default_factory=dict)

    @staticmethod
    def of(events: Iterable[dict[str, Any]]) -> MasterState:
        """The state these `fleet.master` change events fold into, in order."""
        m = MasterState()
        for e in events:
            m.apply(e)
        return m

    def apply(self, event: dict[str, Any]) -> bool:
        """Apply one `fleet.master` change event; False when it is stale or unknown."""
        table = {
            "route": self.routes,
            "zone": self.zones,
            "assignment": self.assignments,
            "vehicle": self.vehicles,
        }.get(event.get("entity", ""))
        if table is None:
            return False
        key, version = str(event["id"]), int(event["version"])
        current = table.get(key)
        if current is not None and current[0] >= version:
            return False
        table[key] = (version, None if event.get("op") == "delete" else event.get("data"))
        return True

    def zone_key(self) -> tuple[tuple[str, int], ...]:
        return tuple(sorted((z, v) for z, (v, d) in self.zones.items() if d is not None))


class Catalog:
    """Compiled geometry cached by (id, version): immutable, so caching keeps replays deterministic."""

    def __init__(self, cfg: EngineConfig) -> None:
        self.cfg = cfg
        self._routes: dict[tuple[str, int], CompiledRoute] = {}
        self._zone_index: tuple[tuple[tuple[str, int], ...], ZoneIndex] | None = None
        self._zones: dict[tuple[str, int], CompiledZone] = {}
        self._route_set: tuple[int, RouteSetIndex] | None = None

    def route(self, route_id: str, version: int, data: dict[str, Any]) -> CompiledRoute:
        key = (route_id, version)
        r = self._routes.get(key)
        if r is None:
            r = compile_route(route_id, version, data, self.cfg.hysteresis_m)
            self._routes[key] = r
        return r

    def route_set(self) -> RouteSetIndex:
        """One R-tree over the segments of every route version compiled here (`route_progress`),
        rebuilt only when a route was compiled since: a worker compiles its fleet's routes in its
        first batches, and a batch then finds every pass of every fix with one query."""
        if self._route_set is None or self._route_set[0] != len(self._routes):
            self._route_set = (len(self._routes), RouteSetIndex.of(self._routes.values()))
        return self._route_set[1]

    def zone_index(self, master: MasterState) -> ZoneIndex:
        key = master.zone_key()
        if self._zone_index is None or self._zone_index[0] != key:
            zones = []
            for zid, (v, data) in master.zones.items():
                if data is None:
                    continue
                z = self._zones.get((zid, v))
                if z is None:
                    z = compile_zone(zid, v, data, self.cfg.hysteresis_m)
                    self._zones[(zid, v)] = z
                zones.append(z)
            self._zone_index = (key, ZoneIndex.build(zones))
        return self._zone_index[1]


def compiled_route(master: MasterState, catalog: Catalog, route_id: str | None) -> CompiledRoute | None:
    if route_id is None:
        return None
    entry = master.routes.get(route_id)
    if entry is None or entry[1] is None:
        return None
    return catalog.route(route_id, entry[0], entry[1])


def assignment_ms(data: dict[str, Any], key: str) -> int:
    """An optional time of an assignment (its planned departure or arrival), -1 when it has none."""
    v = data.get(key)
    return -1 if v is None else int(v)
