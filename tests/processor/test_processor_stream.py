"""The processor end to end on the real broker, Redis and Spark: exactly the expected alerts."""

from __future__ import annotations

import contextlib
import os
import random
import signal
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
import pytest
import redis

from fleetfence.contracts import AlertType, Telemetry
from fleetfence.kafka import ensure_topics, topic_specs
from fleetfence.service import stop_process_group
from fleetfence.settings import Settings
from fleetfence.testing import read_all
from processor.ops.service import EXIT_STALLED
from processor.spark.job import start_query
from tests.processor.helpers import (
    T0,
    circle_zone_event,
    committed_alerts,
    expected_alerts,
    markers,
    master_events,
    processor_settings,
    produce,
    produce_master,
    produce_telemetry,
    scenario,
    spawn_processor,
    wait_for,
)

pytestmark = [pytest.mark.spark, pytest.mark.services]


def test_stream_emits_exactly_the_expected_alerts(spark: Any, settings: Settings, tmp_path: Path) -> None:
    ensure_topics(settings.bootstrap_servers, topic_specs(settings))
    ps = processor_settings(settings, tmp_path)
    fixes = scenario()
    master = [*master_events(), circle_zone_event()]  # a circle zone too
    produce_master(settings, master)
    produce_telemetry(settings, fixes)
    bad = [b"not json", b'{"vehicle_id": "v0"}', orjson.dumps({"vehicle_id": "v9", "seq": "x"})]
    produce(settings, settings.topics.telemetry, [(b"junk", b) for b in bad])
    expected = expected_alerts(fixes, ps.engine_config(), master)
    # Hand-checked: every vehicle crosses the depot and the yard (a circle); v1 deviates and
    # returns; v2 speeds once.
    kinds = sorted((a["vehicle_id"], a["type"].value) for a in expected.values())
    assert kinds.count(("v1", "ROUTE_DEVIATION")) == 1
    assert kinds.count(("v1", "ROUTE_RETURN")) == 1
    assert kinds.count(("v2", "OVERSPEED")) == 1
    assert sum(1 for _, t in kinds if t == "ZONE_ENTER") == 12
    zones = Counter((a["type"].value, a.get("zone_id")) for a in expected.values())
    assert zones[("ZONE_ENTER", "yard")] == zones[("ZONE_EXIT", "yard")] == 6
    assert len(expected) == 27

    q = start_query(spark, ps)
    try:
        got = wait_for(
            lambda: (a := committed_alerts(settings)) and len(a) >= len(expected) and a,
            180,
            "the expected alerts",
        )
        assert sorted(a["alert_id"] for a in got) == sorted(expected)
        assert {a["alert_id"]: a for a in got} == expected
        # Dead letters carry the original bytes; counts reconcile in the commit markers.
        dlq = wait_for(
            lambda: (d := read_all(settings, settings.topics.telemetry_dlq, 1)) and len(d) >= 3 and d,
            60,
            "dead letters",
        )
        assert sorted(m.value() for m in dlq) == sorted(bad)
        for m in dlq:  # the same header set as the gateway's dead letters (docs/contracts.md)
            h = dict(m.headers() or [])
            assert h["reason"] == b"not_canonical"
            assert h["source"] == m.key()
            assert m.key().startswith(f"{settings.topics.telemetry}:".encode())
            assert h["original_size"] == str(len(m.value())).encode()
            assert h["truncated"] == b"false"
            assert h["detail"]
            assert int(h["received_ms"]) > 0

        def reconciled() -> bool:
            ms = markers(settings)
            received: int = sum(m.get("received", 0) for m in ms)
            invalid: int = sum(m.get("invalid", 0) for m in ms)
            accepted: int = sum(m.get("accepted", 0) for m in ms)
            dups: int = sum(m.get("duplicates", 0) for m in ms)
            held: int = ms[-1].get("held", 0) if ms else 0
            return received + invalid == len(fixes) + len(bad) and received == accepted + dups + held

        wait_for(reconciled, 60, "the batch counters to reconcile")
        # Live state in Redis, for the admin API.
        r = redis.Redis.from_url(settings.redis_dsn)
        live = orjson.loads(r.get(f"{ps.redis_prefix}live:v0") or b"{}")
        assert live["seq"] == 59
        assert live["status"] == "on_route"
        assert live["route_id"] == "r1"
        assert 0.0 < live["progress_ratio"] <= 1.0
        assert r.zcard(f"{ps.redis_prefix}live:index") == 6

        # Event-time silence: a fix far ahead moves the watermark; every other vehicle is silent once.
        late = Telemetry("v0", 60, T0 + 400_000, 52.5, 13.05, 30.0, None, None, T0 + 400_000)
        produce_telemetry(settings, [late])
        silent = wait_for(
            lambda: (
                (s := [a for a in committed_alerts(settings) if a["type"] == AlertType.VEHICLE_SILENT])
                and len(s) >= 5
                and s
            ),
            120,
            "silence alerts",
        )
        assert sorted(a["vehicle_id"] for a in silent) == ["v1", "v2", "v3", "v4", "v5"]
        v3 = next(a for a in silent if a["vehicle_id"] == "v3")
        assert v3["ts_ms"] == T0 + 29_000 + 60_000
        all_ids = [a["alert_id"] for a in committed_alerts(settings)]
        assert len(all_ids) == len(set(all_ids))
    finally:
        q.stop()


