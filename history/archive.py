"""The archive writer: a Spark Structured Streaming query from Kafka into GeoParquet, exactly once.

    fleetfence_kafka (output=records: fleet.telemetry, fleet.master, fleet.alerts, read_committed)
      -> parse + validate (mapInArrow; telemetry with the processor's own `canonical_fix`)
      -> watermark on the Kafka record time -> dropDuplicatesWithinWatermark(key)
      -> foreachBatch: repartition by (table, date, bucket) -> each task writes its partitions'
         files under deterministic names into `_staging/batch-N/` -> the driver renames them into
         place -> Spark commits the batch.

Exactly once (the argument, with the failure cases, is in docs/history.md): the offsets of batch N
are in the checkpoint before it runs, the de-duplication state of batch N-1 is checkpointed, so a
replay of N sees the same rows and writes the same files under the same names
(`part-{N:010d}-{n}.parquet`, rows sorted); the rename overwrites what a crashed attempt left.

The de-duplication key is (vehicle_id, seq) for telemetry, alert_id for alerts and
(entity, id, version) for master events. Its watermark runs on the micro-batch time, not on the
fix time nor the Kafka record time: Spark's de-duplication silently drops rows behind its
watermark, and an archive must not lose a vehicle's hour of buffered fixes nor a backlog read
after an outage. A gateway re-delivery sits next to the original in the topic, so it is read
within seconds to minutes of it: `dedup_window_s` bounds that memory (and the state size).
"""

from __future__ import annotations

import logging
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any

import orjson
import pyarrow as pa
import pyarrow.compute as pc
from prometheus_client import Counter
from pyarrow import fs as pafs

from fleetfence.registry import Presence, presence
from fleetfence.service import run_until_stopped, stop_on_signals
from history.errors import ArchiveError
from history.schema import (
    ALERTS,
    MASTER,
    SCHEMAS,
    SORT_COLUMNS,
    TELEMETRY,
    bucket_of,
    date_of_ms,
    filesystem,
    part_file_name,
    partition_dir,
    to_table,
    write_geoparquet,
)
from history.settings import HISTORY_METRICS_PORT, HistorySettings

logger = logging.getLogger(__name__)

ROWS_WRITTEN = Counter(
    "fleetfence_archive_rows_total", "Rows written to the archive (replays included)", ["table"]
)
BATCHES = Counter("fleetfence_archive_batches_total", "Archive micro-batches written")

STAGING = "_staging"
RECORD_DDL = (
    "table string, key string, kts timestamp, date string, bucket int, payload binary, kafka_offset long"
)
RESULT_DDL = "table string, date string, bucket int, staged string, final string, rows long"
# --------------------------------------------------------------------------- parsing (executors)


def parse_records(
    batches: Iterator[pa.RecordBatch], topics: dict[str, str], buckets: int
) -> Iterator[pa.RecordBatch]:
    """Raw Kafka records -> (table, key, kts, date, bucket, payload, kafka_offset).

    Telemetry that is not canonical (the processor dead-letters it) is dropped here, with the
    processor's own check, so "valid" means the same thing in both places.
    """
    from fleetfence.contracts import INVALID_ERRORS, canonical_fix

    schema = pa.schema(
        [
            ("table", pa.string()),
            ("key", pa.string()),
            ("kts", pa.timestamp("us", tz="UTC")),
            ("date", pa.string()),
            ("bucket", pa.int32()),
            ("payload", pa.binary()),
            ("kafka_offset", pa.int64()),
        ]
    )
    for batch in batches:
        out: dict[str, list[Any]] = {f.name: [] for f in schema}
        topic_col = batch.column("topic").to_pylist()
        payloads = batch.column("payload").to_pylist()
        kts = batch.column("ts").cast(pa.int64()).to_pylist()
        offsets = batch.column("kafka_offset").to_pylist()
        for topic, value, ts_us, off in zip(topic_col, payloads, kts, offsets, strict=True):
            table = topics.get(topic)
            if table is None or value is None:
                continue
            try:
                d = orjson.loads(value)
                if table == TELEMETRY:
                    vid, seq, ts_ms, *_ = canonical_fix(d)
                    key, date, bucket = f"T|{vid}|{seq}", date_of_ms(ts_ms), bucket_of(vid, buckets)
                elif table == ALERTS:
                    key, date, bucket = f"A|{d['alert_id']}", date_of_ms(int(d["ts_ms"])), 0
                else:
                    key, date, bucket = f"M|{d['entity']}|{d['id']}|{int(d['version'])}", "", 0
            except INVALID_ERRORS as exc:
                if table != TELEMETRY:
                    logger.warning("archive skipped a record topic=%s offset=%s error=%s", topic, off, exc)
                continue
            out["table"].append(table)
            out["key"].append(key)
            out["kts"].append(ts_us if ts_us is not None else 0)
            out["date"].append(date)
            out["bucket"].append(bucket)
            out["payload"].append(value)
            out["kafka_offset"].append(off)
        yield pa.RecordBatch.from_pydict(out, schema=schema)


