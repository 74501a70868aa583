"""Writing small or synthetic archives in the contract layout (tests and bench/reports.py).

The Spark writer partitions with its own `partitionBy`; this helper does the same split in pyarrow
with history/schema.py's schemas, partition names and GeoParquet writer.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pyarrow as pa

from history.schema import (
    MASTER,
    MASTER_SCHEMA,
    TELEMETRY,
    TELEMETRY_SCHEMA,
    bucket_of,
    date_of_ms,
    partition_dir,
    to_table,
    write_geoparquet,
)

DAY_MS = 86_400_000


def write_telemetry_partitioned(table: pa.Table, root: str | Path, buckets: int, file_name: str) -> int:
    """Split a telemetry table into its `date=/bucket=` partitions, one file `file_name` in each.

    Returns the number of files written.
    """
    table = table.cast(TELEMETRY_SCHEMA)
    days = table.column("ts_ms").to_numpy() // DAY_MS
    vids = table.column("vehicle_id").to_pylist()
    cache: dict[str, int] = {}
    bucket = np.fromiter((cache.setdefault(v, bucket_of(v, buckets)) for v in vids), np.int64, len(vids))
    key = days * buckets + bucket
    order = np.argsort(key, kind="stable")
    keys_sorted = key[order]
    starts = np.flatnonzero(np.r_[True, keys_sorted[1:] != keys_sorted[:-1]]) if len(key) else key
    ends = np.r_[starts[1:], len(order)]
    for s, e in zip(starts.tolist(), ends.tolist(), strict=True):
        day, b = divmod(int(keys_sorted[s]), buckets)
        folder = Path(root) / partition_dir(TELEMETRY, date_of_ms(day * DAY_MS), b)
        folder.mkdir(parents=True, exist_ok=True)
        write_geoparquet(table.take(pa.array(order[s:e])), str(folder / file_name))
    return len(starts)


def telemetry_table(columns: dict[str, Any]) -> pa.Table:
    """A telemetry table from plain columns (vehicle_id, seq, ts_ms, lat, lon, speed_kmh; the
    optional ones default to null)."""
    n = len(columns["ts_ms"])
    cols = dict(columns)
    for name in ("heading_deg", "accuracy_m", "received_ms"):
        cols.setdefault(name, pa.nulls(n, TELEMETRY_SCHEMA.field(name).type))
    return to_table(TELEMETRY, cols)


def write_master(root: str | Path, events: list[dict[str, Any]], file_name: str = "part-0.parquet") -> None:
    """Master change events (`entity`, `id`, `version`, `op`, `data` dict, `event_ts_ms`) as the
    archive's `master/` file; `kafka_offset` is their list position."""
    rows = [
        {
            "entity": e["entity"],
            "id": e["id"],
            "version": int(e["version"]),
            "op": e.get("op", "upsert"),
            "data": None if e.get("data") is None else orjson.dumps(e["data"]).decode(),
            "event_ts_ms": int(e["event_ts_ms"]),
            "kafka_offset": i,
        }
        for i, e in enumerate(events)
    ]
    folder = Path(root) / MASTER
    folder.mkdir(parents=True, exist_ok=True)
    write_geoparquet(pa.Table.from_pylist(rows, schema=MASTER_SCHEMA), str(folder / file_name))
