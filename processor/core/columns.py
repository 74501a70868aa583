"""The engine's columnar containers: a bucket's vehicle states (`StateTable`) and a batch of fixes
(`Fixes`, with its Arrow schema `FIX_SCHEMA`), both as numpy columns.

Columnar so the engine's fast path is a handful of fancy-index assignments per batch and the blob
that goes to the state store is a few numpy buffers, not thousands of Python objects.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, fields
from typing import Any, get_type_hints

import numpy as np
import pandas as pd
import pyarrow as pa

from processor.core.domain import STATE_DEFAULTS, RawFix, VehicleState


def _state_columns() -> dict[type, tuple[str, ...]]:
    """`VehicleState`'s fields by kind, each kind in declaration order (the order a parked row is
    packed in, processor.core.parking); the id is the table's index, not a column."""
    kinds: dict[type, tuple[str, ...]] = {int: (), float: (), bool: (), object: ()}
    for name, hint in get_type_hints(VehicleState).items():
        if name == "vehicle_id":
            continue
        kind = object if name in _OBJECT_COLS else hint
        if kind not in kinds:
            raise TypeError(f"VehicleState.{name}: the state table has no column kind for {hint}")
        kinds[kind] += (name,)
    if kinds[object] != _OBJECT_COLS:
        raise TypeError(f"VehicleState has object fields {kinds[object]}, the state table {_OBJECT_COLS}")
    return kinds


# The fields the table keeps as Python objects, each with code of its own (`get`, `put`,
# processor.core.parking's JSON).
_OBJECT_COLS = ("route_id", "zones")
_KINDS = _state_columns()
INT_COLS = _KINDS[int]
FLOAT_COLS = _KINDS[float]
BOOL_COLS = _KINDS[bool]
# Per-vehicle counters the engine keeps beside the state machine (not part of `VehicleState`):
# `unassigned_fixes` counts fixes with no assignment valid at their event time.
COUNTER_COLS = ("unassigned_fixes",)
# The "nothing yet" of every numeric column: a new vehicle's, and that of a column a stored table or
# parked row was written without.
EMPTY: dict[str, int | float | bool] = {
    **{c: STATE_DEFAULTS[c] for c in INT_COLS + FLOAT_COLS + BOOL_COLS},
    **dict.fromkeys(COUNTER_COLS, 0),
}


class StateTable:
    """The vehicle states of one bucket, column by column (numpy), with an id -> row index.

    Columnar so the fast path is a handful of fancy-index assignments per batch and the blob that
    goes to the state store is a few numpy buffers, not thousands of Python objects.
    """

    def __init__(self, ids: list[str] | None = None, cols: dict[str, np.ndarray] | None = None) -> None:
        self.ids: list[str] = ids or []
        n = len(self.ids)
        if cols is None:
            cols = {}
        for names, dtype in (
            (INT_COLS + COUNTER_COLS, np.int64),
            (FLOAT_COLS, np.float64),
            (BOOL_COLS, bool),
        ):
            for c in names:
                # A new table, or a state written before the column existed (an older checkpoint).
                if c not in cols:
                    cols[c] = np.full(n, EMPTY[c], dtype=dtype)
        for c in _OBJECT_COLS:
            if c not in cols:
                cols[c] = np.full(n, None, dtype=object)
        self.cols = cols
        self.index = {v: i for i, v in enumerate(self.ids)}

    def __len__(self) -> int:
        return len(self.ids)

    def __getstate__(self) -> dict[str, Any]:
        return {"ids": self.ids, "cols": self.cols}

    def __setstate__(self, d: dict[str, Any]) -> None:
        self.__init__(d["ids"], d["cols"])  # type: ignore[misc]

    def add(self, vehicle_ids: list[str]) -> None:
        new = [v for v in vehicle_ids if v not in self.index]
        if not new:
            return
        k = len(new)
        base = len(self.ids)
        self.ids.extend(new)
        for v_i, v in enumerate(new):
            self.index[v] = base + v_i
        for c, arr in self.cols.items():
            ext = np.full(k, None if arr.dtype == object else EMPTY.get(c, 0), dtype=arr.dtype)
            self.cols[c] = np.concatenate([arr, ext])

    def get(self, i: int) -> VehicleState:
        c = self.cols
        scalars: dict[str, Any] = {f: int(c[f][i]) for f in INT_COLS}
        scalars.update({f: float(c[f][i]) for f in FLOAT_COLS})
        scalars.update({f: bool(c[f][i]) for f in BOOL_COLS})
        return VehicleState(
            self.ids[i], route_id=c["route_id"][i], zones=dict(c["zones"][i] or {}), **scalars
        )

    def put(self, i: int, s: VehicleState) -> None:
        c = self.cols
        for f in INT_COLS + FLOAT_COLS + BOOL_COLS:
            c[f][i] = getattr(s, f)
        c["route_id"][i] = s.route_id
        c["zones"][i] = dict(s.zones) if s.zones else None

    def state(self, vehicle_id: str) -> VehicleState:
        return self.get(self.index[vehicle_id])

    def states(self) -> list[VehicleState]:
        return [self.get(i) for i in range(len(self))]

    def take(self, rows: np.ndarray) -> StateTable:
        """The vehicles at these row positions, as a new table (their columns copied)."""
        return StateTable([self.ids[i] for i in rows], {c: arr[rows] for c, arr in self.cols.items()})


