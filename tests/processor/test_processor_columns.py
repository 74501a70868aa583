"""The state table's columns are `VehicleState`'s fields (processor.core.columns): every field has its
column, in declaration order within its kind (the order a parked row is packed in), a state goes
through the table unchanged, and a field group resets on columns exactly as `domain.reset` does on
one state."""

from __future__ import annotations

from dataclasses import fields, replace
from typing import Any, get_type_hints

import numpy as np
import pytest

from processor.core.columns import (
    BOOL_COLS,
    FLOAT_COLS,
    INT_COLS,
    at_defaults,
    reset_columns,
    states_from_objects,
)
from processor.core.domain import (
    CORRIDOR,
    DEVIATION_COUNT,
    DIRECTION,
    OPEN_CONDITIONS,
    OVERSPEED_COUNT,
    SPEED,
    STATE_DEFAULTS,
    STOP,
    TRIP,
    VehicleState,
    reset,
)

FIELDS = [f.name for f in fields(VehicleState) if f.name != "vehicle_id"]
OBJECT_FIELDS = ("route_id", "zones")


def changed_state(vehicle_id: str = "v1") -> VehicleState:
    """A state with every field away from its default."""
    hints = get_type_hints(VehicleState)
    values: dict[str, Any] = {"route_id": "r1", "zones": {"z1": 5}}
    for k, name in enumerate(FIELDS):
        if name in OBJECT_FIELDS:
            continue
        kind = hints[name]
        values[name] = not STATE_DEFAULTS[name] if kind is bool else kind(STATE_DEFAULTS[name] + 100 + k)
    return VehicleState(vehicle_id, **values)


def test_every_field_of_vehicle_state_has_its_column_in_declaration_order() -> None:
    columns = INT_COLS + FLOAT_COLS + BOOL_COLS + OBJECT_FIELDS
    assert sorted(columns) == sorted(FIELDS)
    assert len(set(columns)) == len(columns)
    for kind in (INT_COLS, FLOAT_COLS, BOOL_COLS):
        assert list(kind) == [name for name in FIELDS if name in kind]


def test_a_state_goes_through_the_table_unchanged() -> None:
    s = changed_state()
    assert all(getattr(s, name) != STATE_DEFAULTS.get(name, {}) for name in FIELDS)
    table = states_from_objects([VehicleState("v0"), s])
    assert table.states() == [VehicleState("v0"), s]


@pytest.mark.parametrize(
    "group", [DEVIATION_COUNT, CORRIDOR, OVERSPEED_COUNT, SPEED, DIRECTION, STOP, TRIP, OPEN_CONDITIONS]
)
def test_a_group_resets_on_columns_as_on_a_state(group: tuple[str, ...]) -> None:
    states = [changed_state("v1"), changed_state("v2")]
    table = states_from_objects(states)
    rows = np.array([1])
    assert not at_defaults(table, rows, group).any()
    reset_columns(table, rows, group)
    expected = replace(states[1], zones=dict(states[1].zones))
    reset(expected, group)
    assert table.states() == [states[0], expected]
    assert at_defaults(table, np.array([0, 1]), group).tolist() == [False, True]
