"""Admin API over real Redis (fastapi TestClient): CRUD round trips, validation messages,
optimistic concurrency, the auth matrix, bulk import, read models, limits and probes."""

from __future__ import annotations

import copy
import logging
import uuid
from typing import Any

import orjson
import pytest
import redis
from fastapi.testclient import TestClient
from pydantic import BaseModel

from admin_api import problems, read_schemas, schemas
from admin_api.app import create_app
from admin_api.errors import ApiKeyError
from admin_api.schemas import ROUTE_EXAMPLE, ZONE_EXAMPLE
from admin_api.security import (
    Role,
    create_api_key,
    digest,
    key_hash_key,
    names_key,
    revoke_api_key,
)
from admin_api.settings import ApiSettings
from fleetfence import heard
from fleetfence.contracts import alert_id, ms_to_iso
from fleetfence.probes import free_port
from fleetfence.readmodels import ReadKeys
from tests.admin_api.helpers import Api

pytestmark = pytest.mark.services


def route_feature(rid: str = "r1", **props: Any) -> dict[str, Any]:
    f = copy.deepcopy(ROUTE_EXAMPLE)
    f["id"] = rid
    f["properties"].update(props)
    return f


def zone_feature(zid: str = "z1", **props: Any) -> dict[str, Any]:
    f = copy.deepcopy(ZONE_EXAMPLE)
    f["id"] = zid
    f["properties"].update(props)
    return f


def seed(api: Api) -> None:
    assert api.c.post("/api/v1/routes", json=route_feature("r1"), headers=api.admin).status_code == 201
    assert api.c.post("/api/v1/zones", json=zone_feature("z1"), headers=api.admin).status_code == 201
    v = {"vehicle_id": "v1", "label": "Truck 1", "attributes": {"depot": "north"}}
    assert api.c.post("/api/v1/vehicles", json=v, headers=api.admin).status_code == 201
    a = {"vehicle_id": "v1", "route_id": "r1", "valid_from": "2026-11-22T06:00:00Z"}
    assert api.c.post("/api/v1/assignments", json=a, headers=api.admin).status_code == 201


# --------------------------------------------------------------------------- CRUD round trips


def test_route_round_trip_with_etag_and_if_match(api: Api) -> None:
    c = api.c
    created = c.post("/api/v1/routes", json=route_feature("r1"), headers=api.admin)
    assert created.status_code == 201
    assert created.headers["etag"] == '"1"'
    assert created.headers["location"] == "/api/v1/routes/r1"
    body = created.json()
    assert body["type"] == "Feature"
    assert body["geometry"] == ROUTE_EXAMPLE["geometry"]
    assert body["properties"]["corridor_width_m"] == 100
    assert body["properties"]["version"] == 1
    got = c.get("/api/v1/routes/r1", headers=api.viewer)
    assert got.json() == body
    # A GET body can be sent back as is (echoed version/updated are ignored).
    echoed = got.json()
    echoed["properties"]["speed_limit_kmh"] = 30
    put = c.put("/api/v1/routes/r1", json=echoed, headers={**api.admin, "If-Match": got.headers["etag"]})
    assert put.status_code == 200
    assert put.headers["etag"] == '"2"'
    stale = c.put("/api/v1/routes/r1", json=route_feature("r1"), headers={**api.admin, "If-Match": '"1"'})
    assert stale.status_code == 412
    assert stale.headers["etag"] == '"2"'
    assert c.get("/api/v1/routes/r1", headers=api.viewer).json()["properties"]["speed_limit_kmh"] == 30
    assert c.post("/api/v1/routes", json=route_feature("r1"), headers=api.admin).status_code == 409
    assert c.delete("/api/v1/routes/r1", headers={**api.admin, "If-Match": '"1"'}).status_code == 412
    assert c.delete("/api/v1/routes/r1", headers={**api.admin, "If-Match": '"2"'}).status_code == 204
    assert c.get("/api/v1/routes/r1", headers=api.viewer).status_code == 404
    recreated = c.put("/api/v1/routes/r1", json=route_feature("r1"), headers=api.admin)
    assert (recreated.status_code, recreated.headers["etag"]) == (201, '"4"')


def test_zone_vehicle_assignment_round_trips_and_filters(api: Api) -> None:
    c = api.c
    seed(api)
    c.post("/api/v1/zones", json=zone_feature("z2", kind="restricted"), headers=api.admin)
    zones = c.get("/api/v1/zones", params={"kind": "restricted"}, headers=api.viewer).json()
    assert zones["type"] == "FeatureCollection"
    assert [f["id"] for f in zones["features"]] == ["z2"]
    assert c.get("/api/v1/zones/z1", headers=api.viewer).json()["properties"]["dwell_limit_s"] == 3600
    vehicles = c.get("/api/v1/vehicles", params={"attribute": "depot=north"}, headers=api.viewer).json()
    assert [v["vehicle_id"] for v in vehicles["items"]] == ["v1"]
    a = c.get("/api/v1/assignments/v1", headers=api.viewer).json()
    assert a["route_id"] == "r1"
    assert a["valid_from_ms"] == 1_795_327_200_000
    assert a["valid_from"] == "2026-11-22T06:00:00.000Z"
    c.post("/api/v1/routes", json=route_feature("r2"), headers=api.admin)
    moved = c.put("/api/v1/assignments/v1", json={"route_id": "r2"}, headers=api.admin)
    assert (moved.status_code, moved.json()["version"]) == (200, 2)
    assert c.get("/api/v1/assignments", params={"route_id": "r1"}, headers=api.viewer).json()["items"] == []
    assert c.delete("/api/v1/routes/r2", headers=api.admin).status_code == 409  # still assigned
    assert c.delete("/api/v1/vehicles/v1", headers=api.admin).status_code == 409
    assert c.delete("/api/v1/assignments/v1", headers=api.admin).status_code == 204
    assert c.delete("/api/v1/vehicles/v1", headers=api.admin).status_code == 204


CIRCLE = {"type": "Point", "coordinates": [13.405, 52.515], "radius_m": 250.0}


