"""The gateway's pure parts: routing to a record, dead-letter format, in-flight release order."""

from __future__ import annotations

import time

import orjson
import pytest
from hypothesis import given
from hypothesis import settings as hsettings
from hypothesis import strategies as st
from pydantic import ValidationError

from fleetfence.contracts import MAX_DLQ_VALUE_BYTES, DlqReason, Telemetry, fast_canonical, validate_telemetry
from fleetfence.errors import ContractError
from fleetfence.settings import TopicNames
from gateway.acks import PUBACK_HEAD, AckOrder
from gateway.core import Record, Shard, route, shard_coverage, shard_of
from gateway.inflight import InFlight
from gateway.metrics import GatewayStats
from gateway.settings import GatewaySettings
from gateway.testing import fix
from tests.strategies import json_values

TOPICS = TopicNames("p.")
NOW_MS = int(time.time() * 1000)
KNOWN = {r.value for r in DlqReason} - {DlqReason.INTERNAL_ERROR.value}


def test_valid_fix_becomes_canonical_record_keyed_by_vehicle() -> None:
    d = fix("truck-1", 7, ts_ms=NOW_MS - 1000)
    r = route(TOPICS, "fleet/truck-1/telemetry", orjson.dumps(d), NOW_MS)
    assert (r.topic, r.key, r.headers, r.reason) == ("p.fleet.telemetry", b"truck-1", None, None)
    t = Telemetry.from_json(r.value)
    assert (t.seq, t.ts_ms, t.received_ms, t.accuracy_m) == (7, NOW_MS - 1000, NOW_MS, None)


def test_dead_letter_headers_and_truncation() -> None:
    payload = b"\x00" * (MAX_DLQ_VALUE_BYTES + 10)
    r = route(TOPICS, "fleet/truck-1/telemetry", payload, NOW_MS)
    h = dict(r.headers or [])
    assert r.topic == "p.fleet.telemetry.dlq"
    assert r.key == b"fleet/truck-1/telemetry" == h["mqtt_topic"]
    assert h["reason"] == b"too_large"
    assert h["original_size"] == str(len(payload)).encode()
    assert h["truncated"] == b"true"
    assert h["received_ms"] == str(NOW_MS).encode()
    assert r.value == payload[:MAX_DLQ_VALUE_BYTES]


def test_invalid_utf8_topic_is_dead_lettered_not_raised() -> None:
    r = route(TOPICS, b"fleet/\xff/telemetry", b"{}", NOW_MS)
    assert (r.reason, r.key) == ("bad_topic", b"fleet/\xff/telemetry")


fields = ["vehicle_id", "seq", "ts", "lat", "lon", "speed_kmh", "heading_deg", "accuracy_m"]


@st.composite
def mutated_fix(draw: st.DrawFn) -> bytes:
    d: dict[str, object] = dict(fix("v-1", 3, ts_ms=NOW_MS - 10))
    for name in draw(st.lists(st.sampled_from(fields), max_size=3)):
        if draw(st.booleans()):
            d.pop(name, None)
        else:
            d[name] = draw(json_values)
    return orjson.dumps(d)


@hsettings(max_examples=400, deadline=None)
@given(
    topic=st.one_of(st.just("fleet/v-1/telemetry"), st.text(max_size=30)),
    payload=st.one_of(st.binary(max_size=300), mutated_fix(), json_values.map(orjson.dumps)),
)
def test_route_never_raises_and_classifies_everything(topic: str, payload: bytes) -> None:
    r: Record = route(TOPICS, topic, payload, NOW_MS)
    if r.reason is None:
        t = Telemetry.from_json(r.value)
        assert r.topic == TOPICS.telemetry
        assert topic == f"fleet/{t.vehicle_id}/telemetry"
        assert -90 <= t.lat <= 90
        assert -180 <= t.lon <= 180
        assert t.speed_kmh >= 0
    else:
        assert r.reason in KNOWN
        assert r.topic == TOPICS.telemetry_dlq
        assert r.value == payload


@hsettings(max_examples=600, deadline=None)
@given(
    topic=st.one_of(st.just("fleet/v-1/telemetry"), st.just("fleet/v 1/telemetry"), st.text(max_size=30)),
    payload=st.one_of(st.binary(max_size=300), mutated_fix(), json_values.map(orjson.dumps)),
)
def test_fast_path_only_accepts_what_the_validator_accepts_with_equal_values(
    topic: str, payload: bytes
) -> None:
    fast = fast_canonical(topic, payload, NOW_MS)
    try:
        slow: Telemetry | None = validate_telemetry(topic, payload, NOW_MS)
    except ContractError:
        slow = None
    if fast is not None:
        assert slow is not None, "the fast path accepted what the validator rejects"
        assert fast[0] == slow.vehicle_id
        assert orjson.loads(fast[1]) == orjson.loads(slow.to_json())
        assert list(orjson.loads(fast[1])) == list(orjson.loads(slow.to_json()))  # same field order