def committed_batches(s: Settings, n: int) -> Callable[[], bool]:
    """A check that at least `n` batches have committed (bound now, not when the loop moves on)."""
    return lambda: len(markers(s)) >= n


def received(s: Settings, n: int) -> Callable[[], bool]:
    """A check that the committed batches have read at least `n` telemetry records."""
    return lambda: sum(int(m.get("received", 0)) + int(m.get("invalid", 0)) for m in markers(s)) >= n


def spark_python_workers(root: int) -> list[int]:
    """The pids of Spark's Python workers (`pyspark.daemon` and the workers it forks) among the
    descendants of `root` (each in a process group of its own, so not in the driver's)."""
    parent: dict[int, int] = {}
    cmd: dict[int, bytes] = {}
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            stat = (d / "stat").read_text()
            cmd[int(d.name)] = (d / "cmdline").read_bytes()
        except OSError:
            continue  # gone meanwhile
        parent[int(d.name)] = int(stat.rsplit(")", 1)[1].split()[1])

    def descends(pid: int) -> bool:
        while pid > 1:
            pid = parent.get(pid, 0)
            if pid == root:
                return True
        return False

    return [p for p, c in cmd.items() if b"pyspark.daemon" in c and descends(p)]


# A driver frozen in a batch: in the fault suite, with the other crash tests (the default suite's budget).
@pytest.mark.slow
@pytest.mark.fault
def test_a_stuck_batch_stops_the_driver_with_an_error(settings: Settings, tmp_path: Path) -> None:
    """A batch whose tasks never finish, made for real: the driver's Python workers frozen with
    SIGSTOP, so the next batch's tasks wait on them as they would on executors a cluster never
    gives back. Spark would wait forever; the driver must exit with EXIT_STALLED once a batch has
    run longer than FLEETFENCE_PROCESSOR_STALL_TIMEOUT_S, for its supervisor to restart it."""
    ensure_topics(settings.bootstrap_servers, topic_specs(settings))
    timeout_s = 15.0
    ps = processor_settings(settings, tmp_path, processor_stall_timeout_s=timeout_s)
    fixes = scenario()
    half = len(fixes) // 2
    produce_master(settings, master_events())
    log = tmp_path / "processor.log"
    proc = spawn_processor(ps, log)
    frozen: list[int] = []
    try:
        produce_telemetry(settings, fixes[:half])
        wait_for(committed_batches(settings, 1), 240, "a committed batch")
        frozen = spark_python_workers(proc.pid)
        assert frozen, "no Python worker of Spark's to freeze"
        for pid in frozen:
            os.kill(pid, signal.SIGSTOP)
        t0 = time.monotonic()
        produce_telemetry(settings, fixes[half:])
        rc = proc.wait(timeout_s + 150)
        took_s = time.monotonic() - t0
        text = log.read_text(errors="replace")
        assert rc == EXIT_STALLED, text[-3000:]
        assert "no micro-batch completed for" in text, text[-3000:]
        assert took_s >= timeout_s, took_s
        print(f"stuck batch: the driver exited {rc} after {took_s:.1f} s (timeout {timeout_s:g} s)")
    finally:
        for pid in frozen:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
        stop_process_group(proc)
        # The driver's JVM, in its group, may still run its shutdown hooks after the driver's exit.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)


