"""Re-bucketing a checkpoint (`fleetfence rebucket`, processor.spark.rebucket): every vehicle's state
moves to its new bucket, and the stream goes on exactly once across the move."""

from __future__ import annotations

import logging
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pytest
import redis

from fleetfence.contracts import AlertType, Telemetry, bucket_of
from fleetfence.errors import ConfigError
from fleetfence.kafka import ensure_topics, topic_specs
from fleetfence.settings import Settings
from processor.core.columns import empty_states
from processor.core.engine import process_bucket
from processor.core.master import Catalog
from processor.core.parking import pack_rows, unpack_rows
from processor.ops.lease import CheckpointLease, lease_key
from processor.ops.rebucket_run import run_rebucket
from processor.settings import ProcessorSettings
from processor.spark.checkpoint_files import LocalCheckpointFiles
from processor.spark.job import start_query
from processor.spark.layout import LAYOUT_FILE, balanced_keys
from processor.spark.rebucket import (
    SEED_STATE,
    BucketState,
    Seed,
    batch_end_offsets,
    last_committed_batch,
    master_for_bucket,
    merge_masters,
    read_bucket_states,
    read_seed,
    refuse_incomplete,
    split_buckets,
)
from tests.processor.helpers import (
    T0,
    committed_alerts,
    fixes_frame,
    markers,
    master_events,
    master_state,
    processor_env,
    processor_settings,
    produce_master,
    produce_telemetry,
    scenario,
    wait_for,
)

# The far-ahead fix that moves the watermark on: every other vehicle falls silent once (and parks:
# processor.core.parking); then two of them report again (woken from the parked state: VEHICLE_RESUMED).
FAR = Telemetry("v0", 60, T0 + 400_000, 52.5, 13.05, 30.0, None, None, T0 + 400_000)
BACK = [Telemetry(v, 60, T0 + 401_000, 52.5, 13.05, 30.0, None, None, T0 + 401_000) for v in ("v2", "v5")]


def part(fixes: list[Telemetry], lo: int, hi: int) -> list[Telemetry]:
    """The fixes of seconds [lo, hi) of the scenario (each vehicle sends one a second)."""
    return [f for f in fixes if lo * 1000 <= f.ts_ms - T0 < hi * 1000]


def reference_alerts(
    fixes: list[Telemetry], cfg: Any, master: list[dict[str, Any]], back: list[Telemetry] = BACK
) -> dict[str, Any]:
    """The pure engine over the scenario in one bucket, then the far fix with the watermark it
    brings (so the silence alerts too), then the two that come back: what any bucket layout must
    emit."""
    cat = Catalog(cfg)
    m = master_state(master)
    ref = replace(cfg, fast_path=False)
    r1 = process_bucket(empty_states(), {}, m, fixes_frame(fixes), 0, ref, cat)
    wm = FAR.ts_ms - cfg.lateness_ms
    r2 = process_bucket(r1.states, r1.held, m, fixes_frame([FAR]), wm, ref, cat)
    r3 = process_bucket(r2.states, r2.held, m, fixes_frame(back), wm, ref, cat)
    return {a.alert_id: a.to_dict() for a in r1.alerts + r2.alerts + r3.alerts}


def test_split_state_continues_exactly_like_one_bucket_would() -> None:
    """Two buckets run the first half, are split into three, which run the second half: the same
    alerts as one bucket over everything, and every vehicle's state moved whole."""
    cfg = ProcessorSettings().engine_config()
    master = master_events(trips=True)
    fixes = scenario(trips=True)
    full = master_state(master)
    cat = Catalog(cfg)
    old: list[BucketState] = []
    alerts: dict[str, Any] = {}
    for k in range(2):
        mine = [f for f in part(fixes, 0, 38) if bucket_of(f.vehicle_id, 2) == k]
        m = master_for_bucket(full, k, 2)
        r = process_bucket(empty_states(), {}, m, fixes_frame(mine), 0, cfg, cat)
        alerts |= {a.alert_id: a.to_dict() for a in r.alerts}
        old.append(BucketState(r.states, r.held, m))
    before = {v: s for o in old for v, s in zip(o.states.ids, o.states.states(), strict=True)}
    # One vehicle of the first bucket is parked (processor.core.parking): it moves like the others.
    first = old[0].states
    parked = unpack_rows(first.ids[:1], pack_rows(first.take(np.array([0]))))
    old[0] = BucketState(first.take(np.arange(1, len(first))), old[0].held, old[0].master, parked)

    new = split_buckets(old, 3)
    assert len(new) == 3
    after: dict[str, Any] = {}
    for n, b in enumerate(new):
        assert all(bucket_of(v, 3) == n for v in b.states.ids)
        assert set(b.master.assignments) == {f"v{i}" for i in range(6) if bucket_of(f"v{i}", 3) == n}
        assert b.master.routes == full.routes
        assert b.master.zones == full.zones
        after |= dict(zip(b.states.ids, b.states.states(), strict=True))
    assert after == before

    for n, b in enumerate(new):
        mine = [f for f in [*part(fixes, 38, 60), FAR] if bucket_of(f.vehicle_id, 3) == n]
        r = process_bucket(b.states, b.held, b.master, fixes_frame(mine), 0, cfg, cat)
        alerts |= {a.alert_id: a.to_dict() for a in r.alerts}
    expected = reference_alerts(fixes, cfg, master, back=[])
    expected = {k: a for k, a in expected.items() if a["type"] != AlertType.VEHICLE_SILENT}
    assert alerts == expected


