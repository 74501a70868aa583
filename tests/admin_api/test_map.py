"""The live operations map: the page, its stream token, and the page itself in headless
Chromium (Debian's `chromium`, driven by Playwright) against a real `fleetfence api` subprocess.

Live states are written with the processor's own Redis writer and alerts with the alert history
receiver's, so the page sees exactly what production publishes. Every request the page makes is
recorded (none may leave 127.0.0.1) and every console error fails the test. Screenshots go to
FLEETFENCE_TEST_ARTIFACTS (default test-artifacts/ at the repo root).
"""

from __future__ import annotations

import copy
import logging
import re
import struct
import threading
import time
import uuid
import zlib
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import paho.mqtt.client as mqtt
import pytest
from fastapi.testclient import TestClient
from paho.mqtt.enums import CallbackAPIVersion
from paho.mqtt.reasoncodes import ReasonCode
from playwright.sync_api import Browser, Locator, Page, Response, Route, expect
from pydantic import ValidationError

from admin_api.app import create_app
from admin_api.routers.web import NPM_HINT, STATIC_DIR, content_security_policy, missing_vendor_files
from admin_api.schemas import ROUTE_EXAMPLE, ZONE_EXAMPLE
from admin_api.security import Role, create_api_key, digest, revoke_api_key, stream_token_key
from admin_api.settings import DEFAULT_WEB_VENDOR_DIR, ApiSettings
from fleetfence import heard
from fleetfence.contracts import AlertType, alert_id, ms_to_iso, utc_now_ms
from fleetfence.readmodels import ReadKeys
from fleetfence.settings import Settings
from fleetfence.testing import wait_for
from tests.admin_api.helpers import UI_TIMEOUT_MS, MapServer, Watched, running_api, wait_http
from vehicle_master.models import RouteProps, ZoneKind, ZoneProps

pytestmark = pytest.mark.services


def route(rid: str, name: str, coords: list[list[float]], width_m: float = 120) -> dict[str, Any]:
    f = copy.deepcopy(ROUTE_EXAMPLE)
    f["id"] = rid
    f["geometry"] = {"type": "LineString", "coordinates": coords}
    f["properties"].update(name=name, corridor_width_m=width_m)
    return f


def live(vid: str, seq: int, lat: float, lon: float, status: str = "on_route", **kw: Any) -> dict[str, Any]:
    ts_ms = utc_now_ms()
    return {
        "vehicle_id": vid,
        "seq": seq,
        "ts_ms": ts_ms,
        "lat": lat,
        "lon": lon,
        "speed_kmh": kw.pop("speed_kmh", 42.0),
        "status": status,
        "overspeed": kw.pop("overspeed", False),
        "silent": kw.pop("silent", False),
        "route_id": kw.pop("route_id", "r-map-a"),
        "route_version": 1,
        "progress_m": kw.pop("progress_m", 500.0),
        "progress_ratio": kw.pop("progress_ratio", 0.25),
        "zones": [],
        "h3": None,
        "updated_ms": ts_ms,
        **kw,
    }


def alert(vid: str, kind: str, seq: int, lat: float, lon: float) -> dict[str, Any]:
    ts_ms = utc_now_ms()
    return {
        "alert_id": alert_id(vid, kind, seq),
        "type": kind,
        "vehicle_id": vid,
        "route_id": "r-map-a",
        "route_version": 1,
        "seq": seq,
        "ts_ms": ts_ms,
        "ts": ms_to_iso(ts_ms),
        "lat": lat,
        "lon": lon,
        "details": {"distance_m": 180.0},
    }


# --------------------------------------------------------------------------- the page, without a browser


def test_stream_token_auth_matrix(map_server: MapServer) -> None:
    """EventSource cannot send X-API-Key: the page trades its key for a short-lived token that only
    the stream accepts; the key itself is never accepted in a URL."""
    b = map_server.base
    token_url = f"{b}/api/v1/stream/token"
    assert httpx.post(token_url).status_code == 401
    assert httpx.post(token_url, headers={"X-API-Key": "ffk_bogus"}).status_code == 401
    issued = {}
    for who, headers in (("viewer", map_server.viewer), ("admin", map_server.admin)):
        res = httpx.post(token_url, headers=headers)
        assert res.status_code == 200, res.text
        assert res.json()["role"] == who
        assert res.headers["cache-control"] == "no-store"
        issued[who] = res.json()["token"]
    token = issued["viewer"]
    # Stored hashed, with a TTL: a token leaked from a log dies on its own.
    stored = [stream_token_key(map_server.p, digest(t)) for t in issued.values()]
    assert all(0 < map_server.r.ttl(k) <= 60 for k in stored)
    assert all(map_server.r.get(k) == digest(map_server.viewer_key).encode() for k in stored[:1])
    raw = b"".join(
        map_server.r.dump(k) or b"" for k in map_server.r.scan_iter(f"{map_server.p}streamtoken:*")
    )
    assert token.encode() not in raw
    assert map_server.viewer_key.encode() not in raw

    stream = f"{b}/api/v1/stream"
    assert httpx.get(stream, params={"token": "fft_not-issued"}).status_code == 401
    assert httpx.get(stream, params={"api_key": map_server.viewer_key}).status_code == 401
    assert httpx.get(stream, params={"token": map_server.viewer_key}).status_code == 401
    # Only the stream takes a token; every other route still wants the header.
    assert httpx.get(f"{b}/api/v1/routes", params={"token": token}).status_code == 401
    assert httpx.get(f"{b}/api/v1/live", params={"token": token}).status_code == 401

    got: list[str] = []

    def read() -> None:
        with httpx.stream("GET", stream, params={"token": token, "channels": "alerts"}, timeout=10) as resp:
            got.append(str(resp.status_code))
            for line in resp.iter_lines():
                if line.startswith("event: "):
                    got.append(line)
                    return

    t = threading.Thread(target=read, daemon=True)
    t.start()
    wait_http(lambda: bool(got), 10, "stream response")
    assert got == ["200"]
    map_server.deliver_alert(alert("v-token", "OVERSPEED", 1, 52.5, 13.4))
    t.join(10)
    assert got == ["200", "event: alert"]

    # Revoking the key kills its tokens at once, even before they expire.
    key = create_api_key(map_server.r, map_server.p, "shortlived", Role.VIEWER)
    tok = httpx.post(token_url, headers={"X-API-Key": key}).json()["token"]
    with httpx.stream("GET", stream, params={"token": tok}, timeout=5) as resp:
        assert resp.status_code == 200
    revoke_api_key(map_server.r, map_server.p, "shortlived")
    assert httpx.get(stream, params={"token": tok}).status_code == 401
    # And an expired token (its Redis key gone, as EX makes it) is refused.
    with httpx.stream("GET", stream, params={"token": issued["admin"]}, timeout=5) as resp:
        assert resp.status_code == 200
    for k in map_server.r.scan_iter(f"{map_server.p}streamtoken:*"):
        map_server.r.delete(k)
    assert httpx.get(stream, params={"token": issued["admin"]}).status_code == 401


def test_page_is_self_contained_and_served_at_root_and_map(map_server: MapServer) -> None:
    for path in ("/", "/map"):
        res = httpx.get(map_server.base + path)
        assert res.status_code == 200
        assert res.headers["content-type"].startswith("text/html")
        csp = res.headers["content-security-policy"]
        assert "default-src 'self'" in csp
        assert "script-src 'self';" in csp
        assert "http" not in csp  # no tile server configured: nothing outside this origin
        assert "/static/vendor/leaflet/leaflet.js" in res.text
        assert "https://" not in res.text
        assert "http://" not in res.text
    for asset in (
        "/static/vendor/leaflet/leaflet.js",
        "/static/vendor/leaflet/leaflet.css",
        "/static/vendor/leaflet-geoman/leaflet-geoman.min.js",
        "/static/vendor/leaflet-geoman/leaflet-geoman.css",
        "/static/app/app.js",
        "/static/app/api.js",
        "/static/app/grid.js",
        "/static/app/app.css",
    ):
        res = httpx.get(map_server.base + asset)
        assert res.status_code == 200, asset
        assert len(res.content) > 500, asset
    # The page's code is split into ES modules: every one is served, as JavaScript (a module
    # script with another MIME type is refused by the browser).
    modules = sorted(p.name for p in STATIC_DIR.glob("*.js"))
    assert "app.js" in modules
    for name in modules:
        res = httpx.get(f"{map_server.base}/static/app/{name}")
        assert res.status_code == 200, name
        assert "javascript" in res.headers["content-type"], name
    assert httpx.get(map_server.base + "/static/vendor/leaflet/../package.json").status_code == 404
    assert httpx.get(map_server.base + "/map/config.json").json()["tile_url"] is None
    # The page is not an API operation: it stays out of the OpenAPI schema (and its fuzzing).
    paths = httpx.get(map_server.base + "/openapi.json").json()["paths"]
    assert "/map" not in paths
    assert "/" not in paths


