"""The engine's columnar containers: a bucket's vehicle states (`StateTable`) and a batch of fixes
(`Fixes`), both as numpy columns.

Columnar so the engine's fast path is a handful of fancy-index assignments per batch and the blob
that goes to the state store is a few numpy buffers, not thousands of Python objects.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, get_type_hints

import numpy as np
import pandas as pd

from processor.domain import STATE_DEFAULTS, RawFix, VehicleState

FIX_COLUMNS = ["vehicle_id", "seq", "ts_ms", "lat", "lon", "speed_kmh", "received_ms"]


def _state_columns() -> dict[type, tuple[str, ...]]:
    """`VehicleState`'s fields by kind, each kind in declaration order (the order a parked row is
    packed in, processor.parking); the id is the table's index, not a column."""
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
# processor.parking's JSON).
_OBJECT_COLS = ("route_id", "zones")
_KINDS = _state_columns()
INT_COLS = _KINDS[int]
FLOAT_COLS = _KINDS[float]
BOOL_COLS = _KINDS[bool]
# Per-vehicle counters the engine keeps beside the state machine (not part of `VehicleState`):
# `unassigned_fixes` counts fixes with no assignment valid at their event time (issue #21).
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


@dataclass
class Fixes:
    """A batch of fixes as numpy columns (what the Spark operator hands over)."""

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
    def from_frame(df: pd.DataFrame) -> Fixes:
        where = "kafka_partition" in df.columns and "kafka_offset" in df.columns
        return Fixes(
            df["vehicle_id"].to_numpy(dtype=object),
            df["seq"].to_numpy(dtype=np.int64),
            df["ts_ms"].to_numpy(dtype=np.int64),
            df["lat"].to_numpy(dtype=np.float64),
            df["lon"].to_numpy(dtype=np.float64),
            df["speed_kmh"].to_numpy(dtype=np.float64),
            df["received_ms"].to_numpy(dtype=np.int64),
            df["kafka_partition"].to_numpy(dtype=np.int32) if where else None,
            df["kafka_offset"].to_numpy(dtype=np.int64) if where else None,
        )

    @staticmethod
    def empty() -> Fixes:
        i, f = np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.float64)
        return Fixes(np.zeros(0, dtype=object), i, i, f, f, f, i)

    def take(self, idx: np.ndarray) -> Fixes:
        return Fixes(
            self.vehicle_id[idx],
            self.seq[idx],
            self.ts_ms[idx],
            self.lat[idx],
            self.lon[idx],
            self.speed_kmh[idx],
            self.received_ms[idx],
            None if self.kafka_partition is None else self.kafka_partition[idx],
            None if self.kafka_offset is None else self.kafka_offset[idx],
        )

    def __len__(self) -> int:
        return len(self.seq)

    def raw(self, i: int) -> RawFix:
        return RawFix(
            int(self.seq[i]),
            int(self.ts_ms[i]),
            float(self.lat[i]),
            float(self.lon[i]),
            float(self.speed_kmh[i]),
            int(self.received_ms[i]),
        )
