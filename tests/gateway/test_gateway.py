"""The gateway against the real broker and Mosquitto: round trip, dead letters, acknowledgements."""

from __future__ import annotations

import time
import uuid
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from fleetfence.contracts import MAX_DLQ_VALUE_BYTES, DlqReason, Telemetry
from fleetfence.kafka import ensure_topics, topic_specs
from fleetfence.mqtt import service_account
from fleetfence.settings import Settings
from fleetfence.testing import wait_for
from gateway.service import Gateway
from gateway.settings import GatewaySettings
from gateway.testing import Publisher, TopicReader, fix, fleet_publisher, forget_session, telemetry_seqs
from tests.gateway.helpers import gw_settings
from tests.strategies import json_ints

pytestmark = pytest.mark.services

KNOWN_REASONS = {r.value for r in DlqReason} - {DlqReason.INTERNAL_ERROR.value}


def reconciled(gw: Gateway) -> bool:
    s = gw.stats
    return gw.in_flight == 0 and s.received == s.forwarded + s.dead_lettered_total


def test_round_trip_keys_payloads_and_order(
    gs: GatewaySettings, gateway: Gateway, publisher: Publisher
) -> None:
    prefix = f"rt{uuid.uuid4().hex[:6]}-"
    vehicles = [f"{prefix}{i}" for i in range(8)]
    n_per = 50
    sent: dict[tuple[str, int], dict[str, Any]] = {}
    for seq in range(n_per):
        for v in vehicles:
            d = fix(v, seq, speed_kmh=float(seq))
            if seq % 2:
                d["ts"] = "2026-01-22T08:15:30.250+01:00"
                d.pop("heading_deg")
            sent[(v, seq)] = d
            publisher.publish(f"fleet/{v}/telemetry", orjson.dumps(d))
    publisher.wait_all()
    reader = TopicReader(gs.bootstrap_servers, [gs.topics.telemetry])
    try:
        reader.read_until(lambda rs: len(rs) >= len(sent), 30, "all telemetry records")
        wait_for(lambda: reconciled(gateway) and gateway.stats.acked == len(sent), 10, "acks")
    finally:
        reader.close()
    recs = reader.records
    assert len(recs) == len(sent)
    assert gateway.stats.forwarded == len(sent)
    assert gateway.stats.dead_lettered_total == 0
    last_seq: dict[str, int] = {}
    partition_of: dict[str, int] = {}
    for r in recs:
        t = Telemetry.from_json(r.value)
        assert r.key == t.vehicle_id.encode()
        d = sent[(t.vehicle_id, t.seq)]
        assert t.lat == d["lat"]
        assert t.speed_kmh == d["speed_kmh"]
        assert t.heading_deg == d.get("heading_deg")
        assert t.ts_ms == (1769066130250 if t.seq % 2 else d["ts"])
        assert t.received_ms is not None
        assert partition_of.setdefault(t.vehicle_id, r.partition) == r.partition  # one vehicle, one partition
    for r in sorted(recs, key=lambda r: (r.partition, r.offset)):
        t = Telemetry.from_json(r.value)
        assert t.seq > last_seq.get(t.vehicle_id, -1)  # per-vehicle order kept
        last_seq[t.vehicle_id] = t.seq
    assert len(set(partition_of.values())) > 1


# --------------------------------------------------------------------------- dead letters

NOW_MS = 1_795_320_000_000


def nasties(v: str) -> list[tuple[str, bytes, str]]:
    """(topic, payload, expected reason) hand-picked to break naive bridges."""
    t = f"fleet/{v}/telemetry"
    good = fix(v, 1)

    def with_(**kw: Any) -> bytes:
        d = dict(good)
        d.update(kw)
        return orjson.dumps(d)

    return [
        (
            t,
            b'{"vehicle_id": "%s", "seq": 1, "ts": 1795320000000, "lat": NaN, "lon": 1, "speed_kmh": 1}'
            % v.encode(),
            "not_json",
        ),
        (t, with_(lat=1e300), "out_of_range"),
        (
            t,
            b'{"vehicle_id":"%s","seq":1,"ts":1795320000000,"lat":1e400,"lon":1,"speed_kmh":1}' % v.encode(),
            "not_json",
        ),
        (
            t,
            b'{"vehicle_id":"%s","seq":123456789012345678901234567890,"ts":1,"lat":1,"lon":1,"speed_kmh":1}'
            % v.encode(),
            "wrong_type",
        ),
        (t, with_(seq=2**63), "out_of_range"),
        (t, with_(seq=-1), "out_of_range"),
        (t, with_(seq=1.5), "wrong_type"),
        (t, with_(seq="7"), "wrong_type"),
        (t, with_(seq=True), "wrong_type"),
        (t, with_(lat="52.5"), "wrong_type"),
        (t, with_(lon=None), "missing_field"),
        (t, with_(speed_kmh=-0.1), "out_of_range"),
        (t, with_(heading_deg=[1]), "wrong_type"),
        (t, with_(ts="yesterday"), "bad_timestamp"),
        (t, with_(ts="2026-11-22T08:15:30"), "bad_timestamp"),
        (t, with_(ts=4_000_000_000_000), "ts_in_future"),
        (t, with_(ts=12), "bad_timestamp"),
        (t, with_(vehicle_id="someone-else"), "vehicle_mismatch"),
        (t, with_(vehicle_id=42), "wrong_type"),
        (t, orjson.dumps(good)[:-7], "not_json"),
        (t, b"", "not_json"),
        (t, b"\x00\xff\xfe garbage \x89PNG\r\n", "not_json"),
        (t, b"[1, 2, 3]", "not_object"),
        (t, b'"just a string"', "not_object"),
        (t, b"null", "not_object"),
        (t, b"{" + b" " * 20000 + b"}", "too_large"),
        (t, b"x" * (1024 * 1024), "too_large"),
        ("fleet/bad$id/telemetry", orjson.dumps(fix("bad$id", 1)), "bad_vehicle_id"),
    ]


