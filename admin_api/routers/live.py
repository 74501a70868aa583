"""Read models: live vehicle state, alert history, and a Server-Sent Events stream of both.

Stored values are already the JSON clients want, so the read path splices the stored bytes into
the response instead of decoding and re-encoding them.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from typing import Annotated, Any, Literal

import orjson
from fastapi import APIRouter, HTTPException, Path, Query, Request, Response, Security
from fastapi.responses import StreamingResponse

from admin_api.deps import Redis, StreamViewer, Viewer, api_key_header
from admin_api.problems import INVALID, UNAUTHORIZED, problem_doc
from admin_api.read_schemas import Alert, AlertPage, LivePage, LiveState, StreamToken
from admin_api.readmodels import LiveReader
from admin_api.responses import OrjsonResponse
from admin_api.security import issue_stream_token
from fleetfence.contracts import VEHICLE_ID_RE, AlertType
from fleetfence.readmodels import ReadKeys

logger = logging.getLogger(__name__)
router = APIRouter(prefix="/api/v1")

VehiclePath = Annotated[str, Path(pattern=VEHICLE_ID_RE.pattern)]
ERRORS: dict[int | str, dict[str, Any]] = {
    401: UNAUTHORIZED,
    404: problem_doc("Not found", "no live state for vehicle 'truck-042' (no fix processed yet)"),
    422: INVALID,
}
SCAN_CHUNK = 200


def _keys(request: Request) -> ReadKeys:
    keys: ReadKeys = request.app.state.read_keys
    return keys


def _str(v: Any) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


def _loads_all(raws: list[Any]) -> list[dict[str, Any]]:
    return [orjson.loads(r) for r in raws if r is not None]


@router.get("/live", response_model=LivePage, responses=ERRORS, tags=["live"])
async def list_live(
    request: Request,
    _: Viewer,
    r: Redis,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
    offset: Annotated[int, Query(ge=0, le=10_000_000)] = 0,
    status: Literal["on_route", "off_route", "unassigned"] | None = None,
) -> Response:
    """Live state of every vehicle, most recent fix first, optionally of one status."""
    keys = _keys(request)
    items: list[dict[str, Any]] = []
    pos = offset
    while len(items) < limit:
        ids = await r.zrevrange(keys.live_index, pos, pos + SCAN_CHUNK - 1)
        if not ids:
            pos = -1
            break
        states = _loads_all(await r.mget([keys.live(_str(i)) for i in ids]))
        for n, s in enumerate(states):
            if status is None or s.get("status") == status:
                items.append(s)
                if len(items) == limit:
                    pos += n + 1
                    break
        else:
            pos += len(ids)
    return OrjsonResponse({"items": items, "next_offset": pos if pos >= 0 and len(items) == limit else None})


@router.get("/live/{vehicle_id}", response_model=LiveState, responses=ERRORS, tags=["live"])
async def get_live(request: Request, _: Viewer, vehicle_id: VehiclePath) -> Response:
    """Last position, status, route progress and the open alerts of one vehicle."""
    reader: LiveReader = request.app.state.live_reader
    raw, open_raw = await reader.one(vehicle_id)
    if raw is None:
        raise HTTPException(404, f"no live state for vehicle {vehicle_id!r} (no fix processed yet)")
    state = orjson.loads(raw)
    state["open_alerts"] = sorted(_loads_all(open_raw), key=lambda a: a.get("ts_ms", 0))
    return OrjsonResponse(state)


@router.get("/alerts", response_model=AlertPage, responses=ERRORS, tags=["alerts"])
async def list_alerts(
    *,
    request: Request,
    _: Viewer,
    r: Redis,
    vehicle_id: Annotated[str | None, Query(pattern=VEHICLE_ID_RE.pattern)] = None,
    type: AlertType | None = None,
    since_ms: Annotated[int | None, Query(ge=0, le=2**53, description="Inclusive, epoch ms UTC.")] = None,
    until_ms: Annotated[int | None, Query(ge=0, le=2**53, description="Inclusive, epoch ms UTC.")] = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
    offset: Annotated[int, Query(ge=0, le=10_000_000)] = 0,
) -> Response:
    """Alert history, newest first, by vehicle, type and time window."""
    keys = _keys(request)
    if vehicle_id is not None:
        index = keys.alerts_vehicle(vehicle_id)
    elif type is not None:
        index = keys.alerts_type(type.value)
    else:
        index = keys.alerts_by_ts
    hi: str | int = "+inf" if until_ms is None else until_ms
    lo: str | int = "-inf" if since_ms is None else since_ms
    post_filter = type.value if vehicle_id is not None and type is not None else None
    items: list[dict[str, Any]] = []
    pos = offset
    exhausted = False
    while len(items) < limit:
        ids = await r.zrange(index, hi, lo, desc=True, byscore=True, offset=pos, num=SCAN_CHUNK)
        if not ids:
            exhausted = True
            break
        alerts = _loads_all(await r.mget([keys.alert(_str(i)) for i in ids]))
        taken = len(ids)
        for n, a in enumerate(alerts):
            if post_filter is None or a.get("type") == post_filter:
                items.append(a)
                if len(items) == limit:
                    taken = n + 1
                    break
        pos += taken
    return OrjsonResponse({"items": items, "next_offset": None if exhausted or len(items) < limit else pos})


@router.get("/alerts/{alert_id}", response_model=Alert, responses=ERRORS, tags=["alerts"])
async def get_alert(
    request: Request, _: Viewer, r: Redis, alert_id: Annotated[str, Path(pattern=r"^[0-9a-f]{1,64}$")]
) -> Response:
    raw = await r.get(_keys(request).alert(alert_id))
    if raw is None:
        raise HTTPException(404, f"no alert {alert_id!r}")
    return Response(raw, media_type="application/json")


def _matches(payload: Any, vehicle_id: str | None) -> Any:
    """Filter an alert (object) or a positions batch (array) down to one vehicle."""
    if vehicle_id is None:
        return payload
    if isinstance(payload, list):
        kept = [p for p in payload if isinstance(p, dict) and p.get("vehicle_id") == vehicle_id]
        return kept or None
    if isinstance(payload, dict) and payload.get("vehicle_id") == vehicle_id:
        return payload
    return None


@router.post("/stream/token", response_model=StreamToken, responses=ERRORS, tags=["live"])
async def stream_token(
    request: Request, role: Viewer, r: Redis, key: Annotated[str | None, Security(api_key_header)]
) -> Response:
    """A short-lived token for `GET /api/v1/stream?token=...` (EventSource cannot send X-API-Key);
    also tells the caller its role, so a UI shows editing tools only to admins."""
    ttl_s: int = request.app.state.settings.api_stream_token_ttl_s
    token = await issue_stream_token(r, request.app.state.settings.redis_prefix, key or "", ttl_s)
    return OrjsonResponse(
        {"token": token, "expires_in_s": ttl_s, "role": role.value}, headers={"Cache-Control": "no-store"}
    )


@router.get(
    "/stream",
    tags=["live"],
    responses={
        200: {"content": {"text/event-stream": {}}, "description": "SSE: `alert` and `positions` events"},
        401: problem_doc(
            "No or unknown API key or stream token",
            "unknown or expired stream token: ask POST /api/v1/stream/token for a new one",
        ),
        422: INVALID,
    },
    response_class=StreamingResponse,
)
async def stream(
    request: Request,
    _: StreamViewer,
    r: Redis,
    channels: Annotated[list[Literal["alerts", "positions"]] | None, Query()] = None,
    vehicle_id: Annotated[str | None, Query(pattern=VEHICLE_ID_RE.pattern)] = None,
) -> StreamingResponse:
    """Server-Sent Events: `event: alert` (one alert) and `event: positions` (a batch of live
    states), as the processor and the alert receiver publish them; a comment line every
    FLEETFENCE_API_SSE_HEARTBEAT_S keeps proxies from closing an idle stream. Browsers, whose
    EventSource cannot send X-API-Key, pass `token` from `POST /api/v1/stream/token` instead."""
    keys = _keys(request)
    wanted = set(channels or ["alerts", "positions"])
    names = {keys.alerts_channel: "alert", keys.positions_channel: "positions"}
    subscribe = [ch for ch, ev in names.items() if (ev == "alert" and "alerts" in wanted) or ev in wanted]
    heartbeat_s: float = request.app.state.settings.api_sse_heartbeat_s
    pubsub = r.pubsub()
    await pubsub.subscribe(*subscribe)  # before the response starts: no event published after 200 is lost

    async def events() -> AsyncIterator[bytes]:
        try:
            yield b": connected\n\n"
            while True:
                msg = await pubsub.get_message(ignore_subscribe_messages=True, timeout=heartbeat_s)
                if msg is None:
                    yield b": keep-alive\n\n"
                    continue
                channel = _str(msg["channel"])
                try:
                    payload = _matches(orjson.loads(msg["data"]), vehicle_id)
                except orjson.JSONDecodeError:
                    logger.warning("undecodable pub/sub message channel=%s", channel)
                    continue
                if payload is not None:
                    yield b"event: " + names[channel].encode() + b"\ndata: " + orjson.dumps(payload) + b"\n\n"
        except asyncio.CancelledError:
            raise
        finally:
            await pubsub.unsubscribe()
            await pubsub.aclose()  # type: ignore[no-untyped-call]

    return StreamingResponse(
        events(),
        media_type="text/event-stream",
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
    )
