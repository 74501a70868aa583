"""`fleetfence apikey create|list|revoke` as an operator runs it: the installed console script in a
subprocess against the private Redis, checked through the admin API (TestClient, same Redis and
prefix): the printed key works with its role, `list` never shows a key, `revoke` makes it a 401,
and Redis holds only SHA-256 digests."""

from __future__ import annotations

import hashlib
import subprocess

import pytest
from fastapi.testclient import TestClient

from admin_api.app import create_app
from admin_api.schemas import ROUTE_EXAMPLE
from tests.admin_api.helpers import Cli

pytestmark = pytest.mark.services


def text(x: bytes | str) -> str:
    """A Redis reply as text (this client returns bytes; redis' stubs allow either)."""
    return x.decode() if isinstance(x, bytes) else x


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
    names = {text(k): text(v) for k, v in cli.r.hgetall(f"{p}apikeys:names").items()}
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
