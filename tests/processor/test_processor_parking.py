"""Parked vehicles (processor.core.parking): a silent vehicle's row leaves its bucket's blob for a value of
its own and comes back at its next fix, and a bucket's alerts and states are exactly those of the
blob that keeps everyone. Spark's `MapState` under it is exercised end to end by
tests/processor/test_processor_rebucket.py."""

from __future__ import annotations

import pickle
import struct
from dataclasses import replace

import msgspec
import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fleetfence.contracts import AlertType, Telemetry
from processor.core.codec import load_state
from processor.core.columns import INT_COLS, StateTable, concat_states, states_from_objects
from processor.core.domain import EngineConfig, RawFix, VehicleState
from processor.core.master import Catalog
from processor.core.parking import pack_rows, parkable, split_parked, unpack_rows
from processor.errors import StateError
from processor.spark.rows import OutputKind
from processor.spark.stateful import bucket_step
from tests.processor.helpers import T0, master_events, master_state, same_states, scenario, telemetry_rows

CFG = EngineConfig()
SILENCE = {AlertType.VEHICLE_SILENT, AlertType.VEHICLE_RESUMED}


class DictLot:
    """A parking lot in a dict: the Protocol's contract without Spark (the operator's `MapState`)."""

    def __init__(self) -> None:
        self.values: dict[str, bytes] = {}
        self.fetched = 0

    def fetch(self, vehicle_ids: list[str]) -> StateTable:
        found = [v for v in vehicle_ids if v in self.values]
        self.fetched += len(found)
        return unpack_rows(found, [self.values.pop(v) for v in found])

    def park(self, table: StateTable) -> None:
        assert not set(table.ids) & set(self.values), "a vehicle parked twice"
        self.values.update(zip(table.ids, pack_rows(table), strict=True))


ints = st.integers(-(2**63), 2**63 - 1)
floats = st.floats(allow_nan=False)
vehicle_states = st.builds(
    VehicleState,
    vehicle_id=st.text(min_size=1, max_size=20),
    last_seq=ints,
    last_ts_ms=ints,
    lat=floats,
    speed_kmh=floats,
    route_id=st.none() | st.text(max_size=20),
    silent=st.booleans(),
    zones=st.dictionaries(st.text(max_size=10), ints, max_size=3),
    progress_m=floats,
    eta_ms=ints,
    completed=st.booleans(),
)


@settings(max_examples=100, deadline=None)
@given(st.lists(vehicle_states, min_size=1, max_size=5, unique_by=lambda s: s.vehicle_id))
def test_a_packed_row_unpacks_to_the_same_state(rows: list[VehicleState]) -> None:
    table = states_from_objects(rows)
    table.cols["unassigned_fixes"][:] = range(len(rows))
    back = unpack_rows(table.ids, pack_rows(table))
    assert same_states(back, table)
    assert back.cols["unassigned_fixes"].tolist() == list(range(len(rows)))


def test_a_parked_row_is_a_few_hundred_bytes_not_a_pickled_table() -> None:
    s = VehicleState("vehicle-000123", last_seq=9, route_id="route-17", zones={"depot-3": T0}, silent=True)
    table = states_from_objects([s])
    (value,) = pack_rows(table)
    assert len(value) < 300
    assert len(pickle.dumps(table, protocol=5)) > 4 * len(value)


def test_a_row_parked_before_a_column_existed_unpacks_with_its_nothing_yet() -> None:
    s = VehicleState("v1", last_seq=4, eta_ms=T0, silent=True)
    (value,) = pack_rows(states_from_objects([s]))
    version, n_int, *rest = struct.unpack_from("<BBBBB", value)
    assert INT_COLS[-1] == "eta_ms"
    assert n_int == len(INT_COLS)
    # The same row as a version without the last int column wrote it.
    cut = 5 + 8 * (n_int - 1)
    older = struct.pack("<BBBBB", version, n_int - 1, *rest) + value[5:cut] + value[cut + 8 :]
    (back,) = unpack_rows(["v1"], [older]).states()
    assert back == replace(s, eta_ms=-1)


# A row as the first version of the parked format packed it, with every column of that version: its
# ints 1000, 1001, ... and its floats 0.5, 1.5, ... in their order, its bools alternating.
PARKED_V1 = bytes.fromhex(
    # version 1; 15 ints, 1 counter, 10 floats, 6 bools
    "010f010a06"
    # the ints
    "e803000000000000e903000000000000ea03000000000000eb03000000000000ec03000000000000ed03000000000000"
    "ee03000000000000ef03000000000000f003000000000000f103000000000000f203000000000000f303000000000000"
    "f403000000000000f503000000000000f603000000000000"
    # the counter
    "2a00000000000000"
    # the floats
    "000000000000e03f000000000000f83f00000000000004400000000000000c4000000000000012400000000000001640"
    "0000000000001a400000000000001e4000000000000021400000000000002340"
    # the bools
    "010001000100"
    # route and zones, JSON
    "5b227231222c7b227a31223a377d5d"
)
UNPACKED_V1 = VehicleState(
    "v1",
    last_seq=1000,
    last_ts_ms=1001,
    last_received_ms=1002,
    lat=0.5,
    lon=1.5,
    speed_kmh=2.5,
    route_id="r1",
    route_version=1003,
    off_route=True,
    outside_fixes=1004,
    outside_since_ms=1005,
    inside_fixes=1006,
    overspeed=False,
    over_since_ms=1007,
    over_max_kmh=3.5,
    silent=True,
    zones={"z1": 7},
    progress_m=4.5,
    wrong_way=False,
    dir_anchor_m=5.5,
    dir_anchor_ts_ms=1008,
    dir_anchor_fixes=1009,
    stop_since_ms=1010,
    stop_lat=6.5,
    stop_lon=7.5,
    stop_phase=1011,
    trip_from_ms=1012,
    trip_start_ms=1013,
    trip_start_m=8.5,
    eta_ms=1014,
    at_risk=True,
    off_route_m=9.5,
    completed=False,
)


