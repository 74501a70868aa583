"""A recorded scenario for the history tests: the real processor and the real archive query on the
real broker, built once per test session and shared by the archive and restatement tests.

The recording: master data (sent twice, like a relay re-send), the processor test scenario (with
v4's duplicates), gateway-style re-deliveries of already sent fixes, junk records, the live
processor run until its alerts (including event-time silence) are committed, then the archive
query stopped mid-way, a crash after a batch's files were written but before Spark committed it
simulated, restarted from its checkpoint, more re-deliveries, until it has caught up.

At the end: the small hand-made archive of the reports' tests (test_history_reports.py).
"""

from __future__ import annotations

import hashlib
import json
import math
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from confluent_kafka import TopicPartition

from fleetfence.contracts import Telemetry
from fleetfence.kafka import ensure_topics, group_consumer, topic_specs
from fleetfence.settings import Settings
from history.archive import start_archive
from history.maintenance import last_committed_batch
from history.report_inputs import report_range
from history.schema import batch_of_file
from history.settings import HistorySettings
from history.synthetic import telemetry_table, write_master, write_telemetry_partitioned
from processor.core.domain import EngineConfig
from processor.spark.job import start_query
from tests.processor.helpers import (
    T0,
    committed_alerts,
    expected_alerts,
    markers,
    master_events,
    processor_settings,
    produce,
    produce_master,
    produce_telemetry,
    scenario,
    wait_for,
)

JUNK = [b"not json", b'{"vehicle_id": "v0"}', json.dumps({"vehicle_id": "v9", "seq": "x"}).encode()]
LATE_FIX = Telemetry("v0", 60, T0 + 400_000, 52.5, 13.05, 30.0, 181.5, 3.0, T0 + 400_000)


@dataclass
class Recording:
    settings: Settings
    hs: HistorySettings
    sent: list[Telemetry]  # every valid telemetry record produced, duplicates included
    master: list[dict[str, Any]]
    alerts: list[dict[str, Any]]  # committed by the live processor
    accepted: int  # the processor's own count of accepted fixes (its commit markers)
    cfg: EngineConfig  # the live processor's engine settings
    replayed_batch: int
    replayed_before: dict[str, tuple[str, int]]  # file -> (sha256, mtime_ns) before the restart
    replayed_after: dict[str, tuple[str, int]] = field(default_factory=dict)
    batches_first_run: int = 0

    @property
    def root(self) -> Path:
        return Path(self.hs.archive_root)


def _files_of_batch(root: Path, batch_id: int) -> dict[str, tuple[str, int]]:
    out = {}
    for p in root.rglob(f"part-{batch_id:010d}-*.parquet"):
        if "_staging" in p.parts:
            continue
        out[str(p.relative_to(root))] = (hashlib.sha256(p.read_bytes()).hexdigest(), p.stat().st_mtime_ns)
    return out


def _high_watermarks(s: Settings) -> dict[str, dict[str, int]]:
    c = group_consumer(s.bootstrap_servers, f"hw-{uuid.uuid4().hex}")
    out: dict[str, dict[str, int]] = {}
    for topic, n in (
        (s.topics.telemetry, s.telemetry_partitions),
        (s.topics.master, 1),
        (s.topics.alerts, s.alerts_partitions),
    ):
        out[topic] = {
            str(p): c.get_watermark_offsets(TopicPartition(topic, p), timeout=10, cached=False)[1]
            for p in range(n)
        }
    c.close()
    return out


def _caught_up(q: Any, s: Settings) -> bool:
    """Every topic's end offsets, over all of the query's Kafka sources, at the high watermarks."""
    p = q.lastProgress
    if not p or not p["sources"]:
        return False
    from processor.ops.progress import source_offsets

    end: dict[str, dict[str, int]] = {}
    for src in p["sources"]:
        end.update(source_offsets(src, "endOffset") or {})
    hw = _high_watermarks(s)
    return all(int(end.get(t, {}).get(k, -1)) >= v for t, parts in hw.items() for k, v in parts.items())


