"""The admin API's fixtures: a TestClient with an admin and a viewer key, `fleetfence api` as a real
subprocess (with the relay, and for the map without it), the `fleetfence apikey` CLI's environment,
and headless Chromium for the map."""

from __future__ import annotations

import os
import signal
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import redis
from fastapi.testclient import TestClient
from playwright.sync_api import Browser, Playwright, sync_playwright

from admin_api.app import create_app
from admin_api.security import Role, create_api_key
from admin_api.settings import ApiSettings
from fleetfence.kafka import ensure_topics, topic_specs
from fleetfence.mqtt import account_env
from fleetfence.probes import free_port
from fleetfence.settings import Settings
from tests.admin_api.helpers import (
    CHROMIUM,
    CHROMIUM_ARGS,
    FLEETFENCE,
    REPO,
    UI_TIMEOUT_MS,
    Api,
    ApiServer,
    Cli,
    MapServer,
    Watched,
    running_api,
    wait_http,
)


@pytest.fixture
def api_conf(settings: Settings) -> ApiSettings:
    return ApiSettings.from_base(
        settings,
        redis_prefix=f"{settings.redis_prefix}{uuid.uuid4().hex[:8]}:",
        api_run_relay=False,
        api_key_cache_s=0,
        api_max_body_bytes=64 * 1024,
        api_cors_origins=["https://ops.example"],
    )


@pytest.fixture
def api(api_conf: ApiSettings) -> Iterator[Api]:
    r = redis.Redis.from_url(api_conf.redis_dsn)
    admin = create_api_key(r, api_conf.redis_prefix, "admin", Role.ADMIN)
    viewer = create_api_key(r, api_conf.redis_prefix, "viewer", Role.VIEWER)
    with TestClient(create_app(api_conf)) as client:
        yield Api(client, api_conf, r, admin, viewer)
    r.close()


@pytest.fixture(scope="module")
def api_server(infra_settings: Settings, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ApiServer]:
    conf = infra_settings.model_copy(
        update={
            "topic_prefix": f"t{uuid.uuid4().hex[:10]}.",
            "redis_prefix": f"{infra_settings.redis_prefix}{uuid.uuid4().hex[:8]}:",
        }
    )
    ensure_topics(conf.bootstrap_servers, topic_specs(conf))
    r = redis.Redis.from_url(conf.redis_dsn)
    admin = create_api_key(r, conf.redis_prefix, "admin", Role.ADMIN)
    viewer = create_api_key(r, conf.redis_prefix, "viewer", Role.VIEWER)
    port = free_port()
    env = {
        **os.environ,
        "FLEETFENCE_REDIS_URL": conf.redis_dsn,
        "FLEETFENCE_KAFKA_BOOTSTRAP": conf.bootstrap_servers,
        # The session's broker, as an external one, with its accounts (vehicles' credentials).
        "FLEETFENCE_MQTT_URL": "mqtt://{}:{}".format(*conf.mqtt_host_port),
        **account_env(conf),
        "FLEETFENCE_TOPIC_PREFIX": conf.topic_prefix,
        "FLEETFENCE_REDIS_PREFIX": conf.redis_prefix,
        "FLEETFENCE_API_PORT": str(port),
        "FLEETFENCE_API_RUN_RELAY": "true",
        "FLEETFENCE_API_SSE_HEARTBEAT_S": "0.5",
        "FLEETFENCE_RELAY_BLOCK_MS": "100",
    }
    log = tmp_path_factory.mktemp("api") / "api.log"
    proc = subprocess.Popen(
        [str(FLEETFENCE), "api"], env=env, stdout=log.open("ab"), stderr=subprocess.STDOUT
    )
    base = f"http://127.0.0.1:{port}"
    try:
        wait_http(
            lambda: proc.poll() is None and httpx.get(f"{base}/healthz").status_code == 200, 30, "api up"
        )
        yield ApiServer(base, conf, admin, viewer, r)
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)
        r.close()
    # uvicorn exits by re-raising SIGTERM once its graceful shutdown has completed.
    assert proc.returncode in (0, -signal.SIGTERM), log.read_text()[-3000:]
    assert "Application shutdown complete" in log.read_text()


@pytest.fixture
def cli(settings: Settings, tmp_path: Path) -> Iterator[Cli]:
    """The CLI's environment: the private Redis and a prefix of this test's own, nothing else of
    the caller's FLEETFENCE_* (which could name shared services)."""
    prefix = f"{settings.redis_prefix}{uuid.uuid4().hex[:8]}:"
    # Revocation is checked right after `revoke`: no verified-key cache to wait out.
    conf = ApiSettings.from_base(settings, redis_prefix=prefix, api_run_relay=False, api_key_cache_s=0)
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLEETFENCE_")}
    env |= {"FLEETFENCE_REDIS_URL": conf.redis_dsn, "FLEETFENCE_REDIS_PREFIX": prefix, "COLUMNS": "200"}
    r = redis.Redis.from_url(conf.redis_dsn)
    try:
        yield Cli(conf, env, tmp_path, r)
    finally:
        r.close()


@pytest.fixture(scope="module")
def artifacts() -> Path:
    d = Path(os.environ.get("FLEETFENCE_TEST_ARTIFACTS", REPO / "test-artifacts")) / "map"
    d.mkdir(parents=True, exist_ok=True)
    return d


@pytest.fixture(scope="module")
def map_server(infra_settings: Settings, tmp_path_factory: pytest.TempPathFactory) -> Iterator[MapServer]:
    conf = infra_settings.model_copy(
        update={"redis_prefix": f"{infra_settings.redis_prefix}{uuid.uuid4().hex[:8]}:"}
    )
    r = redis.Redis.from_url(conf.redis_dsn)
    admin = create_api_key(r, conf.redis_prefix, "admin", Role.ADMIN)
    viewer = create_api_key(r, conf.redis_prefix, "viewer", Role.VIEWER)
    try:
        with running_api(conf, tmp_path_factory.mktemp("map-api")) as base:
            srv = MapServer(base, conf, admin, viewer, r)
            try:
                yield srv
            finally:
                srv.history.close()
    finally:
        r.close()


@pytest.fixture(scope="module")
def playwright() -> Iterator[Playwright]:
    with sync_playwright() as p:
        yield p


@pytest.fixture(scope="module")
def browser(playwright: Playwright) -> Iterator[Browser]:
    assert CHROMIUM.exists(), "Debian chromium is missing: apt-get install chromium (scripts/dev.sh does)"
    b = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
    try:
        yield b
    finally:
        b.close()


@pytest.fixture
def watched(browser: Browser, map_server: MapServer) -> Iterator[Watched]:
    context = browser.new_context(viewport={"width": 1366, "height": 850})
    page = context.new_page()
    page.set_default_timeout(UI_TIMEOUT_MS)
    try:
        yield Watched(page, map_server.base)
    finally:
        context.close()
