"""The processor's input stage: Kafka records -> the rows the stateful operator folds.

Runs inside the Spark tasks that read Kafka through Spark's own connector (`processor.spark.source`),
as one vectorized Python pass per task (`mapInArrow`): each task sees one Kafka partition's offset
range in order, parses it, and hands on a few rows per bucket instead of one row per fix:

- telemetry: canonical fixes are decoded and range-checked (msgspec in C for the common case,
  `canonical_fix` for the rest), then cut into one Arrow IPC chunk per vehicle bucket; a record that
  is not canonical telemetry becomes an INVALID_RECORD row that the sink dead-letters, so the counts
  reconcile (in = processed + dead-lettered);
- master data: a route or zone change concerns every bucket and is emitted once per bucket; an
  assignment or vehicle change goes to its vehicle's bucket.

Valid telemetry itself is defined in `fleetfence.contracts` (`canonical_fix` and its msgspec fast
path), beside the gateway's verdict, so the gateway, the processor and the archive judge alike.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from typing import Any

import msgspec
import numpy as np
import orjson
import pyarrow as pa

from fleetfence.contracts import (
    INVALID_ERRORS,
    PlainFix,
    bucket_of,
    canonical_fix,
    decode_plain_fix,
    received_ms_of,
)
from processor.spark.rows import (
    ARROW_SCHEMA,
    FIX_SCHEMA,
    InputKind,
    encode_chunk,
)

logger = logging.getLogger(__name__)

CHUNK_FIXES = 50_000
PARSE_SLICE = 10_000  # records parsed at a time


class BucketRows:
    """Output rows of one read task: master events, dead letters and per-bucket fix chunks."""

    def __init__(self, buckets: int, keys: list[int] | None = None) -> None:
        self.buckets = buckets
        # The Spark state key of each bucket (processor.spark.layout): the `bucket` column carries the key.
        self.keys = keys if keys is not None else list(range(buckets))
        self.cols: dict[str, list[Any]] = {f.name: [] for f in ARROW_SCHEMA}
        # Fixes decoded so far, as column batches with each fix's bucket; cut into one Arrow IPC
        # chunk per bucket by `flush_fixes`.
        self._fix_batches: list[pa.RecordBatch] = []
        self._fix_buckets: list[np.ndarray] = []
        self.n_fixes = 0
        self.max_ts_ms: int | None = None  # the newest fix of the task: its clock row
        self._bucket_cache: dict[str, int] = {}

    def row(
        self,
        kind: InputKind,
        bucket: int,
        ts_ms: int | None,
        n: int,
        payload: bytes | None,
        topic: str | None,
        part: int,
        off: int,
        error: str | None,
    ) -> None:
        c = self.cols
        c["kind"].append(kind)
        c["bucket"].append(self.keys[bucket])
        c["ts"].append(None if ts_ms is None else ts_ms * 1000)
        c["n"].append(n)
        c["payload"].append(payload)
        c["topic"].append(topic)
        c["kafka_partition"].append(part)
        c["kafka_offset"].append(off)
        c["error"].append(error)

    def fixes(self, cols: list[list[Any]]) -> None:
        """Append decoded fixes, given as the FIX_SCHEMA columns, in Kafka order."""
        vids = cols[0]
        if not vids:
            return
        cache = self._bucket_cache
        for vid in set(vids).difference(cache):
            cache[vid] = bucket_of(vid, self.buckets)
        self._fix_buckets.append(np.fromiter(map(cache.__getitem__, vids), np.int32, len(vids)))
        self._fix_batches.append(
            pa.RecordBatch.from_arrays(
                [pa.array(col, type=f.type) for col, f in zip(cols, FIX_SCHEMA, strict=True)],
                schema=FIX_SCHEMA,
            )
        )
        self.n_fixes += len(vids)

    def flush_fixes(self, part: int, off: int) -> None:
        """One Arrow IPC chunk per bucket; a vehicle's fixes keep their Kafka order (stable sort)."""
        if not self._fix_batches:
            return
        table = pa.Table.from_batches(self._fix_batches, FIX_SCHEMA).combine_chunks()
        bk = np.concatenate(self._fix_buckets)
        newest = int(table.column("ts_ms").to_numpy().max())
        self.max_ts_ms = newest if self.max_ts_ms is None else max(self.max_ts_ms, newest)
        order = np.argsort(bk, kind="stable")
        sorted_bk = bk[order]
        cuts = np.flatnonzero(np.diff(sorted_bk)) + 1
        for idx in np.split(order, cuts):
            chunk = encode_chunk(table.take(pa.array(idx)))
            self.row(
                InputKind.FIXES,
                int(bk[idx[0]]),
                None,  # data rows carry no event time: the clock row does (rows.InputKind.CLOCK)
                len(idx),
                chunk,
                None,
                part,
                off,
                None,
            )
        self._fix_batches.clear()
        self._fix_buckets.clear()
        self.n_fixes = 0

    def __len__(self) -> int:
        return len(self.cols["kind"])

    def batch(self) -> pa.RecordBatch:
        out = pa.RecordBatch.from_pydict(self.cols, schema=ARROW_SCHEMA)
        self.cols = {f.name: [] for f in ARROW_SCHEMA}
        return out


