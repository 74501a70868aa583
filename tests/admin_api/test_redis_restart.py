"""The admin API across a Redis restart (issue #64, case 3).

In a compose run a clean-up DELETE answered 500 minutes after Redis had been SIGKILLed and restarted,
with Redis up the whole time. The cause was the API's connection pool: redis-py 8.1's asyncio pool
hands out an idle connection without noticing that the server closed it, so every connection that
sat idle through the restart failed the first command sent on it, whenever the pool next reached
it. The test restarts a Redis of its own (SIGKILL, then the same binary on the same port and data
folder) under writes from several threads, so the pool holds idle connections as it does in
production, and checks both answers: a 503 with Retry-After while Redis is down (a client should
send the request again; a 500 says the API is broken), and nothing but 2xx once Redis answers
again, on every connection the pool held before the kill.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
import redis
from fastapi.testclient import TestClient

from admin_api.app import create_app
from admin_api.security import Role, create_api_key
from admin_api.settings import ApiSettings
from embedded import infra
from embedded.processes import exited, read_pid, reap
from fleetfence.settings import Settings
from fleetfence.testing import wait_for

pytestmark = pytest.mark.services

# Concurrent writers: enough that the API's pool holds several connections, idle between bursts.
WRITERS = 8
# Connections the API must hold before the kill for the test to say anything about idle ones.
MIN_HELD = 4


@pytest.fixture
def own_redis(tmp_path: Path) -> Iterator[ApiSettings]:
    """API settings on a Redis of this test's own: the test SIGKILLs it, and the session's Redis
    serves every other test."""
    base = Settings(**infra.private_fields(tmp_path / "state"), startup_timeout_s=30)
    try:
        infra.up(base, create_topics=False, only=("redis",))
    except Exception as exc:
        infra.down(base)
        pytest.fail(f"could not start the test's Redis: {exc}", pytrace=False)
    try:
        yield ApiSettings.from_base(base, redis_prefix="restart:", api_run_relay=False, api_key_cache_s=0)
    finally:
        infra.down(base)


class Writers:
    """Bursts of concurrent writes (PUT then DELETE of one vehicle per writer) through the API."""

    def __init__(self, client: TestClient, admin_key: str) -> None:
        self.c = client
        self.headers = {"X-API-Key": admin_key}
        self.pool = ThreadPoolExecutor(WRITERS)

    def _pair(self, i: int) -> list[httpx.Response]:
        url = f"/api/v1/vehicles/restart-{i}"
        return [
            self.c.put(url, json={"label": f"restart {i}"}, headers=self.headers),
            self.c.delete(url, headers=self.headers),
        ]

    def burst(self) -> list[httpx.Response]:
        return [res for pair in self.pool.map(self._pair, range(WRITERS)) for res in pair]

    def one_at_a_time(self, n: int) -> list[httpx.Response]:
        """`n` writers' pairs in turn: each takes the pool's most recent connection, so the older
        ones stay as they were (idle through the outage) for the writes after it."""
        return [res for i in range(n) for res in self._pair(i)]

    def burst_ok(self) -> bool:
        """One burst, every answer a success: 2xx, never a 5xx."""
        bad = [(res.request.method, res.status_code, res.text[:200]) for res in self.burst()]
        bad = [b for b in bad if not 200 <= b[1] < 300]
        assert not bad, f"writes failed with Redis up: {bad[:4]}"
        return True


def api_connections(r: redis.Redis) -> int:
    """The connections Redis has from anyone but this test's own client: the API's pool."""
    me = r.client_id()
    return sum(1 for c in r.client_list() if int(c["id"]) != me)


def kill(conf: Settings) -> None:
    """SIGKILL the test's Redis and wait until its sockets are closed (every thread gone)."""
    rec = read_pid(conf, "redis")
    assert rec is not None, "the test's Redis has no pid file"
    os.kill(rec[0], signal.SIGKILL)
    wait_for(lambda: exited(rec[0]), 10, "the SIGKILLed Redis to exit")
    reap(rec[0])


def test_writes_get_503_while_redis_is_down_and_no_5xx_once_it_answers_again(
    own_redis: ApiSettings,
) -> None:
    conf = own_redis
    r = redis.Redis.from_url(conf.redis_dsn)
    admin = create_api_key(r, conf.redis_prefix, "admin", Role.ADMIN)
    # A real client's view: a failure is a 500 answer, not an exception raised into the test.
    with TestClient(create_app(conf), raise_server_exceptions=False) as client:
        writers = Writers(client, admin)
        try:
            wait_for(
                lambda: writers.burst_ok() and api_connections(r) >= MIN_HELD,
                15,
                f"the API's pool holding {MIN_HELD} Redis connections",
            )
            held = api_connections(r)

            kill(conf)
            down = writers.one_at_a_time(3)
            wrong = [(res.status_code, res.text[:200]) for res in down if res.status_code != 503]
            assert not wrong, f"writes while Redis is down answered other than 503: {wrong[:4]}"
            for res in down:
                assert int(res.headers["Retry-After"]) >= 1
                assert "Redis" in res.json()["detail"]

            r.close()  # the test's own connection to the old server goes: it counts on the new one
            infra.up(conf, create_topics=False, only=("redis",))  # same port, same data folder
            # Every connection the pool held before the kill is used again (the new Redis sees as
            # many from the API), and every write on them succeeds.
            wait_for(
                lambda: writers.burst_ok() and api_connections(r) >= held,
                15,
                f"the API using its {held} pooled connections again",
            )
            # The data written before the kill is there: the admin key still authenticates.
            assert client.get("/api/v1/vehicles", headers=writers.headers).status_code == 200
        finally:
            writers.pool.shutdown()
            r.close()
