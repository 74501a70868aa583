"""Proximity rules per route and per fleet group: which fixes each rule compares (`Members`), and
the bucket of cells that keeps a window per rule (`RuleCells`)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from fleetfence.rules import ProximityRule, ProximityScope
from processor.core.proximity import HomedFixes, Position, RuleCells, RulePairs, rules_resolution
from processor.core.proximity_members import Members

FLEET = ProximityRule("fleet", 40, 80, 0, 500, 30_000)
ROUTE = ProximityRule("r1", 20, 35, 0, 500, 30_000, ProximityScope(route_id="r1"))
GROUP = ProximityRule("north", 60, 120, 0, 2_000, 30_000, ProximityScope(group="north"))


def event(entity: str, eid: str, version: int, data: dict[str, Any] | None) -> dict[str, Any]:
    op = "delete" if data is None else "upsert"
    return {"entity": entity, "id": eid, "version": version, "op": op, "data": data}


def assignment(vid: str, route: str, start: int, end: int | None = None) -> dict[str, Any]:
    return {"vehicle_id": vid, "route_id": route, "valid_from_ms": start, "valid_to_ms": end}


def admitted(m: Members, rule: ProximityRule, fixes: list[tuple[str, int]]) -> list[bool]:
    vids = np.array([v for v, _ in fixes], object)
    return [bool(x) for x in m.admitted(rule, vids, np.array([t for _, t in fixes], np.int64))]


def test_a_route_admits_its_assigned_vehicles_while_the_assignment_holds() -> None:
    m = Members()
    assert m.apply(
        event("assignment", "a", 1, {**assignment("a", "r1", 1_000, 5_000), "planned_arrival_ms": 9})
    )
    # Of an assignment only what a route's scope reads.
    assert m.master.assignments["a"] == (1, {"route_id": "r1", "valid_from_ms": 1_000, "valid_to_ms": 5_000})
    assert m.apply(event("assignment", "b", 1, assignment("b", "r2", 0)))
    fixes = [("a", 999), ("a", 1_000), ("a", 4_999), ("a", 5_000), ("b", 2_000), ("c", 2_000)]
    # From inclusive, to exclusive, as the job reads an assignment; another route or none: out.
    assert admitted(m, ROUTE, fixes) == [False, True, True, False, False, False]
    assert admitted(m, FLEET, fixes) == [True] * 6
    # A newer version moves b onto the route; an older one re-sent changes nothing.
    assert m.apply(event("assignment", "b", 2, assignment("b", "r1", 0)))
    assert not m.apply(event("assignment", "b", 1, assignment("b", "r2", 0)))
    assert admitted(m, ROUTE, [("b", 2_000)]) == [True]
    # Deleted: on no route (the tombstone keeps a stale re-send out).
    assert m.apply(event("assignment", "b", 3, None))
    assert not m.apply(event("assignment", "b", 2, assignment("b", "r1", 0)))
    assert admitted(m, ROUTE, [("b", 2_000)]) == [False]


def test_a_group_admits_the_vehicles_whose_attribute_names_it() -> None:
    m = Members()
    m.apply_all(
        [
            event("vehicle", "a", 1, {"vehicle_id": "a", "label": "a", "attributes": {"group": "north"}}),
            event("vehicle", "b", 1, {"vehicle_id": "b", "label": "b", "attributes": {"group": "south"}}),
            event("vehicle", "c", 1, {"vehicle_id": "c", "label": "c", "attributes": {}}),
            # Routes and zones are no scope's business: not kept.
            event("route", "r1", 1, {"route_id": "r1"}),
        ]
    )
    assert m.master.routes == {}
    # Of each vehicle only what a scope reads (every bucket of cells holds a copy).
    assert m.master.vehicles["a"] == (1, {"attributes": {"group": "north"}})
    assert m.master.vehicles["c"] == (1, {})
    # What is no vehicle's or assignment's change event is not folded (the job logs it).
    assert not m.apply({"entity": "vehicle", "id": "x", "data": {"attributes": {"group": "north"}}})
    assert not m.apply({"entity": "vehicle", "id": "x", "version": "one", "data": {}})
    assert not m.apply({"entity": "assignment", "id": "x", "version": 1, "data": "r1"})
    assert "x" not in m.master.vehicles
    assert "x" not in m.master.assignments
    # Attributes that are no object: no group, and nothing raised (the topic is read from its start).
    assert m.apply({"entity": "vehicle", "id": "y", "version": 1, "data": {"attributes": "north"}})
    assert m.master.vehicles["y"] == (1, {})
    # A delete is a delete whatever data it carries.
    assert m.apply({"entity": "vehicle", "id": "y", "version": 2, "op": "delete", "data": "gone"})
    assert stored(m, "y") == (2, None)
    assert admitted(m, GROUP, [("a", 0), ("b", 0), ("c", 0), ("d", 0), ("a", 9)]) == [
        True,
        False,
        False,
        False,
        True,
    ]
    m.apply(event("vehicle", "b", 2, {"vehicle_id": "b", "label": "b", "attributes": {"group": "north"}}))
    assert admitted(m, GROUP, [("b", 0)]) == [True]


def stored(m: Members, vehicle_id: str) -> tuple[int, dict[str, Any] | None]:
    return m.master.vehicles[vehicle_id]


def fix(vid: str, ts: int, north_m: float = 0.0) -> Position:
    return Position(vid, ts // 1000, ts, 52.5 + north_m / 111_320, 13.4, 0.0)


def test_each_rule_meets_only_its_vehicles_with_its_own_distances() -> None:
    """Three vehicles 30 m apart in a row: a and b in group north, c not. The group's rule meets
    only a and b (and reports them at its wider watch distance); the fleet's rule meets all three
    pairs; the route's, whose vehicles none are, meets nobody. The window per rule survives the
    state's round trip."""
    m = Members()
    for vid, group in (("a", "north"), ("b", "north"), ("c", "south")):
        m.apply(event("vehicle", vid, 1, {"vehicle_id": vid, "label": vid, "attributes": {"group": group}}))
    rules = (FLEET, ROUTE, GROUP)
    res = rules_resolution(rules)
    assert res == rules_resolution((GROUP,))  # the widest exit decides the cells
    cells = RuleCells(rules, res)
    fixes = HomedFixes.from_positions([fix("a", 10_000), fix("b", 10_000, 30), fix("c", 10_000, 60)], res)
    steps = dict(cells.step(fixes, 0, m))
    assert set(steps) == {"fleet", "r1", "north"}
    pairs = {
        k: sorted(zip(s.meetings.a.tolist(), s.meetings.b.tolist(), strict=True)) for k, s in steps.items()
    }
    assert pairs == {"fleet": [("a", "b"), ("a", "c"), ("b", "c")], "r1": [], "north": [("a", "b")]}
    # Each window keeps its own fixes, and a restored bucket has the same windows.
    rule_ids, kept = cells.kept()
    assert sorted(rule_ids.tolist()) == ["fleet"] * 3 + ["north"] * 2
    again = RuleCells(rules, res)
    again.restore(rule_ids, kept)
    assert {k: len(w.kept) for k, w in again.windows.items()} == {"fleet": 3, "r1": 0, "north": 2}
    # A later fix of c meets a's and b's kept fixes under the fleet's rule only.
    later = dict(again.step(HomedFixes.from_positions([fix("c", 10_300, 45)], res), 0, m))
    assert sorted(later["fleet"].meetings.a.tolist()) == ["a", "b"]
    assert len(later["north"].meetings) == 0
    # Each window forgets by its own tolerance: the group's (2 s) outlives the fleet's (0.5 s).
    assert again.expires_ms() == 10_300 + FLEET.tolerance_ms
    again.evict(11_000)
    assert {k: len(w.kept) for k, w in again.windows.items()} == {"fleet": 0, "r1": 0, "north": 2}
    # A rule no longer run: its fixes are dropped at the restore, its pairs with the state.
    rule_ids, kept = again.kept()
    fewer = RuleCells((FLEET,), res)
    fewer.restore(rule_ids, kept)
    assert set(fewer.windows) == {"fleet"}
    assert set(RulePairs((FLEET,), {"north": {}, "fleet": {}}).states) == {"fleet"}
    # Two rules of one id would share a window: refused.
    with pytest.raises(ValueError, match="ids must differ"):
        RuleCells((FLEET, GROUP, FLEET), res)
    with pytest.raises(ValueError, match="ids must differ"):
        RulePairs((GROUP, GROUP))