def test_a_row_parked_by_an_older_version_unpacks_field_by_field() -> None:
    """The columns are `VehicleState`'s fields in their order there: a field inserted before an
    older one (not appended) would shift every parked row's values onto the wrong fields."""
    table = unpack_rows(["v1"], [PARKED_V1])
    assert table.states() == [UNPACKED_V1]
    assert table.cols["unassigned_fixes"].tolist() == [42]


def test_a_value_in_an_unknown_format_is_refused_not_misread() -> None:
    (value,) = pack_rows(states_from_objects([VehicleState("v1", last_seq=1)]))
    with pytest.raises(StateError, match="not in a known format"):
        unpack_rows(["v1"], [b"\x09" + value[1:]])


def test_only_silent_vehicles_with_nothing_held_park() -> None:
    table = states_from_objects(
        [
            VehicleState("moving", last_seq=3),
            VehicleState("silent", last_seq=3, silent=True),
            VehicleState("silent-waiting", last_seq=3, silent=True),
        ]
    )
    held = {"silent-waiting": [RawFix(5, T0, 52.5, 13.0, 0.0, T0)]}
    assert [table.ids[r] for r in parkable(table, held)] == ["silent"]
    kept, parked = split_parked(table, held)
    assert (kept.ids, parked.ids) == (["moving", "silent-waiting"], ["silent"])


def test_a_bucket_with_a_parking_lot_alerts_and_keeps_exactly_what_the_blob_alone_does() -> None:
    """The scenario in 10 s batches, then one far-ahead fix (every other vehicle falls silent and
    parks), then two of them report again (woken, VEHICLE_RESUMED): with and without a lot."""
    far = Telemetry("v0", 60, T0 + 400_000, 52.5, 13.05, 30.0, None, None, T0 + 400_000)
    back = [msgspec.structs.replace(far, vehicle_id=v, seq=60, ts_ms=T0 + 401_000) for v in ("v2", "v5")]
    fixes = scenario(60)
    batches = [[f for f in fixes if lo <= f.ts_ms - T0 < lo + 10_000] for lo in range(0, 60_000, 10_000)]
    batches += [[far], [], back]
    master = master_state(master_events())
    cat = Catalog(CFG)

    def run(
        lot: DictLot | None, park_until: int = len(batches)
    ) -> tuple[list[dict[str, object]], StateTable, list[dict[str, int]]]:
        """The batches through `bucket_step`; with `lot`, parking on for the first `park_until`."""
        vehicles: bytes | None = None
        digest, wm = "", 0
        alerts: list[dict[str, object]] = []
        stats: list[dict[str, int]] = []
        for i, batch in enumerate(batches):
            rows = telemetry_rows(batch)
            step = bucket_step(vehicles, master, digest, rows, wm, CFG, cat, lot, park=i < park_until)
            vehicles, digest = step.vehicles, step.digest
            alerts += [orjson.loads(a) for a in step.out.loc[step.out["kind"] == OutputKind.ALERT, "value"]]
            stats.append(orjson.loads(step.out.loc[step.out["kind"] == OutputKind.STATS, "value"].iloc[0]))
            if batch:
                wm = max(wm, max(f.ts_ms for f in batch) - CFG.lateness_ms)
        assert vehicles is not None
        states, _ = load_state(vehicles)
        return alerts, states, stats

    lot = DictLot()
    with_lot, hot, stats = run(lot)
    without, everyone, _ = run(None)
    assert with_lot == without
    silence = [(a["type"], a["vehicle_id"]) for a in without if a["type"] in SILENCE]
    assert sorted(silence) == sorted(
        [(AlertType.VEHICLE_SILENT, f"v{i}") for i in range(1, 6)]
        + [(AlertType.VEHICLE_RESUMED, "v2"), (AlertType.VEHICLE_RESUMED, "v5")]
    ), "every other vehicle falls silent, two of them come back"
    # After the far fix the silent vehicles left the blob; two came back; the rest are parked.
    assert [s.get("parked", 0) for s in stats][-3:] == [0, 5, 0]
    assert [s.get("woken", 0) for s in stats][-3:] == [0, 0, 2]
    assert sorted(hot.ids) == ["v0", "v2", "v5"]
    assert sorted(lot.values) == ["v1", "v3", "v4"]
    parked = unpack_rows(list(lot.values), list(lot.values.values()))
    assert same_states(concat_states([hot, parked]), everyone)
    assert all(s.silent for s in parked.states())

    # Parking turned off (FLEETFENCE_PROCESSOR_PARKING) once five vehicles have parked: the
    # two that report again are still woken, and nothing parks any more.
    lot = DictLot()
    turned_off, hot, stats = run(lot, park_until=len(batches) - 1)
    assert turned_off == without
    assert [s.get("parked", 0) for s in stats][-3:] == [0, 5, 0]
    assert [s.get("woken", 0) for s in stats][-3:] == [0, 0, 2]
    assert sorted(lot.values) == ["v1", "v3", "v4"]
    # Off from the start: every vehicle stays in the blob.
    lot = DictLot()
    never, everyone_again, _ = run(lot, park_until=0)
    assert never == without
    assert not lot.values
    assert same_states(everyone_again, everyone)
