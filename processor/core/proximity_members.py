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

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

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
        return self.master.apply({**event, "data": data})

    def apply_all(self, events: Iterable[dict[str, Any]]) -> bool:
        changed = False
        for e in events:
            changed |= self.apply(e)
        return changed

    def admitted(self, rule: ProximityRule, vehicle_id: np.ndarray, ts_ms: np.ndarray) -> np.ndarray:
        """For each fix (its vehicle and event time), whether `rule` compares it: always for the
        fleet; else when the vehicle is in the rule's route or group at that time. A vehicle the
        master data does not know (yet) is in no route and no group."""
        n = len(vehicle_id)
        scope = rule.scope
        if scope.fleet:
            return np.ones(n, bool)
        if not n:
            return np.zeros(0, bool)
        ids, codes = np.unique(np.asarray(vehicle_id, object), return_inverse=True)
        if scope.group is not None:
            groups = [self._attributes(v).get(GROUP_ATTRIBUTE) for v in ids.tolist()]
            return np.array([g == scope.group for g in groups], bool)[codes]
        start = np.full(len(ids), np.iinfo(np.int64).max, np.int64)  # not on the route: never valid
        end = np.full(len(ids), np.iinfo(np.int64).max, np.int64)
        for k, v in enumerate(ids.tolist()):
            data = self._assignment(v)
            if data is None or data.get("route_id") != scope.route_id:
                continue
            try:
                start[k] = int(data.get("valid_from_ms") or 0)
                if data.get("valid_to_ms") is not None:
                    end[k] = int(data["valid_to_ms"])
            except (TypeError, ValueError):
                start[k] = np.iinfo(np.int64).max  # a validity that is no time: never on the route
        ts = np.asarray(ts_ms, np.int64)
        admitted: np.ndarray = (ts >= start[codes]) & (ts < end[codes])
        return admitted

    def _attributes(self, vehicle_id: str) -> dict[str, str]:
        entry = self.master.vehicles.get(vehicle_id)
        data = entry[1] if entry is not None else None
        return dict(data.get("attributes") or {}) if data else {}

    def _assignment(self, vehicle_id: str) -> dict[str, Any] | None:
        entry = self.master.assignments.get(vehicle_id)
        return entry[1] if entry is not None else None


def needs_members(rules: Iterable[ProximityRule]) -> bool:
    """Whether any rule has a scope narrower than the fleet (the fleet's needs no master data)."""
    return any(not r.scope.fleet for r in rules)
