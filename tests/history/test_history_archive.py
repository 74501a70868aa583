"""The archive writer end to end (real broker, real processor, real Spark): exactly once across a
stop, a simulated crash between writing a batch and committing it, and re-deliveries; GeoParquet
layout; compaction and retention on a copy of the recorded archive."""

from __future__ import annotations

import json
import shutil
from collections import Counter
from pathlib import Path

import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest
import shapely

from history.maintenance import apply_retention, compact
from history.schema import ALERT_SCHEMA, MASTER_SCHEMA, TELEMETRY_SCHEMA, bucket_of, date_of_ms
from tests.history.helpers import Recording

pytestmark = [pytest.mark.spark, pytest.mark.services]


def _read(root: Path, table: str, schema: pa.Schema) -> pa.Table:
    return ds.dataset(root / table, format="parquet", schema=schema).to_table()


def test_telemetry_archived_exactly_once(rec: Recording) -> None:
    t = _read(rec.root, "telemetry", TELEMETRY_SCHEMA)
    keys = list(zip(t.column("vehicle_id").to_pylist(), t.column("seq").to_pylist(), strict=True))
    dups = [k for k, n in Counter(keys).items() if n > 1]
    assert dups == []
    unique_sent = {(f.vehicle_id, f.seq) for f in rec.sent}
    # Re-deliveries and v4's duplicates were really sent: the de-duplication had work to do.
    assert len(rec.sent) - len(unique_sent) >= 30
    assert set(keys) == unique_sent
    # The processor's own count of accepted fixes agrees (it never saw the last re-deliveries,
    # which are duplicates anyway).
    assert len(keys) == rec.accepted
    # Junk never reaches the archive.
    assert "v9" not in set(t.column("vehicle_id").to_pylist())
    # Values: one row per sent fix, same content (heading/accuracy kept when present).
    by_key = {(r["vehicle_id"], r["seq"]): r for r in t.to_pylist()}
    for f in rec.sent:
        r = by_key[(f.vehicle_id, f.seq)]
        assert (r["ts_ms"], r["lat"], r["lon"], r["speed_kmh"]) == (f.ts_ms, f.lat, f.lon, f.speed_kmh)
        assert (r["heading_deg"], r["accuracy_m"], r["received_ms"]) == (
            f.heading_deg,
            f.accuracy_m,
            f.received_ms,
        )
        assert int(r["ts"].timestamp() * 1000) == f.ts_ms
        p = shapely.from_wkb(r["geometry"])
        assert (p.x, p.y) == (f.lon, f.lat)


def test_partition_layout_and_geoparquet_metadata(rec: Recording) -> None:
    files = sorted(rec.root.rglob("*.parquet"))
    tel = [f for f in files if f.parts[-4] == "telemetry"]
    assert tel, files
    for f in tel:
        date, bucket = f.parts[-3].removeprefix("date="), int(f.parts[-2].removeprefix("bucket="))
        t = pq.read_table(f)
        assert t.schema.remove_metadata() == TELEMETRY_SCHEMA
        assert {date_of_ms(x) for x in t.column("ts_ms").to_pylist()} == {date}
        assert {bucket_of(v, 4) for v in t.column("vehicle_id").to_pylist()} == {bucket}
        assert f.name.startswith("part-")
        assert f.name.endswith(".parquet")
        geo = json.loads(pq.read_metadata(f).metadata[b"geo"])
        assert geo["version"] == "1.1.0"
        assert geo["primary_column"] == "geometry"
        col = geo["columns"]["geometry"]
        assert col["encoding"] == "WKB"
        assert col["geometry_types"] == ["Point"]
        pts = shapely.from_wkb(t.column("geometry").to_numpy(zero_copy_only=False))
        xs, ys = shapely.get_x(pts), shapely.get_y(pts)
        assert col["bbox"] == [xs.min(), ys.min(), xs.max(), ys.max()]
    for f in files:
        if f.parts[-2] == "master":
            assert b"geo" not in (pq.read_metadata(f).metadata or {})
    assert not list(rec.root.glob("_staging/*/**/*.parquet")), "staging must be empty after each batch"


def test_replayed_batch_rewrote_identical_files(rec: Recording) -> None:
    assert rec.batches_first_run >= 2
    assert rec.replayed_before, "the replayed batch had written files before the simulated crash"
    assert rec.replayed_after.keys() == rec.replayed_before.keys()
    for name, (digest, mtime) in rec.replayed_before.items():
        after_digest, after_mtime = rec.replayed_after[name]
        assert after_digest == digest, name
        assert after_mtime != mtime, f"{name} was not rewritten by the replay"


