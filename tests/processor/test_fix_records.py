"""The fix's records agree on one field list: the wire's `Telemetry`, the processor's read of it
(`PlainFix`), the columns of a chunk and of a batch (`FIX_SCHEMA`, `Fixes`) and the engine's
records (`RawFix`, `Fix`). Each is written for a job of its own; these tests fail when one of them
drifts from the others."""

from __future__ import annotations

from dataclasses import fields

import numpy as np
import orjson
import pandas as pd
import pyarrow as pa

from fleetfence.contracts import PlainFix, Telemetry
from processor.core.columns import FIX_SCHEMA, Fixes
from processor.core.domain import Fix, RawFix
from processor.core.proximity import Position
from processor.spark.rows import FIX_SCHEMA as ROWS_FIX_SCHEMA
from processor.spark.rows import decode_chunks, encode_chunk

# What the engine does not read of a fix on the wire, and the record's place on the topic.
NOT_READ = ("heading_deg", "accuracy_m")
PLACE = ("kafka_partition", "kafka_offset")


def test_the_processor_reads_the_wire_fields_in_their_order() -> None:
    wire = [f for f in Telemetry.__struct_fields__ if f not in NOT_READ]
    assert list(PlainFix.__struct_fields__) == wire


def test_the_columns_are_the_read_fields_then_the_topic_place() -> None:
    assert FIX_SCHEMA.names == [*PlainFix.__struct_fields__, *PLACE]
    assert [f.name for f in fields(Fixes)] == FIX_SCHEMA.names
    assert ROWS_FIX_SCHEMA is FIX_SCHEMA


def test_the_engine_records_hold_the_read_fields_but_the_vehicle() -> None:
    per_vehicle = [f for f in PlainFix.__struct_fields__ if f != "vehicle_id"]
    assert [f.name for f in fields(RawFix)] == per_vehicle
    assert [f.name for f in fields(Fix)][: len(per_vehicle)] == per_vehicle


def batch() -> Fixes:
    frame = pd.DataFrame(
        {
            "vehicle_id": ["a", "b", "a"],
            "seq": [1, 1, 2],
            "ts_ms": [10, 11, 12],
            "lat": [52.0, 52.1, 52.2],
            "lon": [13.0, 13.1, 13.2],
            "speed_kmh": [0.0, 30.0, 31.5],
            "received_ms": [20, 21, 22],
            "kafka_partition": [0, 1, 0],
            "kafka_offset": [5, 6, 7],
        }
    )
    return Fixes.from_frame(frame)


def dtypes(fx: Fixes) -> list[object]:
    return [None if c is None else c.dtype for c in fx.columns()]


def test_every_form_of_a_batch_keeps_the_schema_types() -> None:
    fx = batch()
    want = [np.dtype(f.type.to_pandas_dtype()) for f in FIX_SCHEMA]
    assert dtypes(fx) == want
    table = pa.Table.from_arrays(fx.columns(), schema=FIX_SCHEMA)
    back = decode_chunks([encode_chunk(table)])
    assert dtypes(back) == want
    assert [c.tolist() for c in back.columns() if c is not None] == [c.to_pylist() for c in table.columns]
    assert dtypes(fx.take(np.array([2, 0]))) == want
    assert dtypes(Fixes.empty()) == [*want[: -len(PLACE)], None, None]


def test_released_fixes_join_a_batch_without_a_topic_place() -> None:
    fx = batch()
    released = Fixes.of_raw(["a", "b"], [fx.raw(2), RawFix(3, 13, 52.3, 13.3, 29.0, 23)])
    assert fx.raw(2) == RawFix(2, 12, 52.2, 13.2, 31.5, 22)
    assert type(fx.raw(2).seq) is int
    both = Fixes.concat([fx, released])
    assert both.seq.tolist() == [1, 1, 2, 2, 3]
    assert both.vehicle_id.tolist() == ["a", "b", "a", "a", "b"]
    assert both.kafka_partition is None
    assert both.kafka_offset is None
    assert dtypes(both)[: -len(PLACE)] == dtypes(fx)[: -len(PLACE)]
    assert Fixes.concat([fx, fx]).kafka_offset.tolist() == [5, 6, 7, 5, 6, 7]  # type: ignore[union-attr]


def test_a_frame_without_the_topic_place_has_none() -> None:
    frame = pd.DataFrame({c: [] for c in FIX_SCHEMA.names if c not in PLACE})
    fx = Fixes.from_frame(frame)
    assert fx.kafka_partition is None
    assert fx.kafka_offset is None
    assert len(fx) == 0


def test_the_wire_record_round_trips_in_its_field_order() -> None:
    t = Telemetry("v1", 3, 1_795_000_000_000, 52.5, 13.4, 30.0, None, 4.0, 1_795_000_000_050)
    assert Telemetry.from_json(t.to_json()) == t
    assert list(orjson.loads(t.to_json())) == list(Telemetry.__struct_fields__)


def test_the_proximity_position_holds_read_fields_in_their_order() -> None:
    read = list(PlainFix.__struct_fields__)
    mine = [f.name for f in fields(Position)]
    assert [f for f in read if f in mine] == mine
    assert set(mine) <= set(read)