@pytest.mark.slow
@pytest.mark.fault
def test_sigkill_at_random_points_loses_and_duplicates_nothing(settings: Settings, tmp_path: Path) -> None:
    """Two SIGKILLs of the active driver at random moments mid-stream: the first taken over by a
    warm standby (`--standby`), the second by the next standby, which is itself killed the moment it
    takes the checkpoint's lease (a kill during takeover), and restarted cold."""
    ensure_topics(settings.bootstrap_servers, topic_specs(settings))
    ps = processor_settings(settings, tmp_path, processor_max_events_per_batch=60)
    standby_ps = ps.model_copy(update={"processor_standby": True})
    fixes = scenario(90, trips=True)
    expected = expected_alerts(fixes, ps.engine_config(), master_events(trips=True))
    # The route-awareness alerts are in the stream the crashes cut through.
    trip_types = {
        AlertType.WRONG_DIRECTION,
        AlertType.DIRECTION_RESTORED,
        AlertType.UNPLANNED_STOP,
        AlertType.STOP_ENDED,
        AlertType.ARRIVAL_AT_RISK,
        AlertType.ROUTE_COMPLETED,
    }
    assert {a["type"] for a in expected.values()} >= trip_types
    produce_master(settings, master_events(trips=True))
    rng = random.Random(7)
    # Store and forward: v1 is out of coverage from its fix 15 to 59 (its deviation, return and
    # depot visit happen there); its tracker uploads them once back, after the fleet's minute 59,
    # and the processor is killed while it applies them.
    stored = [f for f in fixes if f.vehicle_id == "v1" and 15 <= f.seq < 60]
    on_air = [f for f in fixes if not (f.vehicle_id == "v1" and 15 <= f.seq < 60)]
    chunks = [[f for f in on_air if 15_000 * i <= f.ts_ms - T0 < 15_000 * (i + 1)] for i in range(6)]
    assert sum(map(len, chunks)) == len(on_air)
    logs = iter(tmp_path / f"processor-{n}.log" for n in range(10))
    kills = 0
    sent = 0
    active = spawn_processor(ps, next(logs))
    standby_log = next(logs)
    standby = spawn_processor(standby_ps, standby_log)
    procs = [active, standby]

    def logged(log: Path, text: str) -> Callable[[], bool]:
        return lambda: log.exists() and text in log.read_text(errors="replace")

    try:
        for i, chunk in enumerate(chunks):
            produce_telemetry(settings, chunk)
            sent += len(chunk)
            if i == 3:
                # Everything before it read first, so the upload is behind the watermark (49 s).
                wait_for(received(settings, sent), 240, "the fleet's first minute to be read")
                produce_telemetry(settings, stored)
                sent += len(stored)
            if i not in (1, 3):
                continue
            # Kill once the job is mid-stream: some batches committed, more in flight.
            wait_for(committed_batches(settings, kills + 1), 180, "a committed batch")
            wait_for(logged(standby_log, "standby ready"), 180, "the standby to be warm")
            wait_for(lambda: rng.random() < 0.5, 5, "a random moment", interval_s=0.1)
            os.killpg(active.pid, signal.SIGKILL)
            active.wait(30)
            kills += 1
            if i == 1:
                # The warm standby takes over; a new standby waits behind it.
                active, standby_log = standby, next(logs)
                standby = spawn_processor(standby_ps, standby_log)
            else:
                # The standby takes the lease and is killed at once, before its first batch: the
                # checkpoint and the open transaction are left to a cold restart.
                wait_for(logged(standby_log, "lease acquired"), 60, "the standby to take over")
                os.killpg(standby.pid, signal.SIGKILL)
                standby.wait(30)
                active = spawn_processor(ps, next(logs))
            procs += [active, standby]
        got = wait_for(
            lambda: (a := committed_alerts(settings)) and len(a) >= len(expected) and a,
            240,
            "every expected alert after the crashes",
        )
        ids = [a["alert_id"] for a in got]
        assert len(ids) == len(set(ids)), "duplicate alerts after SIGKILL"
        assert set(ids) == set(expected)
        assert kills == 2
        # The stored stretch's alerts came with their on-time ids, flagged late.
        v1 = [a for a in got if a["vehicle_id"] == "v1" and 15 <= a["seq"] < 60]
        assert {a["type"] for a in v1} >= {AlertType.ROUTE_DEVIATION, AlertType.ROUTE_RETURN}
        assert all(a["seq"] < 49 and a.get("late") is True for a in v1), v1
    finally:
        for p in procs:
            stop_process_group(p)
