"""The service registry (fleetfence.registry) and the metrics endpoints (fleetfence.metrics),
against the real Redis of the test session: announce, refresh, delete on stop, expire when the
heartbeat stops (a killed process), keep a newer owner's key, survive an unreachable Redis."""

from __future__ import annotations

import logging
import os
import socket
import uuid
from collections.abc import Iterator
from dataclasses import replace

import pytest
import redis
from prometheus_client import CollectorRegistry, Counter

from fleetfence import probes
from fleetfence.errors import PortInUseError
from fleetfence.metrics import serve_metrics
from fleetfence.readmodels import ReadKeys
from fleetfence.registry import Announcer, check, new_record, registered
from fleetfence.settings import Settings
from fleetfence.testing import wait_for


@pytest.fixture
def rs(settings: Settings) -> Settings:
    """The test's settings with a registry of its own (a unique Redis prefix) and a 10 s TTL: long
    enough that no key expires under a test that does not wait for it, on a busy machine."""
    return settings.model_copy(update={"redis_prefix": f"{settings.topic_prefix}ff:", "registry_ttl_s": 10.0})


@pytest.fixture
def short(rs: Settings) -> Settings:
    """The same registry with a 1 s TTL, for the tests that watch keys refresh and expire."""
    return rs.model_copy(update={"registry_ttl_s": 1.0})


@pytest.fixture
def r(rs: Settings) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(rs.redis_dsn)
    yield client
    client.close()


def announcer(rs: Settings, instance: str = "one", metrics_url: str | None = None, pid: int = 0) -> Announcer:
    record = new_record("gateway", instance, metrics_url=metrics_url, ttl_s=rs.registry_ttl_s)
    if pid:
        record = replace(record, pid=pid)
    return Announcer(rs.redis_dsn, ReadKeys(rs.redis_prefix), record)


def test_announces_refreshes_and_deletes_its_key_on_stop(short: Settings, r: redis.Redis) -> None:
    rs = short
    a = announcer(rs, metrics_url="http://127.0.0.1:1/metrics").start()
    key = ReadKeys(rs.redis_prefix).service("gateway", "one")
    assert key == f"{rs.redis_prefix}services:gateway:one"
    try:
        wait_for(lambda: r.exists(key), 5, "the announcement")
        [entry] = registered(rs)
        rec = entry.record
        assert (rec.kind, rec.instance, rec.pid, rec.host) == (
            "gateway",
            "one",
            a.record.pid,
            socket.gethostname(),
        )
        assert rec.metrics_url == "http://127.0.0.1:1/metrics"
        assert rec.health_url is None
        assert rec.started_at.endswith("+00:00")
        assert 0 <= rec.uptime_s < 60
        # Refreshed: the TTL runs down, then is back near its full second, more than once.
        for _ in range(2):
            wait_for(lambda: 0 < r.pttl(key) < 750, 5, "the TTL to run down")
            wait_for(lambda: r.pttl(key) > 900, 5, "the next heartbeat")
        assert a.beats >= 2
        [entry] = registered(rs)
        assert entry.record == rec
        assert entry.key == key
        assert 0 <= entry.last_heartbeat_s <= 1.0
    finally:
        a.stop()
    assert r.exists(key) == 0  # deleted by the stop itself, not by expiry
    assert registered(rs) == []


def test_a_heartbeat_that_stops_expires_with_its_ttl(short: Settings, r: redis.Redis) -> None:
    """One heartbeat and then none: what a SIGKILLed service leaves behind."""
    rs = short
    a = announcer(rs)
    assert a.beat()
    assert [e.record.instance for e in registered(rs)] == ["one"]
    wait_for(lambda: registered(rs) == [], 5, "the key to expire")
    a.stop()  # (its key is gone already: the stop deletes nothing)


def test_a_stop_keeps_the_key_of_a_newer_process_with_the_same_instance(
    rs: Settings, r: redis.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    old, new = announcer(rs), announcer(rs, pid=os.getpid() + 1)
    assert old.beat()
    with caplog.at_level(logging.WARNING, logger="fleetfence.registry"):
        assert new.beat()  # a replica restarted within the TTL takes its predecessor's key over
    assert "another process announces the same service instance" not in caplog.text
    old.stop()
    [entry] = registered(rs)
    assert entry.record.pid == new.record.pid
    # Two live processes with one instance id: the older one's next beat finds the newer's record.
    twin = announcer(rs, pid=os.getpid() + 2)
    assert twin.beat()
    with caplog.at_level(logging.WARNING, logger="fleetfence.registry"):
        assert new.beat()
    assert "another process announces the same service instance" in caplog.text
    twin.stop()
    new.stop()
    assert registered(rs) == []


def test_an_unreachable_redis_is_logged_once_and_never_raises(
    short: Settings, caplog: pytest.LogCaptureFixture
) -> None:
    dead = short.model_copy(update={"redis_url": f"redis://127.0.0.1:{probes.free_port()}/0"})
    with caplog.at_level(logging.WARNING, logger="fleetfence.registry"):
        a = announcer(dead).start()
        wait_for(lambda: a.failures >= 3, 10, "the heartbeat to keep trying")
        a.stop()
    unreachable = [m for m in caplog.messages if m.startswith("service registry unreachable,")]
    assert len(unreachable) == 1, caplog.messages
    assert a.beats == 0


def test_check_asks_the_endpoints(rs: Settings) -> None:
    reg = CollectorRegistry()
    Counter("fleetfence_test_things", "things", registry=reg).inc(3)
    server = serve_metrics("test", "127.0.0.1", probes.free_port(), default_port=1, registry=reg)
    assert server is not None
    a = announcer(rs, "up", metrics_url=server.url)
    b = announcer(rs, "down", metrics_url=f"http://127.0.0.1:{probes.free_port()}/metrics")
    c = announcer(rs, "silent")
    try:
        for x in (a, b, c):
            assert x.beat()
        by_instance = {e.record.instance: check(e, 2.0) for e in registered(rs)}
        up, down, silent = by_instance["up"], by_instance["down"], by_instance["silent"]
        assert up.answered is True
        assert up.metrics is not None
        assert up.metrics.total("fleetfence_test_things_total") == 3
        assert down.answered is False
        assert "refused" in down.detail.lower()
        assert silent.answered is None  # no endpoint: the heartbeat is all there is
    finally:
        for x in (a, b, c):
            x.stop()
        server.close()


def test_a_busy_default_metrics_port_falls_back_and_a_configured_one_is_an_error() -> None:
    assert serve_metrics("test", "127.0.0.1", 0, default_port=9999) is None
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        fallback = serve_metrics("test", "127.0.0.1", port, default_port=port, registry=CollectorRegistry())
        assert fallback is not None
        try:
            assert fallback.port not in (0, port)
            assert fallback.url == f"http://127.0.0.1:{fallback.port}/metrics"
        finally:
            fallback.close()
        with pytest.raises(PortInUseError, match=f"127.0.0.1:{port} is in use"):
            serve_metrics("test", "127.0.0.1", port, default_port=port + 1, registry=CollectorRegistry())


def test_keys_escape_the_prefix_in_the_scan_pattern() -> None:
    keys = ReadKeys(f"odd*[{uuid.uuid4().hex[:4]}]:")
    assert keys.services_pattern.startswith("odd\\*\\[")
    assert keys.services_pattern.endswith("\\]:services:*")
