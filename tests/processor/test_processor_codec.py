"""The state store's value format (processor.core.codec) across upgrades: a checkpoint written by an
older layout of the package must load and carry on exactly as if the new code had written it.

`data/state-f0efeab.*.bin` were written by commit f0efeab (the flat `processor` package, before the
split into `core` / `spark` / `ops`): the scenario's first three 10 s batches through `bucket_step`,
the vehicle blob as the state store holds it and the master data as pickled then."""

from __future__ import annotations

import importlib
import pickle
import sys
import types
from pathlib import Path
from typing import Any

import orjson
import pytest

from fleetfence.contracts import Telemetry
from processor.core.codec import _MOVED_MODULES, current_name, dump_state, load_state
from processor.core.columns import StateTable
from processor.core.domain import EngineConfig
from processor.core.master import Catalog, MasterState
from processor.spark.rows import OutputKind
from processor.spark.stateful import bucket_step
from tests.processor.helpers import T0, master_events, master_state, same_states, scenario, telemetry_rows

DATA = Path(__file__).parent / "data"
CFG = EngineConfig()


Batches = list[list[Telemetry]]


def _batches() -> Batches:
    fixes = scenario(60)
    return [[f for f in fixes if lo <= f.ts_ms - T0 < lo + 10_000] for lo in range(0, 60_000, 10_000)]


def _run(
    vehicles: bytes | None, master: MasterState, batches: Batches, wm: int
) -> tuple[bytes, list[dict[str, Any]], int]:
    cat = Catalog(CFG)
    digest = ""
    alerts: list[dict[str, Any]] = []
    for batch in batches:
        step = bucket_step(vehicles, master, digest, telemetry_rows(batch), wm, CFG, cat, None, park=False)
        vehicles, digest = step.vehicles, step.digest
        alerts += [orjson.loads(a) for a in step.out.loc[step.out["kind"] == OutputKind.ALERT, "value"]]
        wm = max(wm, max(f.ts_ms for f in batch) - CFG.lateness_ms)
    assert vehicles is not None
    return vehicles, alerts, wm


def test_a_checkpoint_written_by_the_flat_package_loads_and_carries_on_identically() -> None:
    old_vehicles = (DATA / "state-f0efeab.vehicles.bin").read_bytes()
    old_master_blob = (DATA / "state-f0efeab.master.bin").read_bytes()
    assert b"processor.columns" in old_vehicles, "the fixture names the old module"
    with pytest.raises(ModuleNotFoundError):
        pickle.loads(old_vehicles)  # the old names are really gone

    batches = _batches()
    master = master_state(master_events())
    new_vehicles, first_alerts, wm = _run(None, master, batches[:3], 0)
    assert first_alerts, "the first half of the scenario alerts: the state carries something"

    old_states, old_held = load_state(old_vehicles)
    new_states, new_held = load_state(new_vehicles)
    assert type(old_states) is StateTable
    assert same_states(old_states, new_states)
    assert old_held == new_held
    old_master = load_state(old_master_blob)
    assert type(old_master) is MasterState
    assert dump_state(old_master) == dump_state(master)

    # The rest of the scenario from the old blob and from the new one: the same alerts and state.
    _, from_old, _ = _run(old_vehicles, old_master, batches[3:], wm)
    _, from_new, _ = _run(new_vehicles, master, batches[3:], wm)
    assert from_new, "the second half alerts"
    assert from_old == from_new


def test_state_written_before_the_engine_split_still_loads(monkeypatch: pytest.MonkeyPatch) -> None:
    """Older still: StateTable and MasterState were pickled under `processor.engine`."""
    engine = types.ModuleType("processor.engine")
    states = StateTable()
    states.add(["a"])
    states.cols["last_seq"][0] = 7
    m = master_state(master_events())
    with monkeypatch.context() as old:
        old.setitem(sys.modules, "processor.engine", engine)
        for cls in (StateTable, MasterState):
            old.setattr(cls, "__module__", "processor.engine")
            setattr(engine, cls.__name__, cls)
        blob = pickle.dumps((states, {}, m), protocol=5)
    assert b"processor.engine" in blob
    with pytest.raises(ModuleNotFoundError):
        pickle.loads(blob)
    got_states, _, got_master = load_state(blob)
    assert type(got_states) is StateTable
    assert type(got_master) is MasterState
    assert got_states.state("a").last_seq == 7
    assert got_master.routes == m.routes


@pytest.mark.parametrize("old", sorted(_MOVED_MODULES))
def test_every_old_module_maps_to_one_that_exists(old: str) -> None:
    new, _ = current_name(old, "X")
    assert new != old
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module(old)
    importlib.import_module(new)