def test_masters_merge_newest_version_first_and_tombstones_win() -> None:
    a, b = master_state(), master_state()
    b.apply({"entity": "route", "id": "r1", "version": 2, "op": "delete"})
    b.apply({"entity": "assignment", "id": "v7", "version": 1, "op": "upsert", "data": {"route_id": "r1"}})
    m = merge_masters([a, b])
    assert m.routes["r1"] == (2, None)
    assert m.assignments["v7"] == (1, {"route_id": "r1"})
    assert m.zones == a.zones


def test_an_unfinished_batch_or_a_missing_checkpoint_is_refused(tmp_path: Path) -> None:
    files = LocalCheckpointFiles(str(tmp_path / "cp"))
    with pytest.raises(ConfigError, match="no committed micro-batch"):
        last_committed_batch(files)

    def log(folder: str, batch: int, text: str) -> None:
        (files.root / folder).mkdir(parents=True, exist_ok=True)
        (files.root / folder / str(batch)).write_text(text)
        (files.root / folder / f".{batch}.crc").write_bytes(b"\xca\xfe")  # Hadoop's checksums beside

    log("offsets", 0, 'v1\n{"batchWatermarkMs":0}\n{"t.telemetry":{"0":5,"1":7}}\n{"t.master":{"0":3}}')
    log("commits", 0, 'v1\n{"nextBatchWatermarkMs":1234}')
    log("offsets", 1, 'v1\n{"batchWatermarkMs":1234}\n{"t.telemetry":{"0":9,"1":7}}\n{"t.master":{"0":3}}')
    with pytest.raises(ConfigError, match="batch 1 planned and 0 committed"):
        last_committed_batch(files)
    log("commits", 1, 'v1\n{"nextBatchWatermarkMs":2345}')
    assert last_committed_batch(files) == (1, 2345)
    assert batch_end_offsets(files, 1) == {"t.telemetry": {"0": 9, "1": 7}, "t.master": {"0": 3}}


def test_a_seed_state_without_its_seed_is_an_unfinished_rebucketing(tmp_path: Path) -> None:
    files = LocalCheckpointFiles(str(tmp_path / "cp"))
    refuse_incomplete(files, None)  # a new checkpoint
    (files.root / SEED_STATE).mkdir(parents=True)
    (files.root / SEED_STATE / "part-0.parquet").write_bytes(b"PAR1")
    with pytest.raises(ConfigError, match="unfinished re-bucketing"):
        refuse_incomplete(files, None)
    seed = Seed("old", 3, 4, 0, {"t": {"0": 1}}, 6)
    assert Seed.from_json(seed.to_json()) == seed
    refuse_incomplete(files, seed)


def test_a_running_processor_keeps_its_checkpoint_from_being_rebucketed(
    settings: Settings, tmp_path: Path
) -> None:
    ps = processor_settings(settings, tmp_path)
    client = redis.Redis.from_url(settings.redis_dsn)
    holder = CheckpointLease(client, lease_key(ps.redis_prefix, ps.checkpoint), 5000)
    assert holder.try_acquire()
    try:
        with pytest.raises(ConfigError, match="stop it before re-bucketing"):
            run_rebucket(ps, str(tmp_path / "new"), 4)
        assert holder.holder() == holder.owner
    finally:
        holder.release()


def committed_through(checkpoint: str) -> int | None:
    """The last batch planned, once Spark's commit log has it too (None while it is in flight)."""
    files = LocalCheckpointFiles(checkpoint)
    commits = [int(n) for n in files.entries("commits") if n.isdigit()]
    planned = [int(n) for n in files.entries("offsets") if n.isdigit()]
    if commits and planned and max(commits) == max(planned):
        return max(commits)
    return None


