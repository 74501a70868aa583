"""Vehicles' MQTT credentials: issue, read, rotate, disable, enable, revoke.

Writes need an admin key, reading the status a viewer key. The secret is in the answer of issue
and rotate only (the broker keeps its hash, FleetFence nothing); Mosquitto enforces every change
at once, including for a vehicle that is connected (vehicle_master.credentials). The broker is
reached lazily, the first time a credential route is called, so the API starts and serves
everything else while Mosquitto is down; these routes then answer 503.
"""

from __future__ import annotations

import threading
from typing import Any

import redis
import redis.asyncio as aioredis
from fastapi import APIRouter, HTTPException, Request
from fastapi.concurrency import run_in_threadpool

from admin_api.deps import Admin, EntityPath, Redis, Viewer
from admin_api.problems import READ_ERRORS, WRITE_ERRORS, problem_doc
from admin_api.schemas import CredentialsOut, IssuedCredentials
from admin_api.settings import ApiSettings
from fleetfence.contracts import MasterEntity, telemetry_topic
from fleetfence.devices import credentials_key
from fleetfence.errors import ConfigError, MqttControlError, ServiceUnavailableError
from fleetfence.mqtt import DynSec
from vehicle_master.credentials import (
    CredentialRecord,
    CredentialStatus,
    VehicleCredentials,
    decode_credentials,
)
from vehicle_master.store import VehicleMaster

router = APIRouter(prefix="/api/v1", tags=["credentials"])

BROKER_ERRORS: dict[int | str, dict[str, Any]] = {
    503: problem_doc("The MQTT broker cannot be reached", "MQTT 127.0.0.1:1883 refused: ..."),
    409: problem_doc(
        "Credentials exist already, or MQTT authentication is off",
        "vehicle 'truck-042' already has credentials (active): rotate them instead",
    ),
}
_lock = threading.Lock()


def _credentials(request: Request) -> VehicleCredentials:
    """The app's one credential service (created on first use, closed with the app)."""
    app = request.app
    with _lock:
        creds: VehicleCredentials | None = getattr(app.state, "credentials", None)
        if creds is None:
            settings: ApiSettings = app.state.settings
            if not settings.mqtt_auth:
                raise HTTPException(409, "MQTT authentication is off (FLEETFENCE_MQTT_AUTH=false)")
            control = DynSec.from_settings(settings)
            creds = VehicleCredentials(
                redis.Redis.from_url(settings.redis_dsn), settings.redis_prefix, control
            )
            app.state.credentials = creds
        return creds


def close_credentials(app: Any) -> None:
    creds: VehicleCredentials | None = getattr(app.state, "credentials", None)
    if creds is not None:
        creds.control.close()
        creds.r.close()
        app.state.credentials = None


def _call(request: Request, what: str, vehicle_id: str, must_exist: bool = True) -> Any:
    """Run one credential operation, the vehicle checked first; broker trouble is a 503."""
    try:
        creds = _credentials(request)
        if must_exist:
            vm = VehicleMaster(creds.r, creds.prefix)
            vm.get(MasterEntity.VEHICLE, vehicle_id)  # NotFoundError: 404
        return getattr(creds, what)(vehicle_id)
    except (ServiceUnavailableError, MqttControlError, ConfigError) as exc:
        raise HTTPException(503, f"MQTT broker: {exc}") from exc


def _issued(rec: CredentialRecord, secret: str) -> IssuedCredentials:
    return IssuedCredentials(**rec.to_api(), password=secret, topic=telemetry_topic(rec.vehicle_id))


ERRORS = {**WRITE_ERRORS, **BROKER_ERRORS}


@router.post(
    "/vehicles/{vehicle_id}/credentials", status_code=201, response_model=IssuedCredentials, responses=ERRORS
)
async def issue_credentials(_: Admin, request: Request, vehicle_id: EntityPath) -> IssuedCredentials:
    """Issue the vehicle's MQTT credentials: username = vehicle id, a generated secret shown in
    this answer only. 409 when it has some already (rotate them); a revoked vehicle gets new ones."""
    rec, secret = await run_in_threadpool(_call, request, "issue", vehicle_id)
    return _issued(rec, secret)


