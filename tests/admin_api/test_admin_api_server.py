"""The admin API as deployed: `fleetfence api` (uvicorn, outbox relay inside) as a real
subprocess. Checks the relay end to end, the SSE stream, and runs schemathesis over the whole
OpenAPI schema (as admin, viewer and anonymous) asserting no server error and the role rules."""

from __future__ import annotations

import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable
from typing import Any

import httpx
import orjson
import pytest
import schemathesis
from confluent_kafka import TopicPartition
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from schemathesis.core.result import Err

from admin_api.schemas import ROUTE_EXAMPLE
from fleetfence.kafka import group_consumer
from tests.admin_api.helpers import ApiServer

pytestmark = pytest.mark.services


def test_write_reaches_fleet_master_through_the_in_process_relay(api_server: ApiServer) -> None:
    feature = {**ROUTE_EXAMPLE, "id": "r-relay"}
    res = httpx.post(f"{api_server.base}/api/v1/routes", json=feature, headers=api_server.admin)
    assert res.status_code == 201, res.text
    c = group_consumer(api_server.conf.bootstrap_servers, f"t-{uuid.uuid4().hex}")
    c.assign([TopicPartition(api_server.conf.topics.master, 0, 0)])
    found: list[dict[str, Any]] = []
    deadline = time.monotonic() + 20
    try:
        while not found and time.monotonic() < deadline:
            m = c.poll(0.2)
            if m is not None and m.error() is None and m.key() == b"route:r-relay":
                found.append(orjson.loads(m.value()))
    finally:
        c.close()
    assert found, "the route's change event never reached fleet.master"
    assert found[0]["entity"] == "route"
    assert found[0]["version"] == 1
    assert found[0]["data"]["geometry"] == ROUTE_EXAMPLE["geometry"]


def test_sse_stream_delivers_alerts_and_positions(api_server: ApiServer) -> None:
    p = api_server.conf.redis_prefix
    assert httpx.get(f"{api_server.base}/api/v1/stream").status_code == 401
    events: list[tuple[str, Any]] = []
    opened = threading.Event()

    def read() -> None:
        params = {"vehicle_id": "v1"}
        with httpx.stream(
            "GET", f"{api_server.base}/api/v1/stream", params=params, headers=api_server.viewer, timeout=10
        ) as resp:
            assert resp.status_code == 200
            assert resp.headers["content-type"].startswith("text/event-stream")
            opened.set()
            name = None
            for line in resp.iter_lines():
                if line.startswith("event: "):
                    name = line.removeprefix("event: ")
                elif line.startswith("data: ") and name:
                    events.append((name, orjson.loads(line.removeprefix("data: "))))
                    if len(events) == 2:
                        return

    t = threading.Thread(target=read, daemon=True)
    t.start()
    assert opened.wait(10)
    alert = {"alert_id": "abc", "type": "OVERSPEED", "vehicle_id": "v1", "seq": 1, "ts_ms": 1}
    other = {**alert, "vehicle_id": "v2"}
    positions = [{"vehicle_id": "v1", "seq": 5}, {"vehicle_id": "v2", "seq": 6}]

    def published() -> bool:  # the subscription is in place before the 200, so one round suffices
        api_server.r.publish(f"{p}live:alerts", orjson.dumps(other))
        api_server.r.publish(f"{p}live:alerts", orjson.dumps(alert))
        api_server.r.publish(f"{p}live:positions", orjson.dumps(positions))
        return True

    published()
    t.join(10)
    assert not t.is_alive(), f"stream did not deliver both events: {events}"
    assert events == [("alert", alert), ("positions", [positions[0]])]


# --------------------------------------------------------------------------- schemathesis


def _operations(api_server: ApiServer) -> list[Any]:
    """Every operation but the endless SSE stream (its auth is in test_auth_matrix_every_route)."""
    schema = schemathesis.openapi.from_url(f"{api_server.base}/openapi.json").exclude(path="/api/v1/stream")
    operations = []
    for result in schema.get_all_operations():
        if isinstance(result, Err):
            raise result.err()
        operations.append(result.ok())
    assert len(operations) >= 27
    return operations


