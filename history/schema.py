"""The archive layout (the contract between the archive writer and the readers): Arrow schemas,
partition helpers and GeoParquet writing, all pure pyarrow so tests can build small archives with
exactly the code the Spark writer uses.

    <root>/telemetry/date=YYYY-MM-DD/bucket=NN/*.parquet   one row per (vehicle_id, seq)
    <root>/alerts/date=YYYY-MM-DD/*.parquet                one row per alert_id
    <root>/master/*.parquet                                every fleet.master change event

Every telemetry and alert file carries GeoParquet 1.1 metadata for its WKB Point column
`geometry` (lon/lat, OGC:CRS84, the GeoParquet default, so `crs` is omitted).
"""

from __future__ import annotations

import json
import os
from datetime import UTC, datetime
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import shapely
from pyarrow import fs as pafs

from fleetfence.contracts import bucket_of as _processor_bucket_of

TELEMETRY = "telemetry"
ALERTS = "alerts"
MASTER = "master"
TABLES = (TELEMETRY, ALERTS, MASTER)

TS_TYPE = pa.timestamp("ms", tz="UTC")

TELEMETRY_SCHEMA = pa.schema(
    [
        pa.field("vehicle_id", pa.string(), nullable=False),
        pa.field("seq", pa.int64(), nullable=False),
        pa.field("ts_ms", pa.int64(), nullable=False),
        pa.field("ts", TS_TYPE, nullable=False),
        pa.field("lat", pa.float64(), nullable=False),
        pa.field("lon", pa.float64(), nullable=False),
        pa.field("speed_kmh", pa.float64(), nullable=False),
        pa.field("heading_deg", pa.float64()),
        pa.field("accuracy_m", pa.float64()),
        pa.field("received_ms", pa.int64()),
        pa.field("geometry", pa.binary(), nullable=False),
    ]
)

ALERT_SCHEMA = pa.schema(
    [
        pa.field("alert_id", pa.string(), nullable=False),
        pa.field("type", pa.string(), nullable=False),
        pa.field("vehicle_id", pa.string(), nullable=False),
        pa.field("route_id", pa.string()),
        pa.field("route_version", pa.int64(), nullable=False),
        pa.field("zone_id", pa.string()),
        pa.field("seq", pa.int64(), nullable=False),
        pa.field("ts_ms", pa.int64(), nullable=False),
        pa.field("ts", TS_TYPE, nullable=False),
        pa.field("lat", pa.float64(), nullable=False),
        pa.field("lon", pa.float64(), nullable=False),
        pa.field("details", pa.string(), nullable=False),  # JSON object
        pa.field("geometry", pa.binary(), nullable=False),
    ]
)

# `kafka_offset` (position on the single-partition fleet.master topic) is an addition to the
# contract: it is the total order in which the live processor applies master events, which
# restatement needs to reproduce when two events carry the same event time.
MASTER_SCHEMA = pa.schema(
    [
        pa.field("entity", pa.string(), nullable=False),
        pa.field("id", pa.string(), nullable=False),
        pa.field("version", pa.int64(), nullable=False),
        pa.field("op", pa.string(), nullable=False),
        pa.field("data", pa.string()),  # JSON object
        pa.field("event_ts_ms", pa.int64(), nullable=False),
        pa.field("kafka_offset", pa.int64(), nullable=False),
    ]
)

SCHEMAS: dict[str, pa.Schema] = {TELEMETRY: TELEMETRY_SCHEMA, ALERTS: ALERT_SCHEMA, MASTER: MASTER_SCHEMA}


def bucket_of(vehicle_id: str, buckets: int) -> int:
    """The processor's vehicle bucketing (crc32 mod buckets): stable across processes and machines.

    With the same bucket count as the processor, an archive bucket holds exactly the vehicles of
    one processor state bucket, which is what restatement groups by.
    """
    return _processor_bucket_of(vehicle_id, buckets)


def date_of_ms(ts_ms: int) -> str:
    """UTC date of an epoch-ms time, as in the `date=` partition."""
    return datetime.fromtimestamp(ts_ms / 1000, UTC).strftime("%Y-%m-%d")


def dates_of_ms(ts_ms: np.ndarray) -> np.ndarray:
    """Vectorized `date_of_ms` (numpy datetime64 days are UTC)."""
    return np.asarray(ts_ms, dtype="datetime64[ms]").astype("datetime64[D]").astype(str)


