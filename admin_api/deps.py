"""FastAPI dependencies: the store, Redis, the caller's role, and the If-Match precondition."""

from __future__ import annotations

from typing import Annotated

import redis.asyncio as aioredis
from fastapi import Depends, Header, HTTPException, Path, Query, Request, Security
from fastapi.security import APIKeyHeader

from admin_api.security import KeyVerifier, Role, stream_token_role
from admin_api.settings import ApiSettings
from fleetfence.contracts import VEHICLE_ID_RE
from vehicle_master.store import AsyncVehicleMaster

api_key_header = APIKeyHeader(
    name="X-API-Key",
    auto_error=False,
    description="Create one with `fleetfence apikey create NAME --role admin|viewer`.",
)


def get_settings(request: Request) -> ApiSettings:
    settings: ApiSettings = request.app.state.settings
    return settings


def get_master(request: Request) -> AsyncVehicleMaster:
    master: AsyncVehicleMaster = request.app.state.master
    return master


def get_redis(request: Request) -> aioredis.Redis:
    r: aioredis.Redis = request.app.state.redis
    return r


async def current_role(request: Request, key: Annotated[str | None, Security(api_key_header)]) -> Role:
    """401 without a key or with an unknown one."""
    if not key:
        raise HTTPException(
            401, "missing API key: send it in the X-API-Key header", {"WWW-Authenticate": "ApiKey"}
        )
    verifier: KeyVerifier = request.app.state.keys
    role = await verifier.role_of(key)
    if role is None:
        raise HTTPException(401, "unknown or revoked API key", {"WWW-Authenticate": "ApiKey"})
    return role


async def require_admin(role: Annotated[Role, Depends(current_role)]) -> Role:
    """403 for a viewer: only admins change the master data."""
    if role is not Role.ADMIN:
        raise HTTPException(403, "this operation needs an admin API key; yours is a viewer key")
    return role


async def stream_role(
    request: Request,
    key: Annotated[str | None, Security(api_key_header)],
    token: Annotated[
        str | None,
        Query(
            max_length=128,
            description="A token from `POST /api/v1/stream/token`, for clients that cannot send headers "
            "(browsers' EventSource). Accepted on this route only.",
        ),
    ] = None,
) -> Role:
    """X-API-Key as everywhere, or a short-lived stream token; 401 otherwise."""
    if key or not token:
        return await current_role(request, key)
    settings: ApiSettings = request.app.state.settings
    role = await stream_token_role(request.app.state.redis, settings.redis_prefix, token)
    if role is None:
        raise HTTPException(
            401, "unknown or expired stream token: ask POST /api/v1/stream/token for a new one"
        )
    return role


Viewer = Annotated[Role, Depends(current_role)]
StreamViewer = Annotated[Role, Depends(stream_role)]
Admin = Annotated[Role, Depends(require_admin)]
Master = Annotated[AsyncVehicleMaster, Depends(get_master)]
Redis = Annotated[aioredis.Redis, Depends(get_redis)]


def parse_if_match(value: str | None) -> tuple[int | None, bool]:
    """If-Match -> (expected version or None, must_exist).

    `"3"`, `W/"3"` and a bare `3` name version 3; `*` means "any existing version". Anything else
    cannot match a version, so it is a failed precondition (412), not a server error.
    """
    if value is None:
        return None, False
    v = value.strip()
    if v == "*":
        return None, True
    v = v.removeprefix("W/").strip('"')
    if not v.isdigit() or len(v) > 18:
        raise HTTPException(
            412, f'If-Match must be an ETag such as "3" (the entity version), got {value[:40]!r}'
        )
    return int(v), True


# The id in a route's path: every master entity (and a vehicle's credentials) is addressed by one.
EntityPath = Annotated[str, Path(pattern=VEHICLE_ID_RE.pattern, description="Entity id.")]

IfMatch = Annotated[
    str | None,
    Header(
        alias="If-Match",
        description='The ETag (version) you read, e.g. `"3"`; 412 when it is no longer current.',
    ),
]


def etag(version: int) -> str:
    return f'"{version}"'
