"""History reports (SedonaDB) on a small hand-made archive: every figure is derived in this file
from how the tracks were constructed (which fixes were put off-route, in a zone, over the limit),
then compared with SedonaDB's answer, with the Shapely/pandas baseline's, and with the admin API's.

The archive (built by tests/history/helpers.py, buckets=4, GeoParquet via history/schema.py):
- route r1: a straight line along lat 52.50 from lon 13.40 to 13.44. Version 1 (day 0): corridor
  100 m (50 m each side), limit 50 km/h. Version 2 (day 1, 09:00:15): corridor 400 m, limit 80.
- zone z1: the lon/lat box 13.4135..13.4155 x 52.499..52.501.
- v1 (on r1), day 1 from 08:00, one fix every 10 s at lon 13.405 + 0.001 i with sideways offsets;
  fixes 4-6 are 70-170 m off the line (70 m: outside the 50 m half width, inside a
  wrongly unhalved one), fix 11 is 40 m off (inside); speeds cross 50 km/h at fixes 2-4 and
  8-9; fixes 9-10 are in z1. Day 2 from 08:00: three fixes on the line, the last two in z1 (the
  data ends inside).
- v2 (unassigned): four fixes on the line, the middle two in z1, at 90 km/h.
- v3 (on r1), day 1 from 09:00:00: four fixes 150 m off the line at 60 km/h; r1 version 2 starts
  between its second and third fix, so only the first two are off-route and over the limit.
"""

from __future__ import annotations

import io
import math
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import h3
import numpy as np
import orjson
import pandas as pd
import pytest
import shapely
from fastapi.testclient import TestClient

from history.errors import ReportError
from history.report_inputs import report_range
from history.reports import TRACK_COLUMNS, SedonaReports
from history.reports_baseline import BaselineReports
from tests.history.helpers import (
    BUCKETS,
    D1,
    D2,
    FIXES,
    FULL,
    R_M,
    V3_T0,
    ZONE_BOX,
    read_geoparquet,
    read_gpx,
    read_kml,
)

# The zone-visit report's columns, in order, as a user reads them (written here, not taken from the
# code under test).
VISIT_COLUMNS = [
    "vehicle_id",
    "zone_id",
    "entry_ts_ms",
    "exit_ts_ms",
    "last_inside_ts_ms",
    "dwell_s",
    "fixes",
    "entry_lon",
    "entry_lat",
]


def haversine(a: dict[str, Any], b: dict[str, Any]) -> float:
    p1, p2 = math.radians(a["lat"]), math.radians(b["lat"])
    dl = math.radians(b["lon"] - a["lon"])
    h = math.sin((p2 - p1) / 2) ** 2 + math.cos(p1) * math.cos(p2) * math.sin(dl / 2) ** 2
    return 2 * R_M * math.asin(math.sqrt(h))


