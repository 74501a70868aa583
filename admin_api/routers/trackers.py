"""Trackers bound to vehicles: the identities the device edge admits trackers by.

A Teltonika unit connects with its IMEI only, Traccar Client with its device identifier only;
binding that id to a vehicle here is what lets it send, and its fixes become that vehicle's
(vehicle_master.trackers). Writes need an admin key, reading a viewer key. Deleting a vehicle
unbinds its trackers.
"""

from __future__ import annotations

import threading
from typing import Annotated, Any

import redis
from fastapi import APIRouter, Path, Request, Response
from fastapi.concurrency import run_in_threadpool

from admin_api.deps import Admin, EntityPath, Viewer
from admin_api.problems import READ_ERRORS, WRITE_ERRORS
from admin_api.schemas import HeardOut, TrackerOut, TrackersOut
from admin_api.settings import ApiSettings
from fleetfence import heard
from fleetfence.contracts import MasterEntity, ms_to_iso
from fleetfence.devices import TrackerProtocol
from fleetfence.heard import heard_of
from fleetfence.readmodels import ReadKeys
from vehicle_master.store import VehicleMaster
from vehicle_master.trackers import VehicleTrackers

router = APIRouter(prefix="/api/v1", tags=["trackers"])

TrackerId = Annotated[
    str,
    Path(
        min_length=1, max_length=64, description="The tracker's id: an IMEI, or Traccar Client's device id."
    ),
]
_lock = threading.Lock()


def _trackers(request: Request) -> VehicleTrackers:
    """The app's one tracker registry, on a synchronous Redis client (created on first use)."""
    app = request.app
    with _lock:
        t: VehicleTrackers | None = getattr(app.state, "trackers", None)
        if t is None:
            settings: ApiSettings = app.state.settings
            t = VehicleTrackers(redis.Redis.from_url(settings.redis_dsn), settings.redis_prefix)
            app.state.trackers = t
        return t


def close_trackers(app: Any) -> None:
    t: VehicleTrackers | None = getattr(app.state, "trackers", None)
    if t is not None:
        t.r.close()
        app.state.trackers = None


def _known(t: VehicleTrackers, vehicle_id: str) -> None:
    VehicleMaster(t.r, t.prefix).get(MasterEntity.VEHICLE, vehicle_id)  # NotFoundError: 404


def _bind(request: Request, vehicle_id: str, protocol: TrackerProtocol, tracker_id: str) -> bool:
    t = _trackers(request)
    _known(t, vehicle_id)
    return t.bind(vehicle_id, protocol, tracker_id)


def _unbind(request: Request, vehicle_id: str, protocol: TrackerProtocol, tracker_id: str) -> None:
    _trackers(request).unbind(vehicle_id, protocol, tracker_id)


def _list(request: Request, vehicle_id: str) -> TrackersOut:
    t = _trackers(request)
    _known(t, vehicle_id)
    return TrackersOut(
        [TrackerOut(vehicle_id=vehicle_id, protocol=p, tracker_id=i) for p, i in t.of_vehicle(vehicle_id)]
    )


@router.put(
    "/vehicles/{vehicle_id}/trackers/{protocol}/{tracker_id}",
    response_model=TrackerOut,
    status_code=201,
    responses={**WRITE_ERRORS, 200: {"description": "Bound to this vehicle already"}},
)
async def bind_tracker(
    _: Admin,
    request: Request,
    response: Response,
    vehicle_id: EntityPath,
    protocol: TrackerProtocol,
    tracker_id: TrackerId,
) -> TrackerOut:
    """Bind a tracker to the vehicle: from its next connection its fixes are this vehicle's. 201
    when bound now, 200 when it was already; 409 when another vehicle has it (unbind it there);
    422 for an id the protocol does not allow (a Teltonika IMEI is 15 digits, a Traccar Client
    id up to 64 letters, digits, `.`, `_`, `-`)."""
    if not await run_in_threadpool(_bind, request, vehicle_id, protocol, tracker_id):
        response.status_code = 200
    return TrackerOut(vehicle_id=vehicle_id, protocol=protocol, tracker_id=tracker_id)


@router.delete(
    "/vehicles/{vehicle_id}/trackers/{protocol}/{tracker_id}", status_code=204, responses=WRITE_ERRORS
)
async def unbind_tracker(
    _: Admin, request: Request, vehicle_id: EntityPath, protocol: TrackerProtocol, tracker_id: TrackerId
) -> Response:
    """Unbind: a connected tracker is cut off within `FLEETFENCE_GATEWAY_EDGE_RECHECK_S`. 404 when
    it is not bound to this vehicle."""
    await run_in_threadpool(_unbind, request, vehicle_id, protocol, tracker_id)
    return Response(status_code=204)


@router.get("/vehicles/{vehicle_id}/trackers", response_model=TrackersOut, responses=READ_ERRORS)
async def list_trackers(_: Viewer, request: Request, vehicle_id: EntityPath) -> TrackersOut:
    """The vehicle's trackers."""
    return await run_in_threadpool(_list, request, vehicle_id)


def _heard(request: Request, vehicle_id: str) -> HeardOut:
    t = _trackers(request)
    h = heard_of(t.r, ReadKeys(t.prefix), vehicle_id)
    if h is None:
        return HeardOut(vehicle_id=vehicle_id, protocol=None, heard_at=None, replica=None)
    return HeardOut(
        vehicle_id=vehicle_id, protocol=h.protocol, heard_at=ms_to_iso(h.at_ms), replica=h.replica
    )


@router.get("/vehicles/{vehicle_id}/heard", response_model=HeardOut, responses=READ_ERRORS)
async def vehicle_heard(_: Viewer, request: Request, vehicle_id: EntityPath) -> HeardOut:
    """Which protocol the device edge last heard the vehicle speak, when, and through which
    replica: the tracker actually in use (a phone app, a Teltonika unit, an MQTT client). Nulls
    for a vehicle never heard, whether or not the vehicle master knows it (an edge without
    logins hears vehicles it does not register)."""
    return await run_in_threadpool(_heard, request, vehicle_id)


def _forget(request: Request, vehicle_id: str) -> None:
    t = _trackers(request)
    t.unbind_all(vehicle_id)
    heard.drop(t.r, ReadKeys(t.prefix), vehicle_id)


async def unbind_on_delete(request: Request, vehicle_id: str) -> None:
    """A deleted vehicle's trackers are unbound with it, and it leaves the edge's read model of
    how it was last heard (a vehicle created again under its id starts unheard)."""
    await run_in_threadpool(_forget, request, vehicle_id)