def test_fast_path_takes_the_common_fix() -> None:
    """Guard: the property above would pass vacuously if the fast path never accepted anything."""
    d = fix("truck-1", 7, ts_ms=NOW_MS - 1000)
    fast = fast_canonical("fleet/truck-1/telemetry", orjson.dumps(d), NOW_MS)
    assert fast is not None
    assert orjson.loads(fast[1]) == orjson.loads(
        validate_telemetry("fleet/truck-1/telemetry", orjson.dumps(d), NOW_MS).to_json()
    )


def test_in_order_release_waits_for_the_oldest() -> None:
    rec = Record("t", b"k", b"v", None, None)
    f = InFlight(in_order=True)
    a, b, c = (f.add(mid, 0, rec, 0.0) for mid in (1, 2, 3))
    assert f.confirm(c) == []
    assert f.confirm(b) == []
    assert [e.mid for e in f.confirm(a)] == [1, 2, 3]
    assert len(f) == 0
    assert f.released_out_of_order == 0
    assert f.max_seen == 3


def test_out_of_order_release_is_immediate_and_counted() -> None:
    rec = Record("t", b"k", b"v", None, None)
    f = InFlight(in_order=False)
    a, b = f.add(1, 0, rec, 0.0), f.add(2, 0, rec, 0.0)
    assert f.confirm(b) == [b]
    assert f.unconfirmed() == [a]
    assert f.confirm(a) == [a]
    assert f.released_out_of_order == 1
    assert f.confirm(a) == []  # a second confirmation releases nothing


@given(st.text(min_size=1, max_size=40).filter(lambda v: "/" not in v), st.integers(1, 8))
def test_every_topic_has_exactly_one_shard(vehicle: str, count: int) -> None:
    topic = f"fleet/{vehicle}/telemetry".encode()
    assert sum(Shard(i, count).owns(topic) for i in range(count)) == 1


def test_shards_are_stable_across_processes_and_releases() -> None:
    # Literal values: a replica and its restarted successor (another process, maybe another
    # release) must agree on every vehicle's shard, so the hash is fixed, never Python's `hash`.
    assert [shard_of(b"fleet/veh-1/telemetry", n) for n in (2, 3, 7)] == [0, 1, 2]
    assert [shard_of(b"fleet/truck-042/telemetry", n) for n in (2, 3, 7)] == [0, 2, 2]
    assert [shard_of(b"fleet/a/telemetry", n) for n in (2, 3, 7)] == [1, 0, 4]
    assert shard_of(b"not-a-telemetry-topic", 5) == 0


def test_shard_bounds_are_checked() -> None:
    with pytest.raises(ValueError, match="index < count"):
        Shard(2, 2)
    with pytest.raises(ValidationError, match="SHARD_INDEX=3 must be below"):
        GatewaySettings(gateway_shard_index=3, gateway_shard_count=3)
    assert GatewaySettings(gateway_shard_index=1, gateway_shard_count=2).gateway_shard == Shard(1, 2)


def test_another_shards_message_is_acknowledged_in_its_place_and_not_counted() -> None:
    stats = GatewayStats()
    acks = AckOrder(True, stats)
    acks.connection_opened()
    mine = acks.hold(1, 1, Record("t", b"k", b"v", None, None), 0.0)
    acks.pass_on(2, 1, 0.0)
    assert not acks.unsent  # waits behind the held message: PUBACKs go in receive order
    assert [e.mid for e in acks.unconfirmed()] == [1]  # nothing of another shard is ever produced
    acks.stored(mine)
    assert acks._unsent == PUBACK_HEAD + b"\x00\x01" + PUBACK_HEAD + b"\x00\x02"
    assert stats.acked == 1
    assert len(acks) == 0


def test_shard_coverage_names_what_an_operator_must_fix() -> None:
    assert shard_coverage({}) == []
    assert shard_coverage({"a": (0, 2), "b": (1, 2)}) == []
    assert shard_coverage({"a": (0, 3), "b": (2, 3)}) == [
        "shard 1 of 3 has no running gateway: its vehicles' fixes are lost"
    ]
    assert shard_coverage({"a": (0, 2), "b": (1, 2), "c": (1, 2)}) == [
        "shard 1 of 2 is served by 2 gateways (b, c)"
    ]
    assert shard_coverage({"a": (0, 1), "b": (1, 2)}) == [
        "gateway replicas disagree on the shard count: 1, 2"
    ]
