"""Route awareness through the admin API: the per-route trip rules, zones that are
planned stops and the assignment's planned times in and out of the vehicle master, and the trip's
state in the live read model, written by the processor's own engine and writer.

The live rows here are not written by hand: the master data the API stored is read back from its
outbox (exactly the `fleet.master` events the processor consumes), the batch engine folds a few
fixes against it, and the processor's Redis writer stores what it returns; alerts go through the
alert history receiver's sink. So the API is tested against what production writes, and a field
the processor adds that the API's model does not declare fails here.
"""

from __future__ import annotations

import copy
import dataclasses
import math
from typing import Any

import numpy as np
import orjson
import pandas as pd
import pytest

from admin_api.read_schemas import LiveState
from admin_api.schemas import ROUTE_EXAMPLE, ZONE_EXAMPLE
from fleetfence.contracts import AlertRecord, AlertType, ms_to_iso
from fleetfence.geo import LocalProjection
from fleetfence.readmodels import ReadKeys
from fleetfence.rules import RouteRules
from processor.core.columns import empty_states
from processor.core.domain import EngineConfig
from processor.core.engine import process_bucket
from processor.core.master import Catalog, MasterState
from processor.spark.live_store import write_live
from processor.spark.rows import pack_live, unpack_live
from tests.admin_api.helpers import AlertHistory, Api
from vehicle_master.models import RouteProps

pytestmark = pytest.mark.services

# The rules the page and the processor share, set away from every default so a field that is
# dropped or defaulted on the way shows.
TRIP_RULES: dict[str, Any] = {
    "wrong_way_min_m": 50.0,
    "wrong_way_min_fixes": 2,
    "wrong_way_min_s": 1.0,
    "stop_min_s": 10.0,
    "stop_speed_kmh": 2.0,
    "stop_radius_m": 40.0,
    "arrival_risk_s": 30.0,
    "planned_duration_s": 1800.0,
    "completion_radius_m": 40.0,
}
TRIP_FIELDS = (
    "wrong_way",
    "stop",
    "stopped_since_ms",
    "eta_ms",
    "planned_arrival_ms",
    "delay_s",
    "arrival_at_risk",
    "completed",
    "off_route_m",
)
RULE_NAMES = tuple(TRIP_RULES)
OUTBOX = "master:outbox"


def route_feature(rid: str, **props: Any) -> dict[str, Any]:
    f = copy.deepcopy(ROUTE_EXAMPLE)
    f["id"] = rid
    f["properties"].update(props)
    return f


def zone_feature(zid: str, **props: Any) -> dict[str, Any]:
    f = copy.deepcopy(ZONE_EXAMPLE)
    f["id"] = zid
    f["properties"].update(props)
    return f


def outbox_events(api: Api) -> list[dict[str, Any]]:
    """The `fleet.master` events the API wrote, in order (the relay publishes exactly these)."""
    entries = api.r.xrange(f"{api.p}{OUTBOX}")
    assert entries is not None  # redis' stubs allow a None reply and None fields: narrowed
    out = []
    for _sid, fields in entries:
        assert fields is not None
        out.append(orjson.loads(fields[b"event"]))
    return out


# --------------------------------------------------------------------------- master data


