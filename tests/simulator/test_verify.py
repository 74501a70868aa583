"""`verify`: the pure comparison on hand-made inputs, and reading committed alerts from the broker."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import orjson
import pytest
from rich.console import Console

from fleetfence.contracts import alert_id
from fleetfence.kafka import ensure_topics, topic_specs, transactional_producer
from fleetfence.settings import Settings
from simulator.commands import verify
from simulator.settings import SimulatorSettings
from simulator.truth import RunHeader, TruthAlert, TruthWriter
from simulator.verify import ObservedAlert, compare, in_scope, mismatch_table, read_alerts


def t(v: str, typ: str, seq: int, zone: str | None = None, publish_ms: int | None = None) -> TruthAlert:
    return TruthAlert(v, typ, seq, 1000 + seq, zone, -1, publish_ms)


def o(v: str, typ: str, seq: int, zone: str | None = None, rec: int | None = None) -> ObservedAlert:
    return ObservedAlert(alert_id(v, typ, seq, zone or ""), v, typ, zone, seq, 1000 + seq, rec)


TRUTH = [
    t("a", "ROUTE_DEVIATION", 10, publish_ms=5_000),
    t("a", "ROUTE_RETURN", 30, publish_ms=6_000),
    t("b", "OVERSPEED", 7, publish_ms=7_000),
    t("b", "ZONE_ENTER", 40, "z1", publish_ms=8_000),
]


def test_perfect() -> None:
    res = compare(
        TRUTH, [o(a.vehicle_id, a.type, a.seq, a.zone_id, (a.publish_ms or 0) + 100) for a in TRUTH]
    )
    assert (res.overall.precision, res.overall.recall, res.overall.duplicates) == (1.0, 1.0, 0)
    assert res.overall.delay(50) == 100.0
    assert res.failures(1.0, 1.0, 0) == []


def test_missing_extra_and_duplicates_give_exact_figures() -> None:
    observed = [
        o("a", "ROUTE_DEVIATION", 10, rec=5_300),
        o("a", "ROUTE_DEVIATION", 10, rec=5_900),  # the same alert twice
        o("b", "OVERSPEED", 7, rec=7_200),
        o("b", "ZONE_ENTER", 40, "z2", rec=8_100),  # wrong zone: extra, and z1 missing
        o("c", "VEHICLE_SILENT", 3),  # not expected at all
    ]
    res = compare(TRUTH, observed)
    assert res.overall.expected == 4
    assert res.overall.observed == 4  # distinct
    assert res.overall.matched == 2
    assert res.overall.precision == 0.5
    assert res.overall.recall == 0.5
    assert res.overall.duplicates == 1
    assert (res.duplicate_ids, res.duplicate_keys) == (1, 1)
    assert res.by_type["ROUTE_RETURN"].recall == 0.0
    assert res.by_type["ROUTE_RETURN"].precision is None  # nothing observed: undefined, not 0
    assert res.by_type["ROUTE_DEVIATION"].delay(50) == 300.0  # the first copy counts
    assert sorted(m.type for m in res.missing) == ["ROUTE_RETURN", "ZONE_ENTER"]
    assert sorted(u.type for u in res.unexpected) == ["VEHICLE_SILENT", "ZONE_ENTER"]
    assert res.failures(1.0, 1.0, 0) == ["precision 0.5000 < 1.0", "recall 0.5000 < 1.0", "duplicates 1 > 0"]
    assert res.failures(0.5, 0.5, 1) == []


def test_seq_tolerance_matches_near_misses_only() -> None:
    observed = [o("a", "ROUTE_DEVIATION", 11), o("a", "ROUTE_RETURN", 35), o("b", "OVERSPEED", 7)]
    strict = compare(TRUTH, observed)
    assert strict.overall.matched == 1
    loose = compare(TRUTH, observed, seq_tolerance=1)
    assert loose.overall.matched == 2
    assert loose.by_type["ROUTE_RETURN"].matched == 0  # 5 away: still a miss


def test_scope_is_the_runs_vehicles_and_event_time() -> None:
    header = RunHeader("sim-", 2, 1000, 2000, 1000, 1, False, {})
    alerts = [
        ObservedAlert("x", "sim-000001", "OVERSPEED", None, 1, 1500),
        ObservedAlert("y", "sim-000002", "OVERSPEED", None, 1, 1500),  # not in the run
        ObservedAlert("z", "sim-000000", "OVERSPEED", None, 1, 500),  # an earlier run
        ObservedAlert("w", "other", "OVERSPEED", None, 1, 1500),
    ]
    assert [a.alert_id for a in in_scope(header, alerts)] == ["x"]


@pytest.mark.services
def test_verify_reads_only_committed_alerts_and_gates(settings: Settings, tmp_path: Path) -> None:
    ensure_topics(settings.bootstrap_servers, topic_specs(settings))
    topic = settings.topics.alerts
    truth = [t("sim-000000", "OVERSPEED", 5), t("sim-000001", "ZONE_ENTER", 9, "z")]

    def record(a: TruthAlert) -> bytes:
        d = {
            "alert_id": a.alert_id,
            "type": a.type,
            "vehicle_id": a.vehicle_id,
            "seq": a.seq,
            "ts_ms": a.ts_ms,
        }
        if a.zone_id:
            d["zone_id"] = a.zone_id
        return orjson.dumps(d)

    p = transactional_producer(settings.bootstrap_servers, f"v-{uuid.uuid4().hex}")
    p.init_transactions(10)
    p.begin_transaction()
    p.produce(topic, record(truth[0]), truth[0].vehicle_id.encode())
    p.produce(topic, record(truth[1]), truth[1].vehicle_id.encode())
    p.commit_transaction(10)
    p.begin_transaction()  # an aborted duplicate and an aborted extra alert must not count
    p.produce(topic, record(truth[0]), truth[0].vehicle_id.encode())
    p.produce(topic, record(t("sim-000001", "OVERSPEED", 3)), b"sim-000001")
    assert p.flush(10) == 0  # in the log before the abort (and no abort racing AddPartitionsToTxn)
    p.abort_transaction(10)

    got = read_alerts(settings, timeout_s=10, expected={a.key for a in truth})
    assert sorted(a.key for a in got) == sorted(a.key for a in truth)
    assert all(a.record_ts_ms is not None for a in got)

    path = tmp_path / "truth.jsonl"
    w = TruthWriter(path)
    w.write(truth)
    w.close(RunHeader("sim-", 2, 0, 10_000, 1000, 1, False, {}))
    s = SimulatorSettings.from_base(settings)
    assert (
        verify(
            settings=s,
            truth_path=path,
            timeout_s=0,
            seq_tolerance=0,
            min_precision=1,
            min_recall=1,
            max_duplicates=0,
            as_json=False,
        )
        == 0
    )
    # One more expected alert that never comes: recall 2/3 fails the gate.
    w = TruthWriter(path)
    w.write([*truth, t("sim-000001", "ROUTE_DEVIATION", 20)])
    w.close(RunHeader("sim-", 2, 0, 10_000, 1000, 1, False, {}))
    assert (
        verify(
            settings=s,
            truth_path=path,
            timeout_s=0,
            seq_tolerance=0,
            min_precision=1,
            min_recall=1,
            max_duplicates=0,
            as_json=True,
        )
        == 1
    )
    assert json.loads(path.read_text().splitlines()[0])["run"]["n_vehicles"] == 2


def test_mismatches_pair_an_alert_raised_at_another_fix_and_list_the_rest() -> None:
    """Missing and unexpected alerts of one vehicle, type and zone are one alert at another fix
    (`moved`, expected against observed); the rest are `missing` or `extra`; each says where."""
    truth = [
        TruthAlert("a", "ROUTE_COMPLETED", 741, 1_000, None, -1, None, 52.5, 13.4),
        t("b", "ZONE_ENTER", 40, "z1"),
    ]
    observed = [
        ObservedAlert("x1", "a", "ROUTE_COMPLETED", None, 746, 6_000, None, 52.6, 13.5),
        o("a", "WRONG_DIRECTION", 900),
        o("b", "ZONE_ENTER", 40, "z2"),
    ]
    res = compare(truth, observed)
    found = [m.to_dict() for m in res.mismatches]
    assert [(m["kind"], m["vehicle_id"], m["type"], m["zone_id"]) for m in found] == [
        ("moved", "a", "ROUTE_COMPLETED", None),
        ("extra", "a", "WRONG_DIRECTION", None),
        ("missing", "b", "ZONE_ENTER", "z1"),
        ("extra", "b", "ZONE_ENTER", "z2"),
    ]
    assert found[0]["expected"] == {
        "seq": 741,
        "ts": "1970-01-01T00:00:01.000Z",
        "ts_ms": 1_000,
        "lat": 52.5,
        "lon": 13.4,
    }
    assert found[0]["observed"]["seq"] == 746
    assert found[1]["expected"] is None
    assert found[2]["observed"] is None
    assert res.to_dict()["mismatch_count"] == 4
    console = Console(record=True, width=80, color_system=None)
    table = mismatch_table(res, cap=3)
    assert table is not None
    console.print(table)
    text = console.export_text()
    assert "mismatches: 4, 1 more not listed" in text
    for shown in ("seq 741", "seq 746", "52.50000,13.40000"):
        assert shown in text
    assert mismatch_table(compare(truth[:1], [o("a", "ROUTE_COMPLETED", 741)])) is None