@pytest.mark.spark
@pytest.mark.services
def test_rebucketing_a_live_stream_loses_and_duplicates_nothing(
    spark: Any, settings: Settings, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """2 buckets -> `fleetfence rebucket --buckets 3` -> the new checkpoint, restarted once: the
    alerts of one uninterrupted run, every record read once, every vehicle in its new bucket."""
    ensure_topics(settings.bootstrap_servers, topic_specs(settings))
    old = processor_settings(settings, tmp_path / "old", processor_buckets=2)
    new = processor_settings(settings, tmp_path / "new", processor_buckets=3)
    master = master_events(trips=True)
    fixes = scenario(trips=True)
    expected = reference_alerts(fixes, old.engine_config(), master)
    # A v0 wrong-way stretch (fixes 35-44) and v1's return (from fix 30) straddle the move.
    assert {
        AlertType.WRONG_DIRECTION,
        AlertType.ROUTE_RETURN,
        AlertType.VEHICLE_SILENT,
        AlertType.VEHICLE_RESUMED,
    } <= {a["type"] for a in expected.values()}
    silences = [a for a in expected.values() if a["type"] == AlertType.VEHICLE_SILENT]

    def records_read() -> int:
        return sum(int(m.get("received", 0)) + int(m.get("invalid", 0)) for m in markers(settings))

    produce_master(settings, master)
    first = part(fixes, 0, 30)
    produce_telemetry(settings, first)
    q = start_query(spark, old)
    try:
        wait_for(lambda: records_read() >= len(first), 180, "the first half minute to be read")
    finally:
        q.stop()
    # Sent while no processor runs: the command's drain reads them into the old checkpoint.
    drained = part(fixes, 30, 38)
    produce_telemetry(settings, drained)
    cmd = [sys.executable, "-m", "cli", "rebucket", "--to", new.checkpoint, "--buckets", "3"]
    r = subprocess.run(cmd, env=processor_env(old), capture_output=True, timeout=300, check=False)
    assert r.returncode == 0, (r.stdout + r.stderr).decode(errors="replace")[-4000:]
    assert records_read() == len(first) + len(drained)
    seed = read_seed(LocalCheckpointFiles(new.checkpoint))
    # Run again (as after an interruption): it sees the work done and changes nothing.
    with caplog.at_level(logging.INFO, logger="processor.ops.rebucket_run"):
        assert run_rebucket(old, new.checkpoint, 3, spark) == seed
    assert any("rebucket: already done" in r.getMessage() for r in caplog.records)
    assert seed is not None
    assert (seed.buckets, seed.vehicles) == (3, 6)
    with pytest.raises(ConfigError, match="re-bucketed into"):
        start_query(spark, old)

    produce_telemetry(settings, part(fixes, 38, 60))
    q = start_query(spark, new)
    try:
        wait_for(lambda: records_read() >= len(fixes), 180, "the rest of the scenario to be read")
    finally:
        q.stop()
    # A restart of the new checkpoint: its seed is not applied again, its timers still fire; the
    # vehicles they silence park, and two of them are woken by their next fix.
    produce_telemetry(settings, [FAR])
    q = start_query(spark, new)
    try:
        wait_for(
            lambda: (
                len([a for a in committed_alerts(settings) if a["type"] == AlertType.VEHICLE_SILENT])
                >= len(silences)
            ),
            180,
            "the silences",
        )
        produce_telemetry(settings, BACK)
        got = wait_for(
            lambda: (a := committed_alerts(settings)) and len(a) >= len(expected) and a,
            180,
            "every expected alert, the silences included",
        )
        # The sink commits a batch's alerts before Spark logs the batch committed: wait for the commit
        # log to reach the last batch planned, which is at or past the one that read the fixes back.
        (done,) = wait_for(
            lambda: (b := committed_through(new.checkpoint)) is not None and (b,), 180, "the last commit"
        )
    finally:
        q.stop()
    ids = [a["alert_id"] for a in got]
    assert len(ids) == len(set(ids)), "duplicate alerts across the move"
    assert {a["alert_id"]: a for a in got} == expected
    assert records_read() == len(fixes) + 1 + len(BACK)

    state = read_bucket_states(spark, new.checkpoint, done)
    # The keys the command chose for the new checkpoint, balanced for the partitions it was run with
    # (the processor's default for this machine's cores, whatever this test's session has).
    layout = orjson.loads(LocalCheckpointFiles(new.checkpoint).read(LAYOUT_FILE) or b"{}")
    keys = layout["keys"]
    assert keys == balanced_keys(3, layout["partitions"])
    assert sorted(state) == sorted(keys)
    where = {v: keys.index(k) for k, b in state.items() for v in b.states.ids + b.parked.ids}
    assert where == {f"v{i}": bucket_of(f"v{i}", 3) for i in range(6)}
    # Parked: the silent ones that did not come back, in Spark's state store, one value each.
    assert sorted(v for b in state.values() for v in b.parked.ids) == ["v1", "v3", "v4"]
    assert all(s.silent for b in state.values() for s in b.parked.states())
    assert sorted(v for b in state.values() for v in b.states.ids) == ["v0", "v2", "v5"]