def parse_telemetry_batch(
    rows: BucketRows, values: list[bytes | None], offsets: list[int], topic: str, part: int
) -> None:
    """Canonical telemetry (docs/contracts.md) -> the buckets' chunks; anything else -> an invalid
    row that the processor dead-letters, so the counts still reconcile.

    The common case costs ~0.5 us a record: msgspec decodes and range-checks each plain-ASCII record
    in C. A record it rejects (or one with escapes or non-ASCII bytes, where JSON decoders may judge
    differently) is judged by `canonical_fix`, the one definition of valid telemetry, so the fast
    path can only ever be faster, never more lenient. Each record is decoded on its own: joining
    them into one JSON array would let a crafted record swallow its neighbour."""
    try:
        if all(v is not None and v.isascii() and b"\\" not in v for v in values):
            fs = list(map(decode_plain_fix, values))  # type: ignore[arg-type]
            rows.fixes(
                [
                    [f.vehicle_id for f in fs],
                    [f.seq for f in fs],
                    [f.ts_ms for f in fs],
                    [f.lat for f in fs],
                    [f.lon for f in fs],
                    [f.speed_kmh for f in fs],
                    [f.received_ms or 0 for f in fs],
                    [part] * len(fs),
                    offsets,
                ]
            )
            return
    except msgspec.DecodeError:
        pass  # at least one record needs a verdict of its own
    vid: list[str] = []
    seq: list[int] = []
    ts: list[int] = []
    lat: list[float] = []
    lon: list[float] = []
    speed: list[float] = []
    recv: list[int] = []
    where: list[int] = []
    for value, off in zip(values, offsets, strict=True):
        try:
            f, r = read_fix(value)
        except INVALID_ERRORS as exc:
            key = f"{topic}:{part}:{off}"
            rows.row(
                InputKind.INVALID_RECORD,
                bucket_of(key, rows.buckets),
                None,
                1,
                value,
                topic,
                part,
                off,
                f"not canonical telemetry: {type(exc).__name__}: {str(exc)[:120]}",
            )
            continue
        vid.append(f.vehicle_id)
        seq.append(f.seq)
        ts.append(f.ts_ms)
        lat.append(f.lat)
        lon.append(f.lon)
        speed.append(f.speed_kmh)
        recv.append(r)
        where.append(off)
    rows.fixes([vid, seq, ts, lat, lon, speed, recv, [part] * len(vid), where])


def read_fix(value: bytes | None) -> tuple[PlainFix, int]:
    """One telemetry record as the processor reads it, one at a time: the fix and its received_ms
    (0: unknown). A plain-ASCII record is decoded by msgspec (`PlainFix`); one it rejects, or one
    with escapes or non-ASCII bytes (where JSON decoders may judge differently), by `canonical_fix`,
    the one definition of valid telemetry. Raises one of INVALID_ERRORS for an invalid record."""
    try:
        if value is None or not value.isascii() or b"\\" in value:
            raise ValueError("not plain ASCII")
        f = decode_plain_fix(value)
        return f, f.received_ms or 0
    except (msgspec.DecodeError, ValueError):
        d = orjson.loads(value or b"")
        return PlainFix(*canonical_fix(d)), received_ms_of(d)


def parse_master(rows: BucketRows, value: bytes | None, topic: str, part: int, off: int) -> None:
    if value is None:  # a compaction tombstone carries nothing to apply
        return
    try:
        d = orjson.loads(value)
        entity, eid = d["entity"], str(d["id"])
    except (orjson.JSONDecodeError, KeyError, TypeError) as exc:
        logger.warning("master event skipped offset=%s error=%s", off, exc)
        return
    targets = range(rows.buckets) if entity in ("route", "zone") else [bucket_of(eid, rows.buckets)]
    for b in targets:
        rows.row(InputKind.MASTER_EVENT, b, None, 1, value, None, part, off, None)


def parse_kafka_records(
    batches: Iterator[pa.RecordBatch],
    *,
    topic: str,
    master: bool,
    buckets: int,
    keys: list[int],
) -> Iterator[pa.RecordBatch]:
    """The `mapInArrow` body over one Spark task's records of `topic` (columns `value`,
    `partition`, `offset`, as Spark's Kafka source names them), in offset order.

    Fixes are gathered over the whole task and cut into bucket chunks of up to CHUNK_FIXES, so a
    task hands on a few large rows per bucket; master events and dead letters are small rows.
    Output rows follow ARROW_SCHEMA."""
    rows = BucketRows(buckets, keys)
    last: tuple[int, int] | None = None
    for batch in batches:
        n = batch.num_rows
        if n == 0:
            continue
        values: list[bytes | None] = batch.column("value").to_pylist()
        parts = batch.column("partition").to_numpy(zero_copy_only=False)
        offs = batch.column("offset").to_numpy(zero_copy_only=False)
        # One task reads one partition's range; runs are split anyway so nothing depends on it.
        change = np.flatnonzero(parts[1:] != parts[:-1]) + 1
        for lo, hi in zip([0, *change.tolist()], [*change.tolist(), n], strict=True):
            part = int(parts[lo])
            if last is not None and last[0] != part:
                rows.flush_fixes(*last)
            if master:
                for i in range(lo, hi):
                    parse_master(rows, values[i], topic, part, int(offs[i]))
            else:
                for s in range(lo, hi, PARSE_SLICE):
                    e = min(hi, s + PARSE_SLICE)
                    parse_telemetry_batch(rows, values[s:e], offs[s:e].tolist(), topic, part)
                    if rows.n_fixes >= CHUNK_FIXES:
                        rows.flush_fixes(part, int(offs[e - 1]))
            last = (part, int(offs[hi - 1]))
            if len(rows) >= 1000:
                yield rows.batch()
    if last is not None:
        rows.flush_fixes(*last)
        if rows.max_ts_ms is not None:
            rows.row(InputKind.CLOCK, 0, rows.max_ts_ms, 0, None, None, *last, None)
    if len(rows):
        yield rows.batch()


def record_parser(
    topic: str, master: bool, buckets: int, keys: list[int]
) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """The `mapInArrow` function for one topic of one query (a closure Spark pickles to workers)."""

    def parse(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        return parse_kafka_records(batches, topic=topic, master=master, buckets=buckets, keys=keys)

    return parse
