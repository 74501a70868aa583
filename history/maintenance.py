"""Archive maintenance: compaction of settled partitions and retention.

Both run beside the live writer (`fleetfence archive compact|retention`) and only touch what the
writer will never write again: partitions of earlier UTC days whose files all belong to committed
micro-batches (`last_committed_batch`), so a replay cannot resurrect a file compaction removed.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from pyarrow import fs as pafs

from history.schema import (
    ALERTS,
    KEY_COLUMNS,
    SCHEMAS,
    SORT_COLUMNS,
    TELEMETRY,
    batch_of_file,
    filesystem,
    write_geoparquet,
)

logger = logging.getLogger(__name__)


def last_committed_batch(checkpoint: str) -> int:
    """The highest batch id in the checkpoint's commit log (-1 when none): no batch at or below it
    is ever replayed, so its files are final."""
    fs, base = filesystem(checkpoint)
    info = fs.get_file_info(pafs.FileSelector(f"{base}/commits", allow_not_found=True))
    ids = [int(i.base_name) for i in info if i.base_name.isdigit()]
    return max(ids, default=-1)


@dataclass
class CompactionReport:
    partitions: int = 0
    files_removed: int = 0
    rows: int = 0
    skipped_uncommitted: int = 0


def _partition_dirs(fs: Any, base: str, table: str) -> list[tuple[str, str]]:
    """(date, folder) of every leaf partition of a table."""
    out: list[tuple[str, str]] = []
    for d in fs.get_file_info(pafs.FileSelector(f"{base}/{table}", allow_not_found=True)):
        if d.type != pafs.FileType.Directory or not d.base_name.startswith("date="):
            continue
        date = d.base_name.removeprefix("date=")
        if table == TELEMETRY:
            out.extend(
                (date, b.path)
                for b in fs.get_file_info(pafs.FileSelector(d.path))
                if b.type == pafs.FileType.Directory and b.base_name.startswith("bucket=")
            )
        else:
            out.append((date, d.path))
    return out


def compact(root: str, checkpoint: str, today: str | None = None) -> CompactionReport:
    """Merge each partition older than the current UTC day into one file.

    Only `part-*` files of committed batches (and earlier compacted files) are merged. The new file
    is written as `_compacted-*.parquet.tmp` (skipped by Spark, pyarrow and `*.parquet` readers),
    renamed, then the sources are deleted: between the rename and the last delete a reader listing
    the folder sees rows twice (docs/history.md). Merging de-duplicates by the table's key, so a
    compaction that crashed in that window heals on the next run.
    """
    fs, base = filesystem(root)
    today = today or datetime.now(UTC).strftime("%Y-%m-%d")
    cfs, cbase = filesystem(checkpoint)
    if cfs.get_file_info(f"{cbase}/commits").type == pafs.FileType.NotFound:
        # No writer ever committed through this checkpoint (an archive written by other means, or
        # moved here): nothing can replay into it, every file is final.
        logger.warning("no commit log at %s: treating every archive file as committed", checkpoint)
        committed = 2**62
    else:
        committed = last_committed_batch(checkpoint)
    report = CompactionReport()
    for table in (TELEMETRY, ALERTS):
        for date, folder in _partition_dirs(fs, base, table):
            if date >= today:
                continue
            files = [
                f
                for f in fs.get_file_info(pafs.FileSelector(folder))
                if f.type == pafs.FileType.File and f.base_name.endswith(".parquet")
            ]
            eligible = []
            for f in files:
                b = batch_of_file(f.base_name)
                if f.base_name.startswith("compacted-") or (b is not None and b <= committed):
                    eligible.append(f)
                elif b is not None:
                    report.skipped_uncommitted += 1
            if len(eligible) < 2:
                continue
            merged = pa.concat_tables(
                [
                    pq.read_table(f.path, filesystem=fs, schema=SCHEMAS[table])
                    for f in sorted(eligible, key=lambda f: f.base_name)
                ]
            )
            merged = _dedup(merged, KEY_COLUMNS[table]).sort_by(SORT_COLUMNS[table])
            top = max((batch_of_file(f.base_name) or -1) for f in eligible)
            name = f"compacted-{top:010d}-{int(time.time() * 1000)}.parquet"
            tmp = f"{folder}/_{name}.tmp"  # "_": Spark, pyarrow and Hive readers skip it
            write_geoparquet(merged, tmp, filesystem=fs)
            fs.move(tmp, f"{folder}/{name}")
            for f in eligible:
                fs.delete_file(f.path)
            report.partitions += 1
            report.files_removed += len(eligible)
            report.rows += merged.num_rows
            logger.info("compacted partition=%s files=%d rows=%d", folder, len(eligible), merged.num_rows)
    return report


def _dedup(t: pa.Table, keys: list[str]) -> pa.Table:
    """First row of each key (file order: older batches first)."""
    idx = pa.array(np.arange(t.num_rows))
    first = t.append_column("__i", idx).group_by(keys, use_threads=False).aggregate([("__i", "min")])
    return t.take(pa.array(np.sort(first["__i_min"].to_numpy())))


def apply_retention(root: str, retention_days: int, today: str | None = None) -> list[str]:
    """Delete telemetry and alert date partitions older than `retention_days` (master is kept: it
    is the only record of the routes that old alerts refer to). Returns the deleted folders."""
    fs, base = filesystem(root)
    now = datetime.strptime(today, "%Y-%m-%d").replace(tzinfo=UTC) if today else datetime.now(UTC)
    cutoff = (now - timedelta(days=retention_days)).strftime("%Y-%m-%d")
    deleted = []
    for table in (TELEMETRY, ALERTS):
        for d in fs.get_file_info(pafs.FileSelector(f"{base}/{table}", allow_not_found=True)):
            if (
                d.type == pafs.FileType.Directory
                and d.base_name.startswith("date=")
                and d.base_name.removeprefix("date=") < cutoff
            ):
                fs.delete_dir(d.path)
                deleted.append(d.path)
                logger.info("retention deleted partition=%s", d.path)
    return deleted