def _for_each_case(op: Any, max_examples: int, check: Callable[[Any], None]) -> None:
    """Run `check` on property-based cases of one operation.

    Hypothesis drives schemathesis' strategies directly: its pytest plugin (`from_fixture`) does
    not work with this pytest version.
    """

    @given(case=op.as_strategy())
    @settings(
        max_examples=max_examples,
        deadline=None,
        derandomize=True,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    def run(case: Any) -> None:
        check(case)

    run()


def test_schemathesis_no_server_errors(api_server: ApiServer) -> None:
    """Every operation (but the endless SSE stream), property-based bodies/params/headers, as admin."""
    calls: Counter[int] = Counter()
    failures: list[str] = []

    def check(case: Any) -> None:
        response = case.call(headers=api_server.admin, timeout=10)
        calls[response.status_code] += 1
        if response.status_code >= 500:
            failures.append(f"{case.operation.label}: {response.status_code} {case.as_curl_command()}")

    for op in _operations(api_server):
        _for_each_case(op, 12, check)
    assert failures == []
    assert sum(calls.values()) >= 200
    assert any(200 <= code < 300 for code in calls), calls  # some generated requests succeeded


# POSTs that change no master data: a viewer may call them.
VIEWER_POSTS = {"/api/v1/stream/token"}


def test_schemathesis_viewer_and_anonymous_callers(api_server: ApiServer) -> None:
    """The same generated requests with a viewer key and with no key: never a 5xx; without a key
    every /api/v1 operation is a 401 whatever the parameters; a viewer's write is a 403 (the role
    is checked before the body), a viewer's read is never refused."""
    problems: list[str] = []
    calls = 0

    def check(case: Any) -> None:
        nonlocal calls
        op = case.operation
        api = op.path.startswith("/api/v1/")
        write = op.method.lower() in {"post", "put", "delete", "patch"} and op.path not in VIEWER_POSTS
        if case.headers:  # the schema's security scheme may make schemathesis send a key of its own
            case.headers = {k: v for k, v in case.headers.items() if k.lower() != "x-api-key"}
        for who, headers in (("viewer", api_server.viewer), ("anonymous", {})):
            code = case.call(headers=headers, timeout=10).status_code
            calls += 1
            expected = None
            if api and who == "anonymous":
                expected = 401
            elif api and write:
                expected = 403
            refused = api and not write and who == "viewer" and code in (401, 403)
            if code >= 500 or refused or (expected is not None and code != expected):
                problems.append(f"{op.label} {who}: {code} {case.as_curl_command()}")

    for op in _operations(api_server):
        _for_each_case(op, 3, check)
    assert problems == []
    assert calls >= 100


# --------------------------------------------------------------------------- numbers JSON cannot carry

# Raw JSON tokens that Python's parser accepts (or turns into infinity) but no field can hold: each
# must be answered with a 4xx naming where it was, never a 500, and nothing stored.
BAD_NUMBERS = ["NaN", "Infinity", "-Infinity", "1e400", "-1e400", "9" * 400, "1" + "0" * 5000]
DEEP = "[" * 5000 + "]" * 5000  # deeper than Python's recursion limit
BAD_TOKENS = [*BAD_NUMBERS, DEEP]


def _body_operations(api_server: ApiServer) -> list[tuple[str, str, Any]]:
    """(method, path with the example's ids filled in, example body) of every operation that
    takes a JSON body, from the served OpenAPI document."""
    spec = httpx.get(f"{api_server.base}/openapi.json").json()
    comps = spec["components"]["schemas"]
    ops = []
    for path, methods in spec["paths"].items():
        for method, op in methods.items():
            content = (op.get("requestBody") or {}).get("content", {}).get("application/json")
            if content is None:
                continue
            ref = content["schema"].get("$ref", "")
            examples = comps[ref.rsplit("/", 1)[-1]].get("examples") if ref else None
            example = examples[0] if examples else {"type": "FeatureCollection", "features": [ROUTE_EXAMPLE]}
            filled = path.replace("{route_id}", "r-berlin-1").replace("{zone_id}", "z-depot-1")
            ops.append((method.upper(), filled.replace("{vehicle_id}", "truck-042"), example))
    assert len(ops) >= 9
    return ops


def _places(doc: Any, at: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every place in a JSON document a value stands: the whole body, each member and item."""
    out = [at]
    if isinstance(doc, dict):
        for k, v in doc.items():
            out += _places(v, (*at, k))
    elif isinstance(doc, list):
        for i, v in enumerate(doc):
            out += _places(v, (*at, i))
    return out


def _with_token(doc: Any, at: tuple[Any, ...], token: str) -> bytes:
    """`doc` as JSON text with the value at `at` replaced by the raw token."""
    marker = "\x00token\x00"
    if not at:
        return token.encode()
    copy = orjson.loads(orjson.dumps(doc))
    parent = copy
    for k in at[:-1]:
        parent = parent[k]
    parent[at[-1]] = marker
    return orjson.dumps(copy).replace(orjson.dumps(marker), token.encode())


def _stored(api_server: ApiServer) -> dict[bytes, int]:
    """What a write can have stored: each key of the prefix with its length (hashes, sets, streams),
    but the relay's own progress marker, which moves on its own."""
    r = api_server.r
    out = {}
    for key in r.scan_iter(match=f"{api_server.conf.redis_prefix}*", count=1000):
        if key.endswith(b"master:relay:acked"):
            continue
        kind = r.type(key)
        size = {b"hash": r.hlen, b"stream": r.xlen, b"set": r.scard, b"zset": r.zcard, b"list": r.llen}
        out[key] = size[kind](key) if kind in size else 1
    return out


def test_numbers_json_cannot_carry_get_a_4xx_everywhere_and_store_nothing(api_server: ApiServer) -> None:
    """NaN, Infinity, numbers past a double or 64 bits, and nesting past the parser's depth, in
    every place of every body the API takes (the issue's cases among them: a route coordinate, a
    zone vertex, a vehicle label), and in every numeric query parameter: never a 5xx, a 422 names
    the field, and nothing is stored."""
    ops = _body_operations(api_server)
    cases = [(m, p, ex, at) for m, p, ex in ops for at in _places(ex)]

    @given(case=st.sampled_from(cases), token=st.sampled_from(BAD_TOKENS))
    @settings(max_examples=400, deadline=None, derandomize=True, database=None)
    def run(case: tuple[str, str, Any, tuple[Any, ...]], token: str) -> None:
        method, path, example, at = case
        before = _stored(api_server)
        body = _with_token(example, at, token)
        headers = {**api_server.admin, "Content-Type": "application/json"}
        resp = httpx.request(method, f"{api_server.base}{path}", content=body, headers=headers, timeout=10)
        assert 400 <= resp.status_code < 500, (
            method,
            path,
            at,
            token[:20],
            resp.status_code,
            resp.text[:300],
        )
        if resp.status_code == 422 and at:
            locs = [tuple(d["loc"]) for d in resp.json()["detail"]]
            assert any(loc[0] == "body" for loc in locs), locs
        assert _stored(api_server) == before, (method, path, at, token[:20])

    run()
    for path, name in [
        ("/api/v1/routes", "limit"),
        ("/api/v1/live", "offset"),
        ("/api/v1/alerts", "since_ms"),
        ("/api/v1/alerts", "until_ms"),
        ("/api/v1/reports/heatmap", "resolution"),
    ]:
        for token in BAD_NUMBERS:
            resp = httpx.get(f"{api_server.base}{path}", params={name: token}, headers=api_server.admin)
            assert resp.status_code == 422, (path, name, token[:20], resp.status_code)
            assert ["query", name] in [d["loc"] for d in resp.json()["detail"]]


@pytest.mark.parametrize(
    ("path", "body"),
    [
        (
            "/api/v1/routes",
            b'{"type":"Feature","id":"r-nan","geometry":{"type":"LineString",'
            b'"coordinates":[[13.4,NaN],[13.5,52.5]]},"properties":{"corridor_width_m":50,"speed_limit_kmh":50}}',
        ),
        (
            "/api/v1/routes",
            b'{"type":"Feature","id":"r-inf","geometry":{"type":"LineString",'
            b'"coordinates":[[13.4,Infinity],[13.5,52.5]]},"properties":{"corridor_width_m":50,"speed_limit_kmh":50}}',
        ),
        (
            "/api/v1/zones",
            b'{"type":"Feature","id":"z-nan","geometry":{"type":"Polygon","coordinates":'
            b'[[[13.4,52.5],[13.5,NaN],[13.5,52.6],[13.4,52.5]]]},"properties":{}}',
        ),
        ("/api/v1/vehicles", b'{"vehicle_id":"v-nan","label":NaN}'),
    ],
)
def test_the_issues_non_finite_bodies_are_422_naming_the_field(
    api_server: ApiServer, path: str, body: bytes
) -> None:
    headers = {**api_server.admin, "Content-Type": "application/json"}
    resp = httpx.post(f"{api_server.base}{path}", content=body, headers=headers)
    assert resp.status_code == 422, resp.text
    detail = resp.json()["detail"]
    assert detail
    assert all(d["loc"][0] == "body" for d in detail)
    assert any(d.get("input") in ("NaN", "Infinity") for d in detail), detail


def test_a_name_or_label_left_out_is_the_id(api_server: ApiServer) -> None:
    """Like Traccar and Tile38, an id and a geometry are enough: the name (route, zone) or label
    (vehicle) defaults to the id, and the OpenAPI schema says so."""
    h = api_server.admin
    base = api_server.base
    route = {**ROUTE_EXAMPLE, "id": "r-nameless"}
    route["properties"] = {k: v for k, v in ROUTE_EXAMPLE["properties"].items() if k != "name"}
    resp = httpx.post(f"{base}/api/v1/routes", json=route, headers=h)
    assert resp.status_code == 201, resp.text
    assert resp.json()["properties"]["name"] == "r-nameless"
    resp = httpx.post(f"{base}/api/v1/vehicles", json={"vehicle_id": "v-unlabelled"}, headers=h)
    assert resp.status_code == 201, resp.text
    assert resp.json()["label"] == "v-unlabelled"
    schemas = httpx.get(f"{base}/openapi.json").json()["components"]["schemas"]
    assert "label" not in schemas["VehicleIn"].get("required", [])
    assert "the vehicle id" in schemas["VehicleIn"]["properties"]["label"]["description"]
    assert "name" not in schemas["RoutePropsIn"].get("required", [])