def circle_feature(zid: str = "c1", radius_m: float = 250.0, **props: Any) -> dict[str, Any]:
    f = zone_feature(zid, **props)
    f["geometry"] = {**CIRCLE, "radius_m": radius_m}
    return f


def test_circle_zone_round_trip_versions_and_lists(api: Api) -> None:
    """A circle zone (a Point with radius_m) comes back in the shape it was sent, is versioned like
    any zone, and a GET body can be sent back as is."""
    c = api.c
    created = c.post("/api/v1/zones", json=circle_feature("c1", kind="customer"), headers=api.admin)
    assert created.status_code == 201, created.text
    assert created.headers["etag"] == '"1"'
    body = created.json()
    assert body["geometry"] == CIRCLE
    assert body["properties"]["kind"] == "customer"
    got = c.get("/api/v1/zones/c1", headers=api.viewer)
    assert got.json() == body
    echoed = got.json()
    echoed["geometry"]["radius_m"] = 300.5
    put = c.put("/api/v1/zones/c1", json=echoed, headers={**api.admin, "If-Match": got.headers["etag"]})
    assert (put.status_code, put.headers["etag"]) == (200, '"2"')
    assert put.json()["geometry"] == {**CIRCLE, "radius_m": 300.5}
    same = c.put("/api/v1/zones/c1", json=echoed, headers=api.admin)
    assert same.headers["etag"] == '"2"'  # unchanged: no new version
    stale = c.put("/api/v1/zones/c1", json=circle_feature("c1", 10), headers={**api.admin, "If-Match": '"1"'})
    assert stale.status_code == 412
    polygon = c.put("/api/v1/zones/c1", json=zone_feature("c1"), headers=api.admin)
    assert (polygon.headers["etag"], polygon.json()["geometry"]["type"]) == ('"3"', "Polygon")
    c.post("/api/v1/zones", json=circle_feature("c2"), headers=api.admin)
    listed = c.get("/api/v1/zones", headers=api.viewer).json()
    assert [(f["id"], f["geometry"]["type"]) for f in listed["features"]] == [
        ("c1", "Polygon"),
        ("c2", "Point"),
    ]
    assert listed["features"][1]["geometry"] == CIRCLE
    entries = api.r.xrange(f"{api.p}master:outbox")
    assert entries is not None
    events = [orjson.loads(f[b"event"]) for _sid, f in entries if f is not None]
    zone_events = [(e["id"], e["version"], e["data"]["geometry"].get("radius_m")) for e in events]
    assert zone_events == [("c1", 1, 250.0), ("c1", 2, 300.5), ("c1", 3, None), ("c2", 1, 250.0)]


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ('"radius_m": NaN', "finite number"),
        ('"radius_m": Infinity', "finite number"),
        ('"radius_m": -Infinity', "finite number"),
        ('"radius_m": 1e400', "finite number"),
        ('"radius_m": 0', "greater than 0"),
        ('"radius_m": 50000.5', "less than or equal to 50000"),
        ('"radius_m": "250"', "valid number"),
        ('"radius_m": true', "valid number"),
        ('"radius_m": null', "valid number"),
        ('"radius": 250', "Field required"),
    ],
)
def test_bad_circle_radius_is_a_422_never_a_500(api: Api, raw: str, message: str) -> None:
    """Malformed circles answer 422 naming the problem, NaN and Infinity included (Python's JSON
    parser accepts them), and write nothing."""
    body = orjson.dumps(circle_feature("cb")).decode().replace('"radius_m":250.0', raw)
    assert raw in body
    before = api.r.xlen(f"{api.p}master:outbox")
    res = api.c.post("/api/v1/zones", content=body, headers={**api.admin, "Content-Type": "application/json"})
    assert res.status_code == 422, res.text
    assert message in " | ".join(d["msg"] for d in res.json()["detail"])
    assert api.r.xlen(f"{api.p}master:outbox") == before


@pytest.mark.parametrize(
    ("coordinates", "message"),
    [
        ("[13.4, NaN]", "finite number"),
        ("[Infinity, 52.5]", "finite number"),
        ("[181, 52.5]", "longitude 181.0 outside"),
        ("[13.4, 86]", "85.0 degrees"),
        ("[179.999, 0]", "antimeridian"),
        ("[13.4]", "at least 2"),
        ("[[13.4, 52.5]]", "valid number"),
    ],
)
def test_bad_circle_centre_is_a_422(api: Api, coordinates: str, message: str) -> None:
    body = orjson.dumps(circle_feature("cb")).decode().replace("[13.405,52.515]", coordinates)
    assert coordinates in body
    res = api.c.post("/api/v1/zones", content=body, headers={**api.admin, "Content-Type": "application/json"})
    assert res.status_code == 422, res.text
    assert message in " | ".join(d["msg"] for d in res.json()["detail"])


def test_pagination_visits_every_vehicle_once(api: Api) -> None:
    for i in range(23):
        api.c.post("/api/v1/vehicles", json={"vehicle_id": f"v{i:02d}", "label": "x"}, headers=api.admin)
    seen: list[str] = []
    after: str | None = None
    while True:
        params: dict[str, Any] = {"limit": 10, **({"after": after} if after else {})}
        page = api.c.get("/api/v1/vehicles", params=params, headers=api.viewer).json()
        seen += [v["vehicle_id"] for v in page["items"]]
        after = page["next_after"]
        if after is None:
            break
    assert seen == [f"v{i:02d}" for i in range(23)]


def test_routes_name_contains_filter_is_case_insensitive_and_pages(api: Api) -> None:
    names = {"r1": "Berlin loop", "r2": "Hamburg harbour", "r3": "BERLIN airport run", "r4": "Potsdam"}
    for rid, name in names.items():
        assert api.c.post("/api/v1/routes", json=route_feature(rid, name=name), headers=api.admin).is_success

    def page(**params: Any) -> tuple[list[str], str | None]:
        res = api.c.get("/api/v1/routes", params=params, headers=api.viewer)
        assert res.status_code == 200, res.text
        body = res.json()
        return [f["id"] for f in body["features"]], body["next_after"]

    assert page(name_contains="berlin") == (["r1", "r3"], None)
    assert page(name_contains="HARBOUR") == (["r2"], None)
    assert page(name_contains="rome") == ([], None)
    assert page(name_contains="berlin", limit=1) == (["r1"], "r1")
    assert page(name_contains="berlin", limit=1, after="r1") == (["r3"], "r3")
    assert page(name_contains="berlin", limit=1, after="r3") == ([], None)
    too_long = api.c.get("/api/v1/routes", params={"name_contains": "x" * 201}, headers=api.viewer)
    assert too_long.status_code == 422
    assert "at most 200 characters" in too_long.json()["detail"][0]["msg"]


