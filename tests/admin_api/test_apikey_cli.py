"""`fleetfence apikey create|list|revoke` as an operator runs it: the installed console script in a
subprocess against the private Redis, checked through the admin API (TestClient, same Redis and
prefix): the printed key works with its role, `list` never shows a key, `revoke` makes it a 401,
and Redis holds only SHA-256 digests."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import redis
from fastapi.testclient import TestClient

from admin_api.app import create_app
from admin_api.schemas import ROUTE_EXAMPLE
from admin_api.settings import ApiSettings
from fleetfence.settings import Settings

pytestmark = pytest.mark.services

FLEETFENCE = Path(sys.executable).with_name("fleetfence")


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


def created_key(res: subprocess.CompletedProcess[str]) -> str:
    """`create` prints the key alone on stdout (the notice goes to stderr)."""
    lines = res.stdout.strip().splitlines()
    assert len(lines) == 1, res.stdout
    assert lines[0].startswith("ffk_")
    return lines[0]


def sha256(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def test_apikey_create_list_revoke_through_the_real_cli(cli: Cli) -> None:
    admin = created_key(cli.run("create", "ops-admin", "--role", "admin"))
    viewer_res = cli.run("create", "dashboard", "--role", "viewer")
    viewer = created_key(viewer_res)
    assert "store it now" in viewer_res.stderr
    assert viewer not in viewer_res.stderr  # shown once, on stdout only (logs go to stderr)
    dup = cli.run("create", "dashboard", "--role", "admin", ok=False)
    assert dup.returncode == 2
    assert "already exists" in dup.stderr
    bad_role = cli.run("create", "root", "--role", "superuser", ok=False)
    assert bad_role.returncode == 2
    assert "role must be admin or viewer" in bad_role.stderr

    # Redis holds each key only as its SHA-256 digest: the names index points at the digest, and no
    # stored value under the prefix contains a plain key.
    p = cli.conf.redis_prefix
    names = {k.decode(): v.decode() for k, v in cli.r.hgetall(f"{p}apikeys:names").items()}
    assert names == {"ops-admin": sha256(admin), "dashboard": sha256(viewer)}
    assert cli.r.hget(f"{p}apikey:{sha256(admin)}", "role") == b"admin"
    assert cli.r.hget(f"{p}apikey:{sha256(viewer)}", "role") == b"viewer"
    stored = b"".join(k + (cli.r.dump(k) or b"") for k in cli.r.scan_iter(match=f"{p}*"))
    assert admin.encode() not in stored
    assert viewer.encode() not in stored

    listed = cli.run("list")
    out = listed.stdout + listed.stderr
    for name, role in (("ops-admin", "admin"), ("dashboard", "viewer")):
        line = next(ln for ln in listed.stdout.splitlines() if name in ln)
        assert role in line
    for secret in (admin, viewer, sha256(admin), sha256(viewer)):
        assert secret not in out

    route = {**ROUTE_EXAMPLE, "id": "r-cli"}
    with TestClient(create_app(cli.conf)) as c:
        assert c.post("/api/v1/routes", json=route, headers={"X-API-Key": admin}).status_code == 201
        assert c.get("/api/v1/routes/r-cli", headers={"X-API-Key": viewer}).status_code == 200
        denied = c.delete("/api/v1/routes/r-cli", headers={"X-API-Key": viewer})
        assert denied.status_code == 403
        assert c.post("/api/v1/stream/token", headers={"X-API-Key": viewer}).json()["role"] == "viewer"

        assert "revoked dashboard" in cli.run("revoke", "dashboard").stderr.splitlines()
        gone = c.get("/api/v1/routes/r-cli", headers={"X-API-Key": viewer})
        assert (gone.status_code, gone.json()["detail"]) == (401, "unknown or revoked API key")
        assert c.get("/api/v1/routes/r-cli", headers={"X-API-Key": admin}).status_code == 200

    assert not cli.r.exists(f"{p}apikey:{sha256(viewer)}")
    assert "dashboard" not in cli.run("list").stdout
    again = cli.run("revoke", "dashboard", ok=False)
    assert again.returncode == 2
    assert "no API key named 'dashboard'" in again.stderr