def reset_columns(table: StateTable, rows: np.ndarray, names: tuple[str, ...]) -> None:
    """Return these fields of the vehicles at `rows` to their defaults: `domain.reset` on columns,
    with the field groups of `domain` (CORRIDOR, SPEED, TRIP, ...)."""
    for name in names:
        table.cols[name][rows] = STATE_DEFAULTS[name]


def at_defaults(table: StateTable, rows: np.ndarray, names: tuple[str, ...]) -> np.ndarray:
    """Per vehicle at `rows`: True when every one of these fields is at its default (for
    `domain.OPEN_CONDITIONS`: no condition open that a later fix could close with an alert)."""
    out: np.ndarray = np.logical_and.reduce(
        [table.cols[name][rows] == STATE_DEFAULTS[name] for name in names]
    )
    return out


def concat_states(tables: list[StateTable]) -> StateTable:
    """One table of every vehicle of these tables (a vehicle must be in only one of them). Tables
    written before a column existed already have it filled in by `StateTable.__init__`."""
    tables = [t for t in tables if len(t)]
    if not tables:
        return StateTable()
    ids = [v for t in tables for v in t.ids]
    if len(set(ids)) != len(ids):
        raise ValueError("a vehicle is in more than one of the tables")
    return StateTable(ids, {c: np.concatenate([t.cols[c] for t in tables]) for c in tables[0].cols})


def empty_states() -> StateTable:
    return StateTable()


def states_from_objects(states: Iterable[VehicleState]) -> StateTable:
    states = list(states)
    t = StateTable()
    t.add([s.vehicle_id for s in states])
    for s in states:
        t.put(t.index[s.vehicle_id], s)
    return t


# A batch of fixes as columns: the fields of the canonical record the engine reads
# (`fleetfence.contracts.PlainFix`, in its order; a test holds the two lists together), then where
# the record is on the telemetry topic. The Arrow form is what a chunk of the stream carries
# (`processor.spark.rows.encode_chunk`); `Fixes` is the same columns as numpy arrays, in this order.
FIX_SCHEMA = pa.schema(
    [
        ("vehicle_id", pa.string()),
        ("seq", pa.int64()),
        ("ts_ms", pa.int64()),
        ("lat", pa.float64()),
        ("lon", pa.float64()),
        ("speed_kmh", pa.float64()),
        ("received_ms", pa.int64()),
        # A fix dead-lettered later (beyond the lateness bound) is sent with the record's original
        # bytes, read back from here.
        ("kafka_partition", pa.int32()),
        ("kafka_offset", pa.int64()),
    ]
)
# The numpy dtype of each column (the vehicle id as Python str objects).
_DTYPES = {f.name: np.dtype(f.type.to_pandas_dtype()) for f in FIX_SCHEMA}
# The record's place on the topic: known only for fixes read from it (None otherwise).
_PLACE = ("kafka_partition", "kafka_offset")


