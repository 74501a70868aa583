"""Hot drivers (`fleetfence processor --hot`) as processes on the real broker, Redis and Spark: the
active one SIGKILLed at a random moment, frozen past its lease, and a standby killed while it
takes over; the committed alerts are exactly the reference engine's, each once."""

from __future__ import annotations

import os
import random
import signal
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from fleetfence.kafka import ensure_topics, topic_specs
from fleetfence.service import stop_process_group
from fleetfence.settings import Settings
from tests.processor.helpers import (
    T0,
    committed_alerts,
    expected_alerts,
    markers,
    master_events,
    processor_settings,
    produce_master,
    produce_telemetry,
    scenario,
    spawn_processor,
    wait_for,
)

pytestmark = [pytest.mark.spark, pytest.mark.services]

LIVE = "hot driver is live"


def logged(log: Path, text: str, times: int = 1) -> Callable[[], bool]:
    return lambda: log.exists() and log.read_text(errors="replace").count(text) >= times


def shadow_batches(settings: Settings, n: int) -> Callable[[], bool]:
    return lambda: sum(1 for m in markers(settings) if "shadow" in m) >= n


def live_batches(settings: Settings, n: int) -> Callable[[], bool]:
    return lambda: sum(1 for m in markers(settings) if "shadow" not in m) >= n


@pytest.mark.slow
@pytest.mark.fault
def test_hot_drivers_take_over_without_loss_or_duplicate(settings: Settings, tmp_path: Path) -> None:
    ensure_topics(settings.bootstrap_servers, topic_specs(settings))
    base = processor_settings(settings, tmp_path, processor_max_events_per_batch=60, processor_hot=True)
    drivers = {name: base.model_copy(update={"processor_driver_name": name}) for name in ("a", "b")}
    fixes = scenario(90, trips=True)
    expected = expected_alerts(fixes, base.engine_config(), master_events(trips=True))
    produce_master(settings, master_events(trips=True))
    chunks = [[f for f in fixes if 15_000 * i <= f.ts_ms - T0 < 15_000 * (i + 1)] for i in range(6)]
    assert sum(map(len, chunks)) == len(fixes)
    rng = random.Random(11)
    logs = iter(tmp_path / f"driver-{n}.log" for n in range(20))
    procs: list[subprocess.Popen[bytes]] = []

    def start(name: str) -> tuple[subprocess.Popen[bytes], Path]:
        log = next(logs)
        p = spawn_processor(drivers[name], log)
        procs.append(p)
        return p, log

    def kill(p: subprocess.Popen[bytes]) -> None:
        os.killpg(p.pid, signal.SIGKILL)
        p.wait(30)

    try:
        a, a_log = start("a")
        wait_for(logged(a_log, LIVE), 180, "a to take the lease")
        b, b_log = start("b")
        produce_telemetry(settings, chunks[0])
        # 1. SIGKILL the active at a random moment, once both drivers have committed batches.
        wait_for(live_batches(settings, 1), 180, "a's first live batch")
        wait_for(shadow_batches(settings, 1), 180, "b's first shadow batch")
        produce_telemetry(settings, chunks[1])
        wait_for(lambda: rng.random() < 0.3, 5, "a random moment", interval_s=0.1)
        kill(a)
        wait_for(logged(b_log, LIVE), 60, "b to take over")
        a, a_log = start("a")  # back as the standby, on its own checkpoint
        produce_telemetry(settings, chunks[2])
        # 2. Freeze the active (b) past its lease: a takes over; b, woken, is fenced and stops.
        wait_for(logged(a_log, "role=shadow"), 180, "a to shadow again")
        os.killpg(b.pid, signal.SIGSTOP)
        produce_telemetry(settings, chunks[3])
        wait_for(logged(a_log, LIVE), 60, "a to take over from the frozen b")
        os.killpg(b.pid, signal.SIGCONT)
        assert b.wait(60) != 0, "the frozen driver did not stop when it woke without its lease"
        b, b_log = start("b")
        # 3. Kill the active (a), then the standby (b) the moment it takes the lease.
        wait_for(logged(b_log, "role=shadow"), 180, "b to shadow again")
        produce_telemetry(settings, chunks[4])
        wait_for(lambda: rng.random() < 0.3, 5, "a random moment", interval_s=0.1)
        kill(a)
        wait_for(logged(b_log, LIVE), 60, "b to take over")
        kill(b)
        a, a_log = start("a")
        b, b_log = start("b")  # both back: each finishes the stream on its own checkpoint
        produce_telemetry(settings, chunks[5])
        wait_for(
            lambda: (n := _recount(settings)) and len(n) == 2 and all(v == len(fixes) for v in n.values()),
            300,
            "each driver's markers, live and shadow, to count every record once",
        )
        # Both drivers have read everything: no alert can come later to be a duplicate.
        ids = [x["alert_id"] for x in committed_alerts(settings)]
        assert len(ids) == len(set(ids)), "an alert committed twice"
        assert set(ids) == set(expected)
    finally:
        for p in procs:
            stop_process_group(p)


def _recount(settings: Settings) -> dict[str, int]:
    """Telemetry records counted by each driver's markers (its sink id), live and shadow together."""
    sinks: dict[str, int] = {}
    for m in markers(settings):
        counts = m["shadow"] if isinstance(m.get("shadow"), dict) else m
        sink = str(m["sink_id"]).removesuffix(":shadow")
        sinks[sink] = sinks.get(sink, 0) + int(counts.get("received", 0)) + int(counts.get("invalid", 0))
    return sinks