def test_route_rules_round_trip_and_reach_the_processor_as_stored(api: Api) -> None:
    """The trip rules a route is created with come back from every read, survive a GET body sent
    back, and are what the processor will apply (its RouteRules of the outbox event). A rule set to
    null is off (infinity to the processor); a route that names none gets the one set of defaults."""
    c = api.c
    rules = {**TRIP_RULES, "wrong_way_min_m": None}
    created = c.post("/api/v1/routes", json=route_feature("r-trip", **rules), headers=api.admin)
    assert created.status_code == 201, created.text
    props = created.json()["properties"]
    assert {k: props[k] for k in RULE_NAMES} == rules
    got = c.get("/api/v1/routes/r-trip", headers=api.viewer)
    assert got.json() == created.json()
    listed = c.get("/api/v1/routes", headers=api.viewer).json()["features"]
    assert [f["properties"]["stop_radius_m"] for f in listed] == [40.0]

    # A GET body sent back with one rule changed keeps every other rule.
    echoed = got.json()
    echoed["properties"]["stop_radius_m"] = 25
    put = c.put("/api/v1/routes/r-trip", json=echoed, headers={**api.admin, "If-Match": got.headers["etag"]})
    assert put.status_code == 200, put.text
    assert {k: put.json()["properties"][k] for k in RULE_NAMES} == {**rules, "stop_radius_m": 25}

    # What the processor reads from fleet.master: the stored rules, the null one switched off.
    (event,) = [e for e in outbox_events(api) if e["id"] == "r-trip" and e["version"] == 2]
    applied = RouteRules.from_master(event["data"])
    assert applied.wrong_way_min_m == math.inf
    assert (applied.stop_min_s, applied.stop_radius_m, applied.arrival_risk_s) == (10.0, 25.0, 30.0)
    assert applied.planned_duration_s == 1800.0

    # Without trip rules: the defaults of fleetfence.rules, planned_duration_s unset.
    bare = route_feature("r-bare")
    for k in RULE_NAMES:
        bare["properties"].pop(k, None)
    defaults = c.post("/api/v1/routes", json=bare, headers=api.admin).json()["properties"]
    want = RouteRules(corridor_width_m=1, speed_limit_kmh=1).to_master()
    assert {k: defaults[k] for k in RULE_NAMES} == {k: want[k] for k in RULE_NAMES}
    assert defaults["planned_duration_s"] is None


def test_zones_of_kind_rest_area_and_planned_stop_round_trip(api: Api) -> None:
    c = api.c
    for zid, props in (
        ("z-rest", {"kind": "rest_area", "dwell_limit_s": None}),
        ("z-yard", {"kind": "other", "planned_stop": True}),
        ("z-depot-no", {"kind": "depot", "planned_stop": False}),
    ):
        res = c.post("/api/v1/zones", json=zone_feature(zid, **props), headers=api.admin)
        assert res.status_code == 201, res.text
    got = {
        f["id"]: (f["properties"]["kind"], f["properties"]["planned_stop"])
        for f in c.get("/api/v1/zones", headers=api.viewer).json()["features"]
    }
    assert got == {"z-rest": ("rest_area", None), "z-yard": ("other", True), "z-depot-no": ("depot", False)}
    rest = c.get("/api/v1/zones", params={"kind": "rest_area"}, headers=api.viewer).json()
    assert [f["id"] for f in rest["features"]] == ["z-rest"]
    # Changing only planned_stop, through a GET body sent back.
    body = c.get("/api/v1/zones/z-rest", headers=api.viewer).json()
    body["properties"]["planned_stop"] = False
    assert (
        c.put("/api/v1/zones/z-rest", json=body, headers=api.admin).json()["properties"]["planned_stop"]
        is False
    )


