"""Issue #64, case 7: live and history agree on backdated master data.

An assignment registered after its `valid_from` (a backfill, or a day of store-and-forward uploads
assigned afterwards) is applied by the live engine to every fix it reads after the registration
whose event time is in the assignment's window. The reports read `assigned_fixes = 0` for such
fixes while each version applied only from its event time; the restatement did the same. One rule
now (`processor.core.master.takes_effect_ms`): a backdated assignment takes effect from its
`valid_from`. The same archive goes through the live engine, both report engines and the
restatement's per-bucket replay, and their answers are compared with each other and with the track
as it was built: 12 fixes from 08:00, one every 10 s, fixes 4-6 off the route (70-170 m outside a
100 m corridor), the assignment registered at 08:01 with valid_from 08:00.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd

from history.report_inputs import report_range
from history.reports import SedonaReports
from history.reports_baseline import BaselineReports
from history.restate import load_master_events, restate_bucket
from history.synthetic import telemetry_table, write_master, write_telemetry_partitioned
from processor.core.columns import Fixes, empty_states
from processor.core.domain import EngineConfig
from processor.core.engine import process_bucket
from processor.core.master import Catalog, MasterState, takes_effect_ms
from tests.history.helpers import BUCKETS, D0, D1, V1_DAY1_OFF, V1_DAY1_SPEED, _fix, route

REGISTERED = D1 + 60_000  # 08:01, after fix 5 of the day
OFF_ROUTE = [i for i, off in enumerate(V1_DAY1_OFF) if abs(off) > 50]  # 50 m: half the corridor
TRACK = [
    _fix("v1", i, D1 + 10_000 * i, 13.405 + 0.001 * i, off, speed)
    for i, (off, speed) in enumerate(zip(V1_DAY1_OFF, V1_DAY1_SPEED, strict=True))
]
EVENTS: list[dict[str, Any]] = [
    {"entity": "route", "id": "r1", "version": 1, "data": route(1, 100, 50), "event_ts_ms": D0},
    {
        "entity": "assignment",
        "id": "v1",
        "version": 1,
        "event_ts_ms": REGISTERED,
        "data": {"vehicle_id": "v1", "route_id": "r1", "valid_from_ms": D1, "valid_to_ms": None},
    },
]


def write_archive(root: Path) -> Path:
    write_master(root, EVENTS)
    write_telemetry_partitioned(
        telemetry_table({k: [f[k] for f in TRACK] for k in TRACK[0]}), root, BUCKETS, "part-0.parquet"
    )
    return root


def track_frame() -> pd.DataFrame:
    df = pd.DataFrame(TRACK)
    df["received_ms"] = REGISTERED + 3_600_000  # uploaded an hour after the registration
    return df


def test_a_backdated_assignment_takes_effect_from_its_valid_from() -> None:
    assignment = {**EVENTS[1], "data": dict(EVENTS[1]["data"])}
    assert takes_effect_ms(assignment) == D1
    later = {**assignment, "data": {**assignment["data"], "valid_from_ms": REGISTERED + 5_000}}
    assert takes_effect_ms(later) == REGISTERED  # a future valid_from: from the registration
    assert takes_effect_ms({**assignment, "op": "delete", "data": None}) == REGISTERED
    assert takes_effect_ms(EVENTS[0]) == D0


def test_live_engine_reports_and_restatement_agree_on_backdated_assignment(tmp_path: Path) -> None:
    cfg = EngineConfig()
    assert OFF_ROUTE == [4, 5, 6]

    # The live engine, reading the uploaded day after the assignment was registered.
    master = MasterState.of(EVENTS)
    res = process_bucket(empty_states(), {}, master, Fixes.from_frame(track_frame()), 0, cfg, Catalog(cfg))
    row = res.states.index["v1"]
    assert int(res.states.cols["unassigned_fixes"][row]) == 0
    live = sorted(a.to_dict()["alert_id"] for a in res.alerts)
    live_types = sorted(a.to_dict()["type"] for a in res.alerts)
    assert "ROUTE_DEVIATION" in live_types, live_types  # fixes 4-6 judged, before the registration

    # Both report engines over the archive of the same fixes and master data.
    root = write_archive(tmp_path / "archive")
    rng = report_range("2026-11-20", "2026-11-20")
    for reports in (SedonaReports(root, rng, BUCKETS), BaselineReports(root, rng, BUCKETS)):
        adh = reports.adherence()
        v1 = adh[adh["vehicle_id"] == "v1"]
        name = type(reports).__name__
        assert v1["fixes"].tolist() == [len(TRACK)], name
        assert v1["assigned_fixes"].tolist() == [len(TRACK)], name
        assert v1["inside_fixes"].tolist() == [len(TRACK) - len(OFF_ROUTE)], name

    # The restatement's replay of the bucket, with the master events as it loads them.
    events = load_master_events(str(root))
    assert [e["effective_ms"] for e in events] == [D0, D1]
    df = track_frame().assign(slice=D1)
    restated = restate_bucket(df, events, {}, {D1: 0}, 0, D1 - 600_000, 0, cfg)
    assert sorted(restated["alert_id"]) == live
