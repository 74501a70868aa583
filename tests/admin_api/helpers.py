"""Shared by the admin API's tests and their fixtures (conftest.py): the callers and the servers
the fixtures hand out, and the map's browser set-up."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import orjson
import redis
from fastapi.testclient import TestClient
from playwright.sync_api import ConsoleMessage, Page, Request
from prometheus_client import CollectorRegistry

from admin_api.settings import ApiSettings
from alerts.history import HistorySink
from alerts.metrics import ReceiverMetrics
from alerts.model import SourceRecord, parse_alert
from alerts.sink import Context, Outcome
from fleetfence.mqtt import account_env
from fleetfence.probes import free_port
from fleetfence.settings import Settings
from fleetfence.testing import wait_for
from processor.spark.kafka_sink import AlertStreamWriter
from processor.spark.rows import pack_live, unpack_live

# Waits on an HTTP server: a refused or failed request means "not yet".
wait_http = partial(wait_for, ignore=(httpx.HTTPError, OSError))

FLEETFENCE = Path(sys.executable).with_name("fleetfence")

REPO = Path(__file__).resolve().parents[2]
CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
UI_TIMEOUT_MS = 10_000


class Api:
    """A TestClient plus the three callers of the auth matrix."""

    def __init__(
        self, client: TestClient, settings: ApiSettings, r: redis.Redis, admin: str, viewer: str
    ) -> None:
        self.c = client
        self.settings = settings
        self.r = r
        self.admin = {"X-API-Key": admin}
        self.viewer = {"X-API-Key": viewer}
        self.p = settings.redis_prefix


class ApiServer:
    """`fleetfence api` as deployed (relay inside) and the keys of its two roles."""

    def __init__(self, base: str, conf: Settings, admin: str, viewer: str, r: redis.Redis) -> None:
        self.base = base
        self.conf = conf
        self.admin = {"X-API-Key": admin}
        self.viewer = {"X-API-Key": viewer}
        self.r = r


@dataclass
class Cli:
    conf: ApiSettings
    env: dict[str, str]
    cwd: Path
    r: redis.Redis

    def run(self, *args: str, ok: bool = True) -> subprocess.CompletedProcess[str]:
        res = subprocess.run(
            [str(FLEETFENCE), "apikey", *args],
            check=False,  # the exit code is asserted below, with the output in the message
            env=self.env,
            cwd=self.cwd,
            capture_output=True,
            text=True,
            timeout=60,
        )
        if ok:
            assert res.returncode == 0, f"{args}: rc={res.returncode}\n{res.stdout}\n{res.stderr}"
        return res


class AlertHistory:
    """The alert history receiver's sink on a Redis: one Lua script stores an alert, updates the
    vehicle's open conditions and publishes it, exactly as `alerts run` does."""

    def __init__(self, redis_url: str, prefix: str) -> None:
        self.sink = HistorySink(redis.Redis.from_url(redis_url), prefix)
        self.ctx = Context(
            SourceRecord("t", 0, 0, None),
            ReceiverMetrics("history", CollectorRegistry()),
            None,
            threading.Event(),
        )

    def deliver(self, alert: Mapping[str, Any]) -> None:
        assert self.sink.deliver(parse_alert(orjson.dumps(alert)), self.ctx) is Outcome.DELIVERED

    def close(self) -> None:
        self.sink.close()


class MapServer:
    """`fleetfence api` for the map (no relay) with the processor's live-state writer and the alert
    history receiver's sink, so the page sees exactly what production publishes."""

    def __init__(self, base: str, conf: Settings, admin: str, viewer: str, r: redis.Redis) -> None:
        self.base = base
        self.conf = conf
        self.p = conf.redis_prefix
        self.admin_key = admin
        self.viewer_key = viewer
        self.admin = {"X-API-Key": admin}
        self.viewer = {"X-API-Key": viewer}
        self.r = r
        self.live_writer = AlertStreamWriter(
            {
                "bootstrap": conf.bootstrap_servers,
                "alertstopic": "unused",
                "dlqtopic": "unused",
                "markerstopic": "unused",
                "sinkid": "map-test",
                "redisurl": conf.redis_dsn,
                "redisprefix": conf.redis_prefix,
            }
        )
        self.history = AlertHistory(conf.redis_dsn, conf.redis_prefix)

    def write_live(self, states: list[dict[str, Any]], written: int | None = None) -> None:
        """Exactly the processor's path: pack per bucket, unpack in the sink, Lua write + publish
        (the batch is published even when Redis keeps a newer state)."""
        n = self.live_writer._write_live(unpack_live(pack_live(states)))
        assert n == (len(states) if written is None else written)

    def deliver_alert(self, alert: dict[str, Any]) -> None:
        """Exactly the alert history receiver's path: one Lua script that stores and publishes."""
        self.history.deliver(alert)


