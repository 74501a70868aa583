"""Vehicle master: pure geometry validation, the Redis store with its outbox, and the relay
against the real broker and Redis (including a relay killed mid-stream)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import orjson
import pytest
import shapely
import shapely.geometry
from confluent_kafka import TopicPartition

from fleetfence.kafka import ensure_topics, group_consumer, topic_specs
from fleetfence.settings import Settings
from fleetfence.testing import wait_for
from vehicle_master.errors import (
    AlreadyExistsError,
    GeometryError,
    InUseError,
    MasterValidationError,
    NotFoundError,
    UnknownReferenceError,
    VersionConflictError,
)
from vehicle_master.geojson import infer_entity, parse_feature_collection
from vehicle_master.geometry import validate_circle, validate_line_string, validate_zone_geometry, zone_area
from vehicle_master.models import AssignmentData, RouteData, VehicleData, ZoneData
from vehicle_master.relay import OutboxRelay
from vehicle_master.settings import MasterSettings
from vehicle_master.store import VehicleMaster, parse_entity

pytestmark = pytest.mark.services

LINE = {"type": "LineString", "coordinates": [[13.40, 52.52], [13.41, 52.53]]}
SQUARE = {"type": "Polygon", "coordinates": [[[0, 0], [1, 0], [1, 1], [0, 1], [0, 0]]]}


def route(rid: str = "r1", **kw: Any) -> RouteData:
    base: dict[str, Any] = {
        "route_id": rid,
        "name": "R",
        "geometry": LINE,
        "corridor_width_m": 100,
        "speed_limit_kmh": 50,
    }
    return RouteData.model_validate(base | kw)


# --------------------------------------------------------------------------- pure geometry


@pytest.mark.parametrize(
    ("geometry", "message"),
    [
        ({"type": "LineString", "coordinates": [[1, 2]]}, "at least 2 distinct points"),
        ({"type": "LineString", "coordinates": [[1, 2], [1, 2], [1, 2]]}, "at least 2 distinct points"),
        ({"type": "LineString", "coordinates": [[181, 2], [1, 2]]}, "longitude 181.0 outside"),
        ({"type": "LineString", "coordinates": [[1, -91], [1, 2]]}, "latitude -91.0 outside"),
        ({"type": "LineString", "coordinates": [[1, float("nan")], [1, 2]]}, "finite"),
        ({"type": "LineString", "coordinates": [[1], [1, 2]]}, "a position is"),
        ({"type": "Point", "coordinates": [1, 2]}, "must be a LineString"),
    ],
)
def test_line_string_rejections(geometry: dict[str, Any], message: str) -> None:
    with pytest.raises(GeometryError, match=message):
        validate_line_string(geometry)


@pytest.mark.parametrize(
    ("geometry", "message"),
    [
        (
            {"type": "Polygon", "coordinates": [[[0, 0], [1, 1], [1, 0], [0, 1], [0, 0]]]},
            "Self-intersection",
        ),
        ({"type": "Polygon", "coordinates": [[[0, 0], [1, 0], [1, 1], [0, 1]]]}, "must be closed"),
        ({"type": "Polygon", "coordinates": [[[0, 0], [1, 0], [0, 0]]]}, "at least 4 positions"),
        ({"type": "Polygon", "coordinates": [[[0, 0], [200, 0], [1, 1], [0, 0]]]}, "longitude 200.0"),
        ({"type": "Polygon", "coordinates": []}, "non-empty list of rings"),
        ({"type": "MultiPolygon", "coordinates": []}, "non-empty list of polygons"),
        ({"type": "LineString", "coordinates": [[0, 0], [1, 1]]}, "Polygon or MultiPolygon"),
        (  # hole outside its shell
            {
                "type": "Polygon",
                "coordinates": [
                    [[0, 0], [1, 0], [1, 1], [0, 1], [0, 0]],
                    [[5, 5], [6, 5], [6, 6], [5, 6], [5, 5]],
                ],
            },
            "invalid Polygon",
        ),
    ],
)
def test_zone_geometry_rejections(geometry: dict[str, Any], message: str) -> None:
    with pytest.raises(GeometryError, match=message):
        validate_zone_geometry(geometry)


def test_valid_geometries_are_canonical() -> None:
    assert validate_line_string({"type": "LineString", "coordinates": [[1, 2], [3, 4, 10]]}) == {
        "type": "LineString",
        "coordinates": [[1.0, 2.0], [3.0, 4.0]],
    }
    multi = {"type": "MultiPolygon", "coordinates": [SQUARE["coordinates"]]}
    assert validate_zone_geometry(multi)["type"] == "MultiPolygon"


CIRCLE = {"type": "Point", "coordinates": [13.4, 52.5], "radius_m": 250.0}


@pytest.mark.parametrize(
    ("geometry", "message"),
    [
        ({**CIRCLE, "radius_m": 0}, "radius_m"),
        ({**CIRCLE, "radius_m": -5}, "radius_m"),
        ({**CIRCLE, "radius_m": 50_001}, "radius_m"),
        ({**CIRCLE, "radius_m": float("nan")}, "radius_m"),
        ({**CIRCLE, "radius_m": float("inf")}, "radius_m"),
        ({**CIRCLE, "radius_m": True}, "radius_m"),
        ({**CIRCLE, "radius_m": "250"}, "radius_m"),
        ({"type": "Point", "coordinates": [13.4, 52.5]}, "radius_m"),
        ({**CIRCLE, "coordinates": [13.4, float("nan")]}, "coordinates|finite"),
        ({**CIRCLE, "coordinates": [float("-inf"), 52.5]}, "coordinates|finite"),
        ({**CIRCLE, "coordinates": [190, 52.5]}, "longitude|less than"),
        ({**CIRCLE, "coordinates": [13.4, -91]}, "latitude|85"),
        ({**CIRCLE, "coordinates": [13.4, 86]}, "85"),
        ({**CIRCLE, "coordinates": [179.999, 0]}, "antimeridian"),
        ({**CIRCLE, "coordinates": [[13.4, 52.5]]}, "coordinates|position"),
        ({**CIRCLE, "radius": 250}, "Extra inputs|radius"),
    ],
)
def test_circle_rejections(geometry: dict[str, Any], message: str) -> None:
    """Bad circles are validation errors (the API's 422), never an exception from deeper down."""
    with pytest.raises(MasterValidationError, match=message):
        parse_entity("zone", {"zone_id": "c1", "geometry": geometry})


def test_circle_is_canonical_and_a_point_feature_is_a_zone() -> None:
    assert validate_circle({"type": "Point", "coordinates": [13, 52, 40], "radius_m": 5}) == {
        "type": "Point",
        "coordinates": [13.0, 52.0],
        "radius_m": 5.0,
    }
    z = parse_entity("zone", {"zone_id": "c1", "geometry": {**CIRCLE, "coordinates": [13.4, 52.5, 7.0]}})
    assert z.model_dump(mode="json")["geometry"] == CIRCLE
    feature = {"type": "Feature", "id": "c1", "geometry": CIRCLE, "properties": {"kind": "depot"}}
    assert infer_entity(feature) == "zone"
    items, problems = parse_feature_collection({"type": "FeatureCollection", "features": [feature]})
    assert problems == []
    assert [d.model_dump(mode="json")["geometry"] for _i, d in items] == [CIRCLE]


def test_zone_area_of_a_circle_contains_its_disc() -> None:
    """What overlap questions (the load test's "zones in this area") see of a circle: its disc."""
    import numpy as np

    from fleetfence.geo import LocalProjection

    area = zone_area(CIRCLE)
    proj = LocalProjection(13.4, 52.5)
    ang = np.linspace(0, 2 * np.pi, 1000)
    lon, lat = proj.inverse(250.0 * np.cos(ang), 250.0 * np.sin(ang))
    assert shapely.contains_xy(area, lon, lat).all()
    assert area.area < 1.01 * np.pi * (250.0 / proj.kx) * (250.0 / proj.ky)
    assert zone_area(SQUARE).equals(shapely.geometry.shape(SQUARE))


def test_model_rules_reject_bad_numbers_and_windows() -> None:
    with pytest.raises(MasterValidationError, match="corridor_width_m"):
        parse_entity("route", {**route().model_dump(mode="json"), "corridor_width_m": 0})
    with pytest.raises(MasterValidationError, match="valid_to_ms must be after"):
        parse_entity(
            "assignment", {"vehicle_id": "v", "route_id": "r", "valid_from_ms": 10, "valid_to_ms": 5}
        )
    with pytest.raises(MasterValidationError, match="vehicle_id"):
        parse_entity("vehicle", {"vehicle_id": "bad id!", "label": "x"})
    with pytest.raises(MasterValidationError, match="Extra inputs"):
        parse_entity("vehicle", {"vehicle_id": "v", "label": "x", "lable": "typo"})


# --------------------------------------------------------------------------- store


def outbox_fields(vm: VehicleMaster) -> list[dict[bytes | str, bytes | str]]:
    """The fields of every outbox entry (redis' stubs allow a None reply and None fields: narrowed)."""
    entries = vm.r.xrange(vm.keys.outbox)
    assert entries is not None
    out = []
    for _sid, fields in entries:
        assert fields is not None
        out.append(fields)
    return out


def outbox_events(vm: VehicleMaster) -> list[dict[str, Any]]:
    return [orjson.loads(f[b"event"]) for f in outbox_fields(vm)]


def test_write_and_event_follow_the_contract(vm: VehicleMaster) -> None:
    res = vm.create(route("r-berlin-1"))
    assert (res.version, res.op, res.created) == (1, "upsert", True)
    [event] = outbox_events(vm)
    assert list(event) == ["entity", "id", "version", "op", "ts_ms", "data"]
    assert event["entity"] == "route"
    assert event["id"] == "r-berlin-1"
    assert event["version"] == 1
    assert event["op"] == "upsert"
    assert abs(event["ts_ms"] - time.time() * 1000) < 60_000
    assert event["data"] == {
        "route_id": "r-berlin-1",
        "name": "R",
        "geometry": {"type": "LineString", "coordinates": [[13.40, 52.52], [13.41, 52.53]]},
        "corridor_width_m": 100.0,
        "speed_limit_kmh": 50.0,
        "deviation_min_fixes": 3,
        "deviation_min_s": 0.0,
        "overspeed_min_s": 10.0,
        "silent_after_s": 120.0,
        # Route awareness, at their defaults; a null planned duration: none planned.
        "wrong_way_min_m": 100.0,
        "wrong_way_min_fixes": 3,
        "wrong_way_min_s": 5.0,
        "stop_min_s": 300.0,
        "stop_speed_kmh": 3.0,
        "stop_radius_m": 50.0,
        "arrival_risk_s": 600.0,
        "planned_duration_s": None,
        "completion_radius_m": 50.0,
    }
    [fields] = outbox_fields(vm)
    assert fields[b"key"] == b"route:r-berlin-1"


def test_versions_unchanged_conflict_delete_and_recreate(vm: VehicleMaster) -> None:
    vm.create(route())
    with pytest.raises(AlreadyExistsError):
        vm.create(route())
    assert vm.upsert(route()).changed is False  # identical: no version, no event
    assert vm.update(route(name="R2"), if_version=1).version == 2
    with pytest.raises(VersionConflictError) as exc:
        vm.update(route(name="R3"), if_version=1)
    assert exc.value.current_version == 2
    assert vm.get("route", "r1").data["name"] == "R2"
    deleted = vm.delete("route", "r1", if_version=2)
    assert (deleted.version, deleted.op) == (3, "delete")
    with pytest.raises(NotFoundError):
        vm.get("route", "r1")
    with pytest.raises(NotFoundError):
        vm.delete("route", "r1")
    assert vm.create(route()).version == 4  # the tombstone keeps the sequence going
    events = outbox_events(vm)
    assert [(e["version"], e["op"]) for e in events] == [
        (1, "upsert"),
        (2, "upsert"),
        (3, "delete"),
        (4, "upsert"),
    ]
    assert events[2]["data"]["name"] == "R2"  # a delete carries the last data it deleted


def test_circle_zone_versions_like_a_polygon(vm: VehicleMaster) -> None:
    """A circle zone is versioned as any zone: an identical write changes nothing, a new radius or
    centre (or a polygon in its place) is a new version, and each event carries the whole circle."""

    def zone(geometry: dict[str, Any]) -> ZoneData:
        return ZoneData.model_validate({"zone_id": "c1", "kind": "customer", "geometry": geometry})

    assert vm.create(zone(CIRCLE)).version == 1
    assert vm.upsert(zone({**CIRCLE, "radius_m": 250})).changed is False
    assert vm.update(zone({**CIRCLE, "radius_m": 300.5}), if_version=1).version == 2
    with pytest.raises(VersionConflictError):
        vm.update(zone({**CIRCLE, "radius_m": 400}), if_version=1)
    assert vm.upsert(zone({**CIRCLE, "coordinates": [13.41, 52.5], "radius_m": 300.5})).version == 3
    assert vm.upsert(zone(SQUARE)).version == 4
    assert vm.upsert(zone(CIRCLE)).version == 5
    assert vm.get("zone", "c1").data["geometry"] == CIRCLE
    events = outbox_events(vm)
    assert [e["version"] for e in events] == [1, 2, 3, 4, 5]
    assert [e["data"]["geometry"].get("radius_m") for e in events] == [250.0, 300.5, 300.5, None, 250.0]
    assert events[2]["data"]["geometry"]["coordinates"] == [13.41, 52.5]


def test_assignment_references_and_in_use(vm: VehicleMaster) -> None:
    a = AssignmentData(vehicle_id="v1", route_id="r1", valid_from_ms=1_795_320_000_000)
    with pytest.raises(UnknownReferenceError, match="vehicle"):
        vm.upsert(a)
    vm.upsert(VehicleData(vehicle_id="v1", label="V1"))
    with pytest.raises(UnknownReferenceError, match="route"):
        vm.upsert(a)
    vm.upsert(route("r1"))
    vm.upsert(route("r2"))
    assert vm.upsert(a).created
    with pytest.raises(InUseError):
        vm.delete("route", "r1")
    with pytest.raises(InUseError):
        vm.delete("vehicle", "v1")
    # Re-assigning moves the reference: r1 becomes deletable, r2 does not.
    vm.upsert(a.model_copy(update={"route_id": "r2"}))
    vm.delete("route", "r1")
    with pytest.raises(InUseError):
        vm.delete("route", "r2")
    vm.delete("assignment", "v1")
    vm.delete("route", "r2")
    vm.delete("vehicle", "v1")
    assert vm.list("route") == []


def test_list_pages_by_id_with_filter(vm: VehicleMaster) -> None:
    for i in range(25):
        vm.upsert(
            ZoneData.model_validate(
                {
                    "zone_id": f"z{i:02d}",
                    "name": f"Z{i}",
                    "geometry": SQUARE,
                    "kind": "depot" if i % 2 else "restricted",
                }
            )
        )
    first = vm.list("zone", limit=10)
    second = vm.list("zone", limit=10, after=first[-1].id)
    assert [r.id for r in first + second] == [f"z{i:02d}" for i in range(20)]
    depots = vm.list("zone", limit=100, where=lambda d: d["kind"] == "depot")
    assert [r.id for r in depots] == [f"z{i:02d}" for i in range(1, 25, 2)]
    # scan: every one, a page at a time, from after an id; deleted ones are skipped.
    vm.delete("zone", "z07")
    assert [r.id for r in vm.scan("zone", page=4)] == [f"z{i:02d}" for i in range(25) if i != 7]
    assert [r.id for r in vm.scan("zone", after="z1", page=3)] == [f"z{i:02d}" for i in range(10, 25)]


def test_filtered_list_walks_rounds_of_ids_until_the_index_ends(vm: VehicleMaster) -> None:
    # 230 ids, a filter keeping 1 in 50: the matches sit in three rounds of 100 ids each.
    for i in range(230):
        vm.upsert(
            VehicleData(
                vehicle_id=f"v{i:03d}", label=f"L{i}", attributes={"rare": "yes" if i % 50 == 0 else "no"}
            )
        )
    vm.delete("vehicle", "v050")
    rare = lambda d: d["attributes"]["rare"] == "yes"  # noqa: E731
    assert [r.id for r in vm.list("vehicle", limit=3, where=rare)] == ["v000", "v100", "v150"]
    assert [r.id for r in vm.list("vehicle", limit=10, where=rare)] == ["v000", "v100", "v150", "v200"]
    assert [r.id for r in vm.list("vehicle", limit=10, after="v150", where=rare)] == ["v200"]
    page = vm.list("vehicle", limit=1000)
    assert [r.id for r in page] == [f"v{i:03d}" for i in range(230) if i != 50]
    assert vm.list("vehicle", limit=5, after="v229") == []


def test_concurrent_if_match_updates_exactly_one_wins(vm: VehicleMaster, msettings: MasterSettings) -> None:
    vm.create(VehicleData(vehicle_id="v1", label="start"))
    outcomes: list[str] = []
    barrier = threading.Barrier(8)

    def writer(n: int) -> None:
        store = VehicleMaster.from_settings(msettings)
        barrier.wait()
        try:
            store.update(VehicleData(vehicle_id="v1", label=f"w{n}"), if_version=1)
            outcomes.append("won")
        except VersionConflictError:
            outcomes.append("conflict")
        finally:
            store.close()

    threads = [threading.Thread(target=writer, args=(n,)) for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert sorted(outcomes) == ["conflict"] * 7 + ["won"]
    assert vm.get("vehicle", "v1").version == 2
    assert len(outbox_events(vm)) == 2


# --------------------------------------------------------------------------- relay


def consume_all(
    settings: Settings, expect: int, timeout_s: float = 20.0
) -> list[tuple[bytes, dict[str, Any]]]:
    """At least `expect` records and everything up to the topic's end (a killed relay re-sends, so
    the topic can hold more records than distinct changes)."""
    c = group_consumer(settings.bootstrap_servers, f"t-{uuid.uuid4().hex}")
    tp = TopicPartition(settings.topics.master, 0, 0)
    c.assign([tp])
    got: list[tuple[bytes, dict[str, Any]]] = []
    deadline = time.monotonic() + timeout_s

    def end() -> int:
        # Asked only when the reader may be done: the request queues behind the fetch the broker
        # holds for this consumer (up to fetch.wait.max.ms), so asking in every round crawls.
        lo_hi = c.get_watermark_offsets(TopicPartition(settings.topics.master, 0), timeout=5, cached=False)
        return int(lo_hi[1])

    try:
        while time.monotonic() < deadline:
            pos = c.position([TopicPartition(settings.topics.master, 0)])[0].offset
            if len(got) >= expect and pos >= 0 and pos >= end():
                break
            for m in c.consume(500, 0.2):
                if m.error() is None:
                    got.append((m.key(), orjson.loads(m.value())))
    finally:
        c.close()
    return got


def test_relay_in_process_publishes_in_order(vm: VehicleMaster, msettings: MasterSettings) -> None:
    ensure_topics(msettings.bootstrap_servers, topic_specs(msettings))
    with OutboxRelay(msettings) as relay:
        vm.upsert(VehicleData(vehicle_id="v1", label="a"))
        vm.upsert(route("r1"))
        vm.upsert(AssignmentData(vehicle_id="v1", route_id="r1", valid_from_ms=1_795_320_000_000))
        vm.upsert(VehicleData(vehicle_id="v1", label="b"))
        wait_for(lambda: relay.published == 4, 15, "4 events relayed")
    got = consume_all(msettings, 4)
    assert [k for k, _ in got] == [b"vehicle:v1", b"route:r1", b"assignment:v1", b"vehicle:v1"]
    assert [(e["entity"], e["version"]) for _, e in got] == [
        ("vehicle", 1),
        ("route", 1),
        ("assignment", 1),
        ("vehicle", 2),
    ]
    assert vm.r.xlen(vm.keys.outbox) == 1  # acknowledged entries are trimmed (the last one stays)


def _relay_process(msettings: MasterSettings, log: Path) -> subprocess.Popen[bytes]:
    env = {
        **os.environ,
        "FLEETFENCE_REDIS_URL": msettings.redis_dsn,
        "FLEETFENCE_KAFKA_BOOTSTRAP": msettings.bootstrap_servers,
        "FLEETFENCE_TOPIC_PREFIX": msettings.topic_prefix,
        "FLEETFENCE_REDIS_PREFIX": msettings.redis_prefix,
        "FLEETFENCE_RELAY_LEASE_MS": "1000",
        "FLEETFENCE_RELAY_BATCH_SIZE": "7",
        "FLEETFENCE_RELAY_BLOCK_MS": "100",
    }
    exe = Path(sys.executable).with_name("fleetfence")
    return subprocess.Popen(
        [str(exe), "master-relay"], env=env, stdout=log.open("ab"), stderr=subprocess.STDOUT
    )


def test_relay_killed_mid_stream_loses_nothing(
    vm: VehicleMaster, msettings: MasterSettings, tmp_path: Path
) -> None:
    ensure_topics(msettings.bootstrap_servers, topic_specs(msettings))
    log = tmp_path / "relay.log"
    total = 300
    expected: set[tuple[str, int]] = set()
    proc = _relay_process(msettings, log)
    try:
        for i in range(total):
            vid = f"v{i % 40}"
            res = vm.upsert(VehicleData(vehicle_id=vid, label=f"label-{i}"))
            expected.add((f"vehicle:{vid}", res.version))
            if i == 120:
                # Kill it while it is busy: wait until it has acknowledged something, then SIGKILL.
                wait_for(lambda: vm.r.get(vm.keys.relay_acked) is not None, 20, "first relay ack")
                proc.send_signal(signal.SIGKILL)
                proc.wait(10)
        acked_at_kill = vm.r.get(vm.keys.relay_acked)
        assert vm.r.xlen(vm.keys.outbox) > 1, "the killed relay left work behind"
        proc = _relay_process(msettings, log)  # waits out the dead relay's lease, then resumes
        newest = vm.r.xrevrange(vm.keys.outbox, count=1)
        assert newest, "the outbox is empty"
        last_id = newest[0][0]
        wait_for(lambda: vm.r.get(vm.keys.relay_acked) == last_id, 30, "restarted relay to catch up")
        assert acked_at_kill != last_id
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(15)
    assert proc.returncode == 0, log.read_text()[-2000:]
    got = consume_all(msettings, total, 30)
    seen = {(k.decode(), e["version"]) for k, e in got}
    assert seen == expected  # every change arrived (re-sends are duplicates of the same version)
    # Per key, versions arrive in order (ignoring re-sends), so "drop if version <= applied" works.
    applied: dict[str, int] = {}
    for k, e in got:
        if e["version"] > applied.get(k.decode(), 0):
            assert e["version"] == applied.get(k.decode(), 0) + 1
            applied[k.decode()] = e["version"]
    assert sum(applied.values()) == total


class _CrashBeforeAckError(Exception):
    pass


def test_crash_between_kafka_ack_and_outbox_ack_resends_same_versions(
    vm: VehicleMaster, msettings: MasterSettings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The one window SIGKILL rarely hits: Kafka has the batch, the outbox ack is not written."""
    ensure_topics(msettings.bootstrap_servers, topic_specs(msettings))
    for i in range(5):
        vm.upsert(VehicleData(vehicle_id=f"v{i}", label="x"))
    first = OutboxRelay(msettings)
    assert first.acquire_lease()

    def crash(*_a: Any, **_k: Any) -> int:
        raise _CrashBeforeAckError

    monkeypatch.setattr(first, "_ack", crash)  # a fault we cannot time for real
    with pytest.raises(_CrashBeforeAckError):
        first.run_once()
    first.stop()  # releases the lease, as a restarted process finds it expired
    second = OutboxRelay(msettings)
    assert second.acquire_lease()
    assert second.run_once() == 5
    second.stop()
    got = consume_all(msettings, 10)
    assert len(got) == 10  # each event twice: re-sent, never lost
    assert {(k, e["version"]) for k, e in got} == {(f"vehicle:v{i}".encode(), 1) for i in range(5)}