# --------------------------------------------------------------------------- validation


def _bad_route(**change: Any) -> dict[str, Any]:
    f = route_feature("rb")
    for k, v in change.items():
        if k == "geometry":
            f["geometry"] = v
        else:
            f["properties"][k] = v
    return f


@pytest.mark.parametrize(
    ("path", "body", "message"),
    [
        ("routes", _bad_route(geometry={"type": "LineString", "coordinates": [[13.4, 52.5]]}), "at least 2"),
        (
            "routes",
            _bad_route(geometry={"type": "LineString", "coordinates": [[13.4, 52.5], [13.4, 52.5]]}),
            "at least 2 distinct points",
        ),
        (
            "routes",
            _bad_route(geometry={"type": "LineString", "coordinates": [[13.4, 95], [1, 1]]}),
            "latitude 95",
        ),
        (
            "routes",
            _bad_route(geometry={"type": "LineString", "coordinates": [[181, 52.5], [13.4, 52.5]]}),
            "longitude 181.0 outside [-180, 180]",
        ),
        ("routes", _bad_route(corridor_width_m=0), "greater than 0"),
        ("routes", _bad_route(corridor_width_m=-5), "greater than 0"),
        ("routes", _bad_route(speed_limit_kmh=0), "greater than 0"),
        ("routes", _bad_route(deviation_min_fixes=0), "greater than or equal to 1"),
        ("routes", _bad_route(corridor_witdh_m=10), "Extra inputs"),
        ("routes", {**route_feature("rb"), "id": None}, "needs an id"),
        ("routes", {**route_feature("rb"), "id": "bad id"}, "should match pattern"),
        (
            "zones",
            {
                **zone_feature("zb"),
                "geometry": {"type": "Polygon", "coordinates": [[[0, 0], [1, 1], [1, 0], [0, 1], [0, 0]]]},
            },
            "Self-intersection",
        ),
        (
            "zones",
            {
                **zone_feature("zb"),
                "geometry": {"type": "Polygon", "coordinates": [[[0, 0], [1, 0], [1, 1], [0, 0.5]]]},
            },
            "must be closed",
        ),
        (
            "zones",
            zone_feature("zb", kind="volcano"),
            "'depot', 'restricted', 'customer', 'rest_area' or 'other'",
        ),
        ("vehicles", {"label": "no id"}, "vehicle_id is required"),
        ("vehicles", {"vehicle_id": "v9", "label": ""}, "at least 1 character"),
        ("assignments", {"vehicle_id": "nobody", "route_id": "r1"}, "unknown vehicle"),
        ("assignments", {"vehicle_id": "v1", "route_id": "nowhere"}, "route does not exist"),
        (
            "assignments",
            {
                "vehicle_id": "v1",
                "route_id": "r1",
                "valid_from": "2026-11-22T06:00:00Z",
                "valid_to": "2026-11-22T05:00:00Z",
            },
            "valid_to_ms must be after",
        ),
        (
            "assignments",
            {"vehicle_id": "v1", "route_id": "r1", "valid_from": "2026-11-22T06:00:00"},
            "timezone",
        ),
    ],
)
def test_validation_errors_are_clear_422s(api: Api, path: str, body: dict[str, Any], message: str) -> None:
    api.c.post("/api/v1/vehicles", json={"vehicle_id": "v1", "label": "V"}, headers=api.admin)
    api.c.post("/api/v1/routes", json=route_feature("r1"), headers=api.admin)
    before = api.r.xlen(f"{api.p}master:outbox")
    res = api.c.post(f"/api/v1/{path}", json=body, headers=api.admin)
    assert res.status_code == 422, res.text
    msgs = " | ".join(d["msg"] for d in res.json()["detail"])
    assert message in msgs
    assert api.r.xlen(f"{api.p}master:outbox") == before  # nothing written, no event


def test_malformed_if_match_is_a_failed_precondition(api: Api) -> None:
    seed(api)
    res = api.c.put(
        "/api/v1/routes/r1", json=route_feature("r1"), headers={**api.admin, "If-Match": "banana"}
    )
    assert res.status_code == 412
    assert "ETag" in res.json()["detail"]
    assert (
        api.c.put(
            "/api/v1/routes/nope", json=route_feature("nope"), headers={**api.admin, "If-Match": "*"}
        ).status_code
        == 404
    )


# --------------------------------------------------------------------------- auth matrix

MUTATING = {"post", "put", "delete", "patch"}
# POSTs that change no master data: a viewer may call them.
VIEWER_POSTS = {"/api/v1/stream/token"}


def _operations(client: TestClient) -> list[tuple[str, str]]:
    schema = client.get("/openapi.json").json()
    return [
        (method, path)
        for path, item in schema["paths"].items()
        if path.startswith("/api/v1/")
        for method in item
        if method in {"get", "post", "put", "delete", "patch"}
    ]


