"""The processor's row contract: what flows from the Kafka read (`processor.spark.parse`) through the
stateful operator (`processor.spark.stateful`) to the exactly-once sink (`processor.spark.kafka_sink`).

Three shapes, one home:
- input rows (SCHEMA_DDL / ARROW_SCHEMA), one per master event, dead letter or per-bucket chunk of
  fixes, told apart by `kind` (`InputKind`);
- a chunk of fixes: an Arrow IPC stream of FIX_SCHEMA (`encode_chunk` / `decode_chunks`);
- output rows (`OutputRow`, OUTPUT_DDL), told apart by `kind` (`OutputKind`): an alert, a bucket's
  packed live states (`pack_live` / `unpack_live`), a dead letter, a late fix, or the counters.
A change to any of them is a change to both ends, so both ends import it from here.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any, NamedTuple

import orjson
import pandas as pd
import pyarrow as pa

from fleetfence.contracts import Telemetry

# A chunk's schema is part of this contract; it is defined beside the engine's `Fixes`.
from processor.core.columns import FIX_SCHEMA as FIX_SCHEMA  # noqa: PLC0414 (re-exported)
from processor.core.columns import Fixes

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
# `ts` is null on every row but the clock's (InputKind.CLOCK).
# `bucket` is the Spark state key of the row's vehicle bucket (`processor.spark.layout`), not the bucket
# number itself, so that the buckets spread evenly over the stateful tasks.
# One row of the stream carries a whole chunk of one bucket's fixes, as an Arrow IPC stream of
# FIX_SCHEMA (`processor.core.columns`, beside the engine's `Fixes`): the JVM moves a few large binary
# values per bucket instead of converting every fix row by row through the shuffle and into the
# stateful operator, where the per-row cost dominates.


class InputKind(StrEnum):
    """What an input row carries. The values travel in the `kind` column of every row Spark reads,
    shuffles and hands to the stateful operator, so they stay one letter."""

    FIXES = "T"  # a chunk of one bucket's fixes (FIX_SCHEMA), in `payload`
    MASTER_EVENT = "M"  # a record of the master-data topic, in `payload`
    INVALID_RECORD = "E"  # a telemetry record that is not canonical: dead-lettered
    # The event-time clock: one row per read task whose `ts` is the newest fix the task read. It is
    # the only row with a `ts`: Spark drops input rows whose event time is behind the watermark,
    # silently and before the stateful operator sees them, and a chunk's newest fix can be behind it
    # whenever its partition was read later than the others (a backlog, a slow partition) or its
    # vehicle uploads stored fixes. Data rows carry a null `ts`, which the watermark's filter never
    # drops and its maximum ignores; the clock rows move the watermark, and dropping one of them
    # loses nothing.
    CLOCK = "C"


def encode_chunk(table: pa.Table) -> bytes:
    """One bucket's fixes (FIX_SCHEMA) as the payload of an `InputKind.FIXES` row."""
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


class OutputKind(StrEnum):
    """What an output row carries (`OutputRow.kind`)."""

    ALERT = "alert"
    LIVE_STATES = "live"
    DEAD_LETTER = "dlq"  # an invalid input record
    LATE_FIX = "late"  # a fix beyond the lateness bound: dead-lettered with reason `late` (late_rows)
    STATS = "stats"


class OutputRow(NamedTuple):
    """One row from the stateful operator to the sink; its fields are OUTPUT_DDL's columns, in order.

    - ALERT: `value` the alert's record, `vehicle_id` and `seq` its vehicle's and fix's;
    - LIVE_STATES: `value` a bucket's live states (`pack_live`), `seq` how many;
    - DEAD_LETTER: `value` the invalid record's bytes, `detail` why, and where it is on its topic;
    - LATE_FIX: `value` the fix as decoded, `vehicle_id` and `seq` its own, `detail` how late, and
      where its record is on the telemetry topic (`kafka_partition`, `kafka_offset`): the sink
      reads the original bytes back from there;
    - STATS: `value` the bucket's counters as JSON.
    """

    kind: OutputKind
    value: bytes
    vehicle_id: str | None = None
    seq: int = 0
    detail: str | None = None
    topic: str | None = None
    # -1 where the place is unknown or the row has none: a nullable integer column would cost the
    # operator's frame several times its building time (pandas extension arrays).
    kafka_partition: int = -1
    kafka_offset: int = -1

    @property
    def place(self) -> tuple[int, int] | None:
        """(partition, offset) of the row's record on its topic; None when unknown."""
        if self.kafka_partition < 0 or self.kafka_offset < 0:
            return None
        return self.kafka_partition, self.kafka_offset


# Each field's Spark type.
_OUTPUT_TYPES = {
    "kind": "string",
    "value": "binary",
    "vehicle_id": "string",
    "seq": "long",
    "detail": "string",
    "topic": "string",
    "kafka_partition": "int",
    "kafka_offset": "long",
}
if tuple(_OUTPUT_TYPES) != OutputRow._fields:
    raise TypeError(f"OutputRow has fields {OutputRow._fields}, the output columns {tuple(_OUTPUT_TYPES)}")
OUTPUT_DDL = ", ".join(f"{name} {spark}" for name, spark in _OUTPUT_TYPES.items())


def output_frame(rows: list[OutputRow]) -> pd.DataFrame:
    """The operator's output rows as the pandas frame Spark takes (OUTPUT_DDL)."""
    return pd.DataFrame(rows, columns=OutputRow._fields)


def output_rows(batch: pa.RecordBatch) -> list[OutputRow]:
    """The sink's side of `output_frame`: a batch of OUTPUT_DDL rows as typed rows."""
    cols = [batch.column(name).to_pylist() for name in OutputRow._fields]
    return [OutputRow(OutputKind(kind), *rest) for kind, *rest in zip(*cols, strict=True)]


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


def late_rows(late: Fixes, watermark_ms: int, bound_ms: int) -> list[OutputRow]:
    """LATE_FIX rows for fixes beyond the lateness bound, each with its record's place on the
    telemetry topic when known: the sink reads the record's original bytes back from there
    (`processor.spark.kafka_sink.original_records`). The value is the fix in canonical form as decoded,
    sent only if the record is no longer on the topic (retention) or its place is unknown; the
    detail says how late it was."""
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
        out.append(
            OutputRow(
                OutputKind.LATE_FIX,
                fix.to_json(),
                vehicle_id=fix.vehicle_id,
                seq=fix.seq,
                detail=detail,
                kafka_partition=-1 if parts is None or offs is None else int(parts[i]),
                kafka_offset=-1 if parts is None or offs is None else int(offs[i]),
            )
        )
    return out
