"""The hot drivers' sink (processor.spark.hot_sink) on the real broker and Redis, without Spark: two
drivers deciding the same alerts in batches that end at different places, the lease moving
between them, a dead driver's open transaction and a frozen one waking up."""

from __future__ import annotations

import uuid

import orjson
import pytest
import redis
from confluent_kafka import KafkaException

from fleetfence.contracts import alert_id
from fleetfence.kafka import ensure_topics, topic_specs
from fleetfence.probes import free_port
from fleetfence.settings import Settings
from fleetfence.testing import read_all
from processor.errors import LeaseLostError
from processor.ops.lease import CheckpointLease, lease_key
from processor.spark.hot_sink import HotOptions, HotSink, Matcher, Outgoing
from tests.processor.helpers import committed_alerts, markers


def alert(settings: Settings, n: int) -> Outgoing:
    aid = alert_id(f"v{n % 7}", "ZONE_ENTER", n, "z")
    value = orjson.dumps({"alert_id": aid, "vehicle_id": f"v{n % 7}", "seq": n})
    return Outgoing(aid, settings.topics.alerts, f"v{n % 7}".encode(), value)


def dead_letter(settings: Settings, n: int) -> Outgoing:
    source = f"{settings.topics.telemetry}:0:{n}"
    return Outgoing(source, settings.topics.telemetry_dlq, b"v0", b"junk", [("source", source.encode())])


class Driver:
    """One hot driver's sink with its lease token, committing the fleet's alerts in its own batches."""

    def __init__(self, settings: Settings, key: str, name: str, horizon_ms: int = 600_000) -> None:
        self.settings = settings
        self.lease = CheckpointLease(redis.Redis.from_url(settings.redis_dsn), key, 60_000)
        t = settings.topics
        self.hot = HotOptions(
            key, self.lease.owner, settings.redis_dsn, t.processor_shadow, f"hot-{key}", horizon_ms
        )
        self.sink_id = f"{name}-{uuid.uuid4().hex[:6]}"
        self.sink = self.fresh()
        self.batch = 0

    def fresh(self) -> HotSink:
        """The sink as a restarted driver process builds it."""
        t = self.settings.topics
        return HotSink(
            self.settings.bootstrap_servers,
            self.sink_id,
            t.processor_commits,
            t.alerts,
            t.telemetry_dlq,
            self.hot,
        )

    def commit(self, records: list[Outgoing], batch_id: int | None = None) -> None:
        b = self.batch if batch_id is None else batch_id
        stats = {"received": len(records), "alerts": len(records)}
        self.sink.commit(b, records, stats)
        self.batch = max(self.batch, b + 1)


@pytest.fixture
def pair(settings: Settings) -> tuple[Driver, Driver]:
    ensure_topics(settings.bootstrap_servers, topic_specs(settings))
    key = lease_key(f"{settings.topic_prefix}ff:", f"/job/{uuid.uuid4().hex}")
    return Driver(settings, key, "a"), Driver(settings, key, "b")


def ids(settings: Settings) -> list[str]:
    """The committed alert ids, each vehicle's in the order committed (vehicles by first alert)."""
    by_vehicle: dict[str, list[str]] = {}
    for a in committed_alerts(settings):
        by_vehicle.setdefault(a["vehicle_id"], []).append(a["alert_id"])
    return [i for v in sorted(by_vehicle) for i in by_vehicle[v]]


def expected(records: list[Outgoing]) -> list[str]:
    by_vehicle: dict[str, list[str]] = {}
    for r in records:
        by_vehicle.setdefault(r.key.decode(), []).append(r.id)
    return [i for v in sorted(by_vehicle) for i in by_vehicle[v]]


def test_the_matcher_releases_what_nobody_committed_once_in_order(settings: Settings) -> None:
    a = [alert(settings, n) for n in range(8)]
    m = Matcher()
    for r in a[:4]:
        m.shadowed(r)
    m.committed(a[0].id)  # the live driver had committed 0, and 5 (ahead of this one)
    m.committed(a[5].id)
    assert list(m.pending) == [a[1].id, a[2].id, a[3].id]
    assert m.ahead == {a[5].id}
    out, dropped = m.release([a[3], a[4], a[5], a[6]])
    assert [r.id for r in out] == [a[1].id, a[2].id, a[3].id, a[4].id, a[6].id]
    assert dropped == 2
    assert not m.pending
    assert not m.ahead


