"""The report exports (history/report_formats.py) read back by real readers: gpxpy for GPX, fastkml
for KML, geopandas (and pyarrow) for GeoParquet, the csv module for CSV.

No SedonaDB here: the rows come from the reports' own shaping functions (`finish_*`, `h3_counts`)
fed with engine-shaped frames, so they have exactly the columns and dtypes the reports produce;
`test_rows_have_the_report_schemas` fails if those functions and the schemas the exports cast to
drift apart. The exports of the real reports are checked in test_history_reports.py (CLI and API).
"""

from __future__ import annotations

import csv
import io
import re
from pathlib import Path
from typing import Any

import h3
import numpy as np
import orjson
import pandas as pd
import pyarrow.parquet as pq
import pytest
import shapely
from typer.testing import CliRunner

from history.errors import ReportError
from history.report_formats import MEDIA_TYPES, OFFERED, SUFFIXES, check_format, export, filename, geometries
from history.report_inputs import NEVER_MS
from history.reports import (
    REPORTS,
    SCHEMAS,
    TRACK_COLUMNS,
    ReportData,
    finish_adherence,
    finish_speeding,
    finish_stops,
    finish_tracks,
    finish_trips,
    finish_visits,
    h3_counts,
)
from tests.history.helpers import read_geoparquet, read_gpx, read_kml

T = 1_795_161_600_000  # 2026-11-20T08:00:00Z


def with_ts_twins(names: list[str]) -> list[str]:
    """The columns of an export: each `*_ts_ms` followed by its ISO/timestamp twin `*_ts`."""
    out: list[str] = []
    for c in names:
        out += [c, c[: -len("_ms")]] if c.endswith("_ts_ms") else [c]
    return out


def iso(ms: int) -> str:
    return pd.Timestamp(ms, unit="ms", tz="UTC").strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


# --------------------------------------------------------------------------- rows as the reports make them


