"""Proximity on Spark end to end (processor.spark.job.start_proximity_query): the telemetry topic in,
the two chained stateful stages in event time with their state checkpointed, PROXIMITY_ENTER/EXIT
out through the exactly-once sink. Two pairs meet; one parts (an exit by distance), the other's
second vehicle goes silent (an exit by the lost deadline, which only an event-time timer can fire);
a third vehicle is never near anyone. The fixes arrive in two runs of the query on one checkpoint,
cut in the middle of both meetings and read in small batches: each alert exactly once, on each
vehicle's side, at the fix the pure stages say."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import signal
from pathlib import Path
from typing import Any

import pytest

from embedded.pipeline import JOB_BATCHES, JOB_RESTORED, PROXIMITY_BATCHES, PROXIMITY_RESTORED, counted
from fleetfence import probes
from fleetfence.contracts import Telemetry
from fleetfence.errors import ConfigError
from fleetfence.kafka import ensure_topics, topic_specs
from fleetfence.metrics import scrape
from fleetfence.rules import ProximityRule
from fleetfence.service import stop_process_group
from fleetfence.settings import ProximityRuleSpec, Settings
from processor.core.proximity import ProximityCount, resolution_for
from processor.settings import ProcessorSettings
from processor.spark.checkpoint_files import SINK_ID_FILE, HadoopCheckpointFiles
from processor.spark.job import PROXIMITY_CELLS_FILE, refuse_other_cells, start_proximity_query
from tests.processor.helpers import (
    committed_alerts,
    markers,
    processor_settings,
    produce,
    produce_master,
    produce_telemetry,
    spawn_processor,
    wait_for,
)

pytestmark = [pytest.mark.spark, pytest.mark.services]

T0 = 1_795_320_000_000
LAT0, LON0 = 52.52, 13.405


def at(x_m: float, y_m: float) -> tuple[float, float]:
    return LAT0 + y_m / 111_320, LON0 + x_m / 67_770


def fix(v: str, i: int, ts_ms: int, x_m: float, y_m: float, speed_mps: float) -> Telemetry:
    lat, lon = at(x_m, y_m)
    return Telemetry(v, i, ts_ms, lat, lon, round(3.6 * speed_mps, 1), received_ms=ts_ms)


def fleet() -> list[Telemetry]:
    """Fix i of each vehicle has seq i (the alerts' seq says which fix raised them)."""
    out = []
    for i in range(76):
        t = T0 + 2000 * i
        if i <= 40:  # a drives east at 5 m/s; b beside it 30 m north, then also north at 7.5 m/s
            out.append(fix("a", i, t, 10 * i, 0, 5))
            away = i >= 20
            out.append(fix("b", i, t + 500, 10 * i, 30 + 15 * (i - 19) if away else 30, 9 if away else 5))
            out.append(fix("c", i, t + 100, 2000 + 5 * i, 0, 2.5))  # c and d: a pair 20 m apart ...
        if i <= 15:
            out.append(fix("d", i, t + 900, 2000 + 5 * i, 20, 2.5))  # ... until d goes silent
        out.append(fix("e", i, t + 300, 9000, 5000, 0))  # far from everyone; its clock moves time on
    return out


def settings_for(settings: Settings, tmp_path: Path) -> ProcessorSettings:
    return processor_settings(
        settings,
        tmp_path,
        # Meetings cut across batches within each run. A batch spans about 10 s of event time; Spark
        # shares a batch's records out over the partitions by their backlog, so a partition with few
        # records left (d's, after d goes silent) is read behind the others: its fixes may reach
        # the cells behind the watermark, counted (`ProximityCount.BEHIND_WATERMARK`) and met with
        # what the cells still keep, as in a deployment.
        processor_lateness_s=20,
        processor_max_events_per_batch=25,
        processor_proximity_enter_m=50,
        processor_proximity_exit_m=80,
        processor_proximity_min_duration_s=10,
        processor_proximity_tolerance_s=5,
        processor_proximity_lost_after_s=60,
        processor_proximity_checkpoint=str(tmp_path / "cp-proximity"),
        processor_proximity_starting_offsets="earliest",  # the fixes are there before the query
    )


def run(spark: Any, ps: ProcessorSettings) -> None:
    rule = ps.proximity_rule()
    assert rule == ProximityRule("fleet", 50, 80, 10_000, 5_000, 60_000)
    q = start_proximity_query(spark, ps, (rule,), available_now=True)
    q.awaitTermination(600)
    assert q.exception() is None, q.exception()


def alerts(settings: Settings) -> list[tuple[str, str, str, int, int, str]]:
    got = committed_alerts(settings)
    assert len({a["alert_id"] for a in got}) == len(got), "an alert twice"
    return sorted(
        (
            a["type"],
            a["vehicle_id"],
            a["details"]["other_vehicle_id"],
            a["ts_ms"] - T0,
            a["seq"],
            a["details"].get("reason", ""),
        )
        for a in got
    )


def test_pairs_meet_and_part_exactly_once_across_a_restart(
    spark: Any, settings: Settings, tmp_path: Path
) -> None:
    ensure_topics(settings.bootstrap_servers, topic_specs(settings))
    ps = settings_for(settings, tmp_path)
    fixes = fleet()
    cut = T0 + 24_000  # both pairs entered, neither parted: their open meetings cross the restart
    produce_telemetry(settings, [f for f in fixes if f.ts_ms < cut])
    produce(settings, settings.topics.telemetry, [(b"junk", b"{not json")])  # skipped, not fatal
    run(spark, ps)
    # a-b: near from a's fix 0 and b's at 0.5 s; 10 s later, at b's fix 5 (10.5 s), entered. The
    # meeting is of b's fix 5 and a's fix 5, each side's alert at its own fix.
    entered = [
        ("PROXIMITY_ENTER", "a", "b", 10_500, 5, ""),
        ("PROXIMITY_ENTER", "b", "a", 10_500, 5, ""),
        ("PROXIMITY_ENTER", "c", "d", 10_900, 5, ""),
        ("PROXIMITY_ENTER", "d", "c", 10_900, 5, ""),
    ]
    assert alerts(settings) == entered
    # Besides the second half: e's fix 2 again (a gateway's retry), and a fix of a sixth vehicle,
    # far from all, older than the watermark the first run left (24 s less the lateness). Each is
    # counted, and neither changes an alert.
    again = next(f for f in fixes if f.vehicle_id == "e" and f.seq == 2)
    behind = fix("f", 0, T0 - 40_000, -4_000, -3_000, 0)
    produce_telemetry(settings, [again, behind, *(f for f in fixes if f.ts_ms >= cut)])
    run(spark, ps)
    # b leaves: apart once 90 m from a (b's fix 23, a's 23 at 46 s); d's last meeting is c's fix 17
    # 3.2 s after d's last (fix 15, within the tolerance) at 34.1 s: lost 60 s later, at 94.1 s.
    parted = [
        ("PROXIMITY_EXIT", "a", "b", 46_500, 23, "apart"),
        ("PROXIMITY_EXIT", "b", "a", 46_500, 23, "apart"),
        ("PROXIMITY_EXIT", "c", "d", 94_100, 17, "lost"),
        ("PROXIMITY_EXIT", "d", "c", 94_100, 15, "lost"),
    ]
    assert alerts(settings) == sorted(entered + parted)
    run(spark, ps)  # nothing new to read: nothing written again
    assert len(alerts(settings)) == 8
    # The query's own sink id and commit markers count what it wrote.
    ms = markers(settings)
    assert len({m["sink_id"] for m in ms}) == 1
    assert sum(m.get("alerts", 0) for m in ms) == 8
    # Each counted once, by the bucket of its home cell: e's fix again comes first in its
    # partition, in the second run's first batch, while e's bucket still keeps its first delivery;
    # f's is behind the watermark from the start (and d's are, when its partition is read behind).
    assert sum(m.get(ProximityCount.REPEATED, 0) for m in ms) == 1
    assert sum(m.get(ProximityCount.BEHIND_WATERMARK, 0) for m in ms) >= 1


def test_a_group_rule_follows_the_vehicle_masters_groups(
    spark: Any, settings: Settings, tmp_path: Path
) -> None:
    """A rule for fleet group north only, its scope read from the vehicle master's events on the
    master topic. a and b (north) meet and enter; c and d never do (d is in group south). Between
    the two runs b moves to group south (version 2): its later fixes are no longer compared, and the
    pair ends as lost 60 s after its last meeting under the rule (a's fix 13 at 26 s met b's fix 11,
    kept from before the change, 3.5 s earlier), instead of parting at 46.5 s as the fleet's rule has
    it (`test_pairs_meet_and_part_exactly_once_across_a_restart`)."""
    ensure_topics(settings.bootstrap_servers, topic_specs(settings))
    ps = settings_for(settings, tmp_path).model_copy(
        update={
            "processor_proximity_enter_m": None,
            "processor_proximity_exit_m": None,
            "processor_proximity_rules": [
                ProximityRuleSpec(
                    rule_id="north", enter_m=50, exit_m=80, min_duration_s=10, lost_after_s=60, group="north"
                )
            ],
        }
    )
    rules = ps.proximity_rules()
    assert [(r.rule_id, r.scope.group) for r in rules] == [("north", "north")]

    def vehicle(v: str, version: int, group: str) -> dict[str, Any]:
        data = {"vehicle_id": v, "label": v, "attributes": {"group": group}}
        return {"entity": "vehicle", "id": v, "version": version, "op": "upsert", "data": data}

    produce_master(settings, [vehicle(v, 1, "south" if v == "d" else "north") for v in "abcde"])
    fixes = fleet()
    cut = T0 + 24_000
    produce_telemetry(settings, [f for f in fixes if f.ts_ms < cut])

    def run_rules() -> None:
        q = start_proximity_query(spark, ps, rules, available_now=True)
        q.awaitTermination(600)
        assert q.exception() is None, q.exception()

    run_rules()
    entered = [("PROXIMITY_ENTER", "a", "b", 10_500, 5, ""), ("PROXIMITY_ENTER", "b", "a", 10_500, 5, "")]
    assert alerts(settings) == entered
    produce_master(settings, [vehicle("b", 2, "south")])
    produce_telemetry(settings, [f for f in fixes if f.ts_ms >= cut])
    run_rules()
    lost = [
        ("PROXIMITY_EXIT", "a", "b", 86_000, 13, "lost"),
        ("PROXIMITY_EXIT", "b", "a", 86_000, 11, "lost"),
    ]
    assert alerts(settings) == sorted(entered + lost)
    assert {a["details"]["rule_id"] for a in committed_alerts(settings)} == {"north"}


# A driver SIGKILLed: in the fault suite, with the other crash tests (the default suite's budget).
@pytest.mark.slow
@pytest.mark.fault
def test_the_processor_runs_proximity_beside_the_job_through_a_sigkill(
    settings: Settings, tmp_path: Path
) -> None:
    """`fleetfence processor` (`python -m processor`) with a proximity rule runs the proximity query
    beside the geofencing job; SIGKILLed while the second half of the fixes is read, restarted on its
    checkpoints: the same 8 alerts, each once. Started a third time with nothing new to read, it
    needs no batch to be ready (`embedded.pipeline`'s wait): both checkpoints already fix where it
    reads from."""
    ensure_topics(settings.bootstrap_servers, topic_specs(settings))
    ps = settings_for(settings, tmp_path).model_copy(update={"processor_metrics_port": probes.free_port()})
    url = f"http://{settings.host}:{ps.processor_metrics_port}/metrics"
    fixes = fleet()
    cut = T0 + 24_000
    produce_telemetry(settings, [f for f in fixes if f.ts_ms < cut])
    logs = iter(tmp_path / f"processor-{n}.log" for n in range(3))
    proc = spawn_processor(ps, next(logs))
    try:
        wait_for(lambda: len(alerts(settings)) >= 4, 240, "the pairs to enter")
        # New checkpoints: ready only through their first batches (counted from the markers, which
        # the driver reads a moment after they are committed).
        wait_for(lambda: counted(url, [(JOB_BATCHES,), (PROXIMITY_BATCHES,)]), 60, "batches counted")
        first = scrape(url)
        assert first.total(JOB_RESTORED) == first.total(PROXIMITY_RESTORED) == 0
        sink_id = (tmp_path / "cp-proximity" / SINK_ID_FILE).read_text().strip()
        assert {m["sink_id"] for m in markers(settings) if m.get("alerts")} == {sink_id}

        def batches() -> int:
            return sum(1 for m in markers(settings) if m["sink_id"] == sink_id)

        done = batches()
        produce_telemetry(settings, [f for f in fixes if f.ts_ms >= cut])
        # Mid-stream: a batch of the second half committed, more to read (25 records a batch).
        wait_for(lambda: batches() > done, 120, "a proximity batch of the second half")
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(30)
        proc = spawn_processor(ps, next(logs))
        got = wait_for(lambda: (a := alerts(settings)) and len(a) >= 8 and a, 240, "every alert")
        assert [a[:2] for a in got] == [
            ("PROXIMITY_ENTER", "a"),
            ("PROXIMITY_ENTER", "b"),
            ("PROXIMITY_ENTER", "c"),
            ("PROXIMITY_ENTER", "d"),
            ("PROXIMITY_EXIT", "a"),
            ("PROXIMITY_EXIT", "b"),
            ("PROXIMITY_EXIT", "c"),
            ("PROXIMITY_EXIT", "d"),
        ]
        stop_process_group(proc)
        proc = spawn_processor(ps, next(logs))
        wait_for(
            lambda: counted(url, [(JOB_BATCHES, JOB_RESTORED), (PROXIMITY_BATCHES, PROXIMITY_RESTORED)]),
            240,
            "the restarted processor to be ready without new data",
        )
        again = scrape(url)
        assert again.total(JOB_RESTORED) == again.total(PROXIMITY_RESTORED) == 1
        assert len(alerts(settings)) == 8
    finally:
        stop_process_group(proc)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)