@contextmanager
def running_api(conf: Settings, log_dir: Path, **env: str) -> Iterator[str]:
    """`fleetfence api` as deployed, as a subprocess (without the relay: nothing here needs Kafka);
    yields its base URL."""
    port = free_port()
    full_env = {
        **os.environ,
        "FLEETFENCE_REDIS_URL": conf.redis_dsn,
        "FLEETFENCE_KAFKA_BOOTSTRAP": conf.bootstrap_servers,
        "FLEETFENCE_REDIS_PREFIX": conf.redis_prefix,
        # The session's broker, as an external one, with its accounts: the map's credential
        # actions reach the test's Mosquitto, never one a developer runs in the checkout.
        "FLEETFENCE_MQTT_URL": "mqtt://{}:{}".format(*conf.mqtt_host_port),
        **account_env(conf),
        "FLEETFENCE_API_PORT": str(port),
        "FLEETFENCE_API_RUN_RELAY": "false",
        "FLEETFENCE_API_SSE_HEARTBEAT_S": "1",
        "FLEETFENCE_API_KEY_CACHE_S": "0",
        "FLEETFENCE_API_MAP_TILE_URL": "",
        "PYTHONPATH": str(REPO),  # this checkout's code, whatever the venv's install points at
        **env,
    }
    log = log_dir / "api.log"
    proc = subprocess.Popen(
        [str(FLEETFENCE), "api"], env=full_env, stdout=log.open("ab"), stderr=subprocess.STDOUT
    )
    base = f"http://127.0.0.1:{port}"
    try:
        try:
            wait_http(
                lambda: proc.poll() is None and httpx.get(f"{base}/healthz").status_code == 200, 30, "api up"
            )
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n{log.read_text()[-3000:]}") from None
        yield base
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)
    assert "map's front-end libraries are missing" not in log.read_text()


class Watched:
    """A page plus everything it requested and every console error it logged."""

    def __init__(self, page: Page, base: str) -> None:
        self.page = page
        self.base = base
        self.requests: list[str] = []
        self.errors: list[str] = []
        page.on("request", self._request)
        page.on("console", self._console)
        page.on("pageerror", lambda exc: self.errors.append(f"pageerror: {exc}"))

    def _request(self, req: Request) -> None:
        self.requests.append(req.url)

    def _console(self, msg: ConsoleMessage) -> None:
        if msg.type == "error":
            self.errors.append(msg.text)

    def external(self) -> list[str]:
        return [u for u in self.requests if not u.startswith(("http://127.0.0.1:", "data:", "blob:"))]

    def login(self, key: str) -> None:
        page = self.page
        page.goto(f"{self.base}/map")
        page.get_by_role("textbox", name="Key").fill(key)
        page.get_by_role("button", name="Connect").click()
        page.wait_for_selector("body[data-loaded='true']", timeout=UI_TIMEOUT_MS)
        page.wait_for_selector("body[data-stream='live']", timeout=UI_TIMEOUT_MS)

    def marker_latlng(self, vid: str) -> tuple[float, float]:
        ll = self.page.evaluate(
            "vid => { const v = window.fleetfence.vehicles.get(vid); if (!v) return null;"
            " const p = v.marker.getLatLng(); return [p.lat, p.lng]; }",
            vid,
        )
        return (ll[0], ll[1]) if ll else (float("nan"), float("nan"))

    def screen_point(self, lat: float, lon: float) -> tuple[float, float]:
        box = self.page.locator("#map").bounding_box()
        assert box is not None
        pt = self.page.evaluate(
            "([lat, lon]) => { const p = window.fleetfence.map.latLngToContainerPoint([lat, lon]);"
            " return [p.x, p.y]; }",
            [lat, lon],
        )
        return box["x"] + pt[0], box["y"] + pt[1]