def test_missing_vendor_dir_is_a_clear_503_and_a_startup_warning(
    settings: Settings, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    conf = ApiSettings.from_base(settings, api_run_relay=False, api_web_vendor_dir=tmp_path / "node_modules")
    with caplog.at_level(logging.WARNING, logger="admin_api.routers.web"):
        app = create_app(conf)
    assert any(NPM_HINT in r.getMessage() for r in caplog.records)
    with TestClient(app) as c:
        for path in ("/", "/map"):
            res = c.get(path)
            assert res.status_code == 503
            assert NPM_HINT in res.text
            assert "leaflet/leaflet.js" in res.text
        assert c.get("/static/vendor/leaflet/leaflet.js").status_code == 404
        assert c.get("/healthz").status_code == 200  # the API itself is unaffected
    assert missing_vendor_files(DEFAULT_WEB_VENDOR_DIR) == []


def test_tile_url_setting(settings: Settings) -> None:
    osm = "https://tile.openstreetmap.org/{z}/{x}/{y}.png"
    conf = ApiSettings.from_base(settings, api_run_relay=False, api_map_tile_url=osm)
    with TestClient(create_app(conf)) as c:
        cfg = c.get("/map/config.json").json()
        assert cfg["tile_url"] == osm
        assert "OpenStreetMap" in cfg["tile_attribution"]
        assert (
            "img-src 'self' data: blob: https://tile.openstreetmap.org;"
            in c.get("/map").headers["content-security-policy"]
        )
    assert "https://*.tile.example" in content_security_policy("https://{s}.tile.example/{z}/{x}/{y}.png")
    for bad in ("ftp://x/{z}/{x}/{y}", "https://tiles.example/{z}/{x}.png", "javascript:alert(1)"):
        with pytest.raises(ValidationError, match="api_map_tile_url"):
            ApiSettings(api_map_tile_url=bad)


# --------------------------------------------------------------------------- the page in Chromium


A_COORDS = [[13.400, 52.520], [13.410, 52.525], [13.425, 52.527]]
B_COORDS = [[13.390, 52.510], [13.395, 52.500], [13.405, 52.495]]


def test_viewer_sees_routes_a_moving_vehicle_and_live_alerts(
    map_server: MapServer, watched: Watched, artifacts: Path
) -> None:
    for f in (route("r-map-a", "Alpha loop", A_COORDS), route("r-map-b", "Bravo run", B_COORDS, 60)):
        assert (
            httpx.post(f"{map_server.base}/api/v1/routes", json=f, headers=map_server.admin).status_code
            == 201
        )
    zone = {**copy.deepcopy(ZONE_EXAMPLE), "id": "z-map-depot"}
    assert (
        httpx.post(f"{map_server.base}/api/v1/zones", json=zone, headers=map_server.admin).status_code == 201
    )
    map_server.write_live([live("v-map-1", 10, 52.5205, 13.4010)])
    page = watched.page

    watched.login(map_server.viewer_key)
    assert page.locator("body").get_attribute("data-role") == "viewer"
    assert not page.locator("#draw-route").is_visible()  # editing tools are for admins only
    assert page.locator("#routes li").all_inner_texts()[0].startswith("Alpha loop")
    assert "Bravo run" in page.locator("#routes").inner_text()
    assert page.locator("path.route-line").count() == 2
    assert page.locator("path.route-corridor").count() == 2
    assert page.locator("path.zone").count() == 1
    marker = page.locator(".veh-dot[data-vehicle='v-map-1']")
    marker.wait_for()
    assert marker.get_attribute("data-status") == "on_route"
    assert watched.marker_latlng("v-map-1") == (52.5205, 13.4010)
    before = marker.bounding_box()
    page.screenshot(path=str(artifacts / "01-viewer-loaded.png"))

    # The processor writes a newer state: the marker moves and turns "deviating".
    map_server.write_live([live("v-map-1", 11, 52.5232, 13.4105, status="off_route", progress_ratio=0.5)])
    wait_http(lambda: watched.marker_latlng("v-map-1") == (52.5232, 13.4105), 5, "marker to move")
    page.wait_for_function(
        "() => document.querySelector(\".veh-dot[data-vehicle='v-map-1']\").dataset.status === 'deviating'"
    )
    after = marker.bounding_box()
    assert before is not None
    assert after is not None
    assert (after["x"], after["y"]) != (before["x"], before["y"])
    # A late, older state must not move it back.
    stale = live("v-map-1", 9, 52.5100, 13.3900, speed_kmh=99.0)
    others = [
        live("v-map-2", 1, 52.5250, 13.4200),
        live("v-map-3", 1, 52.5260, 13.4150, silent=True),
        live("v-map-4", 1, 52.5240, 13.4180, overspeed=True, speed_kmh=88.0),
        live("v-map-5", 1, 52.5210, 13.4190, status="unassigned", route_id=None),
    ]
    map_server.write_live([stale, *others], written=4)
    page.locator(".veh-dot[data-vehicle='v-map-5']").wait_for()  # the batch has been applied
    assert watched.marker_latlng("v-map-1") == (52.5232, 13.4105)
    statuses = page.evaluate(
        "() => Object.fromEntries([...document.querySelectorAll('.veh-dot')]"
        ".map(e => [e.dataset.vehicle, e.dataset.status]))"
    )
    assert statuses == {
        "v-map-1": "deviating",
        "v-map-2": "on_route",
        "v-map-3": "silent",
        "v-map-4": "speeding",
        "v-map-5": "unassigned",
    }
    # Markers are keyboard-focusable and carry their status in text, not only in colour.
    icon = page.locator(".leaflet-marker-icon:has(.veh-dot[data-vehicle='v-map-4'])")
    assert icon.get_attribute("tabindex") == "0"
    assert icon.get_attribute("aria-label") == "v-map-4: speeding"
    assert (
        page.locator(".leaflet-marker-icon:has(.veh-dot[data-vehicle='v-map-1'])").get_attribute("aria-label")
        == "v-map-1: deviating"
    )  # updated when the status changed

    # A deviation alert reaches the list within seconds, at the top.
    t0 = time.monotonic()
    dev = alert("v-map-1", "ROUTE_DEVIATION", 11, 52.5232, 13.4105)
    map_server.deliver_alert(dev)
    item = page.locator(f"#alerts li[data-alert-id='{dev['alert_id']}']")
    item.wait_for(timeout=5000)
    assert time.monotonic() - t0 < 5
    assert "Route deviation" in item.inner_text()
    assert page.locator("#alerts li").first.get_attribute("data-alert-id") == dev["alert_id"]
    page.screenshot(path=str(artifacts / "02-live-alert.png"))

    # Keyboard: focus the alert and press Enter -> the map centres on it, the vehicle is selected.
    page.evaluate("() => window.fleetfence.map.setView([52.49, 13.35], 12, {animate: false})")
    item.focus()
    page.keyboard.press("Enter")
    page.wait_for_function(
        "() => { const c = window.fleetfence.map.getCenter();"
        " return Math.abs(c.lat - 52.5232) < 1e-4 && Math.abs(c.lng - 13.4105) < 1e-4; }"
    )
    assert item.get_attribute("aria-current") is not None
    panel = page.locator("#vehicle-panel")
    panel.get_by_text("Route progress: 50 %").wait_for()
    assert "deviating" in panel.inner_text()
    assert "Alpha loop (r-map-a)" in panel.inner_text()
    assert page.locator("#route-progress").get_attribute("value") == "50"
    page.screenshot(path=str(artifacts / "03-alert-focused.png"))

    # Tablet width: the side panel becomes a drawer that the Panel button opens.
    page.set_viewport_size({"width": 800, "height": 1000})
    page.reload()
    page.wait_for_selector("body[data-loaded='true']")  # the key survived the reload (sessionStorage)
    assert not page.locator("#panel").is_visible()
    page.get_by_role("button", name="Panel").click()
    assert page.locator("#panel").is_visible()
    page.screenshot(path=str(artifacts / "04-tablet.png"))

    assert watched.errors == []
    assert watched.external() == []
    assert any("/api/v1/stream?token=" in u for u in watched.requests)


def test_admin_draws_a_route_that_the_api_returns(
    map_server: MapServer, watched: Watched, artifacts: Path
) -> None:
    vid = "v-map-admin"
    res = httpx.post(
        f"{map_server.base}/api/v1/vehicles",
        json={"vehicle_id": vid, "label": "Admin test"},
        headers=map_server.admin,
    )
    assert res.status_code == 201, res.text
    map_server.write_live([live(vid, 1, 52.5150, 13.3950, status="unassigned", route_id=None)])
    page = watched.page
    # The route rules' defaults reach the form from the API's OpenAPI schema (their one home is the
    # Python model): the served schema is altered here, so the form can only show them from there.
    bump = {"deviation_min_fixes": 1, "overspeed_min_s": 7}
    served: dict[str, Any] = {}

    def patched_schema(rt: Route) -> None:
        res = rt.fetch()
        doc = res.json()
        props = doc["components"]["schemas"]["RoutePropsIn"]["properties"]
        for name, extra in bump.items():
            props[name]["default"] += extra
        served.update({k: v["default"] for k, v in props.items() if v.get("default") is not None})
        rt.fulfill(response=res, json=doc)

    page.route("**/openapi.json", patched_schema)
    watched.login(map_server.admin_key)
    assert page.locator("body").get_attribute("data-role") == "admin"
    page.evaluate("() => window.fleetfence.map.setView([52.515, 13.40], 14, {animate: false})")

    page.get_by_role("button", name="Draw route").click()
    points = [(52.512, 13.385), (52.516, 13.398), (52.514, 13.412)]
    for lat, lon in points:
        x, y = watched.screen_point(lat, lon)
        page.mouse.click(x, y)
    x, y = watched.screen_point(*points[-1])
    page.mouse.click(x, y)  # clicking the last vertex again finishes the line
    form = page.locator("#editor")
    form.wait_for()
    rules = {
        "deviation_min_fixes": "Deviation after N fixes outside",
        "deviation_min_s": "…and at least (s)",
        "overspeed_min_s": "Speeding alert after (s)",
        "silent_after_s": "Silent after (s)",
    }
    for name, label in rules.items():
        want = RouteProps.model_fields[name].default + bump.get(name, 0)
        assert served[name] == want, name
        assert float(page.get_by_label(label, exact=True).input_value()) == want, name
    page.get_by_label("Route id").fill("r-drawn")
    page.get_by_label("Name").fill("Drawn in the browser")
    page.get_by_label("Corridor width (m, full width)").fill("0")
    page.get_by_role("button", name="Save").click()
    # The API's own validation message is shown, nothing is saved.
    page.locator("#editor-error").get_by_text("corridor_width_m").wait_for()
    assert "greater than 0" in page.locator("#editor-error").inner_text()
    assert httpx.get(f"{map_server.base}/api/v1/routes/r-drawn", headers=map_server.viewer).status_code == 404
    page.get_by_label("Corridor width (m, full width)").fill("80")
    page.get_by_label("Speed limit (km/h)").fill("40")
    page.screenshot(path=str(artifacts / "05-admin-draw-form.png"))
    page.get_by_role("button", name="Save").click()
    page.get_by_text("Route r-drawn saved (version 1).").wait_for()

    got = httpx.get(f"{map_server.base}/api/v1/routes/r-drawn", headers=map_server.viewer)
    assert got.status_code == 200
    feature = got.json()
    assert feature["properties"]["name"] == "Drawn in the browser"
    assert feature["properties"]["corridor_width_m"] == 80
    assert feature["properties"]["speed_limit_kmh"] == 40
    assert feature["properties"]["deviation_min_fixes"] == served["deviation_min_fixes"]
    assert feature["properties"]["overspeed_min_s"] == served["overspeed_min_s"]
    coords = feature["geometry"]["coordinates"]
    assert len(coords) == 3
    for (lon, lat), (want_lat, want_lon) in zip(coords, points, strict=True):
        assert abs(lat - want_lat) < 2e-4
        assert abs(lon - want_lon) < 2e-4
    assert page.locator("path.route-line[data-route-id='r-drawn']").count() == 1
    page.screenshot(path=str(artifacts / "06-admin-route-saved.png"))

    # Assign the vehicle to the new route from its panel.
    page.locator(f"#vehicles li[data-vehicle-id='{vid}']").click()
    page.locator("#assign-route").select_option("r-drawn")
    page.get_by_role("button", name="Assign", exact=True).click()
    page.get_by_text(f"{vid} assigned to r-drawn").wait_for()
    assignment = httpx.get(f"{map_server.base}/api/v1/assignments/{vid}", headers=map_server.viewer).json()
    assert assignment["route_id"] == "r-drawn"

    # Someone else changes the route meanwhile: the page's save is refused with a clear message.
    other = route("r-drawn", "Changed elsewhere", [[13.38, 52.51], [13.39, 52.52]], 50)
    assert (
        httpx.put(
            f"{map_server.base}/api/v1/routes/r-drawn", json=other, headers=map_server.admin
        ).status_code
        == 200
    )
    page.locator("#routes li[data-route-id='r-drawn']").click()
    page.get_by_role("button", name="Edit route").click()
    page.get_by_label("Corridor width (m, full width)").fill("90")
    page.get_by_role("button", name="Save").click()
    page.locator("#editor-error").get_by_text("someone else changed route r-drawn").wait_for()
    assert "now version 2" in page.locator("#editor-error").inner_text()
    after = httpx.get(f"{map_server.base}/api/v1/routes/r-drawn", headers=map_server.viewer).json()
    assert after["properties"]["name"] == "Changed elsewhere"  # the stale edit did not overwrite it
    page.screenshot(path=str(artifacts / "07-admin-conflict.png"))

    # Cancel reloads the current version; editing that one succeeds (If-Match "2" -> version 3).
    page.get_by_role("button", name="Cancel").click()
    page.locator("#route-panel").get_by_text("Changed elsewhere (r-drawn)").wait_for()
    page.get_by_role("button", name="Edit route").click()
    assert page.get_by_label("Name").input_value() == "Changed elsewhere"
    page.get_by_label("Corridor width (m, full width)").fill("90")
    page.get_by_role("button", name="Save").click()
    page.get_by_text("Route r-drawn saved (version 3).").wait_for()
    edited = httpx.get(f"{map_server.base}/api/v1/routes/r-drawn", headers=map_server.viewer).json()
    assert edited["properties"]["corridor_width_m"] == 90
    assert edited["geometry"] == other["geometry"]

    # Draw a zone: three corners, then click the first one to close it.
    page.evaluate("() => window.fleetfence.map.setView([52.505, 13.386], 15, {animate: false})")
    page.get_by_role("button", name="Draw zone").click()
    corners = [(52.508, 13.380), (52.508, 13.392), (52.502, 13.386)]
    for lat, lon in [*corners, corners[0]]:
        x, y = watched.screen_point(lat, lon)
        page.mouse.click(x, y)
    page.get_by_label("Zone id").fill("z-drawn")
    page.get_by_label("Name").fill("Drawn yard")
    page.get_by_label("Kind").select_option("depot")
    page.get_by_role("button", name="Save").click()
    page.get_by_text("Zone z-drawn saved (version 1).").wait_for()
    zone = httpx.get(f"{map_server.base}/api/v1/zones/z-drawn", headers=map_server.viewer).json()
    assert zone["properties"]["kind"] == "depot"
    ring = zone["geometry"]["coordinates"][0]
    assert len(ring) == 4
    assert ring[0] == ring[-1]
    for (lon, lat), (want_lat, want_lon) in zip(ring[:3], corners, strict=True):
        assert abs(lat - want_lat) < 2e-4
        assert abs(lon - want_lon) < 2e-4
    page.screenshot(path=str(artifacts / "08-admin-zone-saved.png"))

    # The only console errors are the browser's own reports of the two refused requests.
    errors = watched.errors
    assert len(errors) == 2, watched.errors
    assert "status of 422" in errors[0]
    assert "status of 412" in errors[1]
    assert watched.external() == []


def test_admin_draws_and_edits_a_circle_zone(
    map_server: MapServer, watched: Watched, artifacts: Path
) -> None:
    """A circle zone is drawn (centre, then a radius click), its radius typed, saved as a Point with
    radius_m, shown as a circle, then edited from the map (If-Match) to a new radius."""
    api_circle = {
        "type": "Feature",
        "id": "c-api",
        "geometry": {"type": "Point", "coordinates": [13.376, 52.505], "radius_m": 120.0},
        "properties": {"kind": "depot"},
    }
    res = httpx.post(f"{map_server.base}/api/v1/zones", json=api_circle, headers=map_server.admin)
    assert res.status_code == 201, res.text
    page = watched.page
    watched.login(map_server.admin_key)
    assert page.locator("path.zone-circle").count() == 1  # a stored circle is drawn as one
    page.evaluate("() => window.fleetfence.map.setView([52.505, 13.386], 15, {animate: false})")
    page.get_by_role("button", name="Draw circle").click()
    for lat, lon in [(52.505, 13.390), (52.505, 13.393)]:  # the centre, then a point on the rim
        x, y = watched.screen_point(lat, lon)
        page.mouse.click(x, y)
    page.get_by_label("Zone id").fill("c-drawn")
    drawn_radius = float(page.get_by_label("Radius (m)").input_value())
    assert 150 < drawn_radius < 260  # 0.003 degrees of longitude at 52.5 N: about 203 m
    assert abs(float(page.get_by_label("Centre latitude").input_value()) - 52.505) < 2e-4
    page.get_by_label("Radius (m)").fill("150")
    page.get_by_label("Name").fill("Drawn customer")
    page.get_by_label("Kind").select_option("customer")
    page.get_by_role("button", name="Save").click()
    page.get_by_text("Zone c-drawn saved (version 1, radius 150 m).").wait_for()
    zone = httpx.get(f"{map_server.base}/api/v1/zones/c-drawn", headers=map_server.viewer).json()
    assert zone["geometry"]["type"] == "Point"
    assert zone["geometry"]["radius_m"] == 150.0
    lon, lat = zone["geometry"]["coordinates"]
    assert abs(lat - 52.505) < 2e-4
    assert abs(lon - 13.390) < 2e-4
    assert zone["properties"]["kind"] == "customer"
    assert page.locator("path.zone-circle").count() == 2
    page.screenshot(path=str(artifacts / "09-admin-circle-saved.png"))

    # Edit it from the map: a click on the circle opens its form with its centre and radius.
    x, y = watched.screen_point(lat, lon)
    page.mouse.click(x + 20, y + 20)
    page.get_by_text("Edit circle zone c-drawn").wait_for()
    assert float(page.get_by_label("Radius (m)").input_value()) == 150.0
    assert page.get_by_label("Kind").input_value() == "customer"
    page.get_by_label("Radius (m)").fill("180.5")
    page.get_by_role("button", name="Save").click()
    page.get_by_text("Zone c-drawn saved (version 2, radius 180.5 m).").wait_for()
    edited = httpx.get(f"{map_server.base}/api/v1/zones/c-drawn", headers=map_server.viewer).json()
    assert edited["geometry"] == {**zone["geometry"], "radius_m": 180.5}
    assert edited["properties"]["name"] == "Drawn customer"
    assert page.locator("path.zone-circle").count() == 2
    assert watched.errors == []
    assert watched.external() == []


def register(map_server: MapServer, *vids: str) -> None:
    for vid in vids:
        res = httpx.post(
            f"{map_server.base}/api/v1/vehicles",
            json={"vehicle_id": vid, "label": vid},
            headers=map_server.admin,
        )
        assert res.status_code == 201, res.text


UNASSIGNED_HINT = "no assignment valid at their time (check the assignment's valid from)"


def test_unassigned_fixes_are_shown_in_the_list_and_the_panel(
    map_server: MapServer, watched: Watched, artifacts: Path
) -> None:
    """The processor counts a vehicle's fixes that had no assignment valid at their event
    time (`unassigned_fixes` in its live state). The panel shows a non-zero count; an unassigned
    vehicle with some stands out in the list. A zero count, or a state from an older processor
    without the field, shows nothing."""
    vid, none, older = "v-unas-12", "v-unas-none", "v-unas-older"
    before = live(older, 1, 52.5190, 13.4030, status="unassigned", route_id=None)
    assert "unassigned_fixes" not in before
    map_server.write_live(
        [
            live(vid, 1, 52.5180, 13.4020, status="unassigned", route_id=None, unassigned_fixes=12),
            live(none, 1, 52.5185, 13.4025, unassigned_fixes=0),
            before,
        ]
    )
    page = watched.page
    watched.login(map_server.viewer_key)
    row = page.locator(f"#vehicles li[data-vehicle-id='{vid}']")
    expect(row.locator(".badge")).to_have_text("12 unassigned fixes", timeout=UI_TIMEOUT_MS)
    assert row.get_attribute("data-unassigned-fixes") == "12"
    for other in (none, older):
        other_row = page.locator(f"#vehicles li[data-vehicle-id='{other}']")
        expect(other_row).to_be_visible(timeout=UI_TIMEOUT_MS)
        assert other_row.locator(".badge").count() == 0
        assert other_row.get_attribute("data-unassigned-fixes") is None

    row.click()
    count = page.locator("#vehicle-panel dt:text-is('Unassigned fixes') + dd")
    expect(count).to_have_text(f"12 — {UNASSIGNED_HINT}", timeout=UI_TIMEOUT_MS)
    page.screenshot(path=str(artifacts / "10-unassigned-fixes.png"))

    # More unassigned fixes arrive over the stream: the list and the open panel follow.
    map_server.write_live(
        [live(vid, 2, 52.5181, 13.4021, status="unassigned", route_id=None, unassigned_fixes=13)]
    )
    expect(row.locator(".badge")).to_have_text("13 unassigned fixes", timeout=UI_TIMEOUT_MS)
    expect(count).to_have_text(f"13 — {UNASSIGNED_HINT}", timeout=UI_TIMEOUT_MS)
    # Once assigned, the vehicle no longer stands out in the list; its panel still tells the count.
    map_server.write_live([live(vid, 3, 52.5182, 13.4022, unassigned_fixes=13)])
    expect(row.locator(".badge")).to_have_count(0, timeout=UI_TIMEOUT_MS)
    expect(page.locator("#vehicle-panel")).to_contain_text("on route", timeout=UI_TIMEOUT_MS)
    expect(count).to_have_text(f"13 — {UNASSIGNED_HINT}", timeout=UI_TIMEOUT_MS)

    for other in (none, older):
        page.locator(f"#vehicles li[data-vehicle-id='{other}']").click()
        expect(page.locator("#vehicle-panel .veh-head")).to_have_text(
            re.compile(other), timeout=UI_TIMEOUT_MS
        )
        expect(page.locator("#vehicle-panel .facts")).to_contain_text("Last fix", timeout=UI_TIMEOUT_MS)
        assert page.locator("#vehicle-panel dt:text-is('Unassigned fixes')").count() == 0
    assert watched.errors == []
    assert watched.external() == []


def test_the_panel_says_which_tracker_a_vehicle_is_heard_through(
    map_server: MapServer, watched: Watched
) -> None:
    """The device edge's read model of the protocol each vehicle last spoke (fleetfence.heard) in
    the vehicle panel; a vehicle never heard has no such row (and its request is no error)."""
    heard_vid, quiet = "v-heard-tel", "v-heard-none"
    map_server.write_live([live(heard_vid, 1, 52.5170, 13.4010), live(quiet, 1, 52.5175, 13.4015)])
    at_ms = 1_765_115_001_000
    heard.write(
        map_server.r,
        ReadKeys(map_server.p),
        {heard_vid.encode(): heard.Heard("teltonika", at_ms, "fleetfence-gw-1")},
    )
    page = watched.page
    watched.login(map_server.viewer_key)
    page.locator(f"#vehicles li[data-vehicle-id='{heard_vid}']").click()
    via = page.locator("#vehicle-panel dt:text-is('Heard via') + dd")
    # The page's UTC format (dom.js fmtTime): "2025-12-07 13:43:21 UTC".
    shown = ms_to_iso(at_ms).replace("T", " ")[:19] + " UTC"
    expect(via).to_have_text(f"Teltonika, {shown} (fleetfence-gw-1)", timeout=UI_TIMEOUT_MS)
    page.locator(f"#vehicles li[data-vehicle-id='{quiet}']").click()
    expect(page.locator("#vehicle-panel .veh-head")).to_have_text(re.compile(quiet), timeout=UI_TIMEOUT_MS)
    expect(page.locator("#vehicle-panel .facts")).to_contain_text("Last fix", timeout=UI_TIMEOUT_MS)
    assert page.locator("#vehicle-panel dt:text-is('Heard via')").count() == 0
    assert watched.errors == []
    assert watched.external() == []


def test_assigning_shows_the_api_warning_about_older_fixes(
    map_server: MapServer, watched: Watched, artifacts: Path
) -> None:
    """An assignment whose valid_from (the map sends none: the API's default, now) is
    later than the vehicle's newest fix answers with `warnings` (those fixes stay unassigned); the
    map shows them with the success, as a warning. The API decides from the vehicle's live state
    (its `ts_ms`), which the processor's writer sets here: two hours ago for one vehicle, a few
    minutes ahead (a tracker whose clock runs ahead) for the other, which gets no warning."""
    rid, stale, ahead = "r-map-warn", "v-warn-stale", "v-warn-ahead"
    # Two routes: the list offers "r-map-other" first, so a reset choice would show.
    for f in (route(rid, "Warning run", B_COORDS), route("r-map-other", "Other run", A_COORDS)):
        res = httpx.post(f"{map_server.base}/api/v1/routes", json=f, headers=map_server.admin)
        assert res.status_code == 201, res.text
    register(map_server, stale, ahead)
    now = utc_now_ms()
    stale_ts = now - 2 * 3600 * 1000
    map_server.write_live(
        [
            live(stale, 4, 52.5050, 13.3940, status="unassigned", route_id=None, ts_ms=stale_ts),
            live(ahead, 4, 52.5040, 13.3960, status="unassigned", route_id=None, ts_ms=now + 10 * 60 * 1000),
        ]
    )
    page = watched.page
    watched.login(map_server.admin_key)
    message = page.locator("#message")

    def assign(vid: str) -> dict[str, Any]:
        # Selecting a vehicle draws its panel at once, then again when its fresh state arrives: that
        # second drawing must keep the route already picked. The fresh state is held back until the
        # pick is made, so the race goes the bad way every time.
        held: list[Route] = []

        def hold(rt: Route) -> None:  # a bound method is refused as a handler
            held.append(rt)

        live_url = f"**/api/v1/live/{vid}"
        page.route(live_url, hold)
        with page.expect_request(live_url):
            page.locator(f"#vehicles li[data-vehicle-id='{vid}']").click()
        expect(page.locator("#vehicle-panel .veh-head")).to_have_text(re.compile(vid), timeout=UI_TIMEOUT_MS)
        page.locator("#assign-route").select_option(rid)
        with page.expect_response(live_url):
            held[0].continue_()
        page.unroute(live_url)
        page.wait_for_function("vid => window.fleetfence.vehicles.get(vid).openAlerts !== undefined", arg=vid)
        assert page.locator("#assign-route").input_value() == rid
        with page.expect_response(
            lambda r: r.url.endswith(f"/api/v1/assignments/{vid}") and r.request.method == "PUT"
        ) as answer:
            page.get_by_role("button", name="Assign", exact=True).click()
        assert answer.value.ok, answer.value.text()
        body: dict[str, Any] = answer.value.json()
        return body

    body = assign(stale)
    # The API's own warning, about the fix the processor wrote, reaches the page with the success.
    assert len(body["warnings"]) == 1, body
    assert f"up to {ms_to_iso(stale_ts)}" in body["warnings"][0]
    expect(message).to_be_visible(timeout=UI_TIMEOUT_MS)
    expect(message).to_have_class(re.compile(r"\bwarn\b"), timeout=UI_TIMEOUT_MS)
    expect(message).to_have_text(
        f"{stale} assigned to {rid} (version {body['version']}).\nWarning: {body['warnings'][0]}",
        timeout=UI_TIMEOUT_MS,
    )
    page.screenshot(path=str(artifacts / "11-assignment-warning.png"))
    got = httpx.get(f"{map_server.base}/api/v1/assignments/{stale}", headers=map_server.viewer).json()
    assert got["route_id"] == rid  # saved all the same: the warning does not block

    body = assign(ahead)
    assert not body.get("warnings")  # the API leaves the field out when there is none
    expect(message).to_have_text(
        f"{ahead} assigned to {rid} (version {body['version']}).", timeout=UI_TIMEOUT_MS
    )
    expect(message).to_have_class(re.compile(r"\bok\b"), timeout=UI_TIMEOUT_MS)
    assert watched.errors == []
    assert watched.external() == []


def tiny_png() -> bytes:
    """A valid 1x1 white PNG, made here (no fixture file)."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    header = struct.pack(">IIBBBBB", 1, 1, 8, 2, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", header)
        + chunk(b"IDAT", zlib.compress(b"\x00\xff\xff\xff"))
        + chunk(b"IEND", b"")
    )


def test_configured_tile_server_is_used_and_allowed(
    map_server: MapServer, browser: Browser, tmp_path: Path, artifacts: Path
) -> None:
    """With FLEETFENCE_API_MAP_TILE_URL set, the page loads its tiles from there (and the CSP lets
    it), instead of drawing the grid. A local tile server stands in for OSM."""
    tiles: list[str] = []
    png = tiny_png()

    class Tiles(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            tiles.append(self.path)
            self.send_response(200)
            self.send_header("Content-Type", "image/png")
            self.send_header("Content-Length", str(len(png)))
            self.end_headers()
            self.wfile.write(png)

        def log_message(self, format: str, *args: Any) -> None:  # quiet
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Tiles)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    tile_base = f"http://127.0.0.1:{httpd.server_port}"
    try:
        with running_api(
            map_server.conf, tmp_path, FLEETFENCE_API_MAP_TILE_URL=tile_base + "/{z}/{x}/{y}.png"
        ) as base:
            context = browser.new_context(viewport={"width": 1024, "height": 700})
            try:
                page = context.new_page()
                page.set_default_timeout(UI_TIMEOUT_MS)
                watched = Watched(page, base)
                watched.login(map_server.viewer_key)
                page.wait_for_selector("img.leaflet-tile-loaded")
                assert page.locator("canvas.leaflet-tile").count() == 0  # no grid
                assert "OpenStreetMap" in page.locator(".leaflet-control-attribution").inner_text()
                page.screenshot(path=str(artifacts / "09-tiles.png"))
                assert watched.errors == []
                tile_requests = [u for u in watched.requests if u.startswith(tile_base)]
                assert tile_requests
                assert all(u.startswith((base, tile_base)) for u in watched.requests)
            finally:
                context.close()
    finally:
        httpd.shutdown()
        httpd.server_close()
    assert tiles
    assert all(p.endswith(".png") and p.count("/") == 3 for p in tiles)


# --------------------------------------------------------------------------- MQTT credentials


def credentials_url(map_server: MapServer, vid: str, action: str = "") -> str:
    return f"{map_server.base}/api/v1/vehicles/{vid}/credentials{action}"


def api_credentials(map_server: MapServer, vid: str) -> dict[str, Any] | None:
    """The credential status as the API reports it; None: never issued."""
    res = httpx.get(credentials_url(map_server, vid), headers=map_server.viewer)
    assert res.status_code == 200, res.text
    body: dict[str, Any] = res.json()
    assert "password" not in body
    return None if body["status"] == "none" else body


def shown_time(iso: str) -> str:
    """An API time as the page writes it (dom.js fmtTime): "2026-11-25 08:00:00 UTC"."""
    return f"{iso[:10]} {iso[11:19]} UTC"


def mqtt_login(conf: Settings, username: str, password: str) -> ReasonCode:
    """What Mosquitto answers a vehicle that logs in with these credentials."""
    answers: list[ReasonCode] = []
    c = mqtt.Client(
        CallbackAPIVersion.VERSION2, client_id=f"map-{uuid.uuid4().hex[:8]}", protocol=mqtt.MQTTv5
    )
    c.username_pw_set(username, password)
    c.on_connect = lambda _c, _u, _f, rc, _p: answers.append(rc)
    c.connect(*conf.mqtt_host_port, keepalive=30)
    c.loop_start()
    try:
        return wait_for(lambda: answers, 10, f"the broker's answer to {username}'s login")[0]
    finally:
        c.loop_stop()
        c.disconnect()


def open_credentials(page: Page, vid: str) -> Locator:
    """Select the vehicle in the list: its panel's credentials part, once it shows the status the
    API gave for this selection."""
    page.locator(f"#vehicles li[data-vehicle-id='{vid}']").click()
    read = page.locator(f"#credentials-panel[data-vehicle-id='{vid}']:not([data-status='loading'])")
    expect(read).to_have_count(1, timeout=UI_TIMEOUT_MS)
    return page.locator("#credentials-panel")


def fact(box: Locator, name: str) -> Locator:
    return box.locator(f"dt:text-is('{name}') + dd")


def click_credentials(page: Page, label: str, url: str, method: str) -> Response:
    """Click a credential button; the API's answer to the request it made."""
    with page.expect_response(lambda r: r.url == url and r.request.method == method) as answer:
        page.locator("#credentials-panel").get_by_role("button", name=label, exact=True).click()
    return answer.value


def test_admin_issues_mqtt_credentials_and_sees_the_password_once(
    map_server: MapServer, watched: Watched, artifacts: Path
) -> None:
    """An admin issues a vehicle's MQTT credentials from its panel. The password is shown
    once, in a marked box with the topic, and stays while the live part of the panel redraws; the
    next look at the vehicle (selecting it again, reloading the page) shows the status only, and the
    page stores it nowhere. The password shown is the one Mosquitto accepts."""
    vid = "v-cred-issue"
    register(map_server, vid)
    map_server.write_live([live(vid, 1, 52.5300, 13.4300, status="unassigned", route_id=None)])
    assert api_credentials(map_server, vid) is None
    page = watched.page
    watched.login(map_server.admin_key)
    creds = open_credentials(page, vid)
    expect(creds).to_have_attribute("data-status", "none", timeout=UI_TIMEOUT_MS)
    expect(fact(creds, "Status")).to_have_text("no credentials", timeout=UI_TIMEOUT_MS)
    expect(creds.get_by_role("button")).to_have_text(["Issue credentials"], timeout=UI_TIMEOUT_MS)

    answer = click_credentials(page, "Issue credentials", credentials_url(map_server, vid), "POST")
    assert answer.status == 201, answer.text()
    issued = answer.json()
    assert issued["topic"] == f"fleet/{vid}/telemetry"
    secret = page.locator("#credentials-secret-box")
    expect(secret.locator(".secret-title")).to_have_text(
        f"New MQTT password for {vid}: shown once", timeout=UI_TIMEOUT_MS
    )
    expect(fact(secret, "Username")).to_have_text(vid, timeout=UI_TIMEOUT_MS)
    expect(fact(secret, "Password")).to_have_text(issued["password"], timeout=UI_TIMEOUT_MS)
    expect(fact(secret, "Topic")).to_have_text(issued["topic"], timeout=UI_TIMEOUT_MS)
    expect(secret).to_contain_text("it will not be shown again", timeout=UI_TIMEOUT_MS)
    expect(secret).to_be_focused(timeout=UI_TIMEOUT_MS)
    expect(page.locator("#message")).to_have_text(f"MQTT credentials of {vid} issued.", timeout=UI_TIMEOUT_MS)
    # The status follows, as the API reports it, with the buttons an active vehicle's allow.
    expect(creds).to_have_attribute("data-status", "active", timeout=UI_TIMEOUT_MS)
    expect(fact(creds, "Status")).to_have_text("active", timeout=UI_TIMEOUT_MS)
    expect(creds.get_by_role("button")).to_have_text(
        ["Rotate password", "Disable", "Revoke"], timeout=UI_TIMEOUT_MS
    )
    got = api_credentials(map_server, vid)
    assert got is not None
    assert got["status"] == "active"
    assert got["issued_at"] == issued["issued_at"]
    expect(fact(creds, "Issued")).to_have_text(shown_time(got["issued_at"]), timeout=UI_TIMEOUT_MS)
    expect(fact(creds, "Rotated")).to_have_text("never", timeout=UI_TIMEOUT_MS)
    assert not mqtt_login(map_server.conf, vid, issued["password"]).is_failure

    # A new position redraws the live part of the panel: the box stays until the next selection.
    map_server.write_live(
        [live(vid, 2, 52.5301, 13.4301, status="unassigned", route_id=None, speed_kmh=57.0)]
    )
    expect(page.locator("#vehicle-panel")).to_contain_text("57 km/h", timeout=UI_TIMEOUT_MS)
    expect(fact(secret, "Password")).to_have_text(issued["password"], timeout=UI_TIMEOUT_MS)
    page.screenshot(path=str(artifacts / "12-credentials-issued.png"))
    stored = page.evaluate("() => JSON.stringify([{...localStorage}, {...sessionStorage}])")
    assert issued["password"] not in stored

    # The next look at the vehicle shows the status, never the password again.
    creds = open_credentials(page, vid)
    expect(creds).to_have_attribute("data-status", "active", timeout=UI_TIMEOUT_MS)
    expect(secret).to_have_count(0, timeout=UI_TIMEOUT_MS)
    assert issued["password"] not in page.content()
    page.reload()
    page.wait_for_selector("body[data-loaded='true']")
    creds = open_credentials(page, vid)
    expect(creds).to_have_attribute("data-status", "active", timeout=UI_TIMEOUT_MS)
    expect(fact(creds, "Issued")).to_have_text(shown_time(got["issued_at"]), timeout=UI_TIMEOUT_MS)
    assert secret.count() == 0
    assert issued["password"] not in page.content()
    assert watched.errors == []
    assert watched.external() == []


def test_admin_rotates_disables_enables_and_revokes_from_the_panel(
    map_server: MapServer, watched: Watched, artifacts: Path
) -> None:
    """Each credential button changes the status the API reports and what Mosquitto lets
    the vehicle do, and the panel then offers the actions the new status allows. An action the API
    refuses (a 409: another admin issued the credentials meanwhile) is told like any refused
    request, and the panel then shows the status the API has."""
    vid = "v-cred-cycle"
    conf = map_server.conf
    register(map_server, vid)
    map_server.write_live([live(vid, 1, 52.5310, 13.4310, status="unassigned", route_id=None)])
    page = watched.page
    watched.login(map_server.admin_key)
    message = page.locator("#message")
    secret = page.locator("#credentials-secret-box")
    url = credentials_url(map_server, vid)
    creds = open_credentials(page, vid)
    expect(creds).to_have_attribute("data-status", "none", timeout=UI_TIMEOUT_MS)

    elsewhere = httpx.post(url, headers=map_server.admin)
    assert elsewhere.status_code == 201, elsewhere.text
    refused = click_credentials(page, "Issue credentials", url, "POST")
    assert refused.status == 409
    expect(message).to_have_text(
        f"Could not issue the MQTT credentials of {vid}: {refused.json()['detail']}", timeout=UI_TIMEOUT_MS
    )
    expect(message).to_have_class(re.compile(r"\berror\b"), timeout=UI_TIMEOUT_MS)
    expect(creds).to_have_attribute("data-status", "active", timeout=UI_TIMEOUT_MS)
    expect(creds.get_by_role("button")).to_have_text(
        ["Rotate password", "Disable", "Revoke"], timeout=UI_TIMEOUT_MS
    )
    assert secret.count() == 0
    old = elsewhere.json()["password"]

    # Rotate: a new password, shown once; the old one no longer logs in.
    answer = click_credentials(page, "Rotate password", f"{url}/rotate", "POST")
    assert answer.status == 200, answer.text()
    rotated = answer.json()
    assert rotated["password"] != old
    expect(fact(secret, "Password")).to_have_text(rotated["password"], timeout=UI_TIMEOUT_MS)
    expect(message).to_have_text(f"MQTT credentials of {vid} rotated.", timeout=UI_TIMEOUT_MS)
    got = api_credentials(map_server, vid)
    assert got is not None
    assert got["status"] == "active"
    assert got["rotated_at"] is not None
    assert got["rotated_at"] == rotated["rotated_at"]
    expect(fact(creds, "Rotated")).to_have_text(shown_time(got["rotated_at"]), timeout=UI_TIMEOUT_MS)
    assert mqtt_login(conf, vid, old).is_failure
    assert not mqtt_login(conf, vid, rotated["password"]).is_failure
    secret.get_by_role("button", name="Hide password").click()
    expect(secret).to_have_count(0, timeout=UI_TIMEOUT_MS)
    assert rotated["password"] not in page.content()

    # Disable: the vehicle can no longer log in; the panel offers Enable.
    answer = click_credentials(page, "Disable", f"{url}/disable", "POST")
    assert answer.status == 200, answer.text()
    expect(creds).to_have_attribute("data-status", "disabled", timeout=UI_TIMEOUT_MS)
    expect(fact(creds, "Status")).to_have_text(
        "disabled: the vehicle cannot log in until enabled", timeout=UI_TIMEOUT_MS
    )
    expect(creds.get_by_role("button")).to_have_text(
        ["Enable", "Rotate password", "Revoke"], timeout=UI_TIMEOUT_MS
    )
    expect(message).to_have_text(f"MQTT credentials of {vid} disabled.", timeout=UI_TIMEOUT_MS)
    got = api_credentials(map_server, vid)
    assert got is not None
    assert got["status"] == "disabled"
    assert got["disabled_at"] is not None
    expect(fact(creds, "Disabled")).to_have_text(shown_time(got["disabled_at"]), timeout=UI_TIMEOUT_MS)
    assert mqtt_login(conf, vid, rotated["password"]).is_failure
    page.screenshot(path=str(artifacts / "13-credentials-disabled.png"))

    # Enable: the same password works again.
    answer = click_credentials(page, "Enable", f"{url}/enable", "POST")
    assert answer.status == 200, answer.text()
    expect(creds).to_have_attribute("data-status", "active", timeout=UI_TIMEOUT_MS)
    expect(creds.get_by_role("button")).to_have_text(
        ["Rotate password", "Disable", "Revoke"], timeout=UI_TIMEOUT_MS
    )
    expect(fact(creds, "Disabled")).to_have_count(0, timeout=UI_TIMEOUT_MS)
    got = api_credentials(map_server, vid)
    assert got is not None
    assert got["status"] == "active"
    assert got["disabled_at"] is None
    assert not mqtt_login(conf, vid, rotated["password"]).is_failure

    # Revoke: gone from the broker; the panel offers to issue new ones.
    answer = click_credentials(page, "Revoke", url, "DELETE")
    assert answer.status == 200, answer.text()
    expect(creds).to_have_attribute("data-status", "revoked", timeout=UI_TIMEOUT_MS)
    expect(fact(creds, "Status")).to_have_text("revoked: the vehicle cannot log in", timeout=UI_TIMEOUT_MS)
    expect(creds.get_by_role("button")).to_have_text(["Issue credentials"], timeout=UI_TIMEOUT_MS)
    expect(message).to_have_text(f"MQTT credentials of {vid} revoked.", timeout=UI_TIMEOUT_MS)
    got = api_credentials(map_server, vid)
    assert got is not None
    assert got["status"] == "revoked"
    assert got["revoked_at"] is not None
    expect(fact(creds, "Revoked")).to_have_text(shown_time(got["revoked_at"]), timeout=UI_TIMEOUT_MS)
    assert mqtt_login(conf, vid, rotated["password"]).is_failure
    page.screenshot(path=str(artifacts / "14-credentials-revoked.png"))

    # A revoked vehicle gets new credentials from the same button as a new one.
    answer = click_credentials(page, "Issue credentials", url, "POST")
    assert answer.status == 201, answer.text()
    again = answer.json()
    expect(fact(secret, "Password")).to_have_text(again["password"], timeout=UI_TIMEOUT_MS)
    expect(creds).to_have_attribute("data-status", "active", timeout=UI_TIMEOUT_MS)
    got = api_credentials(map_server, vid)
    assert got is not None
    assert got["status"] == "active"
    assert got["revoked_at"] is None
    assert not mqtt_login(conf, vid, again["password"]).is_failure

    # The browser's report of the refused issue is the only console error.
    errors = watched.errors
    assert len(errors) == 1, watched.errors
    assert "status of 409" in errors[0]
    assert watched.external() == []


def test_viewer_sees_the_credential_status_but_no_buttons(
    map_server: MapServer, watched: Watched, artifacts: Path
) -> None:
    """A viewer key reads the credential status; the panel offers it no action (the API
    would refuse them: 403)."""
    vid, none = "v-cred-viewer", "v-cred-none"
    register(map_server, vid, none)
    map_server.write_live(
        [
            live(vid, 1, 52.5320, 13.4320, status="unassigned", route_id=None),
            live(none, 1, 52.5325, 13.4325, status="unassigned", route_id=None),
        ]
    )
    url = credentials_url(map_server, vid)
    assert httpx.post(url, headers=map_server.admin).status_code == 201
    assert httpx.post(f"{url}/disable", headers=map_server.admin).status_code == 200
    assert httpx.post(f"{url}/rotate", headers=map_server.viewer).status_code == 403
    got = api_credentials(map_server, vid)
    assert got is not None
    page = watched.page
    watched.login(map_server.viewer_key)
    assert page.locator("body").get_attribute("data-role") == "viewer"

    creds = open_credentials(page, vid)
    expect(creds).to_have_attribute("data-status", "disabled", timeout=UI_TIMEOUT_MS)
    expect(fact(creds, "Status")).to_have_text(
        "disabled: the vehicle cannot log in until enabled", timeout=UI_TIMEOUT_MS
    )
    expect(fact(creds, "Username")).to_have_text(vid, timeout=UI_TIMEOUT_MS)
    expect(fact(creds, "Issued")).to_have_text(shown_time(got["issued_at"]), timeout=UI_TIMEOUT_MS)
    expect(fact(creds, "Disabled")).to_have_text(shown_time(got["disabled_at"]), timeout=UI_TIMEOUT_MS)
    expect(creds.get_by_role("button")).to_have_count(0, timeout=UI_TIMEOUT_MS)
    expect(page.locator("#credentials-secret > *")).to_have_count(0, timeout=UI_TIMEOUT_MS)
    page.screenshot(path=str(artifacts / "15-credentials-viewer.png"))

    creds = open_credentials(page, none)
    expect(creds).to_have_attribute("data-status", "none", timeout=UI_TIMEOUT_MS)
    expect(fact(creds, "Status")).to_have_text("no credentials", timeout=UI_TIMEOUT_MS)
    expect(creds.get_by_role("button")).to_have_count(0, timeout=UI_TIMEOUT_MS)
    assert watched.errors == []
    assert watched.external() == []


# --------------------------------------------------------------------------- route awareness

TRIP_COORDS = [[13.440, 52.540], [13.450, 52.545], [13.465, 52.547]]
# The alert list's colour of each tone (app.css), as the browser computes it.
TONE_RGB = {
    "wrong-way": "rgb(176, 0, 32)",
    "stop": "rgb(163, 23, 122)",
    "risk": "rgb(138, 90, 0)",
    "done": "rgb(21, 112, 47)",
    "calm": "rgb(46, 125, 91)",
}
TRIP_ALERTS: dict[str, tuple[str, str, dict[str, Any], str]] = {
    # type: (label, tone, details as the processor sends them, what the list adds from them)
    "WRONG_DIRECTION": ("Wrong direction", "wrong-way", {"moved_m": 120.0, "over_s": 9.0}, "120 m back"),
    "DIRECTION_RESTORED": ("Direction restored", "calm", {"moved_m": 130.0, "over_s": 12.0}, "130 m forward"),
    "UNPLANNED_STOP": ("Unplanned stop", "stop", {"stopped_s": 600.0, "since_ms": 0}, "stopped 10 min"),
    "STOP_ENDED": ("Stop ended", "calm", {"duration_s": 45.0, "since_ms": 0}, "after 45 s"),
    "ARRIVAL_AT_RISK": (
        "Arrival at risk",
        "risk",
        {"delay_s": 720.0, "remaining_m": 900.0},
        "ETA +12 min (late)",
    ),
    "ARRIVAL_BACK_ON_TIME": ("Back on time", "calm", {"delay_s": -170.0}, "ETA -3 min (early)"),
    "ROUTE_COMPLETED": (
        "Route completed",
        "done",
        {"duration_s": 1500.0, "distance_m": 2400.0, "off_route_m": 0.0, "delay_s": 300.0},
        "in 25 min, +5 min (late)",
    ),
}


def trip_alert(vid: str, kind: str, seq: int, details: dict[str, Any]) -> dict[str, Any]:
    return {**alert(vid, kind, seq, 52.545, 13.450), "route_id": "r-map-trip", "details": details}


def test_page_words_and_formats_cover_every_alert_type(map_server: MapServer, watched: Watched) -> None:
    """The page's label and tone tables and its number formats, called in the browser as the page
    loads them (ES modules): every alert type the API can send has a label, every trip type its
    tone, and delays and durations are written as the panel and the list show them."""
    page = watched.page
    watched.login(map_server.viewer_key)
    labels = page.evaluate(
        "async () => { const m = await import('/static/app/labels.js');"
        " return {label: m.ALERT_LABEL, tone: Object.fromEntries("
        "Object.keys(m.ALERT_LABEL).map(t => [t, m.alertTone(t)])), unknown: m.alertTone('NEW_TYPE')}; }"
    )
    assert labels["label"] == {t.value: t.meta.label for t in AlertType}
    assert labels["tone"] == {t.value: t.meta.tone for t in AlertType}
    assert {t: labels["label"][t] for t in TRIP_ALERTS} == {t: v[0] for t, v in TRIP_ALERTS.items()}
    assert {t: labels["tone"][t] for t in TRIP_ALERTS} == {t: v[1] for t, v in TRIP_ALERTS.items()}
    assert labels["unknown"] == "plain"
    formats = page.evaluate(
        "async () => { const d = await import('/static/app/dom.js');"
        " return {delay: [720, 29, 31, -29, -31, -180, 0].map(d.fmtDelay),"
        " duration: [0, 44.6, 89, 90, 600, 5340, 5400, 7500].map(d.fmtDuration)}; }"
    )
    assert formats["delay"] == [
        "+12 min (late)",
        "0 min (on time)",
        "+1 min (late)",
        "0 min (on time)",
        "-1 min (early)",
        "-3 min (early)",
        "0 min (on time)",
    ]
    assert formats["duration"] == [
        "0 s",
        "45 s",
        "89 s",
        "2 min",
        "10 min",
        "89 min",
        "1 h 30 min",
        "2 h 05 min",
    ]
    assert watched.errors == []


def test_trip_alerts_and_the_vehicle_panel_show_route_awareness(
    map_server: MapServer, watched: Watched, artifacts: Path
) -> None:
    """Each trip alert reaches the list with its label, its tone's colour and the fact
    of its details; the vehicle panel shows the trip's state from the live read model: progress,
    ETA and planned arrival as UTC times, the delay in minutes, and badges for wrong way, an
    unplanned stop (since when), arrival at risk and completion. A state from an older processor,
    without the trip's fields, shows none of it."""
    res = httpx.post(
        f"{map_server.base}/api/v1/routes",
        json=route("r-map-trip", "Trip run", TRIP_COORDS),
        headers=map_server.admin,
    )
    assert res.status_code == 201, res.text
    now = utc_now_ms()
    since, eta, planned = now - 600_000, now + 1_500_000, now + 780_000
    trip: dict[str, Any] = {"route_id": "r-map-trip", "ts_ms": now}
    calm: dict[str, Any] = {
        "wrong_way": False,
        "stop": None,
        "stopped_since_ms": None,
        "eta_ms": None,
        "planned_arrival_ms": None,
        "delay_s": None,
        "arrival_at_risk": False,
        "completed": False,
        "off_route_m": 0.0,
    }
    late: dict[str, Any] = {
        **calm,
        "stop": "unplanned",
        "stopped_since_ms": since,
        "eta_ms": eta,
        "planned_arrival_ms": planned,
        "delay_s": 720.0,
        "arrival_at_risk": True,
    }
    map_server.write_live(
        [
            live("v-trip-late", 5, 52.5450, 13.4500, speed_kmh=0.0, **trip, **late),
            live(
                "v-trip-early",
                5,
                52.5455,
                13.4560,
                speed_kmh=0.0,
                **trip,
                **{
                    **calm,
                    "stop": "planned",
                    "stopped_since_ms": now - 45_000,
                    "eta_ms": now + 600_000,
                    "planned_arrival_ms": now + 780_000,
                    "delay_s": -180.0,
                },
            ),
            live("v-trip-back", 5, 52.5420, 13.4450, **trip, **{**calm, "wrong_way": True}),
            live(
                "v-trip-done",
                5,
                52.5470,
                13.4650,
                progress_ratio=1.0,
                progress_m=2400.0,
                **trip,
                **{**calm, "completed": True, "off_route_m": 1250.0},
            ),
            live("v-trip-older", 5, 52.5430, 13.4470, **trip),  # no trip fields at all
        ]
    )
    page = watched.page
    watched.login(map_server.viewer_key)

    sent = []
    for seq, (kind, (_label, _tone, details, _fact)) in enumerate(TRIP_ALERTS.items(), start=1):
        a = trip_alert("v-trip-late", kind, seq, details)
        map_server.deliver_alert(a)
        sent.append(a)
    for a in sent:
        label, tone, _details, detail = TRIP_ALERTS[a["type"]]
        item = page.locator(f"#alerts li[data-alert-id='{a['alert_id']}']")
        expect(item.locator(".al-type")).to_have_text(label, timeout=UI_TIMEOUT_MS)
        expect(item).to_have_attribute("data-tone", tone, timeout=UI_TIMEOUT_MS)
        expect(item.locator(".sub")).to_contain_text(f"r-map-trip · {detail} · ", timeout=UI_TIMEOUT_MS)
        assert detail in (item.get_attribute("aria-label") or "")
        colour = item.locator(".al-type").evaluate("e => getComputedStyle(e).color")
        assert colour == TONE_RGB[tone], (a["type"], colour)
    assert len(set(TONE_RGB.values())) == len(TONE_RGB)  # five tones, five colours
    # An alert whose details an older processor left out still shows, without the fact.
    bare = trip_alert("v-trip-late", "ARRIVAL_AT_RISK", 99, {})
    map_server.deliver_alert(bare)
    bare_item = page.locator(f"#alerts li[data-alert-id='{bare['alert_id']}']")
    expect(bare_item.locator(".sub")).to_have_text(
        re.compile(r"^ r-map-trip · \d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC$"), timeout=UI_TIMEOUT_MS
    )
    page.screenshot(path=str(artifacts / "16-trip-alerts.png"))

    panel = page.locator("#vehicle-panel")
    badges = panel.locator(".trip-badges .badge")

    def select(vid: str) -> None:
        page.locator(f"#vehicles li[data-vehicle-id='{vid}']").click()
        expect(panel.locator(".veh-head")).to_have_text(re.compile(vid), timeout=UI_TIMEOUT_MS)

    select("v-trip-late")
    expect(badges).to_have_text(
        [f"Unplanned stop since {shown_time(ms_to_iso(since))}", "Arrival at risk: +12 min (late)"],
        timeout=UI_TIMEOUT_MS,
    )
    assert [b.get_attribute("data-trip") for b in badges.all()] == ["unplanned-stop", "arrival-at-risk"]
    expect(fact(panel, "Stopped")).to_have_text(
        f"since {shown_time(ms_to_iso(since))} (10 min, unplanned)", timeout=UI_TIMEOUT_MS
    )
    expect(fact(panel, "ETA")).to_have_text(shown_time(ms_to_iso(eta)), timeout=UI_TIMEOUT_MS)
    expect(fact(panel, "Planned arrival")).to_have_text(shown_time(ms_to_iso(planned)), timeout=UI_TIMEOUT_MS)
    expect(fact(panel, "Delay vs plan")).to_have_text("+12 min (late)", timeout=UI_TIMEOUT_MS)
    expect(panel.get_by_text("Route progress: 25 %")).to_be_visible(timeout=UI_TIMEOUT_MS)
    assert fact(panel, "Off corridor").count() == 0
    page.screenshot(path=str(artifacts / "17-trip-late-panel.png"))

    # The stream moves it on: the stop has ended and the trip is back on time; the open panel follows.
    map_server.write_live(
        [
            live(
                "v-trip-late",
                6,
                52.5451,
                13.4510,
                speed_kmh=30.0,
                **trip,
                **{**late, "stop": None, "stopped_since_ms": None, "delay_s": 60.0, "arrival_at_risk": False},
            )
        ]
    )
    expect(badges).to_have_count(0, timeout=UI_TIMEOUT_MS)
    expect(fact(panel, "Delay vs plan")).to_have_text("+1 min (late)", timeout=UI_TIMEOUT_MS)
    assert fact(panel, "Stopped").count() == 0

    select("v-trip-early")
    expect(fact(panel, "Delay vs plan")).to_have_text("-3 min (early)", timeout=UI_TIMEOUT_MS)
    expect(fact(panel, "Stopped")).to_have_text(
        f"since {shown_time(ms_to_iso(now - 45_000))} (45 s, planned)", timeout=UI_TIMEOUT_MS
    )
    assert badges.count() == 0  # a planned stop, on time: nothing to flag

    select("v-trip-back")
    expect(badges).to_have_text(["Wrong way"], timeout=UI_TIMEOUT_MS)
    assert fact(panel, "ETA").count() == 0  # no ETA yet: no row rather than a blank

    select("v-trip-done")
    expect(badges).to_have_text(["Route completed"], timeout=UI_TIMEOUT_MS)
    expect(panel.get_by_text("Route progress: 100 %")).to_be_visible(timeout=UI_TIMEOUT_MS)
    expect(fact(panel, "Off corridor")).to_have_text("1.25 km this trip", timeout=UI_TIMEOUT_MS)
    badge_colours = badges.evaluate_all("bs => bs.map(b => getComputedStyle(b).borderTopColor)")
    assert badge_colours == [TONE_RGB["done"]]
    page.screenshot(path=str(artifacts / "18-trip-completed-panel.png"))

    select("v-trip-older")
    expect(fact(panel, "Last fix")).to_be_visible(timeout=UI_TIMEOUT_MS)
    assert panel.locator(".trip-badges").count() == 0
    for name in ("Stopped", "ETA", "Planned arrival", "Delay vs plan", "Off corridor"):
        assert fact(panel, name).count() == 0, name
    assert watched.errors == []
    assert watched.external() == []


TRIP_RULE_LABELS = {
    "wrong_way_min_m": "Wrong way after going back (m, empty: off)",
    "wrong_way_min_fixes": "Wrong way over at least N fixes",
    "wrong_way_min_s": "Wrong way over at least (s)",
    "stop_min_s": "Unplanned stop after (s, empty: off)",
    "stop_speed_kmh": "Stopped below (km/h)",
    "stop_radius_m": "Stopped within (m)",
    "arrival_risk_s": "Arrival at risk when late by (s, empty: off)",
    "planned_duration_s": "Planned trip time (s, optional)",
    "completion_radius_m": "Completed within (m of the end)",
}


def test_admin_sets_trip_rules_and_zones_that_are_planned_stops(
    map_server: MapServer, watched: Watched, artifacts: Path
) -> None:
    """The route form offers the trip rules with the defaults the API's schema states
    (altered here, so they can only come from there), an empty rule is saved as off, editing a
    route keeps the rules the form did not touch (a PUT replaces the whole route), the route panel
    tells them; the zone form offers the schema's kinds (rest_area among them) and planned_stop."""
    bump = {"stop_min_s": 60, "wrong_way_min_m": 5, "completion_radius_m": 7}
    served: dict[str, Any] = {}

    def patched_schema(rt: Route) -> None:
        res = rt.fetch()
        doc = res.json()
        props = doc["components"]["schemas"]["RoutePropsIn"]["properties"]
        for name, extra in bump.items():
            props[name]["default"] += extra
        served.update({k: v.get("default") for k, v in props.items()})
        rt.fulfill(response=res, json=doc)

    page = watched.page
    page.route("**/openapi.json", patched_schema)
    watched.login(map_server.admin_key)
    page.evaluate("() => window.fleetfence.map.setView([52.56, 13.50], 14, {animate: false})")

    page.get_by_role("button", name="Draw route").click()
    points = [(52.558, 13.490), (52.561, 13.500), (52.559, 13.510)]
    for lat, lon in [*points, points[-1]]:
        x, y = watched.screen_point(lat, lon)
        page.mouse.click(x, y)
    page.locator("#trip-rules").wait_for()
    labels = TRIP_RULE_LABELS
    for name, label in labels.items():
        want = RouteProps.model_fields[name].default
        if want is not None:
            want += bump.get(name, 0)
        assert served[name] == want, name
        shown = page.get_by_label(label, exact=True).input_value()
        assert (float(shown) if shown else None) == want, name
    page.get_by_label("Route id").fill("r-drawn-trip")
    page.get_by_label("Name").fill("Drawn with trip rules")
    page.get_by_label(labels["arrival_risk_s"], exact=True).fill("")  # off
    page.get_by_label(labels["planned_duration_s"], exact=True).fill("1800")
    page.get_by_label(labels["stop_radius_m"], exact=True).fill("-5")
    page.get_by_role("button", name="Save").click()
    page.locator("#editor-error").get_by_text("stop_radius_m").wait_for()  # the API's own message
    assert "greater than 0" in page.locator("#editor-error").inner_text()
    page.get_by_label(labels["stop_radius_m"], exact=True).fill("35")
    page.screenshot(path=str(artifacts / "19-trip-rules-form.png"))
    page.get_by_role("button", name="Save").click()
    page.get_by_text("Route r-drawn-trip saved (version 1).").wait_for()

    url = f"{map_server.base}/api/v1/routes/r-drawn-trip"
    saved = httpx.get(url, headers=map_server.viewer).json()["properties"]
    assert saved["arrival_risk_s"] is None
    assert saved["planned_duration_s"] == 1800
    assert saved["stop_radius_m"] == 35
    for name in ("stop_min_s", "wrong_way_min_m", "completion_radius_m", "wrong_way_min_fixes"):
        assert saved[name] == served[name], name

    # The panel tells the rules; editing one keeps the others, the off one stays off.
    panel = page.locator("#route-panel")
    expect(fact(panel, "Arrival at risk")).to_have_text("off", timeout=UI_TIMEOUT_MS)
    expect(fact(panel, "Unplanned stop after")).to_have_text(
        f"{served['stop_min_s']:g} s at ≤ {served['stop_speed_kmh']:g} km/h within 35 m",
        timeout=UI_TIMEOUT_MS,
    )
    expect(fact(panel, "Planned trip time")).to_have_text("1800 s", timeout=UI_TIMEOUT_MS)
    page.get_by_role("button", name="Edit route").click()
    assert page.get_by_label(labels["arrival_risk_s"], exact=True).input_value() == ""
    assert page.get_by_label(labels["planned_duration_s"], exact=True).input_value() == "1800"
    page.get_by_label(labels["wrong_way_min_fixes"], exact=True).fill("5")
    page.get_by_role("button", name="Save").click()
    page.get_by_text("Route r-drawn-trip saved (version 2).").wait_for()
    edited = httpx.get(url, headers=map_server.viewer).json()["properties"]
    assert edited["wrong_way_min_fixes"] == 5
    assert {k: v for k, v in edited.items() if k not in ("wrong_way_min_fixes", "version", "updated")} == {
        k: v for k, v in saved.items() if k not in ("wrong_way_min_fixes", "version", "updated")
    }

    # A zone that is a rest area, explicitly not a planned stop.
    page.evaluate("() => window.fleetfence.map.setView([52.565, 13.52], 15, {animate: false})")
    page.get_by_role("button", name="Draw zone").click()
    corners = [(52.567, 13.515), (52.567, 13.525), (52.563, 13.520)]
    for lat, lon in [*corners, corners[0]]:
        x, y = watched.screen_point(lat, lon)
        page.mouse.click(x, y)
    kind = page.get_by_label("Kind")
    kind.wait_for()
    options = kind.locator("option").evaluate_all("os => os.map(o => o.value)")
    assert options == [k.value for k in ZoneKind]
    assert kind.input_value() == ZoneProps.model_fields["kind"].default.value
    stop = page.get_by_label("Planned stop", exact=True)
    assert stop.input_value() == ""  # by kind, the model's null
    assert "rest_area" in (page.locator("#f-planned_stop-help").inner_text())
    page.get_by_label("Zone id").fill("z-rest-no")
    page.get_by_label("Name").fill("Lay-by, no stopping")
    kind.select_option("rest_area")
    stop.select_option("false")
    page.get_by_role("button", name="Save").click()
    page.get_by_text("Zone z-rest-no saved (version 1).").wait_for()
    zone = httpx.get(f"{map_server.base}/api/v1/zones/z-rest-no", headers=map_server.viewer).json()
    assert (zone["properties"]["kind"], zone["properties"]["planned_stop"]) == ("rest_area", False)
    page.screenshot(path=str(artifacts / "20-rest-area-zone.png"))

    # The only console error is the browser's own report of the refused save.
    assert len(watched.errors) == 1, watched.errors
    assert "status of 422" in watched.errors[0]
    assert watched.external() == []


def test_editing_a_route_stored_before_the_trip_rules_does_not_switch_them_off(
    map_server: MapServer, watched: Watched
) -> None:
    """A route stored before the trip rules existed has no trip-rule fields (the API returns what
    was stored; the processor applies the defaults). Its edit form shows those defaults instead of
    empty fields, which would save as null and switch wrong way, stops and arrival off. The stored
    record is simulated by taking the fields out of the route list the page loads."""
    legacy = route("r-legacy", "Stored before #26", [[13.52, 52.57], [13.53, 52.575]])
    res = httpx.post(f"{map_server.base}/api/v1/routes", json=legacy, headers=map_server.admin)
    assert res.status_code == 201, res.text

    def without_trip_rules(rt: Route) -> None:
        got = rt.fetch()
        body = got.json()
        for f in body["features"]:
            if f["id"] == "r-legacy":
                for name in TRIP_RULE_LABELS:
                    f["properties"].pop(name, None)
        rt.fulfill(response=got, json=body)

    page = watched.page
    page.route("**/api/v1/routes?limit=*", without_trip_rules)
    watched.login(map_server.admin_key)
    page.locator("#routes li[data-route-id='r-legacy']").click()
    panel = page.locator("#route-panel")
    expect(fact(panel, "Speed limit")).to_be_visible(timeout=UI_TIMEOUT_MS)
    for name in ("Wrong way after", "Unplanned stop after", "Arrival at risk", "Completed within"):
        assert fact(panel, name).count() == 0, name  # not stored: nothing shown rather than a guess
    page.get_by_role("button", name="Edit route").click()
    for name, label in TRIP_RULE_LABELS.items():
        want = RouteProps.model_fields[name].default
        shown = page.get_by_label(label, exact=True).input_value()
        assert (float(shown) if shown else None) == want, name
    page.get_by_role("button", name="Save").click()
    page.get_by_text("Route r-legacy saved (version 2).").wait_for()
    saved = httpx.get(f"{map_server.base}/api/v1/routes/r-legacy", headers=map_server.viewer).json()
    for name in TRIP_RULE_LABELS:
        assert saved["properties"][name] == RouteProps.model_fields[name].default, name
    assert saved["properties"]["wrong_way_min_m"] is not None  # still on
    expect(fact(panel, "Wrong way after")).to_contain_text("m back", timeout=UI_TIMEOUT_MS)
    assert watched.errors == []
    assert watched.external() == []