def test_a_checkpoint_of_the_per_cell_stages_is_refused(
    spark: Any, settings: Settings, tmp_path: Path
) -> None:
    """A proximity checkpoint with offsets and no bucket layout holds state keyed by cell and by
    pair, which the bucketed stages cannot read: refused with what to do, before Spark starts."""
    ps = settings_for(settings, tmp_path)
    offsets = Path(ps.proximity_checkpoint) / "offsets"
    offsets.mkdir(parents=True)
    (offsets / "0").write_text("v1\n{}\n")
    rule = ps.proximity_rule()
    assert rule is not None
    with pytest.raises(ConfigError, match="before the proximity stages were bucketed"):
        start_proximity_query(spark, ps, (rule,))
    assert not (Path(ps.proximity_checkpoint) / "fleetfence-layout.json").exists()


def test_a_checkpoint_in_cells_of_another_resolution_is_refused(
    spark: Any, settings: Settings, tmp_path: Path
) -> None:
    """The fixes a proximity checkpoint keeps are placed by their cells at the resolution its exit
    distance gave at its first start: another exit distance with other cells is refused."""
    ps = settings_for(settings, tmp_path)
    rule = ps.proximity_rule()
    assert rule is not None
    files = HadoopCheckpointFiles(spark, ps.proximity_checkpoint)
    refuse_other_cells(files, (rule,))  # the first start records it
    refuse_other_cells(files, (rule,))  # the same again: fine
    wider = dataclasses.replace(rule, exit_m=2_000.0)
    assert resolution_for(wider.exit_m) != resolution_for(rule.exit_m)
    with pytest.raises(
        ConfigError, match=f"resolution {resolution_for(rule.exit_m)}, but a largest exit distance of 2000 m"
    ):
        refuse_other_cells(files, (wider,))
    # A rule beside it whose exit distance is as wide: the same.
    with pytest.raises(ConfigError, match="largest exit distance of 2000 m"):
        refuse_other_cells(files, (rule, dataclasses.replace(wider, rule_id="wide")))
    # A checkpoint from before the query read the vehicle master's data: refused, what to do said.
    older = HadoopCheckpointFiles(spark, str(tmp_path / "cp-older"))
    older.create(PROXIMITY_CELLS_FILE, json.dumps({"resolution": resolution_for(rule.exit_m)}))
    with pytest.raises(ConfigError, match="before the proximity query read the vehicle master's data"):
        refuse_other_cells(older, (rule,))
    # Older still: offsets and no record of its cells at all.
    oldest = tmp_path / "cp-oldest"
    (oldest / "offsets").mkdir(parents=True)
    (oldest / "offsets" / "0").write_text("v1\n{}\n")
    with pytest.raises(ConfigError, match="before the proximity query read the vehicle master's data"):
        refuse_other_cells(HadoopCheckpointFiles(spark, str(oldest)), (rule,))
    assert not (oldest / PROXIMITY_CELLS_FILE).exists()