@dataclass
class Fixes:
    """A batch of fixes as numpy columns, `FIX_SCHEMA`'s in its order: what the engine folds.

    Beside `RawFix` (one fix of one vehicle, held in its reorder buffer) this is the batch form,
    so that ordering, routing and the fast path are column operations."""

    vehicle_id: np.ndarray  # object
    seq: np.ndarray
    ts_ms: np.ndarray
    lat: np.ndarray
    lon: np.ndarray
    speed_kmh: np.ndarray
    received_ms: np.ndarray
    # Each fix's record on the telemetry topic, when it came from there (None otherwise): only a
    # fix dead-lettered as late needs it, to send its original bytes.
    kafka_partition: np.ndarray | None = None
    kafka_offset: np.ndarray | None = None

    @staticmethod
    def of_columns(cols: Iterable[Any]) -> Fixes:
        """Fixes from columns in `FIX_SCHEMA`'s order (the topic place may be left out, or None)."""
        return Fixes(*cols)

    def columns(self) -> list[np.ndarray | None]:
        return [getattr(self, name) for name in FIX_SCHEMA.names]

    @staticmethod
    def from_frame(df: pd.DataFrame) -> Fixes:
        """The columns of `df` by name; the topic place only when `df` has both of its columns."""
        place = all(c in df.columns for c in _PLACE)
        return Fixes.of_columns(
            df[c].to_numpy(dtype=_DTYPES[c]) if place or c not in _PLACE else None for c in FIX_SCHEMA.names
        )

    @staticmethod
    def from_table(t: pa.Table) -> Fixes:
        """A table of `FIX_SCHEMA` (decoded chunks) as numpy columns."""
        return Fixes(
            t.column("vehicle_id").to_numpy(zero_copy_only=False).astype(object),
            *(t.column(c).to_numpy() for c in FIX_SCHEMA.names[1:]),
        )

    @staticmethod
    def of_raw(vehicle_ids: list[str], raw: list[RawFix]) -> Fixes:
        """Fixes released from reorder buffers, `vehicle_ids[i]`'s fix `raw[i]` (no topic place)."""
        return Fixes(
            np.array(vehicle_ids, dtype=object),
            *(
                np.array([getattr(f, c) for f in raw], dtype=_DTYPES[c])
                for c in FIX_SCHEMA.names[1:]
                if c not in _PLACE
            ),
        )

    @staticmethod
    def concat(parts: list[Fixes]) -> Fixes:
        """The fixes of `parts` in turn; the topic place only when every part has it."""
        cols = [p.columns() for p in parts]
        return Fixes.of_columns(
            None if any(c[k] is None for c in cols) else np.concatenate([c[k] for c in cols])
            for k in range(len(FIX_SCHEMA))
        )

    @staticmethod
    def empty() -> Fixes:
        return Fixes.of_columns(np.zeros(0, dtype=_DTYPES[c]) for c in FIX_SCHEMA.names if c not in _PLACE)

    def take(self, idx: np.ndarray) -> Fixes:
        return Fixes.of_columns(None if col is None else col[idx] for col in self.columns())

    def __len__(self) -> int:
        return len(self.seq)

    def raw(self, i: int) -> RawFix:
        """The fix at `i` as its vehicle's reorder buffer holds it (Python numbers)."""
        return RawFix(**{f.name: getattr(self, f.name)[i].item() for f in fields(RawFix)})