def dlq_by_payload(records: list[Any], prefix: str) -> list[Any]:
    return [r for r in records if prefix.encode() in r.key or r.key.startswith(b"fleet/bad$id")]


def test_nasties_are_dead_lettered_with_reasons(
    gs: GatewaySettings, gateway: Gateway, publisher: Publisher
) -> None:
    v = f"nasty{uuid.uuid4().hex[:6]}"
    cases = nasties(v)
    for topic, payload, _ in cases:
        publisher.publish(topic, payload)
    publisher.publish(f"fleet/{v}/telemetry", orjson.dumps(fix(v, 99)))  # one valid among them
    publisher.wait_all()
    reader = TopicReader(gs.bootstrap_servers, [gs.topics.telemetry_dlq, gs.topics.telemetry])
    try:
        # The valid fix is in another topic: reading stops only once it is there too, or the
        # reader may finish on the dead letters before it has fetched it.
        reader.read_until(
            lambda rs: (
                sum(r.topic == gs.topics.telemetry_dlq for r in rs) >= len(cases)
                and telemetry_seqs(rs, v) != []
            ),
            30,
            "dead letters and the valid fix",
        )
        wait_for(lambda: reconciled(gateway), 10, "counts to reconcile")
    finally:
        reader.close()
    dlq = [r for r in reader.records if r.topic == gs.topics.telemetry_dlq]
    assert len(dlq) == len(cases)
    # The bad-vehicle-id topic is not ours alone (the `$` topic is shared); match on key + payload.
    remaining = list(cases)
    for r in dlq:
        h = r.headers
        size = int(h["original_size"])
        match = next(
            c for c in remaining if c[0].encode() == r.key and len(c[1]) == size and c[1].startswith(r.value)
        )
        remaining.remove(match)
        assert h["reason"].decode() == match[2], (match, h)
        assert h["mqtt_topic"] == r.key
        assert h["detail"]
        assert int(h["received_ms"]) > NOW_MS - 10**12
        if size > MAX_DLQ_VALUE_BYTES:
            assert h["truncated"] == b"true"
            assert len(r.value) == MAX_DLQ_VALUE_BYTES
        else:
            assert h["truncated"] == b"false"
            assert r.value == match[1]  # the original bytes, unchanged
    assert remaining == []
    assert telemetry_seqs(reader.records, v) == [(v, 99)]
    s = gateway.stats
    assert s.received == len(cases) + 1 == s.forwarded + s.dead_lettered_total
    assert s.dead_lettered["too_large"] == 2


# Payloads that are invalid by construction, each with the reason it must get.
VID = "hyp-vehicle"


def _valid() -> dict[str, Any]:
    return fix(VID, 5, ts_ms=int(time.time() * 1000) - 3_600_000)


bad_number = st.one_of(
    st.text(max_size=5).map(lambda s: ("wrong_type", s)),
    st.booleans().map(lambda b: ("wrong_type", b)),
    st.lists(json_ints, max_size=2).map(lambda x: ("wrong_type", x)),
    st.just(("missing_field", None)),
)