def partition_dir(table: str, date: str | None = None, bucket: int | None = None) -> str:
    """Relative folder of a partition: `telemetry/date=.../bucket=NN`, `alerts/date=...`, `master`."""
    if table == MASTER:
        return MASTER
    if date is None:
        raise ValueError(f"{table} partitions need a date")
    if table == TELEMETRY:
        if bucket is None:
            raise ValueError("telemetry partitions need a bucket")
        return f"{TELEMETRY}/date={date}/bucket={bucket:02d}"
    return f"{ALERTS}/date={date}"


def part_file_name(batch_id: int, n: int) -> str:
    """Deterministic name of the n-th file a micro-batch writes into one partition: a replayed batch
    overwrites the same names instead of adding new files."""
    return f"part-{batch_id:010d}-{n}.parquet"


def batch_of_file(name: str) -> int | None:
    """The batch id in a `part-*` file name (None for compacted or foreign files)."""
    if not name.startswith("part-") or not name.endswith(".parquet"):
        return None
    try:
        return int(name.split("-")[1])
    except (IndexError, ValueError):
        return None


def points_wkb(lon: Any, lat: Any) -> pa.Array:
    """WKB Points (x=lon, y=lat) for a column of coordinates."""
    pts = shapely.points(np.asarray(lon, dtype=np.float64), np.asarray(lat, dtype=np.float64))
    return pa.array(shapely.to_wkb(pts, output_dimension=2, byte_order=1), type=pa.binary())


def geo_metadata(table: pa.Table) -> dict[str, Any]:
    """GeoParquet 1.1 file metadata for the table's `geometry` column (WKB Points, CRS84 default)."""
    lon = table.column("lon").to_numpy(zero_copy_only=False) if table.num_rows else np.zeros(0)
    lat = table.column("lat").to_numpy(zero_copy_only=False) if table.num_rows else np.zeros(0)
    col: dict[str, Any] = {"encoding": "WKB", "geometry_types": ["Point"]}
    if len(lon):
        col["bbox"] = [float(lon.min()), float(lat.min()), float(lon.max()), float(lat.max())]
    return {"version": "1.1.0", "primary_column": "geometry", "columns": {"geometry": col}}


def to_table(table_name: str, columns: dict[str, Any]) -> pa.Table:
    """Build a table of one archive schema from columns, adding `ts` and `geometry` when absent."""
    schema = SCHEMAS[table_name]
    cols = dict(columns)
    if table_name != MASTER:
        ts_ms = np.asarray(cols["ts_ms"], dtype=np.int64)
        cols.setdefault("ts", pa.array(ts_ms, type=pa.int64()).cast(TS_TYPE))
        cols.setdefault("geometry", points_wkb(cols["lon"], cols["lat"]))
    arrays = [
        pa.array(cols[f.name], type=f.type) if not isinstance(cols[f.name], pa.Array) else cols[f.name]
        for f in schema
    ]
    return pa.Table.from_arrays(arrays, schema=schema)


def write_geoparquet(table: pa.Table, path: str, filesystem: Any = None) -> None:
    """Write one parquet file; with a `geometry` column it carries the GeoParquet `geo` key."""
    if "geometry" in table.column_names:
        meta = dict(table.schema.metadata or {})
        meta[b"geo"] = json.dumps(geo_metadata(table)).encode()
        table = table.replace_schema_metadata(meta)
    pq.write_table(table, path, filesystem=filesystem, compression="zstd")


def read_geo_metadata(path: str, filesystem: Any = None) -> dict[str, Any] | None:
    """The decoded `geo` key of a parquet file, or None."""
    md = pq.read_metadata(path, filesystem=filesystem).metadata or {}
    raw = md.get(b"geo")
    return None if raw is None else dict(json.loads(raw))


# The de-duplication key and the sort order of each table: the writer, compaction and the reports
# judge "the same row" alike.
KEY_COLUMNS = {TELEMETRY: ["vehicle_id", "seq"], ALERTS: ["alert_id"], MASTER: ["entity", "id", "version"]}
SORT_COLUMNS = {
    TELEMETRY: [("vehicle_id", "ascending"), ("seq", "ascending")],
    ALERTS: [("alert_id", "ascending")],
    MASTER: [("kafka_offset", "ascending")],
}


def filesystem(uri: str) -> tuple[Any, str]:
    """(pyarrow FileSystem, path inside it) for a local folder or a URI (file://, s3://, hdfs://)."""
    if "://" not in uri:
        return pafs.LocalFileSystem(), os.path.abspath(uri)
    fs, path = pafs.FileSystem.from_uri(uri)
    return fs, str(path)