# What an admin's call in the matrix returns, exactly. The bodies are minimal but valid, so every
# write succeeds (201 creates, 200 replaces what seed() made); reads of what seed() did not create
# are 404s and the reports without their required from/to are 422s. Anything else is 200.
ADMIN_EXPECTED = {
    ("post", "/api/v1/routes"): 201,
    ("put", "/api/v1/routes/{route_id}"): 200,
    ("post", "/api/v1/zones"): 201,
    ("put", "/api/v1/zones/{zone_id}"): 200,
    ("post", "/api/v1/vehicles"): 201,
    ("put", "/api/v1/vehicles/{vehicle_id}"): 200,
    ("post", "/api/v1/assignments"): 201,  # v-new, created by the vehicles POST before it
    ("put", "/api/v1/assignments/{vehicle_id}"): 200,
    ("post", "/api/v1/import"): 200,  # an empty collection: nothing to write, counts all 0
    ("post", "/api/v1/stream/token"): 200,
    ("post", "/api/v1/vehicles/{vehicle_id}/credentials"): 201,  # issued to v1, in the real broker
    ("put", "/api/v1/vehicles/{vehicle_id}/trackers/{protocol}/{tracker_id}"): 201,  # bound to v1
    ("get", "/api/v1/live/{vehicle_id}"): 404,  # no fix processed for v1
    ("get", "/api/v1/alerts/{alert_id}"): 404,
}


def _call(api: Api, method: str, path: str, headers: dict[str, str], query: str = "") -> int:
    url = path.replace("{route_id}", "r1").replace("{zone_id}", "z1").replace("{vehicle_id}", "v1")
    url = url.replace("{alert_id}", "abc123").replace("{protocol}", "teltonika")
    url = url.replace("{tracker_id}", "356307042441013") + query
    if path == "/api/v1/stream":
        # An endless body: take the status once the response starts, then hang up (the client
        # closes the stream at once, as a browser leaving the page does).
        with api.c.stream("GET", url, headers=headers) as res:
            if res.status_code == 200:
                assert res.headers["content-type"].startswith("text/event-stream")
            return int(res.status_code)  # TestClient's responses are untyped without httpx2
    body: Any = None
    if method in {"post", "put"}:
        body = {
            "/api/v1/routes": route_feature("r-new"),
            "/api/v1/routes/{route_id}": route_feature("r1"),
            "/api/v1/zones": zone_feature("z-new"),
            "/api/v1/zones/{zone_id}": zone_feature("z1"),
            "/api/v1/vehicles": {"vehicle_id": "v-new", "label": "x"},
            "/api/v1/vehicles/{vehicle_id}": {"label": "y"},
            "/api/v1/assignments": {"vehicle_id": "v-new", "route_id": "r1"},
            "/api/v1/assignments/{vehicle_id}": {"route_id": "r1"},
            "/api/v1/import": {"type": "FeatureCollection", "features": []},
            "/api/v1/stream/token": None,
            "/api/v1/vehicles/{vehicle_id}/credentials": None,
            "/api/v1/vehicles/{vehicle_id}/credentials/rotate": None,
            "/api/v1/vehicles/{vehicle_id}/credentials/disable": None,
            "/api/v1/vehicles/{vehicle_id}/credentials/enable": None,
            "/api/v1/vehicles/{vehicle_id}/trackers/{protocol}/{tracker_id}": None,
        }[path]
    return int(api.c.request(method.upper(), url, json=body, headers=headers).status_code)


def _reports_need_a_range(path: str) -> bool:
    return path.startswith("/api/v1/reports/")


def test_auth_matrix_every_route(api: Api) -> None:
    seed(api)
    ops = _operations(api.c)
    assert len(ops) >= 24
    assert ("get", "/api/v1/stream") in ops
    problems = []
    for method, path in ops:
        for who, headers in (("none", {}), ("bogus", {"X-API-Key": "ffk_not-a-key"})):
            if (code := _call(api, method, path, headers)) != 401:
                problems.append((method, path, who, code))
        viewer = _call(api, method, path, api.viewer)
        if path in VIEWER_POSTS:
            if viewer != 200:
                problems.append((method, path, "viewer", viewer))
        elif method in MUTATING and viewer != 403:
            problems.append((method, path, "viewer", viewer))
        if method not in MUTATING and viewer in (401, 403):
            problems.append((method, path, "viewer", viewer))
        # Deletes last in the matrix would break later calls, so admins write to throwaway ids.
        if method != "delete":
            admin = _call(api, method, path, api.admin)
            expected = ADMIN_EXPECTED.get((method, path), 422 if _reports_need_a_range(path) else 200)
            if admin != expected:
                problems.append((method, path, "admin", admin))
    # The stream also takes a short-lived token instead of the header (EventSource cannot send one).
    token = api.c.post("/api/v1/stream/token", headers=api.viewer).json()["token"]
    for who, query, expected in (
        ("viewer token", f"?token={token}", 200),
        ("bogus token", "?token=fft_not-a-token", 401),
        ("api key as token", f"?token={api.viewer['X-API-Key']}", 401),
    ):
        if (code := _call(api, "get", "/api/v1/stream", {}, query)) != expected:
            problems.append(("get", "/api/v1/stream", who, code))
    assert problems == []
    # A viewer cannot revoke a vehicle's credentials, an admin can (the status stays readable).
    creds = "/api/v1/vehicles/v1/credentials"
    assert api.c.delete(creds, headers=api.viewer).status_code == 403
    assert api.c.delete(creds, headers=api.admin).json()["status"] == "revoked"
    assert api.c.get(creds, headers=api.viewer).json()["status"] == "revoked"
    # Deletes with an admin key succeed once the references are gone.
    for path in (
        "/api/v1/assignments/v-new",
        "/api/v1/assignments/v1",
        "/api/v1/vehicles/v1",
        "/api/v1/routes/r1",
        "/api/v1/zones/z1",
    ):
        assert api.c.delete(path, headers=api.admin).status_code == 204, path


def test_revoked_key_is_refused(api: Api) -> None:
    assert api.c.get("/api/v1/routes", headers=api.viewer).status_code == 200
    revoke_api_key(api.r, api.p, "viewer")
    assert api.c.get("/api/v1/routes", headers=api.viewer).status_code == 401
    assert api.r.keys(f"{api.p}apikey:*") != []  # the admin key is still there, stored hashed
    assert all(
        api.admin["X-API-Key"].encode() not in (api.r.dump(k) or b"") for k in api.r.keys(f"{api.p}apikey*")
    )