def fixes_of(vid: str, day_ms: int | None = None) -> list[dict[str, Any]]:
    return [
        f
        for f in FIXES
        if f["vehicle_id"] == vid and (day_ms is None or f["ts_ms"] // 86_400_000 == day_ms // 86_400_000)
    ]


# --------------------------------------------------------------------------- expectations


def expected_adherence() -> pd.DataFrame:
    v1 = fixes_of("v1", D1)
    v3 = fixes_of("v3")
    rows = [
        # v1 day 1: fixes 4, 5, 6 outside; each counts the interval and distance to its next fix.
        ("v1", "2026-11-20", 12, 12, 9, 0.75, 30.0, sum(haversine(v1[i], v1[i + 1]) for i in (4, 5, 6))),
        ("v1", "2026-11-21", 3, 3, 3, 1.0, 0.0, 0.0),
        ("v2", "2026-11-20", 4, 0, 0, np.nan, 0.0, 0.0),
        # v3: fixes 0 and 1 outside the 100 m corridor of r1 v1; 2 and 3 inside v2's 400 m one.
        ("v3", "2026-11-20", 4, 4, 2, 0.5, 20.0, haversine(v3[0], v3[1]) + haversine(v3[1], v3[2])),
    ]
    cols = [
        "vehicle_id",
        "date",
        "fixes",
        "assigned_fixes",
        "inside_fixes",
        "inside_share",
        "off_route_s",
        "off_route_m",
    ]
    return pd.DataFrame(rows, columns=cols)


def expected_visits() -> pd.DataFrame:
    v1, v1b, v2 = fixes_of("v1", D1), fixes_of("v1", D2), fixes_of("v2")
    rows = [
        ("v1", "z1", v1[9]["ts_ms"], v1[11]["ts_ms"], v1[10]["ts_ms"], 20.0, 2, v1[9]["lon"], v1[9]["lat"]),
        ("v1", "z1", v1b[1]["ts_ms"], pd.NA, v1b[2]["ts_ms"], 10.0, 2, v1b[1]["lon"], v1b[1]["lat"]),
        ("v2", "z1", v2[1]["ts_ms"], v2[3]["ts_ms"], v2[2]["ts_ms"], 20.0, 2, v2[1]["lon"], v2[1]["lat"]),
    ]
    df = pd.DataFrame(rows, columns=VISIT_COLUMNS)
    df["exit_ts_ms"] = df["exit_ts_ms"].astype("Int64")
    return df


def expected_speeding() -> pd.DataFrame:
    v1, v3 = fixes_of("v1", D1), fixes_of("v3")
    rows = [
        ("v1", "r1", 50.0, v1[2]["ts_ms"], v1[4]["ts_ms"], 20.0, 3, 62.0),
        ("v1", "r1", 50.0, v1[8]["ts_ms"], v1[9]["ts_ms"], 10.0, 2, 71.0),
        ("v3", "r1", 50.0, v3[0]["ts_ms"], v3[1]["ts_ms"], 10.0, 2, 60.0),  # 60 < 80 once r1 v2 applies
    ]
    cols = [
        "vehicle_id",
        "route_id",
        "speed_limit_kmh",
        "start_ts_ms",
        "end_ts_ms",
        "duration_s",
        "fixes",
        "max_kmh",
    ]
    return pd.DataFrame(rows, columns=cols)


def expected_tracks() -> pd.DataFrame:
    """The fixes of each speeding episode of expected_speeding(), keyed by its first fix."""
    v1, v3 = fixes_of("v1", D1), fixes_of("v3")
    runs = [v1[2:5], v1[8:10], v3[0:2]]
    rows = [
        (f["vehicle_id"], run[0]["ts_ms"], f["ts_ms"], f["lon"], f["lat"], f["speed_kmh"])
        for run in runs
        for f in run
    ]
    return pd.DataFrame(rows, columns=TRACK_COLUMNS)


def expected_heat(resolution: int) -> dict[str, int]:
    off = [fixes_of("v1", D1)[i] for i in (4, 5, 6)] + fixes_of("v3")[:2]
    return dict(Counter(h3.latlng_to_cell(f["lat"], f["lon"], resolution) for f in off))


def assert_same(actual: pd.DataFrame, expected: pd.DataFrame) -> None:
    pd.testing.assert_frame_equal(
        actual.reset_index(drop=True), expected.reset_index(drop=True), check_dtype=False, rtol=1e-9
    )


# --------------------------------------------------------------------------- SedonaDB vs hand-made truth


def test_adherence(sedona: SedonaReports) -> None:
    assert_same(sedona.adherence(), expected_adherence())


def test_zone_visits(sedona: SedonaReports) -> None:
    assert_same(sedona.zone_visits(), expected_visits())


def test_speeding(sedona: SedonaReports) -> None:
    assert_same(sedona.speeding(), expected_speeding())


def test_speeding_tracks(sedona: SedonaReports) -> None:
    """The exports' track of each episode: exactly its fixes above the limit, in fix order."""
    assert_same(sedona.speeding_tracks(), expected_tracks())
    episodes = sedona.speeding_tracks().groupby(["vehicle_id", "start_ts_ms"], sort=False).size()
    assert episodes.tolist() == expected_speeding()["fixes"].tolist()


@pytest.mark.parametrize("resolution", [7, 11])
def test_heatmap(sedona: SedonaReports, resolution: int) -> None:
    df = sedona.heatmap(resolution)
    assert dict(zip(df["h3_cell"], df["off_route_fixes"].astype(int), strict=True)) == expected_heat(
        resolution
    )
    assert df["off_route_fixes"].is_monotonic_decreasing


def test_vehicle_filter_and_range(archive: Path) -> None:
    """The vehicle filter prunes to one bucket; a one-day range keeps that day's runs only."""
    only_v3 = SedonaReports(archive, report_range("2026-11-20", "2026-11-21", "v3"), BUCKETS)
    assert_same(only_v3.adherence(), expected_adherence().iloc[[3]])
    day2 = SedonaReports(archive, report_range("2026-11-21", "2026-11-21"), BUCKETS)
    assert_same(day2.adherence(), expected_adherence().iloc[[1]])
    assert_same(day2.zone_visits(), expected_visits().iloc[[1]])
    assert day2.speeding().empty


def test_empty_range(archive: Path) -> None:
    empty = SedonaReports(archive, report_range("2025-01-01", "2025-01-02"), BUCKETS)
    assert empty.files == 0
    assert empty.adherence().empty
    assert empty.zone_visits().empty
    assert empty.heatmap().empty
    assert empty.speeding_tracks().empty


def test_bad_ranges() -> None:
    with pytest.raises(ReportError, match="end must be after"):
        report_range("2026-11-21", "2026-11-20")
    with pytest.raises(ReportError, match="neither a date"):
        report_range("yesterday", "2026-11-20")
    with pytest.raises(ReportError, match="longer than"):
        report_range("2024-01-01", "2026-01-01")
    with pytest.raises(ReportError, match="UTC offset"):
        report_range("2026-11-20T08:00:00", "2026-11-21")
    rng = report_range("2026-11-20T08:00:00Z", "2026-11-20")  # a date end is inclusive: whole day
    assert (rng.from_ms, rng.to_ms) == (D1, D1 + 16 * 3_600_000)


def test_sedonadb_reads_the_archive_as_geoparquet(sedona: SedonaReports) -> None:
    """The `geo` metadata makes `geometry` a CRS84 geometry column for SedonaDB, equal to lon/lat."""
    field = str(sedona.sd.view("telemetry").schema)
    assert "geometry: non-nullable geometry<WkbView(ogc:crs84)>" in field
    rows = sedona.sd.sql(
        "SELECT count(*) AS n, sum(CASE WHEN ST_X(geometry) = lon AND ST_Y(geometry) = lat THEN 1 ELSE 0 END)"
        " AS same FROM telemetry"
    ).to_arrow_table()
    assert rows.to_pylist() == [{"n": len(FIXES), "same": len(FIXES)}]


def test_circle_zone_visits_are_the_processors_circle(tmp_path: Path) -> None:
    """A circle zone's visits are decided as the processor decides them: within radius_m of the
    centre in its local projection, the boundary included; 1 cm outside is outside even though the
    polygon the query pre-filters with contains it. SedonaDB and the baseline agree with that."""
    from fleetfence.geo import LocalProjection, circle_distance_m
    from history.synthetic import telemetry_table, write_master, write_telemetry_partitioned

    cx, cy = 13.4265, 52.5015
    proj = LocalProjection(cx, cy)
    # Due north the distance is |dlat| x ky, exactly, in numpy and in SQL alike: a fix exactly on
    # the circle, whose distance is the radius.
    on_lat = float(proj.inverse(np.array([0.0]), np.array([60.0]))[1][0])
    r = float(circle_distance_m(cx, on_lat, cx, cy))
    east = [-100.0, -(r + 0.01), -(r - 0.01), 0.0, r - 0.01, r + 0.01, 100.0]
    elon, elat = proj.inverse(np.array(east), np.zeros(len(east)))
    north_lat = [cy, on_lat, float(proj.inverse(np.array([0.0]), np.array([r + 0.01]))[1][0])]
    fixes = [
        {
            "vehicle_id": "ve",
            "seq": i,
            "ts_ms": D1 + 1000 * i,
            "lon": float(x),
            "lat": float(y),
            "speed_kmh": 20.0,
        }
        for i, (x, y) in enumerate(zip(elon, elat, strict=True))
    ] + [
        {"vehicle_id": "vn", "seq": i, "ts_ms": D1 + 1000 * i, "lon": cx, "lat": y, "speed_kmh": 20.0}
        for i, y in enumerate(north_lat)
    ]
    circle = {"type": "Point", "coordinates": [cx, cy], "radius_m": r}
    write_master(
        tmp_path,
        [
            {
                "entity": "zone",
                "id": "c1",
                "version": 1,
                "data": {"zone_id": "c1", "kind": "customer", "geometry": circle},
                "event_ts_ms": D1 - 86_400_000,
            }
        ],
    )
    cols = {k: [f[k] for f in fixes] for k in fixes[0]}
    write_telemetry_partitioned(telemetry_table(cols), tmp_path, BUCKETS, "part-0.parquet")
    d = circle_distance_m(np.array(cols["lon"]), np.array(cols["lat"]), cx, cy)
    assert d[8] == r
    assert list(d <= r) == [False, False, True, True, True, False, False, True, True, False]
    want = pd.DataFrame(
        [
            ("ve", "c1", D1 + 2000, D1 + 5000, D1 + 4000, 3.0, 3, float(elon[2]), float(elat[2])),
            ("vn", "c1", D1, D1 + 2000, D1 + 1000, 2.0, 2, cx, cy),
        ],
        columns=VISIT_COLUMNS,
    )
    want["exit_ts_ms"] = want["exit_ts_ms"].astype("Int64")
    assert_same(SedonaReports(tmp_path, FULL, BUCKETS).zone_visits(), want)
    assert_same(BaselineReports(tmp_path, FULL, BUCKETS).zone_visits(), want)


# --------------------------------------------------------------------------- baseline cross-check


@pytest.mark.parametrize("name", ["adherence", "zone_visits", "speeding", "heatmap", "trips"])
def test_baseline_agrees(sedona: SedonaReports, baseline: BaselineReports, name: str) -> None:
    assert_same(getattr(baseline, name)(), getattr(sedona, name)())


def test_baseline_agrees_on_random_tracks(tmp_path: Path) -> None:
    """Beyond the hand-made tracks: jittered random tracks crossing corridor and zone edges."""
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    from rich.console import Console

    from bench.reports import DAY_MS, START_MS, generate

    generate(
        tmp_path, vehicles=12, fixes=1500, n_routes=3, buckets=BUCKETS, seed=3, console=Console(quiet=True)
    )
    rng = report_range(
        datetime.fromtimestamp(START_MS / 1000, UTC), datetime.fromtimestamp((START_MS + DAY_MS) / 1000, UTC)
    )
    s, b = SedonaReports(tmp_path, rng, BUCKETS), BaselineReports(tmp_path, rng, BUCKETS)
    # No stops here (these tracks never slow to 5 km/h): test_stops_trips.py has stop-and-go tracks.
    for name in ("adherence", "zone_visits", "speeding", "heatmap", "trips"):
        got = getattr(s, name)()
        assert len(got) > 0, name
        assert_same(getattr(b, name)(), got)
    adherence = s.adherence()
    assert 0.5 < adherence["inside_share"].mean() < 1.0  # excursions happened, most fixes on route


# --------------------------------------------------------------------------- admin API


Q = {"from": "2026-11-20", "to": "2026-11-21"}


@pytest.mark.services
def test_api_requires_a_key(api: tuple[TestClient, dict[str, str]]) -> None:
    client, _ = api
    assert client.get("/api/v1/reports/adherence", params=Q).status_code == 401


@pytest.mark.services
def test_api_adherence_and_speeding(api: tuple[TestClient, dict[str, str]]) -> None:
    client, key = api
    res = client.get("/api/v1/reports/adherence", params=Q, headers=key)
    assert res.status_code == 200, res.text
    body = res.json()
    assert (body["from"], body["to"]) == ("2026-11-20T00:00:00.000Z", "2026-11-22T00:00:00.000Z")
    got = pd.DataFrame(body["items"]).astype({"inside_share": float})
    assert_same(got[list(expected_adherence().columns)], expected_adherence())
    res = client.get("/api/v1/reports/speeding", params={**Q, "vehicle_id": "v3"}, headers=key)
    items = res.json()["items"]
    assert [(i["start_ts_ms"], i["duration_s"], i["max_kmh"]) for i in items] == [(V3_T0, 10.0, 60.0)]
    assert items[0]["start_ts"] == "2026-11-20T09:00:00.000Z"


@pytest.mark.services
def test_api_zone_visits_geojson(api: tuple[TestClient, dict[str, str]]) -> None:
    client, key = api
    plain = client.get("/api/v1/reports/zone-visits", params=Q, headers=key).json()["items"]
    assert [(v["vehicle_id"], v["entry_ts_ms"], v["exit_ts_ms"], v["dwell_s"]) for v in plain] == [
        (
            r["vehicle_id"],
            r["entry_ts_ms"],
            None if pd.isna(r["exit_ts_ms"]) else r["exit_ts_ms"],
            r["dwell_s"],
        )
        for r in expected_visits().to_dict("records")
    ]
    for url, params in (
        ("/api/v1/reports/zone-visits", {**Q, "format": "geojson"}),
        ("/api/v1/reports/zone-visits.geojson", Q),
    ):
        res = client.get(url, params=params, headers=key)
        assert res.status_code == 200
        assert res.headers["content-type"].startswith("application/geo+json")
        fc = res.json()
        assert fc["type"] == "FeatureCollection"
        assert len(fc["features"]) == 3
        x0, y0, x1, y1 = ZONE_BOX
        for f in fc["features"]:
            lon, lat = f["geometry"]["coordinates"]
            assert x0 < lon < x1  # the entry fix lies in the zone
            assert y0 < lat < y1


@pytest.mark.services
def test_api_heatmap_geojson(api: tuple[TestClient, dict[str, str]]) -> None:
    client, key = api
    fc = client.get("/api/v1/reports/heatmap.geojson", params={**Q, "resolution": 10}, headers=key).json()
    assert {f["id"]: f["properties"]["off_route_fixes"] for f in fc["features"]} == expected_heat(10)
    for f in fc["features"]:
        ring = f["geometry"]["coordinates"][0]
        assert f["geometry"]["type"] == "Polygon"
        assert ring[0] == ring[-1]
        assert len(ring) == 7
        assert (
            h3.latlng_to_cell(ring[0][1] * 0.5 + ring[3][1] * 0.5, ring[0][0] * 0.5 + ring[3][0] * 0.5, 10)
            == f["id"]
        )


@pytest.mark.services
def test_api_exports_by_accept(api: tuple[TestClient, dict[str, str]], tmp_path: Path) -> None:
    """Each export negotiated by Accept, read back by a real reader; a file is an attachment."""
    client, key = api

    def get(path: str, accept: str, **params: Any) -> Any:
        res = client.get(f"/api/v1/reports/{path}", params={**Q, **params}, headers={**key, "Accept": accept})
        assert res.status_code == 200, res.text
        assert res.headers["vary"] == "Accept"
        return res

    res = get("speeding", "application/gpx+xml")
    assert res.headers["content-type"] == "application/gpx+xml"
    assert res.headers["content-disposition"] == (
        'attachment; filename="speeding_20261120T000000Z_20261122T000000Z.gpx"'
    )
    gpx = read_gpx(res.content)
    tracks = expected_tracks()
    assert [
        [(p.longitude, p.latitude, int(p.time.timestamp() * 1000)) for p in t.segments[0].points]
        for t in gpx.tracks
    ] == [list(zip(g["lon"], g["lat"], g["ts_ms"], strict=True)) for _, g in tracks.groupby("start_ts_ms")]

    res = get("zone-visits", "application/vnd.google-earth.kml+xml, application/json;q=0.5")
    assert res.headers["content-type"] == "application/vnd.google-earth.kml+xml"
    placemarks = read_kml(res.content)
    visits = expected_visits()
    assert [(p.begin_ms, p.geometry.x, p.geometry.y) for p in placemarks] == list(
        zip(visits["entry_ts_ms"], visits["entry_lon"], visits["entry_lat"], strict=True)
    )

    res = get("adherence", "text/csv")
    assert res.headers["content-type"] == "text/csv; charset=utf-8; header=present"
    assert res.headers["content-disposition"].endswith('.csv"')
    got = pd.read_csv(io.BytesIO(res.content))
    assert_same(got[list(expected_adherence().columns)], expected_adherence())

    res = get("heatmap", "application/vnd.apache.parquet", resolution=10)
    path = tmp_path / "heat.parquet"
    path.write_bytes(res.content)
    gdf = read_geoparquet(path)
    assert dict(zip(gdf["h3_cell"], gdf["off_route_fixes"], strict=True)) == expected_heat(10)
    centres = shapely.centroid(gdf.geometry.values)  # each polygon is its cell
    assert [h3.latlng_to_cell(c.y, c.x, 10) for c in centres] == gdf["h3_cell"].tolist()

    res = get("speeding", "application/geo+json", vehicle_id="v3")
    (feature,) = res.json()["features"]
    assert feature["geometry"]["type"] == "LineString"
    assert len(feature["geometry"]["coordinates"]) == 2

    res = get("adherence", "text/html,*/*;q=0.8")  # a browser: the JSON envelope, as before
    assert res.json()["report"] == "adherence"
    res = get("zone-visits", "application/json", format="gpx")  # the parameter wins
    assert len(read_gpx(res.content).waypoints) == len(visits)


@pytest.mark.services
def test_api_refuses_what_a_report_cannot_give(api: tuple[TestClient, dict[str, str]]) -> None:
    client, key = api
    res = client.get("/api/v1/reports/heatmap", params=Q, headers={**key, "Accept": "application/gpx+xml"})
    assert res.status_code == 406
    assert res.json()["offered"] == [
        "application/json",
        "application/geo+json",
        "text/csv",
        "application/vnd.apache.parquet",
    ]
    res = client.get("/api/v1/reports/adherence", params={**Q, "format": "kml"}, headers=key)
    assert res.status_code == 422
    assert "it can be: json, csv, parquet" in res.text


@pytest.mark.services
@pytest.mark.parametrize(
    ("params", "status"),
    [
        ({"from": "2026-11-21", "to": "2026-11-20"}, 422),
        ({"from": "2026-13-45", "to": "2026-11-20"}, 422),
        ({"from": "2020-01-01", "to": "2026-11-20"}, 422),
        ({"to": "2026-11-20"}, 422),
        ({**Q, "vehicle_id": "bad id!"}, 422),
        ({**Q, "resolution": 16}, 422),
    ],
)
def test_api_rejects_bad_requests(
    api: tuple[TestClient, dict[str, str]], params: dict[str, Any], status: int
) -> None:
    client, key = api
    res = client.get("/api/v1/reports/heatmap", params=params, headers=key)
    assert res.status_code == status, res.text


# --------------------------------------------------------------------------- CLI


def test_cli_report(archive: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from typer.testing import CliRunner

    from cli.app import app

    monkeypatch.setenv("FLEETFENCE_HISTORY_BUCKETS", str(BUCKETS))
    runner = CliRunner()
    common = ["--from", "2026-11-20", "--to", "2026-11-21", "--archive", str(archive)]
    res = runner.invoke(app, ["report", "adherence", *common, "--json"])
    assert res.exit_code == 0, res.output
    got = pd.DataFrame(orjson.loads(res.stdout)).astype({"inside_share": float})
    assert_same(got[list(expected_adherence().columns)], expected_adherence())

    png, gj = tmp_path / "heat.png", tmp_path / "heat.geojson"
    res = runner.invoke(app, ["report", "heatmap", *common, "--png", str(png), "--geojson", str(gj)])
    assert res.exit_code == 0, res.output
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    features = orjson.loads(gj.read_bytes())["features"]
    assert {f["id"]: f["properties"]["off_route_fixes"] for f in features} == expected_heat(9)
    assert "Off-route fixes per H3 cell" in res.stdout  # the rich table

    res = runner.invoke(app, ["report", "zones", *common, "--vehicle", "v2"])
    assert res.exit_code == 0, res.output
    assert "Zone visits (1 rows)" in res.stdout

    for name in ("adherence", "zones", "speeding"):
        chart = tmp_path / f"{name}.png"
        res = runner.invoke(app, ["report", name, *common, "--png", str(chart)])
        assert res.exit_code == 0, res.output
        assert chart.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    res = runner.invoke(app, ["report", "speeding", "--from", "2026-11-21", "--to", "2026-11-20"])
    assert res.exit_code == 2
    assert "end must be after" in res.output


def test_cli_report_exports(archive: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`--format` to `--out` or to standard output, read back by real readers."""
    from typer.testing import CliRunner

    from cli.app import app

    monkeypatch.setenv("FLEETFENCE_HISTORY_BUCKETS", str(BUCKETS))
    runner = CliRunner()
    common = ["--from", "2026-11-20", "--to", "2026-11-21", "--archive", str(archive)]

    gpx_path = tmp_path / "speeding.gpx"
    res = runner.invoke(app, ["report", "speeding", *common, "--format", "gpx", "--out", str(gpx_path)])
    assert res.exit_code == 0, res.output
    assert res.stdout == ""  # the file, and the note on standard error
    tracks = expected_tracks()
    assert [
        [(p.longitude, p.latitude, int(p.time.timestamp() * 1000)) for p in t.segments[0].points]
        for t in read_gpx(gpx_path.read_bytes()).tracks
    ] == [list(zip(g["lon"], g["lat"], g["ts_ms"], strict=True)) for _, g in tracks.groupby("start_ts_ms")]

    res = runner.invoke(app, ["report", "zones", *common, "--format", "kml"])  # to standard output
    assert res.exit_code == 0, res.output
    visits = expected_visits()
    assert [p.begin_ms for p in read_kml(res.stdout_bytes)] == visits["entry_ts_ms"].tolist()
    gpx = read_gpx(runner.invoke(app, ["report", "zones", *common, "--format", "gpx"]).stdout_bytes)
    assert [(w.longitude, w.latitude) for w in gpx.waypoints] == list(
        zip(visits["entry_lon"], visits["entry_lat"], strict=True)
    )

    res = runner.invoke(app, ["report", "adherence", *common, "--format", "csv"])
    assert res.exit_code == 0, res.output
    got = pd.read_csv(io.StringIO(res.stdout))
    assert_same(got[list(expected_adherence().columns)], expected_adherence())

    pq_path = tmp_path / "speeding.parquet"
    res = runner.invoke(app, ["report", "speeding", *common, "--format", "geoparquet", "--out", str(pq_path)])
    assert res.exit_code == 0, res.output
    gdf = read_geoparquet(pq_path)
    assert gdf["start_ts_ms"].tolist() == expected_speeding()["start_ts_ms"].tolist()
    assert gdf.geometry.geom_type.tolist() == ["LineString"] * 3
    assert [len(g.coords) for g in gdf.geometry] == expected_speeding()["fixes"].tolist()

    res = runner.invoke(app, ["report", "adherence", *common, "--format", "parquet"])  # not a terminal
    assert res.exit_code == 0, res.output
    assert res.stdout_bytes[:4] == b"PAR1"
    assert len(pd.read_parquet(io.BytesIO(res.stdout_bytes))) == len(expected_adherence())

    res = runner.invoke(app, ["report", "heatmap", *common, "--format", "kml"], env={"COLUMNS": "200"})
    assert res.exit_code == 2
    assert (
        "the heatmap report cannot be given as kml; it can be: json, geojson, csv, geoparquet" in res.output
    )