def test_assignment_planned_times_in_iso_or_ms_and_back(api: Api) -> None:
    """Planned times go in as ISO 8601 (like valid_from) or as the epoch ms a GET returns, and come
    back in both forms, to the millisecond; a GET body sent back keeps them; a PUT without them
    plans nothing."""
    c = api.c
    assert c.post("/api/v1/routes", json=route_feature("r1"), headers=api.admin).status_code == 201
    for vid in ("v1", "v2"):
        assert c.post(
            "/api/v1/vehicles", json={"vehicle_id": vid, "label": vid}, headers=api.admin
        ).is_success
    dep, arr = 1_795_327_200_123, 1_795_329_000_457  # odd milliseconds: a float on the way would show
    res = c.post(
        "/api/v1/assignments",
        json={
            "vehicle_id": "v1",
            "route_id": "r1",
            "valid_from": "2026-11-22T06:00:00Z",
            "planned_departure": ms_to_iso(dep),
            "planned_arrival": ms_to_iso(arr),
        },
        headers=api.admin,
    )
    assert res.status_code == 201, res.text
    body = res.json()
    assert (body["planned_departure_ms"], body["planned_arrival_ms"]) == (dep, arr)
    assert (body["planned_departure"], body["planned_arrival"]) == (ms_to_iso(dep), ms_to_iso(arr))
    got = c.get("/api/v1/assignments/v1", headers=api.viewer)
    assert {k: v for k, v in got.json().items() if k != "warnings"} == {
        k: v for k, v in body.items() if k != "warnings"
    }
    # The event the processor consumes carries the planned times as the contract's epoch ms.
    (event,) = [e for e in outbox_events(api) if e["entity"] == "assignment"]
    assert (event["data"]["planned_departure_ms"], event["data"]["planned_arrival_ms"]) == (dep, arr)

    # Sent back as read (both forms, agreeing): unchanged.
    echoed = c.put("/api/v1/assignments/v1", json=got.json(), headers=api.admin)
    assert echoed.status_code == 200, echoed.text
    assert (echoed.json()["planned_departure_ms"], echoed.json()["planned_arrival_ms"]) == (dep, arr)
    # Epoch ms only, arrival only.
    ms_only = c.put(
        "/api/v1/assignments/v2", json={"route_id": "r1", "planned_arrival_ms": arr}, headers=api.admin
    )
    assert ms_only.status_code == 201, ms_only.text
    assert ms_only.json()["planned_departure"] is None
    assert (ms_only.json()["planned_arrival_ms"], ms_only.json()["planned_arrival"]) == (arr, ms_to_iso(arr))
    # A replacement that names no planned times plans none.
    cleared = c.put("/api/v1/assignments/v1", json={"route_id": "r1"}, headers=api.admin).json()
    assert (cleared["planned_departure_ms"], cleared["planned_arrival_ms"]) == (None, None)
    page = c.get("/api/v1/assignments", headers=api.viewer).json()["items"]
    assert [(a["vehicle_id"], a["planned_arrival"]) for a in page] == [("v1", None), ("v2", ms_to_iso(arr))]


def _bad_route(**props: Any) -> dict[str, Any]:
    return route_feature("rb", **props)


ASSIGN = {"vehicle_id": "v1", "route_id": "r1", "valid_from": "2026-11-22T06:00:00Z"}


@pytest.mark.parametrize(
    ("path", "body", "message"),
    [
        ("routes", _bad_route(stop_radius_m=-5), "stop_radius_m: Input should be greater than 0"),
        ("routes", _bad_route(stop_radius_m=0), "stop_radius_m: Input should be greater than 0"),
        ("routes", _bad_route(wrong_way_min_m=0), "wrong_way_min_m: Input should be greater than 0"),
        ("routes", _bad_route(wrong_way_min_fixes=0), "greater than or equal to 1"),
        ("routes", _bad_route(stop_min_s=-1), "stop_min_s: Input should be greater than 0"),
        ("routes", _bad_route(stop_speed_kmh=51), "stop_speed_kmh: Input should be less than or equal to 50"),
        (
            "routes",
            _bad_route(arrival_risk_s=-1),
            "arrival_risk_s: Input should be greater than or equal to 0",
        ),
        ("routes", _bad_route(planned_duration_s=0), "planned_duration_s: Input should be greater than 0"),
        (
            "routes",
            _bad_route(completion_radius_m="near"),
            "completion_radius_m: Input should be a valid number",
        ),
        ("routes", _bad_route(stop_radius_metres=40), "Extra inputs"),
        ("zones", zone_feature("zb", kind="rest-area"), "'customer', 'rest_area' or 'other'"),
        ("zones", zone_feature("zb", planned_stop="sometimes"), "valid boolean"),
        (
            "assignments",
            {
                **ASSIGN,
                "planned_departure": "2026-11-22T07:00:00Z",
                "planned_arrival": "2026-11-22T06:30:00Z",
            },
            "planned_arrival_ms must be after planned_departure_ms",
        ),
        (
            "assignments",
            {**ASSIGN, "planned_departure_ms": 1_795_329_000_000, "planned_arrival_ms": 1_795_329_000_000},
            "planned_arrival_ms must be after planned_departure_ms",
        ),
        (
            "assignments",
            {**ASSIGN, "planned_arrival": "2026-11-22T06:30:00Z", "planned_arrival_ms": 1_795_329_000_001},
            "planned_arrival (2026-11-22T06:30:00+00:00) and planned_arrival_ms (1795329000001) name "
            "different times: send one",
        ),
        (
            "assignments",
            {**ASSIGN, "planned_arrival": "2026-11-22T06:30:00"},
            "timezone",
        ),
        (
            "assignments",
            {**ASSIGN, "planned_departure_ms": -1},
            "greater than or equal to 0",
        ),
        ("assignments", {**ASSIGN, "planned_arival": "2026-11-22T06:30:00Z"}, "Extra inputs"),
    ],
)
def test_invalid_trip_rules_and_plans_are_clear_422s(
    api: Api, path: str, body: dict[str, Any], message: str
) -> None:
    """Each refusal names the field and why, and writes nothing (no event for the processor)."""
    api.c.post("/api/v1/vehicles", json={"vehicle_id": "v1", "label": "V"}, headers=api.admin)
    api.c.post("/api/v1/routes", json=route_feature("r1"), headers=api.admin)
    before = api.r.xlen(f"{api.p}{OUTBOX}")
    res = api.c.post(f"/api/v1/{path}", json=body, headers=api.admin)
    assert res.status_code == 422, res.text
    found = [f"{'.'.join(map(str, d['loc'][-1:]))}: {d['msg']}" for d in res.json()["detail"]]
    assert any(message in f for f in found), found
    assert api.r.xlen(f"{api.p}{OUTBOX}") == before