def test_corrupt_stored_role_is_refused_with_a_warning(api: Api, caplog: pytest.LogCaptureFixture) -> None:
    """A role value that is not a Role (hand-edited, or written by a newer version) must make the
    key invalid (401), for the header and for stream tokens issued to it, not crash every request."""
    viewer_key = api.viewer["X-API-Key"]
    token = api.c.post("/api/v1/stream/token", headers=api.viewer).json()["token"]
    api.r.hset(key_hash_key(api.p, digest(viewer_key)), "role", "superuser")
    with caplog.at_level(logging.WARNING, logger="admin_api.security"):
        res = api.c.get("/api/v1/routes", headers=api.viewer)
        assert (res.status_code, res.json()["detail"]) == (401, "unknown or revoked API key")
        assert api.c.get("/api/v1/stream", params={"token": token}).status_code == 401
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 2, warnings
    assert all("invalid stored role" in w and "'superuser'" in w for w in warnings)
    assert not any(viewer_key in w for w in warnings)  # the log never carries the key
    assert api.c.get("/api/v1/routes", headers=api.admin).status_code == 200  # others unaffected


def test_create_api_key_writes_name_and_key_in_one_atomic_command(api: Api) -> None:
    """The name and the key's hash are written by one server-side script, so no crash can leave a
    name without its key. A crash cannot be placed between two commands on purpose, so the test
    watches the wire (MONITOR): no write to the key store may come as a plain client command."""
    monitor_client = redis.Redis.from_url(api.settings.redis_dsn, socket_timeout=10)
    marker = f"end-{uuid.uuid4().hex}"
    try:
        # redis leaves Redis.monitor() unannotated.
        with monitor_client.monitor() as m:  # type: ignore[no-untyped-call]
            key = create_api_key(api.r, api.p, "ops", Role.VIEWER)
            with pytest.raises(ApiKeyError, match="already exists"):
                create_api_key(api.r, api.p, "ops", Role.ADMIN)
            api.r.echo(marker)
            seen: list[dict[str, Any]] = []
            while marker not in (cmd := m.next_command())["command"]:  # socket_timeout is the deadline
                seen.append(cmd)
    finally:
        monitor_client.close()
    ours = [c for c in seen if api.p in c["command"]]
    plain = [c["command"] for c in ours if c["client_type"] != "lua" and c["command"].split()[0] != "EVALSHA"]
    assert plain == []
    assert sum(c["client_type"] == "lua" and c["command"].startswith("HSETNX") for c in ours) == 2
    assert sum(c["client_type"] == "lua" and c["command"].startswith("HSET ") for c in ours) == 1
    # The refused duplicate left the first key as it was, and wrote no second key.
    assert api.r.hget(names_key(api.p), "ops") == digest(key).encode()
    assert api.r.hget(key_hash_key(api.p, digest(key)), "role") == b"viewer"
    assert len(api.r.keys(f"{api.p}apikey:*")) == 3  # admin, viewer, ops


# --------------------------------------------------------------------------- bulk import


def test_bulk_import_counts_reconcile_and_reimport_is_unchanged(api: Api) -> None:
    features = [route_feature(f"r{i}") for i in range(3)] + [zone_feature("z1")]
    features += [
        {
            "type": "Feature",
            "id": f"v{i}",
            "geometry": None,
            "properties": {"entity": "vehicle", "label": f"V{i}"},
        }
        for i in range(4)
    ]
    features.insert(
        0,
        {  # before its vehicle and route in the file: the import orders it last
            "type": "Feature",
            "id": "v0",
            "geometry": None,
            "properties": {"entity": "assignment", "route_id": "r2", "valid_from_ms": 1_795_320_000_000},
        },
    )
    fc = {"type": "FeatureCollection", "features": features}
    res = api.c.post("/api/v1/import", json=fc, headers=api.admin).json()
    assert res == {
        "received": 9,
        "created": 9,
        "updated": 0,
        "unchanged": 0,
        "by_entity": {"vehicle": 4, "route": 3, "zone": 1, "assignment": 1},
    }
    assert api.r.xlen(f"{api.p}master:outbox") == 9
    features[1]["properties"]["name"] = "renamed"  # r0
    again = api.c.post("/api/v1/import", json=fc, headers=api.admin).json()
    assert (again["received"], again["created"], again["updated"], again["unchanged"]) == (9, 0, 1, 8)
    assert api.r.xlen(f"{api.p}master:outbox") == 10


def test_bulk_import_rejects_whole_file_listing_every_problem(api: Api) -> None:
    fc = {
        "type": "FeatureCollection",
        "features": [
            route_feature("ok"),
            _bad_route(corridor_width_m=0),
            {
                "type": "Feature",
                "id": "v1",
                "geometry": None,
                "properties": {"entity": "assignment", "route_id": "ok", "valid_from_ms": 0},
            },
            {"type": "Feature", "geometry": {"type": "Point", "coordinates": [0, 0]}, "properties": {}},
        ],
    }
    res = api.c.post("/api/v1/import", json=fc, headers=api.admin)
    assert res.status_code == 422
    locs = sorted(d["loc"][2] for d in res.json()["detail"])
    assert locs == [1, 3]  # the dangling assignment is reported once the rest is valid
    assert api.r.xlen(f"{api.p}master:outbox") == 0
    fc["features"] = [fc["features"][0], fc["features"][2]]
    res = api.c.post("/api/v1/import", json=fc, headers=api.admin)
    assert res.status_code == 422
    assert res.json()["detail"][0]["loc"] == ["body", "features", 1, "vehicle_id"]
    assert "unknown vehicle 'v1'" in res.json()["detail"][0]["msg"]
    assert api.r.xlen(f"{api.p}master:outbox") == 0


# --------------------------------------------------------------------------- read models


def _alert(vid: str, atype: str, seq: int, ts_ms: int) -> dict[str, Any]:
    return {
        "alert_id": alert_id(vid, atype, seq),
        "type": atype,
        "vehicle_id": vid,
        "route_id": "r1",
        "route_version": 1,
        "seq": seq,
        "ts_ms": ts_ms,
        "ts": "2026-11-22T08:15:30.250Z",
        "lat": 52.52,
        "lon": 13.40,
        "details": {},
    }