def record(spark: Any, infra_settings: Settings, base: Path) -> Recording:
    """The recording (once per session: the `rec` fixture in conftest.py)."""
    settings = infra_settings.model_copy(update={"topic_prefix": f"h{uuid.uuid4().hex[:10]}."})
    ensure_topics(settings.bootstrap_servers, topic_specs(settings))
    ps = processor_settings(settings, base / "processor")
    events = master_events()
    fixes = scenario()
    produce_master(settings, events)
    produce_master(settings, events[:3])  # a relay re-send: the same versions again
    redelivered = [f for f in fixes if f.vehicle_id == "v0" and f.seq < 10]
    produce_telemetry(settings, fixes + redelivered)
    produce(settings, settings.topics.telemetry, [(b"junk", b) for b in JUNK])
    n_expected = len(expected_alerts(fixes, ps.engine_config()))

    q = start_query(spark, ps, query_name=f"proc-{settings.topic_prefix}")
    try:
        wait_for(lambda: len(committed_alerts(settings)) >= n_expected, 180, "the live alerts")
        produce_telemetry(settings, [LATE_FIX])  # moves the watermark: every other vehicle goes silent
        wait_for(lambda: len(committed_alerts(settings)) >= n_expected + 5, 120, "the silence alerts")
        total = len(fixes) + len(redelivered) + len(JUNK) + 1

        def reconciled() -> bool:
            ms = markers(settings)
            return sum(int(m.get("received", 0)) + int(m.get("invalid", 0)) for m in ms) == total

        wait_for(reconciled, 60, "the processor to account for every record")
    finally:
        q.stop()
    alerts = committed_alerts(settings)
    accepted = sum(m.get("accepted", 0) for m in markers(settings))

    hs = HistorySettings.from_base(
        settings,
        history_archive_path=str(base / "archive"),
        history_checkpoint=str(base / "checkpoints" / "archive"),
        history_buckets=4,
        history_max_events_per_batch=150,
        history_trigger_ms=100,
    )
    root = Path(hs.archive_root)
    a = start_archive(spark, hs, query_name=f"archive-{settings.topic_prefix}")
    try:
        wait_for(lambda: last_committed_batch(hs.checkpoint_location) >= 1, 120, "two archive batches")
    finally:
        a.stop()
    # The last committed batch that wrote files (a no-data batch may have followed it).
    with_files = {b for p in root.rglob("part-*.parquet") if (b := batch_of_file(p.name)) is not None}
    committed = max(b for b in with_files if b <= last_committed_batch(hs.checkpoint_location))
    # A crash after the batch's files were renamed into place but before Spark's commit log entry:
    # the restart must replay the batch and overwrite its files with identical ones.
    # That state has offsets up to the batch and no commit entry for it (a batch the stop
    # interrupted after it would not exist yet), so Spark re-runs exactly that batch.
    cp = Path(hs.checkpoint_location)
    for log, first in (("offsets", committed + 1), ("commits", committed)):
        for f in (cp / log).iterdir():
            n = f.name.removeprefix(".").removesuffix(".crc")
            if n.isdigit() and int(n) >= first:
                f.unlink()
    before = _files_of_batch(root, committed)
    rec = Recording(
        settings,
        hs,
        fixes + redelivered + [LATE_FIX],
        events,
        alerts,
        accepted,
        ps.engine_config(),
        committed,
        before,
        batches_first_run=committed + 1,
    )

    a = start_archive(spark, hs, query_name=f"archive2-{settings.topic_prefix}")
    try:
        wait_for(lambda: last_committed_batch(hs.checkpoint_location) >= committed, 120, "the replayed batch")
        # Re-deliveries after the restart, of fixes archived in earlier batches.
        again = [f for f in fixes if f.vehicle_id == "v5" and f.seq < 20]
        produce_telemetry(settings, again)
        rec.sent += again
        wait_for(lambda: _caught_up(a, settings), 120, "the archive to catch up with every topic")
    finally:
        a.stop()
    rec.replayed_after = _files_of_batch(root, committed)
    return rec


# --------------------------------------------------------------------------- the reports' archive
# A small hand-made archive whose every figure test_history_reports.py derives by hand (its
# docstring describes the tracks).

BUCKETS = 4
R_M = 6_371_008.8
KY = R_M * math.pi / 180.0  # metres per degree of latitude
LAT0 = 52.50
D0 = int(datetime(2026, 11, 19, tzinfo=UTC).timestamp() * 1000)
D1 = int(datetime(2026, 11, 20, 8, tzinfo=UTC).timestamp() * 1000)  # day 1, 08:00
D2 = int(datetime(2026, 11, 21, 8, tzinfo=UTC).timestamp() * 1000)  # day 2, 08:00
V3_T0 = D1 + 3_600_000  # day 1, 09:00
R1_V2_TS = V3_T0 + 15_000
ZONE_BOX = (13.4135, 52.499, 13.4155, 52.501)


def _fix(vid: str, seq: int, ts: int, lon: float, off_m: float, speed: float) -> dict[str, Any]:
    return {
        "vehicle_id": vid,
        "seq": seq,
        "ts_ms": ts,
        "lon": lon,
        "lat": LAT0 + off_m / KY,
        "speed_kmh": speed,
    }


V1_DAY1_OFF = [0, 10, -10, 0, 70, 160, -170, 0, 0, 0, 0, 40]
V1_DAY1_SPEED = [40, 45, 55, 60, 62, 48, 40, 40, 70, 71, 40, 40]
FIXES = (
    [
        _fix("v1", i, D1 + 10_000 * i, 13.405 + 0.001 * i, o, s)
        for i, (o, s) in enumerate(zip(V1_DAY1_OFF, V1_DAY1_SPEED, strict=True))
    ]
    + [_fix("v1", 100 + i, D2 + 10_000 * i, lon, 0, 40) for i, lon in enumerate([13.410, 13.414, 13.415])]
    + [_fix("v2", i, D1 + 10_000 * i, lon, 0, 90) for i, lon in enumerate([13.410, 13.414, 13.415, 13.420])]
    + [_fix("v3", i, V3_T0 + 10_000 * i, 13.425 + 0.001 * i, 150, 60) for i in range(4)]
)


