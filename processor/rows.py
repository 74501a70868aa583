"""The processor's row contract: what flows from the Kafka read (`processor.parse`) through the
stateful operator (`processor.stateful`) to the exactly-once sink (`processor.kafka_sink`).

Three shapes, one home:
- input rows (SCHEMA_DDL / ARROW_SCHEMA), one per master event, dead letter or per-bucket chunk of
  fixes, told apart by `kind` (KIND_*);
- a chunk of fixes: an Arrow IPC stream of FIX_SCHEMA (`encode_chunk` / `decode_chunks`);
- output rows (OUTPUT_DDL), told apart by `kind` (OUT_*): an alert, a bucket's packed live states
  (`pack_live` / `unpack_live`), a dead letter, or the batch's counters.
A change to any of them is a change to both ends, so both ends import it from here.
"""

from __future__ import annotations

from typing import Any

import orjson
import pyarrow as pa

from fleetfence.contracts import Telemetry

# A chunk's schema is part of this contract; it is defined beside the engine's `Fixes`.
from processor.columns import FIX_SCHEMA as FIX_SCHEMA  # noqa: PLC0414 (re-exported)
from processor.columns import Fixes

# --------------------------------------------------------------------------- input rows

SCHEMA_DDL = (
    "kind string, bucket int, ts timestamp, n long, payload binary, topic string, kafka_partition int, "
    "kafka_offset long, error string"
)
ARROW_SCHEMA = pa.schema(
    [
        ("kind", pa.string()),
        ("bucket", pa.int32()),
        ("ts", pa.timestamp("us", tz="UTC")),
        ("n", pa.int64()),
        ("payload", pa.binary()),
        ("topic", pa.string()),
        ("kafka_partition", pa.int32()),
        ("kafka_offset", pa.int64()),
        ("error", pa.string()),
    ]
)
# `ts` is null on every row but KIND_CLOCK (see there).
# `bucket` is the Spark state key of the row's vehicle bucket (`processor.layout`), not the bucket
# number itself, so that the buckets spread evenly over the stateful tasks.
# One row of the stream carries a whole chunk of one bucket's fixes, as an Arrow IPC stream of
# FIX_SCHEMA (`processor.columns`, beside the engine's `Fixes`): the JVM moves a few large binary
# values per bucket instead of converting every fix row by row through the shuffle and into the
# stateful operator, where the per-row cost dominates.

KIND_TELEMETRY = "T"
KIND_MASTER = "M"
KIND_INVALID = "E"
# The event-time clock: one row per read task whose `ts` is the newest fix the task read. It is the
# only row with a `ts`: Spark drops input rows whose event time is behind the watermark, silently
# and before the stateful operator sees them, and a chunk's newest fix can be behind it whenever its
# partition was read later than the others (a backlog, a slow partition) or its vehicle uploads
# stored fixes. Data rows carry a null `ts`, which the watermark's filter never drops and its
# maximum ignores; the clock rows move the watermark, and dropping one of them loses nothing.
KIND_CLOCK = "C"


def encode_chunk(table: pa.Table) -> bytes:
    """One bucket's fixes (FIX_SCHEMA) as the payload of a KIND_TELEMETRY row."""
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, FIX_SCHEMA) as w:
        w.write_table(table)
    return bytes(sink.getvalue().to_pybytes())


def decode_chunks(chunks: list[bytes]) -> Fixes:
    """Arrow IPC chunks written by `encode_chunk` -> one batch of fixes."""
    if not chunks:
        return Fixes.empty()
    tables = [pa.ipc.open_stream(c).read_all() for c in chunks]
    return Fixes.from_table(pa.concat_tables(tables) if len(tables) > 1 else tables[0])


# --------------------------------------------------------------------------- output rows

OUTPUT_DDL = "kind string, key string, value binary, seq long, error string"
OUT_COLUMNS = ["kind", "key", "value", "seq", "error"]
OUT_ALERT = "alert"
OUT_LIVE = "live"
OUT_DLQ = "dlq"
OUT_LATE = "late"  # a fix beyond the lateness bound: dead-lettered with reason `late` (see late_rows)
OUT_STATS = "stats"

LIVE_SCHEMA = pa.schema(
    [("vehicle_id", pa.string()), ("version", pa.int64()), ("ts_ms", pa.int64()), ("state", pa.binary())]
)


def pack_live(live: list[dict[str, Any]]) -> bytes:
    """A bucket's live states as one Arrow IPC blob: each state is JSON-encoded once, here, and
    written to Redis as these bytes. The version orders states of one vehicle: a newer seq wins;
    at the same seq, "silent" is the newer state."""
    batch = pa.RecordBatch.from_arrays(
        [
            pa.array([d["vehicle_id"] for d in live], pa.string()),
            pa.array([d["seq"] * 2 + (1 if d["silent"] else 0) for d in live], pa.int64()),
            pa.array([d["ts_ms"] for d in live], pa.int64()),
            pa.array([orjson.dumps(d) for d in live], pa.binary()),
        ],
        schema=LIVE_SCHEMA,
    )
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, LIVE_SCHEMA) as w:
        w.write_batch(batch)
    return bytes(sink.getvalue().to_pybytes())


def unpack_live(blob: bytes) -> list[tuple[str, int, int, bytes]]:
    """(vehicle_id, version, ts_ms, state JSON) for each state packed by `pack_live`."""
    t = pa.ipc.open_stream(blob).read_all()
    return list(zip(*(t.column(c).to_pylist() for c in LIVE_SCHEMA.names), strict=True))


def late_rows(late: Fixes, watermark_ms: int, bound_ms: int) -> list[tuple[str, str, bytes, int, str]]:
    """OUT_LATE rows for fixes beyond the lateness bound. The key is `{partition}:{offset}:{vehicle_id}`
    (the record's place on the telemetry topic, empty when unknown): the sink reads the record's
    original bytes back from there (`processor.kafka_sink.original_records`). The value is the fix
    in canonical form as decoded, sent only if the record is no longer on the topic (retention) or
    its place is unknown; the detail says how late it was."""
    out = []
    parts, offs = late.kafka_partition, late.kafka_offset
    for i in range(len(late)):
        fix = Telemetry(
            str(late.vehicle_id[i]),
            int(late.seq[i]),
            int(late.ts_ms[i]),
            float(late.lat[i]),
            float(late.lon[i]),
            float(late.speed_kmh[i]),
            received_ms=int(late.received_ms[i]),
        )
        behind_s = (watermark_ms - fix.ts_ms) / 1000
        detail = f"{behind_s:.0f} s behind the watermark, beyond the bound of {bound_ms / 1000:.0f} s"
        where = f"{int(parts[i])}:{int(offs[i])}" if parts is not None and offs is not None else ":"
        out.append((OUT_LATE, f"{where}:{fix.vehicle_id}", fix.to_json(), fix.seq, detail))
    return out