@st.composite
def bad_payload(draw: st.DrawFn) -> tuple[bytes, str]:
    kind = draw(
        st.sampled_from(["field_type", "range", "garbage", "non_object", "mismatch", "missing", "future"])
    )
    d = _valid()
    if kind == "field_type":
        field = draw(st.sampled_from(["lat", "lon", "speed_kmh"]))
        reason, value = draw(bad_number)
        d[field] = value
        return orjson.dumps(d), reason
    if kind == "range":
        field, lo, hi = draw(st.sampled_from([("lat", -90, 90), ("lon", -180, 180), ("speed_kmh", 0, 1000)]))
        above = draw(st.booleans())
        x = draw(
            st.floats(min_value=hi, exclude_min=True, max_value=1e300)
            if above
            else st.floats(max_value=lo, exclude_max=True, min_value=-1e300)
        )
        d[field] = x
        return orjson.dumps(d), "out_of_range"
    if kind == "garbage":
        return b"\xff" + draw(st.binary(max_size=200)), "not_json"
    if kind == "non_object":
        v = draw(st.one_of(json_ints, st.text(max_size=20), st.lists(json_ints, max_size=3), st.none()))
        return orjson.dumps(v), "not_object"
    if kind == "mismatch":
        other = draw(st.text(min_size=1, max_size=20).filter(lambda s: s != VID))
        d["vehicle_id"] = other
        return orjson.dumps(d), "vehicle_mismatch"
    if kind == "missing":
        field = draw(st.sampled_from(["vehicle_id", "seq", "ts", "lat", "lon", "speed_kmh"]))
        del d[field]
        return orjson.dumps(d), "missing_field"
    d["ts"] = int(time.time() * 1000) + draw(st.integers(min_value=6 * 60 * 1000, max_value=10**12))
    return orjson.dumps(d), "ts_in_future"


@hsettings(max_examples=3, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(batch=st.lists(bad_payload(), min_size=20, max_size=60))
def test_generated_bad_payloads_all_dead_lettered(
    gs: GatewaySettings, gateway: Gateway, publisher: Publisher, batch: list[tuple[bytes, str]]
) -> None:
    # A fresh vehicle id per example, so examples never read each other's dead letters; the
    # generated payloads name VID, which is rewritten to it (same length keeps sizes honest).
    vid = f"h{uuid.uuid4().hex[:10]}"
    assert len(vid) == len(VID)
    topic = f"fleet/{vid}/telemetry"
    start = (gateway.stats.received, gateway.stats.forwarded, gateway.stats.dead_lettered_total)
    payloads = [(p.replace(VID.encode(), vid.encode()), r) for p, r in batch]
    for p, _ in payloads:
        publisher.publish(topic, p)
    publisher.wait_all()
    reader = TopicReader(gs.bootstrap_servers, [gs.topics.telemetry_dlq, gs.topics.telemetry])
    try:
        reader.read_until(
            lambda rs: sum(r.key == topic.encode() for r in rs) >= len(payloads), 30, "generated dead letters"
        )
        wait_for(lambda: reconciled(gateway), 10, "counts to reconcile")
    finally:
        reader.close()
    mine = [r for r in reader.records if r.key == topic.encode()]
    assert all(r.topic == gs.topics.telemetry_dlq for r in mine)
    got = sorted((r.value, r.headers["reason"].decode()) for r in mine)
    assert got == sorted(payloads)
    assert all(r.headers["reason"].decode() in KNOWN_REASONS for r in mine)
    s = gateway.stats
    assert s.received - start[0] == len(payloads)
    assert s.forwarded == start[1]
    assert s.dead_lettered_total - start[2] == len(payloads)


# --------------------------------------------------------------------------- acknowledgements


@pytest.mark.parametrize("in_order", [True, False])
def test_acks_are_accepted_by_mosquitto_in_either_order(settings: Settings, in_order: bool) -> None:
    """After a clean stop and a restart of the same session nothing is redelivered: Mosquitto took
    every PUBACK, in receive order or in Kafka-confirmation order (MQTT 5 section 4.6 asks for
    receive order; Mosquitto matches PUBACKs by packet id either way)."""
    ensure_topics(settings.bootstrap_servers, topic_specs(settings))
    gs = gw_settings(settings, gateway_ack_in_order=in_order, gateway_receive_maximum=300)
    host, port = gs.mqtt_host_port
    prefix = f"ack{uuid.uuid4().hex[:6]}-"
    pub = fleet_publisher(settings)
    gw = Gateway(gs)
    try:
        gw.start()
        for seq in range(150):
            for i in range(8):
                pub.publish(f"fleet/{prefix}{i}/telemetry", orjson.dumps(fix(f"{prefix}{i}", seq)))
        pub.wait_all()
        wait_for(lambda: gw.stats.acked == 1200, 30, "every message acknowledged")
        # Kafka confirms partitions independently, so without in-order release some PUBACKs
        # really do overtake earlier messages; with it, none does.
        if in_order:
            assert gw.acks.released_out_of_order == 0
        else:
            assert gw.acks.released_out_of_order > 0
        assert gw.stop(drain_timeout_s=5)
        gw2 = Gateway(gs)
        gw2.start()
        try:
            pub.publish(f"fleet/{prefix}0/telemetry", orjson.dumps(fix(f"{prefix}0", 10_000)))
            pub.wait_all()
            # Redeliveries of a resumed session come before new messages.
            wait_for(lambda: gw2.stats.forwarded >= 1, 15, "the marker message")
            assert gw2.stats.redelivered == 0
            assert gw2.stats.received == 1
            assert gw2.stats.mqtt_connects == 1
        finally:
            gw2.stop(drain_timeout_s=5)
    finally:
        gw.stop(drain_timeout_s=1)
        pub.close()
        forget_session(host, port, gs.gateway_client_id, service_account(gs, "gateway"))
