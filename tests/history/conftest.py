"""The history tests' fixtures: the recorded scenario (real broker, processor and archive), and
the reports' hand-made archive with the readers and the admin API over it."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from fastapi.testclient import TestClient

from fleetfence.settings import Settings
from history.reports import SedonaReports
from history.reports_baseline import BaselineReports
from history.settings import HistorySettings
from tests.history.helpers import BUCKETS, FULL, Recording, record, write_report_archive


@pytest.fixture(scope="session")
def rec(spark: Any, infra_settings: Settings, tmp_path_factory: pytest.TempPathFactory) -> Recording:
    """Recorded once per session, shared by the archive and the restatement tests."""
    return record(spark, infra_settings, tmp_path_factory.mktemp("history"))


@pytest.fixture(scope="module")
def archive(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_report_archive(tmp_path_factory.mktemp("archive"))


@pytest.fixture(scope="module")
def sedona(archive: Path) -> SedonaReports:
    return SedonaReports(archive, FULL, BUCKETS)


@pytest.fixture(scope="module")
def baseline(archive: Path) -> BaselineReports:
    return BaselineReports(archive, FULL, BUCKETS)


@pytest.fixture(scope="module")
def api(archive: Path, infra_settings: Settings) -> Iterator[tuple[TestClient, dict[str, str]]]:
    from admin_api.app import create_app
    from admin_api.security import Role, create_api_key
    from admin_api.settings import ApiSettings

    conf = ApiSettings.from_base(
        infra_settings, redis_prefix=f"rep{uuid.uuid4().hex[:8]}:", api_run_relay=False, api_key_cache_s=0
    )
    r = redis.Redis.from_url(conf.redis_dsn)
    viewer = create_api_key(r, conf.redis_prefix, "viewer", Role.VIEWER)
    app = create_app(conf)
    app.state.history_settings = HistorySettings.from_base(
        conf, history_archive_path=str(archive), history_buckets=BUCKETS
    )
    with TestClient(app) as client:
        yield client, {"X-API-Key": viewer}
    r.close()
