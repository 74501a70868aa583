"""Restatement over the recorded scenario (real processor alerts, real archive, Spark batch):
nothing changed reproduces the live alerts exactly; a widened corridor removes exactly the
deviation alerts of the moderate excursion."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
import shapely

from history.errors import RestateError
from history.restate import (
    RestateRequest,
    RestateResult,
    load_master_events,
    route_overrides,
    run_restatement,
)
from history.schema import bucket_of, date_of_ms, part_file_name, partition_dir, to_table, write_geoparquet
from processor.core.domain import EngineConfig
from processor.core.master import takes_effect_ms
from tests.history.helpers import Recording
from tests.processor.helpers import LINE, T0, master_events, scenario

pytestmark = [pytest.mark.spark, pytest.mark.services]

WINDOW = (T0, T0 + 600_000)


def _restate(spark: Any, rec: Recording, out: Path, **kw: Any) -> RestateResult:
    req = RestateRequest(WINDOW[0], WINDOW[1], str(out), **kw)
    return run_restatement(spark, rec.hs.archive_root, req, rec.cfg)


def test_nothing_changed_reproduces_the_live_alerts(spark: Any, rec: Recording, tmp_path: Path) -> None:
    r = _restate(spark, rec, tmp_path / "same")
    live_ids = sorted(a["alert_id"] for a in rec.alerts)
    assert len(live_ids) >= 20  # deviation, return, overspeed, zones and event-time silences
    assert sorted(r.restated["alert_id"]) == live_ids
    assert r.only_live == []
    assert r.only_restated == []
    assert r.changed == []
    assert sorted(r.same) == live_ids
    # Content, field by field, against the alerts the live processor committed to Kafka.
    by_id = {row["alert_id"]: row for row in r.restated.to_dict("records")}
    for a in rec.alerts:
        got = by_id[a["alert_id"]]
        for k in ("type", "vehicle_id", "route_id", "route_version", "seq", "ts_ms", "lat", "lon"):
            assert got[k] == a[k], (a["alert_id"], k)
        assert json.loads(got["details"]) == a["details"]
        assert (got["zone_id"] or None) == a.get("zone_id")
    out = pq.read_table(tmp_path / "same" / "alerts.parquet")
    assert out.num_rows == len(live_ids)
    geo = json.loads(out.schema.metadata[b"geo"])
    assert geo["columns"]["geometry"]["encoding"] == "WKB"
    assert all(isinstance(shapely.from_wkb(g), shapely.Point) for g in out.column("geometry").to_pylist())
    diff = json.loads((tmp_path / "same" / "diff.json").read_text())
    assert diff["counts"]["same"] == len(live_ids)
    assert diff["counts"]["only_live"] == 0


def test_widened_corridor_removes_exactly_the_excursion_deviations(
    spark: Any, rec: Recording, tmp_path: Path
) -> None:
    route = next(e for e in rec.master if e["entity"] == "route")["data"]
    # v1 leaves the line by 300 m; a 1 km wide corridor (500 m each side) contains that excursion.
    proposed = {
        "type": "FeatureCollection",
        "features": [
            {
                "type": "Feature",
                "id": "r1",
                "geometry": {"type": "LineString", "coordinates": LINE},
                "properties": {
                    **{k: v for k, v in route.items() if k not in ("geometry", "route_id")},
                    "entity": "route",
                    "corridor_width_m": 1000,
                },
            }
        ],
    }
    r = _restate(spark, rec, tmp_path / "wide", routes_geojson=proposed)
    excursion = sorted(
        a["alert_id"]
        for a in rec.alerts
        if a["vehicle_id"] == "v1" and a["type"] in ("ROUTE_DEVIATION", "ROUTE_RETURN")
    )
    assert len(excursion) == 2
    assert r.only_live == excursion
    assert r.only_restated == []
    assert r.changed == []
    assert sorted(r.same) == sorted(a["alert_id"] for a in rec.alerts if a["alert_id"] not in excursion)
    diff = json.loads((tmp_path / "wide" / "diff.json").read_text())
    assert sorted(a["alert_id"] for a in diff["only_live"]) == excursion
    assert {a["type"] for a in diff["only_live"]} == {"ROUTE_DEVIATION", "ROUTE_RETURN"}


def test_overrides_are_validated(rec: Recording) -> None:
    events = load_master_events(rec.hs.archive_root)
    # Every archived event once, in the order each takes effect (a backdated assignment first).
    assert sorted((e["entity"], e["id"], e["version"]) for e in events) == sorted(
        (e["entity"], e["id"], e["version"]) for e in rec.master
    )
    assert [e["effective_ms"] for e in events] == sorted(takes_effect_ms(e) for e in events)
    route = next(e for e in rec.master if e["entity"] == "route")["data"]
    assert route_overrides(events, None, {"r1": 1}) == {"r1": route}
    with pytest.raises(RestateError, match="version 9"):
        route_overrides(events, None, {"r1": 9})
    bad = {"type": "FeatureCollection", "features": [{"type": "Feature", "id": "r1", "properties": {}}]}
    with pytest.raises(RestateError, match="not valid"):
        route_overrides(events, bad, {})


def test_cli_restate_prints_and_writes_the_diff(
    spark: Any, rec: Recording, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from typer.testing import CliRunner

    from cli.app import app
    from fleetfence.contracts import ms_to_iso

    route = next(e for e in rec.master if e["entity"] == "route")["data"]
    proposed = {
        "type": "FeatureCollection",
        "features": [
            {
                "type": "Feature",
                "id": "r1",
                "geometry": route["geometry"],
                "properties": {"entity": "route", **{k: v for k, v in route.items() if k != "geometry"}},
            }
        ],
    }
    (tmp_path / "same.geojson").write_text(json.dumps(proposed))
    monkeypatch.setenv("FLEETFENCE_STATE_DIR", str(tmp_path / "state"))
    args = ["restate", "--archive", rec.hs.archive_root, "--out", str(tmp_path / "cli")]
    args += [
        "--from",
        ms_to_iso(WINDOW[0]),
        "--to",
        str(WINDOW[1]),
        "--routes",
        str(tmp_path / "same.geojson"),
    ]
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 0, res.output
    assert "only live" in res.output
    diff = json.loads((tmp_path / "cli" / "diff.json").read_text())
    # The proposal is the archived route itself: nothing changes.
    assert diff["counts"]["same"] == len(rec.alerts)
    assert diff["counts"]["only_live"] == diff["counts"]["only_restated"] == diff["counts"]["changed"] == 0
    bad = CliRunner().invoke(app, [*args[:-2], "--route-version", "r1=x"])
    assert bad.exit_code == 2
    assert "ID=VERSION" in bad.output


def _small_archive(root: Path, extra_master: list[dict[str, Any]]) -> None:
    """The processor scenario written straight into an archive with the archive's own helpers."""
    fixes = list({(f.vehicle_id, f.seq): f for f in scenario()}.values())
    parts: dict[tuple[str, int], list[Any]] = {}
    for f in fixes:
        parts.setdefault((date_of_ms(f.ts_ms), bucket_of(f.vehicle_id, 4)), []).append(f)
    names = (
        "vehicle_id",
        "seq",
        "ts_ms",
        "lat",
        "lon",
        "speed_kmh",
        "heading_deg",
        "accuracy_m",
        "received_ms",
    )
    for (day, bucket), fs in parts.items():
        folder = root / partition_dir("telemetry", day, bucket)
        folder.mkdir(parents=True)
        cols = {k: [getattr(f, k) for f in fs] for k in names}
        write_geoparquet(to_table("telemetry", cols), str(folder / part_file_name(0, 0)))
    events = master_events() + extra_master
    (root / "master").mkdir(parents=True)
    master = {
        "entity": [e["entity"] for e in events],
        "id": [e["id"] for e in events],
        "version": [e["version"] for e in events],
        "op": [e["op"] for e in events],
        "data": [json.dumps(e["data"]) for e in events],
        "event_ts_ms": [e["ts_ms"] for e in events],
        "kafka_offset": list(range(len(events))),
    }
    write_geoparquet(to_table("master", master), str(root / "master" / part_file_name(0, 0)))


