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
from confluent_kafka import Consumer, TopicPartition
from hypothesis import HealthCheck, given, settings
from schemathesis.core.result import Err

from admin_api.schemas import ROUTE_EXAMPLE
from fleetfence.kafka import consumer_config
from tests.admin_api.helpers import ApiServer

pytestmark = pytest.mark.services


def test_write_reaches_fleet_master_through_the_in_process_relay(api_server: ApiServer) -> None:
    feature = {**ROUTE_EXAMPLE, "id": "r-relay"}
    res = httpx.post(f"{api_server.base}/api/v1/routes", json=feature, headers=api_server.admin)
    assert res.status_code == 201, res.text
    c = Consumer(consumer_config(api_server.conf.bootstrap_servers, f"t-{uuid.uuid4().hex}"))
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
