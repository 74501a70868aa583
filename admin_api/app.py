"""The admin API application: `create_app(settings)`; `fleetfence api` serves it with uvicorn.

The lifespan owns the shared resources (one Redis connection pool, the key verifier, optionally
the in-process outbox relay) so tests and workers each get their own, cleanly closed.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import redis
import redis.asyncio as aioredis
from fastapi import FastAPI
from fastapi.exceptions import RequestValidationError
from fastapi.middleware.cors import CORSMiddleware
from redis.maint_notifications import MaintNotificationsConfig

from admin_api.middleware import BodyLimitMiddleware, MetricsMiddleware
from admin_api.readmodels import LiveReader
from admin_api.responses import master_error_handler, redis_unavailable_handler, request_validation_handler
from admin_api.routers import credentials, live, master, reports, system, trackers, web
from admin_api.security import KeyVerifier
from admin_api.settings import ApiSettings
from fleetfence import __version__
from fleetfence.readmodels import ReadKeys
from vehicle_master.errors import MasterError
from vehicle_master.relay import OutboxRelay
from vehicle_master.store import AsyncVehicleMaster

logger = logging.getLogger(__name__)

DESCRIPTION = """
FleetFence's admin API: the vehicle master (routes, zones, vehicles, assignments; GeoJSON in and
out), live vehicle state, alert history and a Server-Sent Events stream. The live operations map
is at [/map](/map).

Send an API key in `X-API-Key` (`fleetfence apikey create NAME --role admin|viewer`): viewer keys
read, admin keys also write. Every entity response carries its version as `ETag`; send it back in
`If-Match` to update only that version (412 when someone changed it meanwhile).
"""


def open_redis(settings: ApiSettings) -> aioredis.Redis:
    """The API's one Redis client, with the pool checking each idle connection before using it.

    redis-py 8.1's asyncio pool checks a connection it hands out for "closed by the server" only
    when maintenance notifications are off, and its default (`enabled="auto"` with RESP3, which a
    plain Redis rejects) counts as on. So every connection that sat idle in the pool while Redis
    restarted was handed out as it was and failed the first command sent on it, at whatever time
    the pool next reached it (issue #64: a DELETE answered 500 minutes after the restart, Redis
    up). Maintenance notifications come from managed Redis (Redis Cloud / Software), never from
    FleetFence's single Redis; off, the pool finds the closed connection and reconnects it before
    the command goes out. Upstream changes the check in redis-py #4260; 8.1.0, pinned here, has not.

    No command is retried (the pool's default, kept): a write script that ran before its reply
    was lost must not run twice (a create would answer 409, a delete 404, for the client's own
    write). A failure answers 503 with Retry-After instead (`redis_unavailable_handler`).
    """
    return aioredis.Redis.from_url(
        settings.redis_dsn,
        max_connections=256,
        maint_notifications_config=MaintNotificationsConfig(enabled=False),
    )


def create_app(settings: ApiSettings | None = None) -> FastAPI:
    settings = settings or ApiSettings()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        r = open_redis(settings)
        app.state.redis = r
        app.state.master = AsyncVehicleMaster(r, settings.redis_prefix)
        app.state.keys = KeyVerifier(r, settings.redis_prefix, settings.api_key_cache_s)
        app.state.live_reader = LiveReader(r, app.state.read_keys)
        relay = OutboxRelay(settings).start() if settings.api_run_relay else None
        logger.info("admin api started relay=%s prefix=%s", relay is not None, settings.redis_prefix)
        try:
            yield
        finally:
            if relay is not None:
                relay.stop()
            credentials.close_credentials(app)
            trackers.close_trackers(app)
            await r.aclose()
            logger.info("admin api stopped")

    app = FastAPI(
        title="FleetFence admin API",
        version=__version__,
        description=DESCRIPTION,
        lifespan=lifespan,
    )
    app.state.settings = settings
    app.state.read_keys = ReadKeys(settings.redis_prefix)
    app.add_exception_handler(MasterError, master_error_handler)
    app.add_exception_handler(RequestValidationError, request_validation_handler)
    # Redis unreachable, restarting, still loading its data, or not answering in time.
    app.add_exception_handler(redis.ConnectionError, redis_unavailable_handler)
    app.add_exception_handler(redis.TimeoutError, redis_unavailable_handler)
    app.include_router(master.router)
    app.include_router(credentials.router)
    app.include_router(trackers.router)
    app.include_router(live.router)
    app.include_router(system.router)
    app.include_router(reports.router)
    app.include_router(web.router)
    web.mount_static(app, settings)
    if settings.api_cors_origins:
        app.add_middleware(
            CORSMiddleware,
            allow_origins=settings.api_cors_origins,
            allow_methods=["GET", "POST", "PUT", "DELETE"],
            allow_headers=["X-API-Key", "If-Match", "Content-Type"],
            expose_headers=["ETag", "Location"],
        )
    app.add_middleware(BodyLimitMiddleware, max_body_bytes=settings.api_max_body_bytes)
    app.add_middleware(MetricsMiddleware)
    return app
