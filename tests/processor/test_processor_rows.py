"""The row contract between the stateful operator and the sink (processor.spark.rows): an output row
comes out of Spark's pandas-to-Arrow conversion, as the sink reads it, with every field as the
operator wrote it; a late fix carries its record's place as typed fields. Pure: Spark's own
converter, no session."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
from pyspark.sql.pandas.conversion import create_arrow_array_from_pandas
from pyspark.sql.types import BinaryType, DataType, IntegerType, LongType, StringType

from fleetfence.contracts import Telemetry
from processor.core.columns import Fixes
from processor.spark.rows import OUTPUT_DDL, OutputKind, OutputRow, late_rows, output_frame, output_rows

SPARK_TYPES: dict[str, DataType] = {
    "string": StringType(),
    "binary": BinaryType(),
    "int": IntegerType(),
    "long": LongType(),
}


def through_spark(rows: list[OutputRow]) -> pa.RecordBatch:
    """The operator's frame as Spark hands it to the sink: each column converted to OUTPUT_DDL's
    type by Spark's converter (with the overflow check on)."""
    frame = output_frame(rows)
    names, arrays = [], []
    for column in OUTPUT_DDL.split(", "):
        name, ddl_type = column.split(" ")
        names.append(name)
        arrays.append(create_arrow_array_from_pandas(frame[name], SPARK_TYPES[ddl_type], safecheck=True))
    return pa.RecordBatch.from_arrays(arrays, names=names)


def fixes(where: bool) -> Fixes:
    i = np.array([7, 8], dtype=np.int64)
    f = np.array([52.5, 52.6])
    return Fixes(
        vehicle_id=np.array(["v1", "v2"], dtype=object),
        seq=i,
        ts_ms=i * 1000,
        lat=f,
        lon=f,
        speed_kmh=f,
        received_ms=i,
        kafka_partition=np.array([0, 3], dtype=np.int32) if where else None,
        kafka_offset=np.array([0, 2**40], dtype=np.int64) if where else None,
    )


def test_the_output_columns_are_the_rows_fields_in_order() -> None:
    assert [c.split(" ")[0] for c in OUTPUT_DDL.split(", ")] == list(OutputRow._fields)


def test_every_kind_of_output_row_reaches_the_sink_as_written() -> None:
    rows = [
        OutputRow(OutputKind.ALERT, b'{"type": "OVERSPEED"}', vehicle_id="v1", seq=12),
        OutputRow(OutputKind.LIVE_STATES, b"packed", seq=3),
        OutputRow(
            OutputKind.DEAD_LETTER,
            b"{not json",
            seq=-1,
            detail="not canonical telemetry",
            topic="fleet.telemetry",
            kafka_partition=5,
            kafka_offset=123_456,
        ),
        *late_rows(fixes(where=True), watermark_ms=100_000, bound_ms=60_000),
        *late_rows(fixes(where=False), watermark_ms=100_000, bound_ms=60_000),
        OutputRow(OutputKind.STATS, b'{"received": 1}'),
    ]
    back = output_rows(through_spark(rows))
    assert back == rows
    assert all(type(r.kind) is OutputKind for r in back)


def test_a_late_fix_carries_its_vehicle_and_its_records_place() -> None:
    known = late_rows(fixes(where=True), watermark_ms=100_000, bound_ms=60_000)
    assert [(r.kind, r.vehicle_id, r.seq, r.place) for r in known] == [
        (OutputKind.LATE_FIX, "v1", 7, (0, 0)),
        (OutputKind.LATE_FIX, "v2", 8, (3, 2**40)),
    ]
    assert Telemetry.from_json(known[1].value).vehicle_id == "v2"
    assert known[0].detail == "93 s behind the watermark, beyond the bound of 60 s"
    unknown = late_rows(fixes(where=False), watermark_ms=100_000, bound_ms=60_000)
    assert [(r.vehicle_id, r.place) for r in unknown] == [("v1", None), ("v2", None)]