def test_openapi_documents_the_trip_rules_plans_and_live_fields(api: Api) -> None:
    """The map reads the rules' defaults from this schema (schema.js): they must be there, equal to
    the one home of the defaults; and every trip field of a live state is documented."""
    doc = api.c.get("/openapi.json").json()
    schemas = doc["components"]["schemas"]
    route_in = schemas["RoutePropsIn"]["properties"]
    defaults = RouteRules(corridor_width_m=1, speed_limit_kmh=1).to_master()
    for name in RULE_NAMES:
        assert name in route_in, name
        assert route_in[name].get("default") == defaults[name], name
        assert name in schemas["RoutePropsOut"]["properties"], name
    assert "rest_area" in schemas["ZoneKind"]["enum"]
    assert "planned_stop" in schemas["ZonePropsIn"]["properties"]
    assert "planned_stop" in schemas["ZonePropsOut"]["properties"]
    for name in ("planned_departure", "planned_arrival", "planned_departure_ms", "planned_arrival_ms"):
        assert name in schemas["AssignmentIn"]["properties"], name
        assert name in schemas["AssignmentOut"]["properties"], name
    live = schemas["LiveState"]["properties"]
    for name in TRIP_FIELDS:
        assert live[name].get("description"), name
    assert set(AlertType) <= set(schemas["AlertType"]["enum"])


def test_route_props_are_the_rules_with_their_specs() -> None:
    """RouteProps is built from RouteRules' fields: every rule, in order, with its default (null for
    a rule off by default), its form label as the schema's title and its group; and what the API
    stores reads back into the same rules."""
    rules = dataclasses.fields(RouteRules)
    assert list(RouteProps.model_fields) == ["name", *(f.name for f in rules)]
    schema = RouteProps.model_json_schema()["properties"]
    defaults = RouteRules(corridor_width_m=1, speed_limit_kmh=1).to_master()
    for f in rules:
        if f.name not in ("corridor_width_m", "speed_limit_kmh"):
            assert RouteProps.model_fields[f.name].default == defaults[f.name], f.name
        assert schema[f.name]["title"], f.name
        assert schema[f.name]["x-rule"] in ("route", "trip"), f.name
    assert schema["wrong_way_min_m"]["title"] == "Wrong way after going back (m, empty: off)"
    assert schema["stop_radius_m"]["x-rule"] == "trip"
    assert schema["overspeed_min_s"]["x-rule"] == "route"
    r = RouteRules(80.0, 40.0, deviation_min_fixes=5, stop_min_s=math.inf, planned_duration_s=900.0)
    stored = RouteProps.model_validate({"name": "n", **r.to_master()}).model_dump()
    assert RouteRules.from_master(stored) == r