def route(version: int, width: float, limit: float) -> dict[str, Any]:
    return {
        "route_id": "r1",
        "name": "line",
        "geometry": {"type": "LineString", "coordinates": [[13.40, LAT0], [13.44, LAT0]]},
        "corridor_width_m": width,
        "speed_limit_kmh": limit,
    }


def write_report_archive(root: Path) -> Path:
    """The reports' archive (test_history_reports.py's docstring describes it) under `root`."""
    x0, y0, x1, y1 = ZONE_BOX
    zone = {"type": "Polygon", "coordinates": [[[x0, y0], [x1, y0], [x1, y1], [x0, y1], [x0, y0]]]}
    write_master(
        root,
        [
            {"entity": "route", "id": "r1", "version": 1, "data": route(1, 100, 50), "event_ts_ms": D0},
            {
                "entity": "zone",
                "id": "z1",
                "version": 1,
                "data": {"zone_id": "z1", "kind": "depot", "geometry": zone},
                "event_ts_ms": D0,
            },
            {
                "entity": "assignment",
                "id": "v1",
                "version": 1,
                "event_ts_ms": D0,
                "data": {"vehicle_id": "v1", "route_id": "r1", "valid_from_ms": 0, "valid_to_ms": None},
            },
            {
                "entity": "assignment",
                "id": "v3",
                "version": 1,
                "event_ts_ms": D0,
                "data": {"vehicle_id": "v3", "route_id": "r1", "valid_from_ms": 0, "valid_to_ms": None},
            },
            {"entity": "route", "id": "r1", "version": 2, "data": route(2, 400, 80), "event_ts_ms": R1_V2_TS},
        ],
    )
    cols = {k: [f[k] for f in FIXES] for k in FIXES[0]}
    files = write_telemetry_partitioned(telemetry_table(cols), root, BUCKETS, "part-0.parquet")
    assert files >= 3  # two days, several buckets: the reader has to combine partitions
    return root


FULL = report_range("2026-11-20", "2026-11-21")


# --------------------------------------------------------------------------- report exports, read back


@dataclass(frozen=True)
class KmlPlacemark:
    name: str
    geometry: Any  # shapely, from the KML coordinates
    begin_ms: int
    end_ms: int
    data: dict[str, str]  # ExtendedData


def read_gpx(body: bytes) -> Any:
    """The GPX as gpxpy reads it (a GPX 1.1 reader independent of the writer)."""
    import gpxpy

    gpx = gpxpy.parse(body.decode("utf-8"))
    assert gpx.version == "1.1"
    assert gpx.creator == "FleetFence"
    return gpx


def read_kml(body: bytes) -> list[KmlPlacemark]:
    """The Placemarks of a KML document as fastkml reads it (strict: unknown elements fail)."""
    from datetime import datetime as _datetime

    import shapely
    from fastkml import containers, data, features, kml, times

    doc = kml.KML.from_string(body.decode("utf-8"), strict=True)
    (document,) = doc.features
    assert isinstance(document, containers.Document)
    out = []
    for pm in document.features:
        assert isinstance(pm, features.Placemark)
        assert pm.geometry is not None
        assert isinstance(pm.times, times.TimeSpan)
        assert pm.times.begin is not None
        assert pm.times.end is not None
        begin, end = pm.times.begin.dt, pm.times.end.dt
        assert isinstance(begin, _datetime)
        assert isinstance(end, _datetime)
        assert pm.extended_data is not None
        fields = {}
        for d in pm.extended_data.elements:
            assert isinstance(d, data.Data)
            assert d.name is not None
            fields[d.name] = d.value or ""
        out.append(
            KmlPlacemark(
                name=pm.name or "",
                geometry=shapely.from_wkt(pm.geometry.wkt),
                begin_ms=int(begin.timestamp() * 1000),
                end_ms=int(end.timestamp() * 1000),
                data=fields,
            )
        )
    return out


def read_geoparquet(path: Path) -> Any:
    """geopandas' GeoDataFrame of a GeoParquet file, after checking its `geo` metadata (1.1, WKB,
    CRS omitted = OGC:CRS84, a bbox that holds every geometry)."""
    import geopandas
    import pyarrow.parquet as pq
    import shapely
    from pyproj import CRS

    geo = json.loads(pq.read_metadata(path).metadata[b"geo"])
    assert geo["version"] == "1.1.0"
    assert geo["primary_column"] == "geometry"
    col = geo["columns"]["geometry"]
    assert col["encoding"] == "WKB"
    assert "crs" not in col  # omitted: OGC:CRS84 by the spec
    gdf = geopandas.read_parquet(path)
    assert gdf.crs == CRS("OGC:CRS84")
    assert sorted(col["geometry_types"]) == sorted(set(gdf.geometry.geom_type))
    if len(gdf):
        assert col["bbox"] == list(shapely.total_bounds(gdf.geometry.values))
    return gdf