def write_alert(api: Api, a: dict[str, Any]) -> None:
    """As the alert history receiver does (docs/contracts.md, Redis read models)."""
    p, r = api.p, api.r
    r.set(f"{p}alert:{a['alert_id']}", orjson.dumps(a), nx=True)
    r.zadd(f"{p}alerts:by_ts", {a["alert_id"]: a["ts_ms"]})
    r.zadd(f"{p}alerts:vehicle:{a['vehicle_id']}", {a["alert_id"]: a["ts_ms"]})
    r.zadd(f"{p}alerts:type:{a['type']}", {a["alert_id"]: a["ts_ms"]})


def write_live(api: Api, vid: str, seq: int, ts_ms: int, status: str) -> dict[str, Any]:
    """As the processor does."""
    state = {
        "vehicle_id": vid,
        "seq": seq,
        "ts_ms": ts_ms,
        "lat": 52.52,
        "lon": 13.4,
        "speed_kmh": 40.0,
        "status": status,
        "overspeed": False,
        "silent": False,
        "route_id": "r1",
        "route_version": 1,
        "progress_m": 120.5,
        "progress_ratio": 0.1,
        "zones": [],
        "h3": "891f1d48177ffff",
        "updated_ms": ts_ms + 50,
    }
    api.r.set(f"{api.p}live:{vid}", orjson.dumps(state))
    api.r.zadd(f"{api.p}live:index", {vid: ts_ms})
    return state


def test_an_assignment_after_telemetry_already_received_answers_with_a_warning(api: Api) -> None:
    """Fixes before valid_from stay unassigned; an assignment that leaves the vehicle's telemetry
    so far uncovered says so instead of keeping silent."""
    seed(api)
    v = {"vehicle_id": "v7", "label": "Truck 7"}
    assert api.c.post("/api/v1/vehicles", json=v, headers=api.admin).status_code == 201
    last_fix = 1_795_320_000_000  # 2026-11-22T04:00:00Z
    write_live(api, "v7", 40, last_fix, "unassigned")
    after = {"vehicle_id": "v7", "route_id": "r1", "valid_from": "2026-11-22T06:00:00Z"}
    res = api.c.post("/api/v1/assignments", json=after, headers=api.admin)
    assert res.status_code == 201
    assert int(res.headers["content-length"]) == len(res.content)  # the length of the new body
    (warning,) = res.json()["warnings"]
    assert "v7 already sent telemetry up to 2026-11-22T04:00:00" in warning
    assert "valid_from 2026-11-22T06:00:00" in warning
    assert res.headers["ETag"]
    # Covering it: no warning; nor for a vehicle that has sent nothing yet (v1).
    before = {"route_id": "r1", "valid_from": "2026-11-22T03:00:00Z"}
    res = api.c.put("/api/v1/assignments/v7", json=before, headers=api.admin)
    assert res.status_code == 200
    assert res.json().get("warnings", []) == []
    res = api.c.put("/api/v1/assignments/v1", json={"route_id": "r1"}, headers=api.admin)
    assert res.json().get("warnings", []) == []
    # A GET never carries the write's warnings.
    assert "warnings" not in api.c.get("/api/v1/assignments/v7", headers=api.viewer).json()


def test_live_state_with_open_alerts_and_status_filter(api: Api) -> None:
    t0 = 1_795_320_000_000
    write_live(api, "v1", 10, t0, "off_route")
    write_live(api, "v2", 11, t0 + 1000, "on_route")
    write_live(api, "v3", 12, t0 + 2000, "off_route")
    dev = _alert("v1", "ROUTE_DEVIATION", 9, t0 - 500)
    write_alert(api, dev)
    api.r.hset(f"{api.p}alerts:open:v1", "ROUTE_DEVIATION", dev["alert_id"])
    one = api.c.get("/api/v1/live/v1", headers=api.viewer).json()
    assert one["status"] == "off_route"
    assert [a["alert_id"] for a in one["open_alerts"]] == [dev["alert_id"]]
    assert api.c.get("/api/v1/live/v9", headers=api.viewer).status_code == 404
    everyone = api.c.get("/api/v1/live", headers=api.viewer).json()
    assert [s["vehicle_id"] for s in everyone["items"]] == ["v3", "v2", "v1"]
    off = api.c.get("/api/v1/live", params={"status": "off_route", "limit": 1}, headers=api.viewer).json()
    assert [s["vehicle_id"] for s in off["items"]] == ["v3"]
    rest = api.c.get(
        "/api/v1/live", params={"status": "off_route", "offset": off["next_offset"]}, headers=api.viewer
    ).json()
    assert [s["vehicle_id"] for s in rest["items"]] == ["v1"]


def test_alert_history_filters_and_pages(api: Api) -> None:
    t0 = 1_795_320_000_000
    alerts = [
        _alert(f"v{i % 3}", ["OVERSPEED", "ROUTE_DEVIATION"][i % 2], i, t0 + i * 1000) for i in range(30)
    ]
    for a in alerts:
        write_alert(api, a)
    c, h = api.c, api.viewer

    def ids(**params: Any) -> list[str]:
        return [a["alert_id"] for a in c.get("/api/v1/alerts", params=params, headers=h).json()["items"]]

    newest_first = sorted(alerts, key=lambda a: -a["ts_ms"])
    assert ids() == [a["alert_id"] for a in newest_first]
    assert ids(vehicle_id="v1") == [a["alert_id"] for a in newest_first if a["vehicle_id"] == "v1"]
    assert ids(type="OVERSPEED") == [a["alert_id"] for a in newest_first if a["type"] == "OVERSPEED"]
    both = [a["alert_id"] for a in newest_first if a["vehicle_id"] == "v1" and a["type"] == "OVERSPEED"]
    assert ids(vehicle_id="v1", type="OVERSPEED") == both
    window = [a["alert_id"] for a in newest_first if t0 + 5000 <= a["ts_ms"] <= t0 + 9000]
    assert ids(since_ms=t0 + 5000, until_ms=t0 + 9000) == window
    paged: list[str] = []
    offset: int | None = 0
    while offset is not None:
        page = c.get(
            "/api/v1/alerts", params={"type": "ROUTE_DEVIATION", "limit": 4, "offset": offset}, headers=h
        ).json()
        paged += [a["alert_id"] for a in page["items"]]
        offset = page["next_offset"]
    assert paged == ids(type="ROUTE_DEVIATION")
    assert c.get(f"/api/v1/alerts/{alerts[3]['alert_id']}", headers=h).json() == alerts[3]
    assert c.get("/api/v1/alerts", params={"type": "NOPE"}, headers=h).status_code == 422