@router.get("/vehicles/{vehicle_id}/credentials", response_model=CredentialsOut, responses=READ_ERRORS)
async def get_credentials(_: Viewer, r: Redis, request: Request, vehicle_id: EntityPath) -> CredentialsOut:
    """The credential status: `none` (never issued, also for an id the vehicle master does not
    know: the map asks for every vehicle it sees live), `active`, `disabled` or `revoked`, with
    when each happened. Read from Redis alone: the status is there even while the broker is down."""
    rec = await _status(r, request, vehicle_id)
    if rec is None:
        return CredentialsOut(
            vehicle_id=vehicle_id,
            username=vehicle_id,
            status="none",
            issued_at=None,
            rotated_at=None,
            disabled_at=None,
            revoked_at=None,
        )
    return CredentialsOut(**rec.to_api())


@router.post("/vehicles/{vehicle_id}/credentials/rotate", response_model=IssuedCredentials, responses=ERRORS)
async def rotate_credentials(_: Admin, request: Request, vehicle_id: EntityPath) -> IssuedCredentials:
    """A new secret, shown in this answer only; the old one stops working at once and a vehicle
    connected with it is disconnected."""
    rec, secret = await run_in_threadpool(_call, request, "rotate", vehicle_id)
    return _issued(rec, secret)


@router.post("/vehicles/{vehicle_id}/credentials/disable", response_model=CredentialsOut, responses=ERRORS)
async def disable_credentials(_: Admin, request: Request, vehicle_id: EntityPath) -> CredentialsOut:
    """The vehicle can no longer log in (a connected one is cut off at once) until enabled."""
    rec = await run_in_threadpool(_call, request, "disable", vehicle_id)
    return CredentialsOut(**rec.to_api())


@router.post("/vehicles/{vehicle_id}/credentials/enable", response_model=CredentialsOut, responses=ERRORS)
async def enable_credentials(_: Admin, request: Request, vehicle_id: EntityPath) -> CredentialsOut:
    rec = await run_in_threadpool(_call, request, "enable", vehicle_id)
    return CredentialsOut(**rec.to_api())


@router.delete("/vehicles/{vehicle_id}/credentials", response_model=CredentialsOut, responses=ERRORS)
async def revoke_credentials(_: Admin, request: Request, vehicle_id: EntityPath) -> CredentialsOut:
    """Revoke: the vehicle's account is deleted in the broker (a connected vehicle is cut off at
    once); issuing again gives new credentials. 404 when it never had any."""
    rec = await run_in_threadpool(_call, request, "revoke", vehicle_id, False)
    if rec is None:
        raise HTTPException(404, f"vehicle {vehicle_id!r} has no credentials")
    return CredentialsOut(**rec.to_api())


async def _status(r: aioredis.Redis, request: Request, vehicle_id: str) -> CredentialRecord | None:
    settings: ApiSettings = request.app.state.settings
    return decode_credentials(vehicle_id, await r.hgetall(credentials_key(settings.redis_prefix, vehicle_id)))


async def revoke_on_delete(r: aioredis.Redis, request: Request, vehicle_id: str) -> None:
    """A deleted vehicle's access ends with it (the broker is asked only when it had credentials)."""
    rec = await _status(r, request, vehicle_id)
    if rec is not None and rec.status is not CredentialStatus.REVOKED:
        try:
            await run_in_threadpool(_call, request, "revoke", vehicle_id, False)
        except HTTPException as exc:
            # The vehicle is gone already: say so, and how to finish the job.
            raise HTTPException(
                exc.status_code,
                f"vehicle {vehicle_id!r} was deleted, but revoking its MQTT credentials failed "
                f"({exc.detail}); DELETE /api/v1/vehicles/{vehicle_id}/credentials revokes them",
            ) from exc
