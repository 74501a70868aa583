"""Which vehicles each proximity rule compares (`fleetfence.rules.ProximityScope`): the whole
fleet, the vehicles assigned to a route, or a fleet group (the vehicle attribute GROUP_ATTRIBUTE).
Pure, no I/O.

The proximity query reads the vehicle master's change events (`fleet.master`) beside the
telemetry, and each bucket of cells folds the vehicles and assignments among them (`Members`,
newest version wins, as the job's `MasterState`). A fix enters a rule's window of the bucket only
when its vehicle is in the rule's scope at the fix's event time, as the bucket knows it in the
batch the fix arrives in (`admitted`): the vehicle master's data reaches the query through Kafka in
offset order, so a replayed batch judges the same. A route's scope follows the assignment's
validity as the job does (from inclusive, to exclusive).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from fleetfence.rules import GROUP_ATTRIBUTE, ProximityRule
from processor.core.master import MasterState

# The master data's entities a scope reads; routes and zones (most of the topic's bytes) are not kept.
SCOPE_ENTITIES = frozenset({"vehicle", "assignment"})
# Of an assignment, what a route's scope reads.
_ASSIGNMENT_FIELDS = ("route_id", "valid_from_ms", "valid_to_ms")


def scope_event(event: Any) -> bool:
    """Whether `event` is a vehicle's or an assignment's change event that `Members` can fold (an
    entity id and an integer version, as the job's `MasterState` reads them; an upsert's data an
    object): anything else on the master topic is the job's to log, and a record that cannot be
    folded must not fail the query at every restart (the topic is read from its start)."""
    if not (isinstance(event, dict) and event.get("entity") in SCOPE_ENTITIES):
        return False
    try:
        int(event["version"])
        str(event["id"])
    except (KeyError, TypeError, ValueError):
        return False
    return event.get("op") == "delete" or isinstance(event.get("data"), dict | None)


@dataclass
class Members:
    """The vehicles and assignments a bucket of cells knows, with their versions (`MasterState`'s
    tables, the others left empty), and of each only what a scope reads (a vehicle's group, an
    assignment's route and validity): every bucket of cells holds a copy."""

    master: MasterState = field(default_factory=MasterState)
    _table: pd.DataFrame | None = field(default=None, init=False, repr=False, compare=False)

    def apply(self, event: dict[str, Any]) -> bool:
        """Fold one `fleet.master` change event; False when it changes nothing here (another
        entity, malformed, or stale)."""
        if not scope_event(event):
            return False
        data = event.get("data")
        if event.get("op") == "delete":
            data = None
        elif data is not None:
            if event["entity"] == "vehicle":
                attributes = data.get("attributes")
                group = attributes.get(GROUP_ATTRIBUTE) if isinstance(attributes, dict) else None
                data = {"attributes": {GROUP_ATTRIBUTE: group}} if isinstance(group, str) else {}
            else:
                data = {f: data.get(f) for f in _ASSIGNMENT_FIELDS}
        if not self.master.apply({**event, "data": data}):
            return False
        self._table = None  # `_lookup` is of the data before
        return True

    def apply_all(self, events: Iterable[dict[str, Any]]) -> bool:
        changed = False
        for e in events:
            changed |= self.apply(e)
        return changed

    def admitted(self, rule: ProximityRule, vehicle_id: np.ndarray, ts_ms: np.ndarray) -> np.ndarray:
        """For each fix (its vehicle and event time), whether `rule` compares it: always for the
        fleet; else when the vehicle is in the rule's route or group at that time. A vehicle the
        master data does not know (yet) is in no route and no group. In columns: the fixes' rows in
        `_lookup`, one hashed pass."""
        n = len(vehicle_id)
        scope = rule.scope
        if scope.fleet:
            return np.ones(n, bool)
        if not n:
            return np.zeros(0, bool)
        t = self._lookup()
        if t.empty:
            return np.zeros(n, bool)
        rows = t.index.get_indexer(pd.Index(np.asarray(vehicle_id, object)))
        known = rows >= 0
        rows = np.where(known, rows, 0)  # unknown vehicles: any row, masked out by `known`
        if scope.group is not None:
            in_group: np.ndarray = known & (t["group"].to_numpy()[rows] == scope.group)
            return in_group
        ts = np.asarray(ts_ms, np.int64)
        admitted: np.ndarray = (
            known
            & (t["route_id"].to_numpy()[rows] == scope.route_id)
            & (ts >= t["valid_from_ms"].to_numpy()[rows])
            & (ts < t["valid_to_ms"].to_numpy()[rows])
        )
        return admitted

    def _lookup(self) -> pd.DataFrame:
        """Each known vehicle's group, route and validity (a validity that is no time: never on
        the route), built once per version of the data (`apply` drops it): `admitted` runs on every
        batch of every bucket of cells, the data changes rarely."""
        if self._table is not None:
            return self._table
        never = np.iinfo(np.int64).max
        ids = sorted(set(self.master.vehicles) | set(self.master.assignments))
        group: list[object] = []
        route: list[object] = []
        start: list[int] = []
        end: list[int] = []
        for v in ids:
            entry = self.master.vehicles.get(v)
            attributes = (entry[1] or {}).get("attributes") if entry else None
            group.append(attributes.get(GROUP_ATTRIBUTE) if isinstance(attributes, dict) else None)
            entry = self.master.assignments.get(v)
            data = entry[1] if entry else None
            valid = (never, never)  # no assignment, or a validity that is no time: never on a route
            if data:
                with contextlib.suppress(TypeError, ValueError):
                    to = data.get("valid_to_ms")
                    valid = (int(data.get("valid_from_ms") or 0), never if to is None else int(to))
            route.append(data.get("route_id") if data else None)
            start.append(valid[0])
            end.append(valid[1])
        self._table = pd.DataFrame(
            {
                "group": np.asarray(group, object),
                "route_id": np.asarray(route, object),
                "valid_from_ms": np.asarray(start, np.int64),
                "valid_to_ms": np.asarray(end, np.int64),
            },
            index=pd.Index(ids, dtype=object),
        )
        return self._table


def needs_members(rules: Iterable[ProximityRule]) -> bool:
    """Whether any rule has a scope narrower than the fleet (the fleet's needs no master data)."""
    return any(not r.scope.fleet for r in rules)