# --------------------------------------------------------------------------- limits, CORS, probes


def test_request_size_limit_and_cors(api: Api) -> None:
    huge = {"type": "FeatureCollection", "features": [], "pad": "x" * (70 * 1024)}
    res = api.c.post("/api/v1/import", json=huge, headers=api.admin)
    assert res.status_code == 413
    pre = api.c.options(
        "/api/v1/routes",
        headers={
            "Origin": "https://ops.example",
            "Access-Control-Request-Method": "PUT",
            "Access-Control-Request-Headers": "X-API-Key, If-Match",
        },
    )
    assert pre.status_code == 200
    assert pre.headers["access-control-allow-origin"] == "https://ops.example"
    evil = api.c.options(
        "/api/v1/routes", headers={"Origin": "https://evil.example", "Access-Control-Request-Method": "GET"}
    )
    assert "access-control-allow-origin" not in evil.headers


def _resolve(schema: dict[str, Any], node: dict[str, Any]) -> dict[str, Any]:
    while "$ref" in node:
        node = schema["components"]["schemas"][node["$ref"].rsplit("/", 1)[1]]
    return node


def _has_example(schema: dict[str, Any], media: dict[str, Any]) -> bool:
    """An example on the media type (example/examples) or on the (resolved) schema."""
    if media.get("example") is not None or media.get("examples"):
        return True
    resolved = _resolve(schema, media.get("schema", {}))
    return bool(resolved.get("examples")) or resolved.get("example") is not None


def test_health_ready_metrics_and_openapi_examples(api: Api) -> None:
    assert api.c.get("/healthz").json() == {"status": "ok"}
    ready = api.c.get("/readyz")
    assert ready.status_code == 200, ready.text
    assert ready.json()["checks"]["redis"] == "ok"
    api.c.get("/api/v1/routes", headers=api.viewer)
    metrics = api.c.get("/metrics").text
    assert 'fleetfence_api_requests_total{method="GET",route="/api/v1/routes",status="200"}' in metrics
    schema = api.c.get("/openapi.json").json()
    assert "X-API-Key" in str(schema["components"]["securitySchemes"])
    # Every request body and every JSON response (2xx and errors) of every operation has an example.
    missing = []
    operations = 0
    for path, item in schema["paths"].items():
        for method, op in item.items():
            operations += 1
            body = op.get("requestBody")
            if body is not None:
                json_bodies = [m for t, m in body["content"].items() if t.endswith("json")]
                if not json_bodies or not all(_has_example(schema, m) for m in json_bodies):
                    missing.append(f"{method} {path} request body")
            for status, response in op["responses"].items():
                for media_type, media in response.get("content", {}).items():
                    if media_type.endswith("json") and not _has_example(schema, media):
                        missing.append(f"{method} {path} {status} {media_type}")
            ok = [s for s in op["responses"] if s.startswith("2")]
            json_ok = any(t.endswith("json") for s in ok for t in op["responses"][s].get("content", {}))
            documented = path == "/api/v1/stream" or method == "delete" or json_ok
            if path.startswith("/api/v1/") and not documented:  # every JSON read and write
                missing.append(f"{method} {path}: no JSON 2xx body")
    assert operations >= 30
    assert missing == []
    # The examples are real: each validates against its own model.
    for module in (schemas, read_schemas, problems):
        for model in vars(module).values():
            if (
                not (isinstance(model, type) and issubclass(model, BaseModel))
                or model.__module__ != module.__name__
            ):
                continue
            extra = model.model_config.get("json_schema_extra")
            examples = extra.get("examples", []) if isinstance(extra, dict) else []
            assert isinstance(examples, list), model
            for example in examples:
                model.model_validate(example)
    # Liveness vs readiness is part of the contract.
    healthz, readyz = schema["paths"]["/healthz"]["get"], schema["paths"]["/readyz"]["get"]
    assert "Liveness" in healthz["description"]
    assert "checks no dependency" in healthz["description"]
    assert "Readiness" in readyz["description"]
    assert "503" in readyz["responses"]


def test_readyz_reports_unreachable_kafka(api_conf: ApiSettings) -> None:
    conf = api_conf.model_copy(update={"kafka_bootstrap": f"127.0.0.1:{free_port()}"})
    with TestClient(create_app(conf)) as c:
        res = c.get("/readyz")
    assert res.status_code == 503
    assert res.json()["checks"]["kafka"].startswith("unreachable")
    assert res.json()["checks"]["redis"] == "ok"


def test_readyz_reports_unreachable_redis_while_healthz_stays_live(api_conf: ApiSettings) -> None:
    """Nothing listens on the port: readiness fails and names Redis; liveness checks no dependency,
    so it still answers 200 (a restart would not bring Redis back)."""
    conf = api_conf.model_copy(update={"redis_url": f"redis://127.0.0.1:{free_port()}/0"})
    with TestClient(create_app(conf)) as c:
        live = c.get("/healthz")
        res = c.get("/readyz")
    assert (live.status_code, live.json()) == (200, {"status": "ok"})
    assert res.status_code == 503, res.text
    body = res.json()
    assert body["ready"] is False
    assert body["checks"]["redis"].startswith("unreachable: "), body
    assert not body["checks"]["kafka"].startswith("unreachable"), body