def test_master_change_inside_the_window_applies_from_its_event_time(spark: Any, tmp_path: Path) -> None:
    route = master_events()[0]
    # r1 v2 widens the corridor to 1 km at T0 + 24.5 s, while v1 is 300 m off (fixes 20-29, 1 Hz).
    wider = {**route, "version": 2, "ts_ms": T0 + 24_500, "data": {**route["data"], "corridor_width_m": 1000}}
    _small_archive(tmp_path / "archive", [wider])
    req = RestateRequest(WINDOW[0], WINDOW[1], str(tmp_path / "out"))
    r = run_restatement(spark, str(tmp_path / "archive"), req, EngineConfig())
    v1 = r.restated[r.restated["vehicle_id"] == "v1"].sort_values("seq")
    dev = v1[v1["type"] == "ROUTE_DEVIATION"]
    ret = v1[v1["type"] == "ROUTE_RETURN"]
    # Deviation under v1 at the third outside fix (seq 22); from 24.5 s on, fixes 25 and 26 are
    # inside the wider corridor: the return comes at seq 26 under v2 (not at seq 31 as with v1).
    assert dev[["seq", "route_version"]].to_numpy().tolist() == [[22, 1]]
    assert ret[["seq", "route_version"]].to_numpy().tolist() == [[26, 2]]
    assert json.loads(ret.iloc[0]["details"]) == {"off_route_s": 6.0}
    # No live alerts in this archive: every restated alert is only_restated.
    assert sorted(r.only_restated) == sorted(r.restated["alert_id"])
