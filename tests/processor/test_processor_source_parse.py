"""The source's telemetry parse: msgspec's fast path against `canonical_fix`, the one definition of
valid telemetry, and the per-bucket chunks it cuts (pure: no Kafka, no Spark)."""

from __future__ import annotations

from typing import Any

import orjson
import pyarrow as pa
import pytest
from hypothesis import given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from fleetfence.contracts import INVALID_ERRORS, Telemetry, bucket_of, canonical_fix, decode_plain_fix
from processor.spark.parse import BucketRows, parse_telemetry_batch
from processor.spark.rows import FIX_SCHEMA, InputKind
from tests.strategies import json_values

BUCKETS = 4


def canonical(vid: str, n: int, **over: Any) -> bytes:
    d = orjson.loads(Telemetry(vid, n, 1_795_000_000_000 + n, 52.5, 13.4, 30.0, received_ms=7).to_json())
    d.update(over)
    return orjson.dumps(d)


def reference(value: bytes | None) -> tuple[Any, ...] | None:
    """What the processor accepted before the fast path: one orjson + canonical_fix per record."""
    try:
        d = orjson.loads(value or b"")
        fix = canonical_fix(d)
    except INVALID_ERRORS:
        return None
    recv = d.get("received_ms")
    return (*fix, recv if type(recv) is int and -(2**63) <= recv < 2**63 else 0)


def parsed(values: list[bytes | None]) -> tuple[list[tuple[Any, ...]], list[int]]:
    """(accepted fixes in Kafka order, offsets of the invalid rows) after parse + flush."""
    rows = BucketRows(BUCKETS)
    parse_telemetry_batch(rows, values, list(range(len(values))), "t", 0)
    rows.flush_fixes(0, len(values))
    b = rows.batch()
    out = {c: b.column(c).to_pylist() for c in ("kind", "bucket", "payload", "kafka_offset")}
    fixes: list[tuple[Any, ...]] = []
    invalid = []
    cols = (out["kind"], out["bucket"], out["payload"], out["kafka_offset"])
    for kind, bucket, payload, off in zip(*cols, strict=True):
        if kind == InputKind.INVALID_RECORD:
            invalid.append(off)
            continue
        assert kind == InputKind.FIXES
        t = pa.ipc.open_stream(payload).read_all()
        assert t.schema.equals(FIX_SCHEMA)
        for r in zip(*(t.column(c).to_pylist() for c in FIX_SCHEMA.names), strict=True):
            assert bucket_of(r[0], BUCKETS) == bucket, "a fix in another vehicle's bucket chunk"
            *fix, part, offset = r
            # Each fix knows its record (a late one is dead-lettered with the record's bytes).
            assert part == 0
            assert reference(values[offset]) == tuple(fix)
            fixes.append(tuple(fix))
    return fixes, sorted(invalid)


FIELDS = ["vehicle_id", "seq", "ts_ms", "lat", "lon", "speed_kmh", "received_ms", "heading_deg"]


@st.composite
def record(draw: st.DrawFn) -> bytes | None:
    kind = draw(st.integers(0, 9))
    if kind == 0:
        return None
    if kind == 1:
        return draw(st.binary(max_size=80))
    d: dict[str, Any] = orjson.loads(canonical(draw(st.sampled_from(["a", "b", "vé", "c\\u0001"])), 1))
    for name in draw(st.lists(st.sampled_from(FIELDS), max_size=2)):
        if draw(st.booleans()):
            d.pop(name, None)
        else:
            d[name] = draw(json_values)
    return orjson.dumps(d)


@hsettings(max_examples=300, deadline=None)
@given(st.lists(record(), min_size=1, max_size=12))
def test_batch_parse_equals_the_per_record_reference(values: list[bytes | None]) -> None:
    """Every record gets the verdict and the values `canonical_fix` gives it: the fast path only
    makes the common case cheaper. A vehicle's fixes keep their order; the count reconciles."""
    fixes, invalid = parsed(values)
    expected = [reference(v) for v in values]
    assert invalid == [i for i, e in enumerate(expected) if e is None]
    by_vehicle: dict[str, list[tuple[Any, ...]]] = {}
    for e in expected:
        if e is not None:
            by_vehicle.setdefault(e[0], []).append(e)
    got: dict[str, list[tuple[Any, ...]]] = {}
    for f in fixes:
        got.setdefault(f[0], []).append(f)
    assert got == by_vehicle
    assert len(fixes) + len(invalid) == len(values)


def test_fast_path_takes_the_common_fix(monkeypatch: pytest.MonkeyPatch) -> None:
    """Guard for the property above: a batch of plain canonical fixes takes the msgspec path."""
    import processor.spark.parse as ks

    calls: list[bytes] = []
    real = decode_plain_fix  # what processor.spark.parse calls, patched there below

    def spy(v: bytes) -> Any:
        calls.append(v)
        return real(v)

    monkeypatch.setattr(ks, "decode_plain_fix", spy)
    values: list[bytes | None] = [canonical(f"veh-{i % 7}", i) for i in range(50)]
    fixes, invalid = parsed(values)
    assert len(calls) == 50
    assert invalid == []
    assert len(fixes) == 50
    # Per vehicle in Kafka order, whichever bucket chunk it landed in.
    seqs = [f[1] for f in fixes if f[0] == "veh-3"]
    assert seqs == sorted(seqs) == [i for i in range(50) if i % 7 == 3]


def test_out_of_int64_numbers_are_dead_lettered_not_a_poison_pill() -> None:
    """A seq beyond int64, a `true` seq or an event time beyond int64 microseconds would pass a
    type check and then fail every retry of the read task; they are dead-lettered, and an event time
    outside the gateway's static bounds is refused too (it would drag the watermark)."""
    values: list[bytes | None] = [
        canonical("a", 1),
        canonical("a", 2, seq=2**63),
        canonical("a", 3, ts_ms=2**63 - 1),
        canonical("a", 4, received_ms=2**64 - 1),
        canonical("a", 5, seq=True),
        canonical("a", 6, received_ms=True),
        canonical("a", 7, ts_ms=1000),
        canonical("a", 8),
    ]
    fixes, invalid = parsed(values)
    assert invalid == [1, 2, 4, 6]
    assert [(f[1], f[6]) for f in fixes] == [(1, 7), (4, 0), (6, 0), (8, 7)]
