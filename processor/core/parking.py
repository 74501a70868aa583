"""Parked vehicles: the state of a vehicle with nothing pending, kept apart from its bucket's blob.

A bucket's vehicle table is one blob, read and written whole by every micro-batch that touches the
bucket, so a batch's state cost grows with the vehicles registered, not with those that report. A
national fleet is mostly parked: a vehicle that has gone silent (its `VEHICLE_SILENT` raised) and
holds no fix for reordering has nothing to do until its next fix, and the engine never reads its row
before then. So such a row leaves the blob for a store with one value per vehicle (the operator's
`MapState`), written once when the vehicle parks and read once when it reports again: the blob, and
what a batch rewrites, holds the vehicles that are active.

A parked row is packed by hand rather than pickled: a one-row `StateTable` pickles to kilobytes of
array headers, the packed row to a few hundred bytes (its numeric columns, then its route and zones
as JSON). The header records how many columns of each kind the row has, and the columns of a kind
are `VehicleState`'s fields of that kind in their order there, where a new field goes at the end: a
row parked before a column existed unpacks with that column's "nothing yet" value (as an older
pickled table does).
"""

from __future__ import annotations

import struct
from typing import Protocol

import numpy as np
import orjson
import pandas as pd

from processor.core.columns import (
    BOOL_COLS,
    COUNTER_COLS,
    EMPTY,
    FLOAT_COLS,
    INT_COLS,
    StateTable,
    concat_states,
)
from processor.core.domain import RawFix
from processor.errors import StateError

_VERSION = 1
_HEADER = struct.Struct("<BBBBB")  # version, then the int, counter, float and bool columns it holds
_KINDS: tuple[tuple[tuple[str, ...], type[np.generic]], ...] = (
    (INT_COLS, np.int64),
    (COUNTER_COLS, np.int64),
    (FLOAT_COLS, np.float64),
    (BOOL_COLS, np.bool_),
)


class ParkingLot(Protocol):
    """Where a bucket's parked vehicles are kept (one per bucket, for the duration of a batch)."""

    def fetch(self, vehicle_ids: list[str]) -> StateTable:
        """The rows of those of `vehicle_ids` that are parked, taken out of the lot."""
        ...

    def park(self, table: StateTable) -> None:
        """Keep these rows (none of them is in the lot already)."""
        ...


def parkable(states: StateTable, held: dict[str, list[RawFix]]) -> np.ndarray:
    """The rows with nothing pending: silent (alerted as such), and no fix held for reordering.

    Nothing else changes such a row before the vehicle's next fix: silence is its last event-time
    deadline (`processor.spark.stateful.next_timer_ms` skips it), master changes are applied to a
    vehicle's state at its next fix, and the live view only shows the rows a batch touched."""
    if not len(states):
        return np.zeros(0, dtype=np.int64)
    c = states.cols
    rows = np.flatnonzero(c["silent"] & (c["last_seq"] >= 0))
    if held and len(rows):
        rows = np.array([r for r in rows.tolist() if states.ids[r] not in held], dtype=np.int64)
    return rows


def split_parked(states: StateTable, held: dict[str, list[RawFix]]) -> tuple[StateTable, StateTable]:
    """(the rows that stay in the bucket's blob, the rows to park)."""
    rows = parkable(states, held)
    if not len(rows):
        return states, StateTable()
    keep = np.ones(len(states), dtype=bool)
    keep[rows] = False
    return states.take(np.flatnonzero(keep)), states.take(rows)


def wake(states: StateTable, lot: ParkingLot, vehicle_ids: np.ndarray) -> StateTable:
    """The bucket's table with those of `vehicle_ids` (one per fix) that are parked back in it."""
    index = states.index
    missing = [v for v in pd.unique(vehicle_ids).tolist() if v not in index]
    if not missing:
        return states
    woken = lot.fetch(missing)
    return concat_states([states, woken]) if len(woken) else states


def pack_rows(table: StateTable) -> list[bytes]:
    """Each row of `table` as a parked value."""
    n = len(table)
    if not n:
        return []
    header = _HEADER.pack(_VERSION, *(len(names) for names, _ in _KINDS))
    blocks = [
        np.ascontiguousarray(np.stack([table.cols[c].astype(dtype) for c in names], axis=1))
        for names, dtype in _KINDS
    ]
    route, zones = table.cols["route_id"], table.cols["zones"]
    return [
        b"".join([header, *(b[i].tobytes() for b in blocks), orjson.dumps([route[i], zones[i] or None])])
        for i in range(n)
    ]


def unpack_rows(vehicle_ids: list[str], values: list[bytes]) -> StateTable:
    """The parked values of these vehicles as a table (`pack_rows`' inverse)."""
    n = len(vehicle_ids)
    cols = {c: np.zeros(n, dtype=dtype) for names, dtype in _KINDS for c in names}
    route = np.full(n, None, dtype=object)
    zones = np.full(n, None, dtype=object)
    for i, value in enumerate(values):
        counts = _unpack_header(value)
        at = _HEADER.size
        for (names, dtype), count in zip(_KINDS, counts, strict=True):
            row = np.frombuffer(value, dtype=dtype, count=count, offset=at).tolist()
            for c, x in zip(names, row + [None] * (len(names) - len(row)), strict=False):
                # A column the row was parked without: its "nothing yet", as `StateTable` gives it.
                cols[c][i] = EMPTY[c] if x is None else x
            at += np.dtype(dtype).itemsize * count
        route[i], zone_map = orjson.loads(value[at:])
        zones[i] = zone_map or None
    cols["route_id"], cols["zones"] = route, zones
    return StateTable(list(vehicle_ids), cols)


def _unpack_header(value: bytes) -> tuple[int, ...]:
    if len(value) < _HEADER.size or value[0] != _VERSION:
        raise StateError(f"a parked vehicle's state is not in a known format (version byte {value[:1]!r})")
    counts: tuple[int, ...] = _HEADER.unpack_from(value)[1:]
    return counts