def adherence_rows() -> pd.DataFrame:
    return finish_adherence(
        pd.DataFrame(
            {
                "vehicle_id": ["v1", "v2"],
                "day": [T // 86_400_000, T // 86_400_000],
                "fixes": [12, 4],
                "assigned_fixes": [12, 0],  # v2 unassigned: inside_share is NaN
                "inside_fixes": [9, None],
                "off_route_s": [30.0, 0.0],
                "off_route_m": [632.5, 0.0],
            }
        )
    )


def visits_rows() -> pd.DataFrame:
    return finish_visits(
        pd.DataFrame(
            {
                "vehicle_id": ["v1", "v2"],
                "zone_id": ["z-dépôt, nord", "z2"],  # non-ASCII and a comma: UTF-8 and CSV quoting
                "entry_ts_ms": [T, T + 60_000],
                "last_inside_ts_ms": [T + 10_000, T + 90_000],
                "exit_or_never": [T + 20_000, NEVER_MS],  # v2: the data ends inside
                "fixes": [2, 4],
                "entry_lon": [13.414, -0.127758],
                "entry_lat": [52.5, 51.507351],
            }
        )
    )


def speeding_data() -> ReportData:
    rows = finish_speeding(
        pd.DataFrame(
            {
                "vehicle_id": ["v1", "v3"],
                "route_id": ["r1", "r1"],
                "speed_limit_kmh": [50.0, 50.0],
                "start_ts_ms": [T + 20_000, T + 3_600_000],
                "end_ts_ms": [T + 40_000, T + 3_600_000],  # v3: one fix above the limit, a 0 s episode
                "fixes": [3, 1],
                "max_kmh": [62.0, 60.0],
            }
        )
    )
    tracks = finish_tracks(
        pd.DataFrame(
            {
                "vehicle_id": ["v1", "v1", "v1", "v3"],
                "start_ts_ms": [T + 20_000] * 3 + [T + 3_600_000],
                "ts_ms": [T + 20_000, T + 30_000, T + 40_000, T + 3_600_000],
                "lon": [13.407, 13.408, 13.409, 13.425],
                "lat": [52.49991006796, 52.5, 52.50062952425, 52.50134898],
                "speed_kmh": [55.0, 60.0, 62.0, 60.0],
                "rn": [3, 4, 5, 1],  # the engine's fix number, dropped
            }
        )
    )
    return ReportData("speeding", rows, tracks=tracks)


def heatmap_rows() -> pd.DataFrame:
    return h3_counts(np.array([52.5, 52.5, 48.85]), np.array([13.41, 13.41, 2.35]), 9)


def stops_rows() -> pd.DataFrame:
    return finish_stops(
        pd.DataFrame(
            {
                "vehicle_id": ["v1", "v2"],
                "start_ts_ms": [T, T + 600_000],
                "end_ts_ms": [T + 300_000, T + 1_500_000],
                "fixes": [5, 16],
                "lon": [13.403, -0.127758],
                "lat": [52.5, 51.507351],
            }
        )
    )


def trips_data() -> ReportData:
    rows = finish_trips(
        pd.DataFrame(
            {
                "vehicle_id": ["v1", "v3"],
                "start_ts_ms": [T + 300_000, T + 3_600_000],
                "end_ts_ms": [T + 420_000, T + 3_600_000],  # v3: two fixes at one instant, a 0 s trip
                "fixes": [3, 2],
                "distance_m": [1354.5, 0.0],
                "max_kmh": [42.0, 3.0],
                "start_lon": [13.403, 13.425],
                "start_lat": [52.5, 52.50134898],
                "end_lon": [13.423, 13.425],
                "end_lat": [52.501, 52.50134898],
                "rn": [1, 2],  # an engine's extra column, dropped
            }
        )
    )
    tracks = finish_tracks(
        pd.DataFrame(
            {
                "vehicle_id": ["v1", "v1", "v1", "v3", "v3"],
                "start_ts_ms": [T + 300_000] * 3 + [T + 3_600_000] * 2,
                "ts_ms": [T + 300_000, T + 360_000, T + 420_000, T + 3_600_000, T + 3_600_000],
                "lon": [13.403, 13.413, 13.423, 13.425, 13.425],
                "lat": [52.5, 52.5005, 52.501, 52.50134898, 52.50134898],
                "speed_kmh": [20.0, 42.0, 30.0, 3.0, 0.0],
            }
        )
    )
    return ReportData("trips", rows, tracks=tracks)


def data_of(name: str, empty: bool = False) -> ReportData:
    if name in ("speeding", "trips"):
        data = speeding_data() if name == "speeding" else trips_data()
        if empty:
            assert data.tracks is not None
            return ReportData(name, data.rows.iloc[:0], tracks=data.tracks.iloc[:0])
        return data
    rows = {
        "adherence": adherence_rows,
        "zone_visits": visits_rows,
        "heatmap": heatmap_rows,
        "stops": stops_rows,
    }[name]()
    return ReportData(name, rows.iloc[:0] if empty else rows)


def expected_geometries(name: str) -> list[Any]:
    if name == "zone_visits":
        return [shapely.Point(13.414, 52.5), shapely.Point(-0.127758, 51.507351)]
    if name == "speeding":
        return [
            shapely.LineString([(13.407, 52.49991006796), (13.408, 52.5), (13.409, 52.50062952425)]),
            shapely.Point(13.425, 52.50134898),
        ]
    if name == "stops":
        return [shapely.Point(13.403, 52.5), shapely.Point(-0.127758, 51.507351)]
    if name == "trips":
        return [
            shapely.LineString([(13.403, 52.5), (13.413, 52.5005), (13.423, 52.501)]),
            shapely.Point(13.425, 52.50134898),  # its fixes hold one position: a Point, not a line
        ]
    if name == "heatmap":
        out = []
        for cell in heatmap_rows()["h3_cell"]:
            ring = [(lng, lat) for lat, lng in h3.cell_to_boundary(cell)]
            out.append(shapely.Polygon(ring))
        return out
    return []


CASES = [(name, fmt) for name in REPORTS for fmt in OFFERED[name]]


def test_rows_have_the_report_schemas() -> None:
    """What the shaping functions return is what the exports cast to (and the API documents)."""
    for name in REPORTS:
        rows = data_of(name).rows
        assert list(rows.columns) == SCHEMAS[name].names, name
        assert export(data_of(name), "json")  # the cast inside succeeds
    for data in (speeding_data(), trips_data()):
        assert data.tracks is not None
        assert list(data.tracks.columns) == TRACK_COLUMNS
    # finish_trips derives the duration and the average speed (NaN for a 0 s trip, not inf).
    trips = trips_data().rows
    assert trips["duration_s"].tolist() == [120.0, 0.0]
    assert trips["avg_kmh"].iloc[0] == 1354.5 / 120.0 * 3.6
    assert pd.isna(trips["avg_kmh"].iloc[1])
    assert stops_rows()["duration_s"].tolist() == [300.0, 900.0]


def test_every_format_has_a_media_type_and_a_suffix() -> None:
    offered = {f for formats in OFFERED.values() for f in formats}
    assert offered <= set(MEDIA_TYPES) == set(SUFFIXES)
    for name in REPORTS:  # the API negotiates by media type: one format per media type and report
        assert len({MEDIA_TYPES[f] for f in OFFERED[name]}) == len(OFFERED[name])
    # GeoParquet for every report with a geometry; plain Parquet for the one without.
    assert [n for n in REPORTS if geometries(data_of(n)) is None] == ["adherence"]
    assert {n for n in REPORTS if "parquet" in OFFERED[n]} == {"adherence"}
    assert {n for n in REPORTS if "gpx" in OFFERED[n]} == {"zone_visits", "speeding", "stops", "trips"}
    assert {n for n in REPORTS if "kml" in OFFERED[n]} == {"zone_visits", "speeding", "stops", "trips"}
    # Every report but adherence as CSV and GeoParquet (issue #40: every report exports to both).
    assert {n for n in REPORTS if {"csv", "geoparquet"} <= set(OFFERED[n])} == set(REPORTS) - {"adherence"}


@pytest.mark.parametrize(
    ("name", "fmt"), [(n, f) for n in REPORTS for f in MEDIA_TYPES if f not in OFFERED[n]]
)
def test_a_format_the_report_cannot_give_names_those_it_can(name: str, fmt: str) -> None:
    with pytest.raises(
        ReportError, match=f"cannot be given as {fmt}; it can be: {', '.join(OFFERED[name])}$"
    ):
        export(data_of(name), fmt)
    with pytest.raises(ReportError, match="it can be"):
        check_format(name, fmt)


def test_filename() -> None:
    assert filename("speeding", T, T + 86_400_000, "geoparquet") == (
        "speeding_20261120T080000Z_20261121T080000Z.parquet"
    )


# --------------------------------------------------------------------------- CSV


@pytest.mark.parametrize("name", REPORTS)
def test_csv(name: str) -> None:
    data = data_of(name)
    body = export(data, "csv")
    rows = list(csv.DictReader(io.StringIO(body.decode("utf-8"), newline="")))
    assert len(rows) == len(data.rows)
    header = next(csv.reader(io.StringIO(body.decode("utf-8"))))
    expected_header = with_ts_twins(SCHEMAS[name].names)
    if name != "adherence":
        expected_header.append("geometry_wkt")
    assert header == expected_header
    for got, want in zip(rows, data.rows.to_dict("records"), strict=True):
        for c in SCHEMAS[name].names:
            v = want[c]
            if pd.isna(v):
                assert got[c] == "", c
            elif isinstance(v, float):
                assert float(got[c]) == v, c  # full precision
            else:
                assert got[c] == str(v), c
            if c.endswith("_ts_ms"):
                assert got[c[:-3]] == ("" if pd.isna(v) else iso(int(v)))
    if name != "adherence":
        for got, geom in zip(rows, expected_geometries(name), strict=True):
            assert shapely.equals_exact(shapely.from_wkt(got["geometry_wkt"]), geom, tolerance=0)


# --------------------------------------------------------------------------- (Geo)Parquet


@pytest.mark.parametrize("name", ["zone_visits", "speeding", "heatmap", "stops", "trips"])
def test_geoparquet(name: str, tmp_path: Path) -> None:
    data = data_of(name)
    path = tmp_path / f"{name}.parquet"
    path.write_bytes(export(data, "geoparquet"))
    gdf = read_geoparquet(path)
    assert pq.read_schema(path).names == [*with_ts_twins(SCHEMAS[name].names), "geometry"]
    for got, want in zip(gdf.geometry.values, expected_geometries(name), strict=True):
        assert shapely.equals_exact(got, want, tolerance=0)
    for c in SCHEMAS[name].names:
        pd.testing.assert_series_equal(
            gdf[c].reset_index(drop=True),
            data.rows[c].reset_index(drop=True),
            check_dtype=False,
            check_names=False,
        )
        if c.endswith("_ts_ms"):  # a real UTC timestamp beside the epoch milliseconds
            ts = gdf[c[:-3]]
            assert str(ts.dtype) in ("datetime64[ms, UTC]", "datetime64[ns, UTC]")
            want = [pd.NaT if pd.isna(v) else pd.Timestamp(int(v), unit="ms", tz="UTC") for v in data.rows[c]]
            assert ts.tolist() == want


def test_adherence_parquet_has_no_geometry(tmp_path: Path) -> None:
    data = data_of("adherence")
    path = tmp_path / "adherence.parquet"
    path.write_bytes(export(data, "parquet"))
    assert b"geo" not in (pq.read_metadata(path).metadata or {})
    table = pq.read_table(path)
    assert table.schema == SCHEMAS["adherence"]
    got = table.to_pandas()
    pd.testing.assert_frame_equal(got, data.rows, check_dtype=False)


# --------------------------------------------------------------------------- GPX


def test_gpx_zone_visits_are_waypoints() -> None:
    data = data_of("zone_visits")
    gpx = read_gpx(export(data, "gpx"))
    assert gpx.tracks == []
    assert len(gpx.waypoints) == 2
    for wpt, row in zip(gpx.waypoints, data.rows.to_dict("records"), strict=True):
        assert (wpt.longitude, wpt.latitude) == (row["entry_lon"], row["entry_lat"])
        assert int(wpt.time.timestamp() * 1000) == row["entry_ts_ms"]
        assert wpt.name == f"{row['vehicle_id']} @ {row['zone_id']}"
        assert wpt.type == "zone_visit"
        assert f"dwell {row['dwell_s']:g} s" in wpt.description
    assert "data ends inside" in gpx.waypoints[1].description


def test_gpx_speeding_episodes_are_tracks() -> None:
    data = speeding_data()
    gpx = read_gpx(export(data, "gpx"))
    assert gpx.waypoints == []
    assert [t.name for t in gpx.tracks] == [
        f"v1 speeding {iso(T + 20_000)}",
        f"v3 speeding {iso(T + 3_600_000)}",
    ]
    assert data.tracks is not None
    for trk, (_, fixes) in zip(gpx.tracks, data.tracks.groupby("start_ts_ms"), strict=True):
        (seg,) = trk.segments
        assert [(p.longitude, p.latitude, int(p.time.timestamp() * 1000)) for p in seg.points] == list(
            zip(fixes["lon"], fixes["lat"], fixes["ts_ms"], strict=True)
        )
        assert trk.type == "speeding"
    assert "max 62 km/h" in gpx.tracks[0].description


def test_gpx_stops_are_waypoints() -> None:
    data = data_of("stops")
    gpx = read_gpx(export(data, "gpx"))
    assert gpx.tracks == []
    rows = data.rows.to_dict("records")
    assert [(w.longitude, w.latitude) for w in gpx.waypoints] == [(r["lon"], r["lat"]) for r in rows]
    for wpt, row in zip(gpx.waypoints, rows, strict=True):
        assert int(wpt.time.timestamp() * 1000) == row["start_ts_ms"]
        assert wpt.name == f"{row['vehicle_id']} stop {iso(row['start_ts_ms'])}"
        assert wpt.type == "stop"
        assert f"{row['duration_s']:g} s, {row['fixes']} fixes" in wpt.description


def test_gpx_trips_are_tracks() -> None:
    data = trips_data()
    gpx = read_gpx(export(data, "gpx"))
    assert gpx.waypoints == []
    assert [t.name for t in gpx.tracks] == [f"v1 trip {iso(T + 300_000)}", f"v3 trip {iso(T + 3_600_000)}"]
    assert data.tracks is not None
    for trk, (_, fixes) in zip(gpx.tracks, data.tracks.groupby("start_ts_ms"), strict=True):
        (seg,) = trk.segments
        assert [(p.longitude, p.latitude, int(p.time.timestamp() * 1000)) for p in seg.points] == list(
            zip(fixes["lon"], fixes["lat"], fixes["ts_ms"], strict=True)
        )
        assert trk.type == "trip"
    assert "1354 m, 3 fixes, max 42 km/h, avg 40.6 km/h" in gpx.tracks[0].description
    assert "avg - km/h" in gpx.tracks[1].description  # a 0 s trip has no average


# --------------------------------------------------------------------------- KML


def test_kml_zone_visits_are_points_with_a_time_span() -> None:
    data = data_of("zone_visits")
    placemarks = read_kml(export(data, "kml"))
    rows = data.rows.to_dict("records")
    assert [p.name for p in placemarks] == [f"{r['vehicle_id']} @ {r['zone_id']}" for r in rows]
    for pm, row, geom in zip(placemarks, rows, expected_geometries("zone_visits"), strict=True):
        assert shapely.equals_exact(pm.geometry, geom, tolerance=0)
        assert pm.begin_ms == row["entry_ts_ms"]
        # until the exit, or the last fix inside when the data ends inside
        assert pm.end_ms == (row["last_inside_ts_ms"] if pd.isna(row["exit_ts_ms"]) else row["exit_ts_ms"])
        assert pm.data["zone_id"] == row["zone_id"]
        if pd.isna(row["exit_ts_ms"]):  # a null column is left out
            assert "exit_ts" not in pm.data
            assert "exit_ts_ms" not in pm.data
        else:
            assert pm.data["exit_ts"] == iso(row["exit_ts_ms"])
        assert float(pm.data["dwell_s"]) == row["dwell_s"]


def test_kml_speeding_episodes_are_lines_with_a_time_span() -> None:
    data = speeding_data()
    placemarks = read_kml(export(data, "kml"))
    rows = data.rows.to_dict("records")
    for pm, row, geom in zip(placemarks, rows, expected_geometries("speeding"), strict=True):
        assert shapely.equals_exact(pm.geometry, geom, tolerance=0)  # a one-fix episode is a Point
        assert (pm.begin_ms, pm.end_ms) == (row["start_ts_ms"], row["end_ts_ms"])
        assert float(pm.data["max_kmh"]) == row["max_kmh"]
        assert pm.data["route_id"] == row["route_id"]


def test_kml_stops_are_points_with_a_time_span() -> None:
    data = data_of("stops")
    placemarks = read_kml(export(data, "kml"))
    rows = data.rows.to_dict("records")
    for pm, row, geom in zip(placemarks, rows, expected_geometries("stops"), strict=True):
        assert shapely.equals_exact(pm.geometry, geom, tolerance=0)
        assert (pm.begin_ms, pm.end_ms) == (row["start_ts_ms"], row["end_ts_ms"])
        assert float(pm.data["duration_s"]) == row["duration_s"]
        assert pm.data["vehicle_id"] == row["vehicle_id"]


def test_kml_trips_are_lines_with_a_time_span() -> None:
    data = trips_data()
    placemarks = read_kml(export(data, "kml"))
    rows = data.rows.to_dict("records")
    assert len(placemarks) == len(rows)
    for pm, row, geom in zip(placemarks, rows, expected_geometries("trips"), strict=True):
        assert shapely.equals_exact(pm.geometry, geom, tolerance=0)
        assert (pm.begin_ms, pm.end_ms) == (row["start_ts_ms"], row["end_ts_ms"])
        assert float(pm.data["distance_m"]) == row["distance_m"]
    assert "avg_kmh" not in placemarks[1].data  # null for a 0 s trip: left out


# --------------------------------------------------------------------------- GeoJSON, JSON


@pytest.mark.parametrize("name", ["zone_visits", "speeding", "heatmap", "stops", "trips"])
def test_geojson(name: str) -> None:
    fc = orjson.loads(export(data_of(name), "geojson"))
    assert fc["type"] == "FeatureCollection"
    for f, geom in zip(fc["features"], expected_geometries(name), strict=True):
        assert shapely.equals_exact(shapely.geometry.shape(f["geometry"]), geom, tolerance=0)
    if name == "heatmap":
        assert [f["id"] for f in fc["features"]] == list(heatmap_rows()["h3_cell"])
        assert {f["properties"]["resolution"] for f in fc["features"]} == {9}


# --------------------------------------------------------------------------- empty reports


@pytest.mark.parametrize(("name", "fmt"), CASES)
def test_an_empty_report_exports_and_reads_back(name: str, fmt: str, tmp_path: Path) -> None:
    body = export(data_of(name, empty=True), fmt)
    if fmt == "csv":
        assert len(list(csv.reader(io.StringIO(body.decode())))) == 1  # the header only
    elif fmt == "geoparquet":
        path = tmp_path / "empty.parquet"
        path.write_bytes(body)
        assert len(read_geoparquet(path)) == 0
    elif fmt == "parquet":
        assert pq.read_table(io.BytesIO(body)).num_rows == 0
    elif fmt == "gpx":
        gpx = read_gpx(body)
        assert gpx.waypoints == []
        assert gpx.tracks == []
    elif fmt == "kml":
        assert read_kml(body) == []
    elif fmt == "geojson":
        assert orjson.loads(body)["features"] == []
    else:
        assert orjson.loads(body) == []


# --------------------------------------------------------------------------- the CLI refuses before it runs


def test_cli_refuses_a_format_the_report_cannot_give(tmp_path: Path) -> None:
    """Refused before anything is read: the archive does not even exist."""
    from cli.app import app

    common = ["--from", "2026-11-20", "--to", "2026-11-21", "--archive", str(tmp_path / "none")]
    runner = CliRunner()
    res = runner.invoke(app, ["report", "heatmap", *common, "--format", "gpx"], env={"COLUMNS": "200"})
    assert res.exit_code == 2
    assert (
        "the heatmap report cannot be given as gpx; it can be: json, geojson, csv, geoparquet" in res.output
    )
    res = runner.invoke(
        app, ["report", "adherence", *common, "--format", "geoparquet"], env={"COLUMNS": "200"}
    )
    assert res.exit_code == 2
    assert "it can be: json, csv, parquet" in res.output
    res = runner.invoke(
        app, ["report", "speeding", *common, "--out", str(tmp_path / "x")], env={"COLUMNS": "200"}
    )
    assert res.exit_code == 2
    assert "give a --format too" in res.output
    res = runner.invoke(app, ["report", "zones", *common, "--format", "shp"], env={"COLUMNS": "200"})
    assert res.exit_code == 2  # typer's own refusal of a value outside the choices
    assert not (tmp_path / "none").exists()


def test_cli_formats_are_the_exports_and_the_table() -> None:
    from cli.history import ReportFormat

    assert {f.value for f in ReportFormat} == {"table", *MEDIA_TYPES}


def test_xml_coordinates_are_decimals_that_read_back_exactly() -> None:
    """GPX coordinates are xsd:decimal (no exponent): a fix a metre from Greenwich stays 0.00001."""
    rows = visits_rows()
    rows.loc[0, ["entry_lon", "entry_lat"]] = [1e-05, 0.1]
    data = ReportData("zone_visits", rows)
    body = export(data, "gpx")
    assert b'lat="0.1" lon="0.00001"' in body
    assert all("e" not in v for v in re.findall(r'(?:lat|lon)="([^"]*)"', body.decode()))
    wpt = read_gpx(body).waypoints[0]
    assert (wpt.longitude, wpt.latitude) == (1e-05, 0.1)
    assert read_kml(export(data, "kml"))[0].geometry.x == 1e-05