def _telemetry_columns(payloads: list[bytes]) -> dict[str, Any]:
    cols: dict[str, list[Any]] = {
        k: []
        for k in (
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
    }
    for p in payloads:
        d = orjson.loads(p)
        for k, col in cols.items():
            v = d.get(k)
            if k in ("lat", "lon", "speed_kmh"):
                v = float(v)
            elif k in ("heading_deg", "accuracy_m"):
                v = None if v is None else float(v)
            elif k == "received_ms":
                v = v if isinstance(v, int) else None
            col.append(v)
    return cols


def _alert_columns(payloads: list[bytes]) -> dict[str, Any]:
    names = ("alert_id", "type", "vehicle_id", "route_id", "route_version", "zone_id", "seq", "ts_ms")
    cols: dict[str, list[Any]] = {k: [] for k in (*names, "lat", "lon", "details")}
    for p in payloads:
        d = orjson.loads(p)
        for k in names:
            cols[k].append(d.get(k))
        cols["route_version"][-1] = int(cols["route_version"][-1] or 0)
        cols["lat"].append(float(d["lat"]))
        cols["lon"].append(float(d["lon"]))
        cols["details"].append(orjson.dumps(d.get("details") or {}, option=orjson.OPT_SORT_KEYS).decode())
    return cols


def _master_columns(payloads: list[bytes], kts_ms: list[int], offsets: list[int]) -> dict[str, Any]:
    cols: dict[str, list[Any]] = {f.name: [] for f in SCHEMAS[MASTER]}
    for p, k, off in zip(payloads, kts_ms, offsets, strict=True):
        d = orjson.loads(p)
        cols["entity"].append(str(d["entity"]))
        cols["id"].append(str(d["id"]))
        cols["version"].append(int(d["version"]))
        cols["op"].append(str(d.get("op") or "upsert"))
        data = d.get("data")
        cols["data"].append(
            None if data is None else orjson.dumps(data, option=orjson.OPT_SORT_KEYS).decode()
        )
        ts = d.get("ts_ms")
        cols["event_ts_ms"].append(ts if isinstance(ts, int) and not isinstance(ts, bool) else k)
        cols["kafka_offset"].append(off)
    return cols


def build_table(table: str, payloads: list[bytes], kts_ms: list[int], offsets: list[int]) -> pa.Table:
    """One partition's rows of one batch as an archive table, sorted so a replay writes the same bytes."""
    if table == TELEMETRY:
        cols = _telemetry_columns(payloads)
    elif table == ALERTS:
        cols = _alert_columns(payloads)
    else:
        cols = _master_columns(payloads, kts_ms, offsets)
    return to_table(table, cols).sort_by(SORT_COLUMNS[table])


def write_partitions(
    batches: Iterator[pa.RecordBatch], root: str, batch_id: int, max_rows_per_file: int
) -> Iterator[pa.RecordBatch]:
    """Executor side of foreachBatch: write this task's partitions into the batch's staging folder."""
    fs, base = filesystem(root)
    received = list(batches)
    rows = pa.Table.from_batches(received) if received else None
    out: dict[str, list[Any]] = {"table": [], "date": [], "bucket": [], "staged": [], "final": [], "rows": []}
    if rows is not None and rows.num_rows:
        groups = rows.group_by(["table", "date", "bucket"]).aggregate([]).to_pylist()
        for g in groups:
            mask = pc.and_(
                pc.and_(pc.equal(rows["table"], g["table"]), pc.equal(rows["date"], g["date"])),
                pc.equal(rows["bucket"], g["bucket"]),
            )
            part = rows.filter(mask)
            kts_ms = (part.column("kts").cast(pa.int64()).to_numpy() // 1000).tolist()
            t = build_table(
                g["table"],
                part.column("payload").to_pylist(),
                kts_ms,
                part.column("kafka_offset").to_pylist(),
            )
            rel = partition_dir(g["table"], g["date"] or None, g["bucket"])
            staged_dir = f"{base}/{STAGING}/batch-{batch_id:010d}/{rel}"
            fs.create_dir(staged_dir, recursive=True)
            for n, start in enumerate(range(0, t.num_rows, max_rows_per_file)):
                chunk = t.slice(start, max_rows_per_file)
                name = part_file_name(batch_id, n)
                write_geoparquet(chunk, f"{staged_dir}/{name}", filesystem=fs)
                for k, v in (
                    ("table", g["table"]),
                    ("date", g["date"]),
                    ("bucket", g["bucket"]),
                    ("staged", f"{staged_dir}/{name}"),
                    ("final", f"{base}/{rel}/{name}"),
                    ("rows", chunk.num_rows),
                ):
                    out[k].append(v)
    yield pa.RecordBatch.from_pydict(
        out,
        schema=pa.schema(
            [
                ("table", pa.string()),
                ("date", pa.string()),
                ("bucket", pa.int32()),
                ("staged", pa.string()),
                ("final", pa.string()),
                ("rows", pa.int64()),
            ]
        ),
    )


# --------------------------------------------------------------------------- the query (driver)


@dataclass
class BatchReport:
    batch_id: int
    rows: dict[str, int] = field(default_factory=dict)
    files: int = 0


def commit_files(root: str, batch_id: int, results: list[Any]) -> BatchReport:
    """Rename the staged files of a batch into place (overwriting a crashed attempt's), then drop
    the staging folder. Runs on the driver after every task of the batch succeeded."""
    fs, base = filesystem(root)
    report = BatchReport(batch_id)
    for r in sorted(results, key=lambda r: str(r["final"])):
        final = str(r["final"])
        fs.create_dir(final.rsplit("/", 1)[0], recursive=True)
        fs.move(str(r["staged"]), final)
        report.rows[r["table"]] = report.rows.get(r["table"], 0) + int(r["rows"])
        report.files += 1
    staging = f"{base}/{STAGING}/batch-{batch_id:010d}"
    if fs.get_file_info(staging).type != pafs.FileType.NotFound:
        fs.delete_dir(staging)
    return report


def start_archive(spark: Any, hs: HistorySettings, query_name: str = "fleetfence-archive") -> Any:
    """Build and start the archive query; returns the StreamingQuery."""
    from pyspark.sql import functions as F

    from processor.spark.source import kafka_stream

    t = hs.topics
    topics = {t.telemetry: TELEMETRY, t.alerts: ALERTS, t.master: MASTER}
    buckets, root, max_rows = hs.history_buckets, hs.archive_root, hs.history_max_rows_per_file
    # Spark's Kafka connector, committed records only: the alerts topic is written in transactions
    # by the processor, so an aborted batch's alerts never reach the archive. The compacted master
    # topic is a source of its own (holes in its offsets are not data loss).
    cols = ["topic", "value AS payload", "timestamp AS ts", "offset AS kafka_offset"]
    events = kafka_stream(
        spark,
        hs.bootstrap_servers,
        [t.telemetry, t.alerts],
        max_offsets_per_trigger=hs.history_max_events_per_batch,
    ).selectExpr(*cols)
    master = kafka_stream(spark, hs.bootstrap_servers, [t.master], compacted=True).selectExpr(*cols)
    src = events.unionByName(master)
    parsed = src.mapInArrow(lambda it: parse_records(it, topics, buckets), RECORD_DDL)
    # The de-duplication clock is the micro-batch time (kept in the offset log, so a replay sees
    # the same): no row is ever behind that watermark, so nothing is dropped as late, and a
    # re-delivery is caught when it is read within `dedup_window_s` of the original.
    deduped = (
        parsed.withColumn("seen", F.current_timestamp())
        .withWatermark("seen", f"{int(hs.history_dedup_window_s * 1000)} milliseconds")
        .dropDuplicatesWithinWatermark(["key"])
        .drop("seen")
    )
    partitions = max(int(spark.conf.get("spark.sql.shuffle.partitions")), 1)

    def write_batch(df: Any, batch_id: int) -> None:
        started = time.monotonic()
        results = (
            df.repartition(partitions, "table", "date", "bucket")
            .mapInArrow(lambda it: write_partitions(it, root, batch_id, max_rows), RESULT_DDL)
            .collect()
        )
        report = commit_files(root, batch_id, [r.asDict() for r in results])
        for table, n in report.rows.items():
            ROWS_WRITTEN.labels(table).inc(n)
        BATCHES.inc()
        logger.info(
            "archive batch written batch_id=%d telemetry=%d alerts=%d master=%d files=%d duration_ms=%d",
            batch_id,
            report.rows.get(TELEMETRY, 0),
            report.rows.get(ALERTS, 0),
            report.rows.get(MASTER, 0),
            report.files,
            (time.monotonic() - started) * 1000,
        )

    writer = (
        deduped.writeStream.queryName(query_name)
        .option("checkpointLocation", hs.checkpoint_location)
        .foreachBatch(write_batch)
    )
    if hs.history_trigger_ms > 0:
        writer = writer.trigger(processingTime=f"{hs.history_trigger_ms} milliseconds")
    q = writer.start()
    logger.info("archive started query=%s root=%s checkpoint=%s", q.id, root, hs.checkpoint_location)
    return q


def run_archive(hs: HistorySettings, stop: threading.Event | None = None) -> None:
    """`fleetfence archive run`: the query until SIGTERM/SIGINT (the current batch completes)."""
    with stop_on_signals(stop) as event:
        _run_archive(hs, event)


def archive_presence(hs: HistorySettings) -> AbstractContextManager[Presence]:
    """The archive writer's metrics endpoint and its announcement in the service registry (one
    writer per host: the host name is its instance id)."""
    return presence(
        hs,
        "archive",
        socket.gethostname(),
        metrics_port=hs.history_metrics_port,
        default_port=HISTORY_METRICS_PORT,
    )


def _run_archive(hs: HistorySettings, stop: threading.Event) -> None:
    with archive_presence(hs):
        _run_query(hs, stop)


def _run_query(hs: HistorySettings, stop: threading.Event) -> None:
    from processor.spark.session import build_session, spark_master_url

    spark = build_session(
        app_name="fleetfence-archive", spark_master=spark_master_url(hs.history_spark_master)
    )
    q = start_archive(spark, hs)
    try:
        run_until_stopped(lambda: bool(q.awaitTermination(0.5)), stop)
        exc = q.exception()
        if exc is not None:
            raise ArchiveError(f"archive query failed: {exc}")
    finally:
        if q.isActive:
            q.stop()
        spark.stop()