def test_credentials_while_the_broker_is_unreachable(api: Api) -> None:
    """The credential status is read from Redis alone; a change needs the broker and answers 503
    without it; a vehicle deleted then says its credentials could not be revoked, and how to
    finish (the broker is really unreachable: a second app on a port nothing listens on)."""
    v = {"vehicle_id": "v-out", "label": "x"}
    assert api.c.post("/api/v1/vehicles", json=v, headers=api.admin).status_code == 201
    issued = api.c.post("/api/v1/vehicles/v-out/credentials", headers=api.admin)
    assert issued.status_code == 201, issued.text
    cut_off = api.settings.model_copy(update={"mqtt_url": f"mqtt://127.0.0.1:{free_port()}"})
    with TestClient(create_app(cut_off)) as other:
        status = other.get("/api/v1/vehicles/v-out/credentials", headers=api.viewer)
        assert status.json()["status"] == "active"
        rotate = other.post("/api/v1/vehicles/v-out/credentials/rotate", headers=api.admin)
        assert rotate.status_code == 503
        gone = other.delete("/api/v1/vehicles/v-out", headers=api.admin)
        assert gone.status_code == 503
        assert "was deleted" in gone.json()["detail"]
        assert "DELETE /api/v1/vehicles/v-out/credentials" in gone.json()["detail"]
    assert api.c.get("/api/v1/vehicles/v-out", headers=api.viewer).status_code == 404
    # With the broker back, the credentials are revoked as the answer said.
    revoked = api.c.delete("/api/v1/vehicles/v-out/credentials", headers=api.admin)
    assert revoked.json()["status"] == "revoked"


def test_trackers_are_bound_to_one_vehicle_each_and_go_with_it(api: Api) -> None:
    """A Teltonika unit is admitted by its IMEI's binding: one vehicle per tracker (a second vehicle
    is refused with 409), ids the protocol does not allow are 422, and deleting the vehicle unbinds
    its trackers, so the IMEI can be bound again."""
    for vid in ("t-a", "t-b"):
        assert api.c.post("/api/v1/vehicles", json={"vehicle_id": vid}, headers=api.admin).status_code == 201
    imei = "356307042441013"
    at = f"/api/v1/vehicles/t-a/trackers/teltonika/{imei}"
    first = api.c.put(at, headers=api.admin)
    assert first.status_code == 201, first.text
    assert first.json() == {"vehicle_id": "t-a", "protocol": "teltonika", "tracker_id": imei}
    assert api.c.put(at, headers=api.admin).status_code == 200  # bound already: nothing changes
    taken = api.c.put(f"/api/v1/vehicles/t-b/trackers/teltonika/{imei}", headers=api.admin)
    assert taken.status_code == 409, taken.text
    assert "t-a" in taken.text
    for bad in ("12345", "35630704244101x", "3563070424410131"):
        r = api.c.put(f"/api/v1/vehicles/t-b/trackers/teltonika/{bad}", headers=api.admin)
        assert r.status_code == 422, (bad, r.text)
    assert api.c.put(f"/api/v1/vehicles/t-b/trackers/nokia/{imei}", headers=api.admin).status_code == 422
    # Traccar Client's id is free text within a narrow alphabet; the same IMEI digits are another
    # protocol's tracker, so they bind to another vehicle.
    phone = api.c.put(f"/api/v1/vehicles/t-b/trackers/osmand/{imei}", headers=api.admin)
    assert phone.status_code == 201, phone.text
    assert api.c.put("/api/v1/vehicles/t-b/trackers/osmand/van%202", headers=api.admin).status_code == 422
    assert api.c.delete(f"/api/v1/vehicles/t-b/trackers/osmand/{imei}", headers=api.admin).status_code == 204
    assert (
        api.c.put(f"/api/v1/vehicles/nobody/trackers/teltonika/{imei}", headers=api.admin).status_code == 404
    )
    assert api.c.put(at, headers=api.viewer).status_code == 403
    listed = api.c.get("/api/v1/vehicles/t-a/trackers", headers=api.viewer)
    assert listed.json() == [{"vehicle_id": "t-a", "protocol": "teltonika", "tracker_id": imei}]

    assert (
        api.c.delete(f"/api/v1/vehicles/t-b/trackers/teltonika/{imei}", headers=api.admin).status_code == 404
    )
    assert api.c.delete("/api/v1/vehicles/t-a", headers=api.admin).status_code == 204
    again = api.c.put(f"/api/v1/vehicles/t-b/trackers/teltonika/{imei}", headers=api.admin)
    assert again.status_code == 201, "the deleted vehicle's tracker is free again"
    assert (
        api.c.delete(f"/api/v1/vehicles/t-b/trackers/teltonika/{imei}", headers=api.admin).status_code == 204
    )
    assert api.c.get("/api/v1/vehicles/t-b/trackers", headers=api.viewer).json() == []


def test_which_protocol_a_vehicle_was_last_heard_on(api: Api) -> None:
    """The device edge's read model of how each vehicle was last heard (fleetfence.heard), as the
    API serves it: nulls before the first fix, then the protocol, when and through which replica."""
    assert api.c.post("/api/v1/vehicles", json={"vehicle_id": "h-1"}, headers=api.admin).status_code == 201
    before = api.c.get("/api/v1/vehicles/h-1/heard", headers=api.viewer)
    assert before.status_code == 200, before.text
    assert before.json() == {"vehicle_id": "h-1", "protocol": None, "heard_at": None, "replica": None}
    at_ms = 1_765_115_001_512
    heard.write(api.r, ReadKeys(api.p), {b"h-1": heard.Heard("teltonika", at_ms, "fleetfence-gw-2")})
    got = api.c.get("/api/v1/vehicles/h-1/heard", headers=api.viewer).json()
    assert got == {
        "vehicle_id": "h-1",
        "protocol": "teltonika",
        "heard_at": ms_to_iso(at_ms),
        "replica": "fleetfence-gw-2",
    }
    assert api.c.delete("/api/v1/vehicles/h-1", headers=api.admin).status_code == 204
    gone = api.c.get("/api/v1/vehicles/h-1/heard", headers=api.viewer).json()
    assert gone["protocol"] is None, "a deleted vehicle leaves the read model with it"
    assert api.r.zscore(ReadKeys(api.p).heard_by("teltonika"), "h-1") is None
    nobody = api.c.get("/api/v1/vehicles/nobody/heard", headers=api.viewer)
    assert nobody.status_code == 200, nobody.text
    assert nobody.json()["protocol"] is None