@pytest.mark.parametrize("standby_ahead", [True, False])
def test_takeover_commits_each_alert_once(pair: tuple[Driver, Driver], standby_ahead: bool) -> None:
    """The active commits alerts 0..39 live in batches of 10; the standby shadows the same alerts
    in batches of 7, ahead of the active (to 55) or behind it (to 20). The active dies with a
    transaction open; the standby takes the lease and goes on: 0..79 each exactly once."""
    a, b = pair
    s = a.settings
    fleet = [alert(s, n) for n in range(80)] + [dead_letter(s, n) for n in range(3)]
    assert a.lease.try_acquire()
    for i in range(0, 40, 10):
        a.commit(fleet[i : i + 10])
    shadowed = 56 if standby_ahead else 21
    for i in range(0, shadowed, 7):
        b.commit(fleet[i : min(i + 7, shadowed)])
    assert ids(s) == expected(fleet[:40])
    # The active dies inside its next commit: records of 40..49 sent, not committed.
    p = a.sink.live
    p.begin_transaction()
    for r in fleet[40:50]:
        p.produce(r.topic, key=r.key, value=r.value)
    p.flush(10)
    a.lease.client.delete(a.lease.key)  # its lease expired
    assert b.lease.try_acquire()
    for i in range(shadowed, len(fleet), 9):
        b.commit(fleet[i : i + 9])
    got = ids(s)
    assert len(got) == len(set(got)), "an alert committed twice"
    assert got == expected(fleet[:80]), "not every alert once, in each vehicle's order"
    letters = read_all(s, s.topics.telemetry_dlq, 1)
    assert [m.headers()[0][1].decode() for m in letters] == [r.id for r in fleet[80:]]
    # The live markers count what went to fleet.alerts; the shadow ones nest their counts.
    live = [m for m in markers(s) if "shadow" not in m]
    assert sum(m["alerts"] for m in live) == 80
    assert all(isinstance(m["shadow"], dict) for m in markers(s) if "shadow" in m)


def test_a_frozen_active_that_wakes_is_fenced_and_writes_nothing(pair: tuple[Driver, Driver]) -> None:
    a, b = pair
    s = a.settings
    fleet = [alert(s, n) for n in range(30)]
    assert a.lease.try_acquire()
    a.commit(fleet[:10])
    b.commit(fleet[:20])
    # a freezes past its lease; b takes over and commits.
    a.lease.client.delete(a.lease.key)
    assert b.lease.try_acquire()
    b.commit(fleet[20:25])
    # a wakes in its next commit with the producer it had: the lease says no.
    with pytest.raises(LeaseLostError):
        a.commit(fleet[10:20])
    # Even past the lease check (it read the lease just before it froze), its producer is fenced.
    p = a.sink.live
    p.begin_transaction()
    p.produce(s.topics.alerts, key=b"v0", value=fleet[10].value)
    with pytest.raises(KafkaException):
        p.commit_transaction(10)
    # A restarted a (a new process, not the holder) only shadows.
    a.sink = a.fresh()
    a.commit(fleet[10:30], batch_id=5)
    b.commit(fleet[25:30])
    assert ids(s) == expected(fleet)


def test_a_replayed_batch_is_skipped_in_either_role(pair: tuple[Driver, Driver]) -> None:
    a, b = pair
    s = a.settings
    fleet = [alert(s, n) for n in range(20)]
    assert a.lease.try_acquire()
    a.commit(fleet[:20])
    b.commit(fleet[:10], batch_id=0)  # shadow
    b.sink = b.fresh()  # b crashed after its commit, before Spark's commit log: batch 0 replays
    a.lease.client.delete(a.lease.key)
    assert b.lease.try_acquire()
    b.commit(fleet[:10], batch_id=0)
    b.commit(fleet[10:20], batch_id=1)
    b.sink = b.fresh()  # and again, live
    b.commit(fleet[10:20], batch_id=1)
    assert ids(s) == expected(fleet)


def test_a_restarted_standby_matches_what_was_committed_while_it_was_down(settings: Settings) -> None:
    """The standby's matcher starts reading the committed alerts from its own last commit (less the
    horizon), not from its restart: with a horizon of 1 ms, everything the live driver committed
    while the standby was down is still matched, and nothing is released twice."""
    ensure_topics(settings.bootstrap_servers, topic_specs(settings))
    key = lease_key(f"{settings.topic_prefix}ff:", f"/job/{uuid.uuid4().hex}")
    a, b = Driver(settings, key, "a"), Driver(settings, key, "b", horizon_ms=1)
    fleet = [alert(settings, n) for n in range(50)]
    assert a.lease.try_acquire()
    b.commit(fleet[:10])  # b shadows 0..9, then is down
    for i in range(0, 40, 10):
        a.commit(fleet[i : i + 10])
    b.sink = b.fresh()  # b restarts and catches up on 10..39
    b.commit(fleet[10:25])
    b.commit(fleet[25:40])
    a.lease.client.delete(a.lease.key)
    assert b.lease.try_acquire()
    b.commit(fleet[40:50])
    assert ids(settings) == expected(fleet)


def test_a_live_driver_commits_through_a_redis_outage(pair: tuple[Driver, Driver]) -> None:
    """Redis unreachable: the live driver goes on (its producer is fenced if another takes over;
    its service stops on the lease it cannot renew); a standby shadows and cannot go live."""
    a, b = pair
    s = a.settings
    fleet = [alert(s, n) for n in range(30)]
    assert a.lease.try_acquire()
    a.commit(fleet[:10])
    nowhere = redis.Redis(port=free_port(), socket_timeout=1.0)
    a.sink.redis = nowhere
    a.commit(fleet[10:20])
    b.sink.redis = nowhere
    b.commit(fleet[:20])
    assert b.sink.live is None
    assert ids(s) == expected(fleet[:20])
