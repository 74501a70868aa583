"""Exact batch accounting: the processor's counters and its per-batch log lines come from the commit
markers, so metrics = markers = records."""

from __future__ import annotations

import urllib.request
from pathlib import Path

import pytest
from msgspec.structs import replace
from prometheus_client import REGISTRY
from prometheus_client.parser import text_string_to_metric_families

from fleetfence.contracts import AlertType
from fleetfence.kafka import ensure_topics, topic_specs
from fleetfence.probes import free_port
from fleetfence.service import stop_process_group
from fleetfence.settings import Settings
from fleetfence.testing import read_all
from processor.ops.markers import BatchLedger
from tests.processor.helpers import (
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

# v1's fixes from 15 up to 48 are stored by its tracker while out of coverage and uploaded late.
DARK = (15, 48)


def counter(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


def test_the_ledger_counts_each_marker_once_and_joins_it_with_its_progress() -> None:
    ledger = BatchLedger("s1")
    before = counter("fleetfence_processor_records_total", outcome="accepted")
    batches_before = counter("fleetfence_processor_committed_batches_total")
    m = {"sink_id": "s1", "batch_id": 7, "received": 5, "accepted": 4, "duplicates": 1, "invalid": 2}
    assert ledger.marker(m, now=0.0)
    assert not ledger.marker({**m, "sink_id": "other"}, now=0.0)  # another checkpoint's sink
    assert ledger.flush(now=1.0) == []  # waits for the batch's progress report
    ledger.progress({"batchId": 7, "durationMs": {"triggerExecution": 120}, "eventTime": {"watermark": "W"}})
    (line,) = ledger.flush(now=2.0)
    assert line["batch_id"] == 7
    assert (line["accepted"], line["duplicates"], line["invalid"]) == (4, 1, 2)
    assert (line["duration_ms"], line["watermark"]) == (120, "W")
    assert ledger.flush(now=3.0) == []  # logged once
    assert counter("fleetfence_processor_records_total", outcome="accepted") == before + 4
    assert counter("fleetfence_processor_committed_batches_total") == batches_before + 1
    # A marker whose progress never comes is still logged, without duration.
    ledger.marker({**m, "batch_id": 8}, now=10.0)
    assert ledger.flush(now=20.0) == []
    (late,) = ledger.flush(now=41.0)
    assert (late["batch_id"], late["duration_ms"]) == (8, None)


def test_the_proximity_ledger_counts_its_alerts_and_batches_and_none_of_the_jobs_records() -> None:
    """The proximity query reads the records the job counts: its markers add alerts, batches and the
    stages' own counts (`ProximityCount`), never to the job's record outcomes, batches or held gauge."""
    job, near = BatchLedger("job"), BatchLedger("near", proximity=True)
    alerts = counter("fleetfence_processor_alerts_total")
    batches = counter("fleetfence_processor_committed_batches_total")
    near_batches = counter("fleetfence_processor_proximity_committed_batches_total")
    received = counter("fleetfence_processor_records_total", outcome="received")
    counted = {c: counter("fleetfence_processor_proximity_counted_total", outcome=c) for c in OUTCOMES_NEAR}
    m = {"sink_id": "near", "batch_id": 3, "alerts": 4, "received": 99}  # a stray count: not read
    m |= {"proximity_repeated": 2, "proximity_behind_watermark": 5, "proximity_late_meetings": 1}
    assert not job.marker(m, now=0.0)
    assert near.marker(m, now=0.0)
    near.progress({"batchId": 3, "durationMs": {"triggerExecution": 80}, "eventTime": {"watermark": "W"}})
    (line,) = near.flush(now=1.0)
    assert line == {
        "batch_id": 3,
        "alerts": 4,
        "proximity_repeated": 2,
        "proximity_behind_watermark": 5,
        "proximity_late_meetings": 1,
        "role": "proximity",
        "duration_ms": 80,
        "watermark": "W",
    }
    for outcome, n in (("repeated", 2), ("behind_watermark", 5), ("late_meetings", 1)):
        assert (
            counter("fleetfence_processor_proximity_counted_total", outcome=outcome) == counted[outcome] + n
        )
    assert counter("fleetfence_processor_alerts_total") == alerts + 4
    assert counter("fleetfence_processor_proximity_committed_batches_total") == near_batches + 1
    assert counter("fleetfence_processor_committed_batches_total") == batches
    assert counter("fleetfence_processor_records_total", outcome="received") == received


OUTCOMES_NEAR = ("repeated", "behind_watermark", "late_meetings")
Sample = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def scrape(port: int) -> Sample:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        text = r.read().decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for fam in text_string_to_metric_families(text)
        for s in fam.samples
    }


@pytest.mark.spark
@pytest.mark.services
def test_metrics_equal_markers_equal_records_over_many_small_batches(
    settings: Settings, tmp_path: Path
) -> None:
    ensure_topics(settings.bootstrap_servers, topic_specs(settings))
    port = free_port()
    ps = processor_settings(settings, tmp_path, processor_metrics_port=port)
    fixes = scenario(60)  # 6 vehicles at 1 Hz, one with duplicates in its own stream
    produce_master(settings, master_events())
    log = tmp_path / "processor.log"
    proc = spawn_processor(ps, log)
    try:
        # A live-like stream: ten rounds of 6 s of fixes, each followed by re-deliveries of three of
        # its fixes and one record that is not telemetry; every round is read before the next, so
        # the run has many small batches. v1 is out of coverage from its fix 15 (its deviation, the
        # depot and the return all happen there) and uploads its stored fixes 15-47 at round 8,
        # when the watermark has passed most of them: store and forward.
        records_in = 0
        stored = [f for f in fixes if f.vehicle_id == "v1" and DARK[0] <= f.seq < DARK[1]]
        for r in range(10):
            part = [f for f in fixes if 6 * r <= f.seq < 6 * r + 6 and f not in stored]
            if r == 8:
                produce_telemetry(settings, stored)
                records_in += len(stored)
            # A vehicle nobody assigned: its fixes are accepted and counted as unassigned.
            stray = [
                replace(part[0], vehicle_id="u1", seq=2 * r + i, ts_ms=part[0].ts_ms + i) for i in (0, 1)
            ]
            produce_telemetry(settings, part + part[:3] + stray)
            produce(settings, settings.topics.telemetry, [(b"junk", b"not json %d" % r)])
            records_in += len(part) + 3 + len(stray) + 1

            def read_so_far(n: int = records_in) -> bool:
                ms = markers(settings)
                return sum(int(m.get("received", 0)) + int(m.get("invalid", 0)) for m in ms) >= n

            wait_for(read_so_far, 120, f"round {r} to be committed")
        # The stored stretch got its alerts, flagged late, with the ids they would have had on time.
        reference = [
            a for a in expected_alerts(fixes, ps.engine_config()).values() if a["vehicle_id"] == "v1"
        ]
        assert {a["type"] for a in reference} >= {
            AlertType.ROUTE_DEVIATION,
            AlertType.ROUTE_RETURN,
            AlertType.ZONE_ENTER,
            AlertType.ZONE_EXIT,
        }
        assert all(DARK[0] <= a["seq"] < DARK[1] for a in reference), "the scenario's v1 moved"
        v1 = wait_for(
            lambda: (
                (got := [a for a in committed_alerts(settings) if a["vehicle_id"] == "v1"])
                and len(got) >= len(reference)
                and got
            ),
            120,
            "v1's alerts for its stored stretch",
        )
        assert sorted(a["alert_id"] for a in v1) == sorted(a["alert_id"] for a in reference)
        # Raised after the watermark (fleet time 47 s - 10 s) had passed them: flagged late.
        assert all(a.get("late") is True for a in v1 if a["seq"] < 37), v1
        assert not [a for a in committed_alerts(settings) if a["type"] == AlertType.VEHICLE_SILENT]
        # A fix seven hours old: beyond the lateness bound (6 h), dead-lettered `late`.
        too_late = replace(fixes[0], vehicle_id="u2", seq=0, ts_ms=fixes[0].ts_ms - 7 * 3600 * 1000)
        produce_telemetry(settings, [too_late])
        records_in += 1

        def consistent() -> tuple[list[dict[str, object]], Sample] | None:
            """Markers and metrics read at one moment that agree on the batch count and account
            for every record (a batch committing in between makes the next try)."""
            ms = markers(settings)
            got = sum(int(str(m.get("received", 0))) + int(str(m.get("invalid", 0))) for m in ms)
            if got != records_in:
                return None
            m = scrape(port)
            if m.get(("fleetfence_processor_committed_batches_total", ()), 0) != len(ms):
                return None
            return (ms, m) if markers(settings) == ms else None

        agreed = wait_for(consistent, 240, "markers and metrics to account for every record")
        ms, m = agreed
        assert len(ms) >= 10, "the test wants many small batches"
        sums = {
            k: sum(int(str(x.get(k, 0))) for x in ms)
            for k in ("received", "accepted", "duplicates", "late", "invalid")
        }
        held = int(str(ms[-1].get("held", 0)))
        assert sums["invalid"] == 10
        assert sums["received"] + sums["invalid"] == records_in
        assert sums["late"] == 1
        assert sums["received"] == sums["accepted"] + sums["duplicates"] + sums["late"] + held
        assert sums["duplicates"] >= 30  # the re-deliveries, and v4's own
        for key, outcome in (
            ("received", "received"),
            ("accepted", "accepted"),
            ("duplicates", "duplicate"),
            ("late", "late"),
            ("invalid", "invalid"),
        ):
            assert m[("fleetfence_processor_records_total", (("outcome", outcome),))] == sums[key], key
        assert m[("fleetfence_processor_held_fixes", ())] == held
        unassigned = sum(int(str(x.get("unassigned", 0))) for x in ms)
        assert unassigned == 20
        assert m[("fleetfence_processor_unassigned_fixes_total", ())] == unassigned
        letters = read_all(settings, settings.topics.telemetry_dlq, 1)
        dead = [dict(d.headers() or []) for d in letters]
        late = [d for d in letters if dict(d.headers() or []).get("reason") == b"late"]
        assert len(late) == 1
        (original,) = [
            m
            for m in read_all(settings, settings.topics.telemetry, settings.telemetry_partitions)
            if m.key() == b"u2"
        ]
        h = dict(late[0].headers() or [])
        # The record's own bytes, and where it is, like every dead letter of the processor.
        assert late[0].value() == original.value() == too_late.to_json()
        assert (
            h["source"] == f"{settings.topics.telemetry}:{original.partition()}:{original.offset()}".encode()
        )
        assert late[0].key() == b"u2"
        assert b"behind the watermark" in h["detail"]
        assert b"no longer" not in h["detail"]
        assert sum(1 for h in dead if h.get("reason") == b"not_canonical") == 10
        want = {int(str(x["batch_id"])) for x in ms}

        def logged_batches() -> set[int] | None:
            text = log.read_text(errors="replace")
            got = {
                int(ln.split("batch_id=")[1].split()[0])
                for ln in text.splitlines()
                if "batch committed" in ln
            }
            return got if want <= got else None

        got = wait_for(logged_batches, 60, "one log line per committed batch")
        lines = [ln for ln in log.read_text(errors="replace").splitlines() if "batch committed" in ln]
        assert len(lines) == len(got), "a batch logged twice"
        assert got <= {int(str(x["batch_id"])) for x in markers(settings)}  # nothing logged uncommitted
        assert all("duration_ms=" in ln and "watermark=" in ln for ln in lines)
    finally:
        stop_process_group(proc)


@pytest.mark.spark
@pytest.mark.services
def test_no_fix_vanishes_behind_the_watermark_when_a_backlog_is_read_in_small_batches(
    settings: Settings, tmp_path: Path
) -> None:
    """A backlog read 40 records a batch: the partitions advance unevenly in event time, so chunks
    of the slower ones were behind the watermark and Spark dropped them before the operator saw
    them (9 batches counted 345 of 360 fixes and none of 25 re-deliveries). Every record must now be
    counted, whichever other records share its batch."""
    ensure_topics(settings.bootstrap_servers, topic_specs(settings))
    ps = processor_settings(settings, tmp_path, processor_max_events_per_batch=40)
    fixes = scenario(60)
    produce_master(settings, master_events())
    produce_telemetry(settings, fixes)
    produce_telemetry(settings, fixes[:25])  # re-delivered a minute of event time later
    bad = [b"not json", b'{"vehicle_id": "v0"}', b"[]"]
    produce(settings, settings.topics.telemetry, [(b"junk", b) for b in bad])
    records_in = len(fixes) + 25 + len(bad)
    proc = spawn_processor(ps, tmp_path / "processor.log")
    try:

        def accounted() -> list[dict[str, object]] | None:
            ms = markers(settings)
            got = sum(int(str(m.get("received", 0))) + int(str(m.get("invalid", 0))) for m in ms)
            assert got <= records_in, "a record counted twice"
            return ms if got == records_in else None

        ms = wait_for(accounted, 240, "the markers to account for every record")
        assert len(ms) >= 9
        sums = {k: sum(int(str(m.get(k, 0))) for m in ms) for k in ("received", "accepted", "duplicates")}
        assert sums["received"] == sums["accepted"] + sums["duplicates"] + int(str(ms[-1].get("held", 0)))
        assert sums["duplicates"] >= 25
    finally:
        stop_process_group(proc)