def test_alert_types_are_served_without_a_key_as_declared(api: Api) -> None:
    """The map's words for alert types come from here (labels.js), read before anyone logs in."""
    res = api.c.get("/map/alert-types.json")
    assert res.status_code == 200, res.text
    got = res.json()
    assert list(got) == [t.value for t in AlertType]
    for t in AlertType:
        assert (got[t]["label"], got[t]["tone"], got[t]["closes"]) == (
            t.meta.label,
            t.meta.tone,
            t.meta.closes,
        )
    assert got["ROUTE_COMPLETED"]["detail"] == [
        ["in {}", "duration_s", "duration"],
        ["{}", "delay_s", "delay"],
    ]


# --------------------------------------------------------------------------- live read model

T0 = 1_795_327_260_000  # 2026-11-22T06:01:00Z, after the assignments' valid_from
LINE = [[13.40, 52.52], [13.43, 52.52]]  # due east, about 2 km
PROJ = LocalProjection(13.40, 52.52)


def fixes_of(vid: str, xs: list[float], speeds: list[float], t0: int = T0) -> list[dict[str, Any]]:
    """1 Hz fixes along LINE at `xs` metres east of its start."""
    lon, lat = PROJ.inverse(np.array(xs), np.zeros(len(xs)))
    return [
        {
            "vehicle_id": vid,
            "seq": k,
            "ts_ms": t0 + k * 1000,
            "lat": float(lat[k]),
            "lon": float(lon[k]),
            "speed_kmh": speeds[k],
            "received_ms": t0 + k * 1000 + 40,
        }
        for k in range(len(xs))
    ]


def run_processor(api: Api, fixes: list[dict[str, Any]]) -> list[AlertRecord]:
    """The processor over one batch: master data from the API's outbox, the engine, its live
    writer into this API's Redis and the alert history receiver's sink. Returns the alerts."""
    master = MasterState()
    for event in outbox_events(api):
        master.apply(event)
    cfg = EngineConfig()
    res = process_bucket(empty_states(), {}, master, pd.DataFrame(fixes), 0, cfg, Catalog(cfg))
    assert len(res.live) == len({f["vehicle_id"] for f in fixes})
    written = write_live(api.settings.redis_dsn, ReadKeys(api.p), unpack_live(pack_live(res.live)))
    assert written == len(res.live)
    alerts = [a.to_dict() for a in res.alerts]
    history = AlertHistory(api.settings.redis_dsn, api.p)
    try:
        for a in alerts:
            history.deliver(a)
    finally:
        history.close()
    return alerts