def test_alerts_archived_equal_committed_alerts(rec: Recording) -> None:
    t = _read(rec.root, "alerts", ALERT_SCHEMA)
    rows = {r["alert_id"]: r for r in t.to_pylist()}
    assert t.num_rows == len(rows) == len(rec.alerts) >= 20
    for a in rec.alerts:
        r = rows[a["alert_id"]]
        for k in ("type", "vehicle_id", "route_id", "route_version", "seq", "ts_ms", "lat", "lon"):
            assert r[k] == a[k], k
        assert r["zone_id"] == a.get("zone_id")
        assert json.loads(r["details"]) == a["details"]
        assert shapely.from_wkb(r["geometry"]).equals(shapely.Point(a["lon"], a["lat"]))
    for f in (rec.root / "alerts").rglob("*.parquet"):
        assert {date_of_ms(x) for x in pq.read_table(f).column("ts_ms").to_pylist()} == {
            f.parent.name.removeprefix("date=")
        }


def test_master_events_archived_once(rec: Recording) -> None:
    t = _read(rec.root, "master", MASTER_SCHEMA)
    got = sorted((r["entity"], r["id"], r["version"]) for r in t.to_pylist())
    assert got == sorted((e["entity"], e["id"], e["version"]) for e in rec.master)
    for r in t.to_pylist():
        e = next(e for e in rec.master if (e["entity"], e["id"]) == (r["entity"], r["id"]))
        assert json.loads(r["data"]) == e["data"]
        assert r["event_ts_ms"] == e["ts_ms"]
        assert r["op"] == e["op"]


def test_compaction_and_retention(rec: Recording, tmp_path: Path) -> None:
    root = tmp_path / "archive"
    shutil.copytree(rec.root, root)
    before = _read(root, "telemetry", TELEMETRY_SCHEMA).sort_by(
        [("vehicle_id", "ascending"), ("seq", "ascending")]
    )
    alerts_before = _read(root, "alerts", ALERT_SCHEMA).num_rows
    day = date_of_ms(rec.sent[0].ts_ms)
    # Today is the data's day: nothing is old enough.
    assert compact(str(root), rec.hs.checkpoint_location, today=day).partitions == 0
    leaves = list((root / "telemetry").glob("date=*/bucket=*")) + list((root / "alerts").glob("date=*"))
    multi = [d for d in leaves if len(list(d.glob("*.parquet"))) > 1]
    assert multi, "several batches wrote into the same partition"
    report = compact(str(root), rec.hs.checkpoint_location, today="2099-01-01")
    assert report.partitions >= len(multi)
    for d in leaves:
        names = [p.name for p in d.glob("*.parquet")]
        assert len(names) == 1, names
        assert names[0].startswith("compacted-") == (d in multi), (d, names)
        assert not list(d.glob("*.tmp")), list(d.iterdir())
    after = _read(root, "telemetry", TELEMETRY_SCHEMA).sort_by(
        [("vehicle_id", "ascending"), ("seq", "ascending")]
    )
    assert after.equals(before)
    assert _read(root, "alerts", ALERT_SCHEMA).num_rows == alerts_before
    # A second run has nothing left to merge.
    assert compact(str(root), rec.hs.checkpoint_location, today="2099-01-01").partitions == 0
    # Retention: partitions of the data's day go once they are older than the setting, master stays.
    assert apply_retention(str(root), 90, today=day) == []
    deleted = apply_retention(str(root), 90, today="2099-01-01")
    assert len(deleted) == 2
    assert not list((root / "telemetry").glob("date=*"))
    assert not list((root / "alerts").glob("date=*"))
    assert list((root / "master").glob("*.parquet"))


def test_cli_archive_compact_and_retention(
    rec: Recording, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from typer.testing import CliRunner

    from cli.app import app

    root = tmp_path / "archive"
    shutil.copytree(rec.root, root)
    monkeypatch.setenv("FLEETFENCE_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.setenv("FLEETFENCE_HISTORY_ARCHIVE_PATH", str(root))
    monkeypatch.setenv("FLEETFENCE_HISTORY_CHECKPOINT", rec.hs.checkpoint_location)
    res = CliRunner().invoke(app, ["archive", "compact"])
    assert res.exit_code == 0, res.output
    # The data is days old (the scenario's clock): every multi-file partition got merged.
    for d in (root / "telemetry").glob("date=*/bucket=*"):
        assert len(list(d.glob("*.parquet"))) == 1
    res = CliRunner().invoke(app, ["archive", "retention", "--days", "1"])
    assert res.exit_code == 0, res.output
    assert "deleted 2 date partitions" in res.output
