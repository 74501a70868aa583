"""The checkpoint lease (processor.ops.lease) on the test session's real Redis."""

from __future__ import annotations

import socket
import subprocess
import sys
import threading
import time
import uuid

import redis

from fleetfence.settings import Settings
from processor.ops.lease import CheckpointLease, lease_key
from processor.ops.service import warm_up_checkpoint
from tests.processor.helpers import wait_for


def leases(settings: Settings, ttl_ms: int = 400) -> tuple[CheckpointLease, CheckpointLease]:
    key = lease_key(f"{settings.topic_prefix}ff:", f"/checkpoints/{uuid.uuid4().hex}")
    client = redis.Redis.from_url(settings.redis_dsn)
    return CheckpointLease(client, key, ttl_ms), CheckpointLease(client, key, ttl_ms)


HOLDER = """
import sys, threading, redis
from processor.ops.lease import CheckpointLease
lease = CheckpointLease(redis.Redis.from_url(sys.argv[1]), sys.argv[2], int(sys.argv[3]))
assert lease.try_acquire()
lease.start_renewing()
print(lease.owner, flush=True)
threading.Event().wait()
"""


def test_one_holder_at_a_time_and_a_standby_takes_over_when_the_holder_is_killed(settings: Settings) -> None:
    _, standby = leases(settings)
    # The active driver: another process holding and renewing the lease.
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLDER, settings.redis_dsn, standby.key, "400"], stdout=subprocess.PIPE
    )
    try:
        assert proc.stdout is not None
        owner = proc.stdout.readline().decode().strip()
        assert standby.holder() == owner
        stop = threading.Event()
        got: list[bool] = []
        t = threading.Thread(target=lambda: got.append(standby.wait_acquire(stop, poll_s=0.05)))
        t.start()
        # Renewed, the lease outlives its 400 ms ttl many times over; the standby keeps waiting.
        wait_for(lambda: standby.holder() == owner and not got, 1.5, "the renewed lease to hold")
        assert not got
        killed = time.monotonic()
        proc.kill()
        t.join(5)
        took_s = time.monotonic() - killed
    finally:
        proc.kill()
        proc.wait(10)
    assert got == [True]
    assert standby.holder() == standby.owner
    assert took_s < 0.4 + 1.0  # the ttl, a poll, and slack for a loaded machine
    standby.release()
    assert standby.holder() is None


def test_a_driver_whose_lease_was_taken_knows_it_lost_it(settings: Settings) -> None:
    active, other = leases(settings, ttl_ms=400)
    assert active.try_acquire()
    active.start_renewing()
    # Someone (an operator, a driver that saw the lease expire during a stall) holds it now.
    active.client.set(active.key, other.owner, px=10_000)
    wait_for(active.lost.is_set, 3, "the lease loss to be noticed")
    active.release()  # releases nothing that is not its own
    assert active.holder() == other.owner


def test_a_graceful_stop_hands_the_lease_over_at_once(settings: Settings) -> None:
    active, standby = leases(settings, ttl_ms=60_000)
    assert active.try_acquire()
    active.start_renewing()
    active.release()
    assert standby.try_acquire()  # no need to wait out the minute


def test_a_standby_asked_to_stop_while_waiting_returns_without_the_lease(settings: Settings) -> None:
    active, standby = leases(settings, ttl_ms=60_000)
    assert active.try_acquire()
    stop = threading.Event()
    stop.set()
    assert standby.wait_acquire(stop) is False
    assert active.holder() == active.owner


def test_a_standbys_warm_up_checkpoint_sits_beside_the_real_one() -> None:
    """On a cluster the executors write the warm-up query's state where the driver planned it: on
    the checkpoint's own file system (a shared volume, HDFS, S3), never the driver's /tmp; one per
    host, so two standbys of a job do not share one."""
    here = socket.gethostname()
    assert warm_up_checkpoint("/data/checkpoints/processor/") == f"/data/checkpoints/processor.warm-up-{here}"
    assert warm_up_checkpoint("hdfs://nn/ff/processor") == f"hdfs://nn/ff/processor.warm-up-{here}"