def test_live_state_carries_the_trip_as_the_processor_writes_it(api: Api) -> None:
    """Three vehicles on one route: one stops outside any zone and is late for its planned arrival,
    one turns back, one reaches the route's end. Their live states, read through the API, carry the
    trip's state; their open alerts are the trip's open conditions."""
    c = api.c
    route = route_feature("r-live", **TRIP_RULES)
    route["geometry"] = {"type": "LineString", "coordinates": LINE}
    assert c.post("/api/v1/routes", json=route, headers=api.admin).status_code == 201
    plans = {
        "v-stop": {"planned_departure_ms": T0, "planned_arrival_ms": T0 + 60_000},
        "v-back": {},
        "v-done": {"planned_arrival_ms": T0 + 3_600_000},
    }
    for vid, plan in plans.items():
        assert c.post(
            "/api/v1/vehicles", json={"vehicle_id": vid, "label": vid}, headers=api.admin
        ).is_success
        a = {"vehicle_id": vid, "route_id": "r-live", "valid_from": "2026-11-22T06:00:00Z", **plan}
        res = c.post("/api/v1/assignments", json=a, headers=api.admin)
        assert res.status_code == 201, res.text

    # v-stop: 70 s at 36 km/h, then 20 s standing still (stop_min_s is 10 s): stopped, and late.
    stop_xs = [10.0 * k for k in range(70)] + [700.0] * 20
    stop_v = [36.0] * 70 + [0.0] * 20
    # v-back: 300 m forward, then 100 m back (wrong_way_min_m is 50 m).
    back_xs = [10.0 * k for k in range(31)] + [300.0 - 10.0 * k for k in range(1, 11)]
    # v-done: from 1.5 km to 10 m before the end (completion_radius_m is 40 m).
    end_m = PROJ.forward(np.array([LINE[1][0]]), np.array([LINE[1][1]]))[0][0]
    done_xs = [1500.0 + 20.0 * k for k in range(int((end_m - 1510.0) // 20) + 1)]
    alerts = run_processor(
        api,
        fixes_of("v-stop", stop_xs, stop_v)
        + fixes_of("v-back", back_xs, [36.0] * len(back_xs))
        + fixes_of("v-done", done_xs, [72.0] * len(done_xs)),
    )
    raised = {(a["vehicle_id"], a["type"]) for a in alerts}
    assert {
        ("v-stop", "UNPLANNED_STOP"),
        ("v-stop", "ARRIVAL_AT_RISK"),
        ("v-back", "WRONG_DIRECTION"),
        ("v-done", "ROUTE_COMPLETED"),
    } <= raised

    states = {s["vehicle_id"]: s for s in c.get("/api/v1/live", headers=api.viewer).json()["items"]}
    assert set(states) == set(plans)
    for vid, s in states.items():
        # Every field the processor writes is one the API documents, and the documented model reads it.
        undeclared = set(s) - set(LiveState.model_fields)
        assert undeclared == set(), (vid, undeclared)
        LiveState.model_validate(s)
        one = c.get(f"/api/v1/live/{vid}", headers=api.viewer).json()
        assert {k: one[k] for k in s} == s

    stop = states["v-stop"]
    assert stop["status"] == "on_route"
    assert (stop["stop"], stop["stopped_since_ms"]) == ("unplanned", T0 + 70_000)
    assert stop["planned_arrival_ms"] == T0 + 60_000
    assert stop["eta_ms"] > T0 + 89_000  # still 1.3 km to go at the trip's average speed
    assert stop["delay_s"] == round((stop["eta_ms"] - stop["planned_arrival_ms"]) / 1000, 1)
    assert stop["delay_s"] > TRIP_RULES["arrival_risk_s"]
    assert stop["arrival_at_risk"] is True
    assert (stop["wrong_way"], stop["completed"], stop["off_route_m"]) == (False, False, 0.0)
    assert abs(stop["progress_m"] - 700.0) < 1.0

    back = states["v-back"]
    assert back["wrong_way"] is True
    assert abs(back["progress_m"] - 200.0) < 1.0  # where it is now, not the furthest it came
    assert (back["stop"], back["stopped_since_ms"], back["arrival_at_risk"]) == (None, None, False)
    # No planned time in the assignment: the route's planned_duration_s from the trip's start.
    assert back["planned_arrival_ms"] == T0 + 1_800_000
    assert back["eta_ms"] is None  # the trip is younger than the ETA's warm-up
    assert back["delay_s"] is None

    done = states["v-done"]
    assert done["completed"] is True
    assert done["progress_ratio"] > 0.98
    assert (done["wrong_way"], done["stop"], done["arrival_at_risk"]) == (False, None, False)
    assert done["planned_arrival_ms"] == T0 + 3_600_000

    # The open conditions, as the history receiver keeps them, come with the single-vehicle read.
    def open_types(vid: str) -> set[str]:
        body = c.get(f"/api/v1/live/{vid}", headers=api.viewer).json()
        return {a["type"] for a in body["open_alerts"]}

    assert {"UNPLANNED_STOP", "ARRIVAL_AT_RISK"} <= open_types("v-stop")
    assert "WRONG_DIRECTION" in open_types("v-back")
    assert not open_types("v-done") & {"WRONG_DIRECTION", "UNPLANNED_STOP", "ARRIVAL_AT_RISK"}
    # The history filters by the new types, with the details the processor gave.
    stops = c.get("/api/v1/alerts", params={"type": "UNPLANNED_STOP"}, headers=api.viewer).json()["items"]
    assert [(a["vehicle_id"], a["details"]["since_ms"]) for a in stops] == [("v-stop", T0 + 70_000)]
    assert stops[0]["details"]["stopped_s"] >= TRIP_RULES["stop_min_s"]
