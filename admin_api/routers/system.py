"""Liveness, readiness and Prometheus metrics (no API key: probes and scrapers have none)."""

from __future__ import annotations

import asyncio

from fastapi import APIRouter, Request, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from admin_api.deps import Redis
from admin_api.responses import OrjsonResponse
from admin_api.schemas import Health, Readiness
from fleetfence.probes import kafka_ping

router = APIRouter(tags=["system"])


@router.get(
    "/healthz",
    response_model=Health,
    summary="Liveness probe",
    description="**Liveness**: 200 while the process serves requests. It checks no dependency on "
    "purpose: a Redis or Kafka outage must not make an orchestrator restart every API replica "
    "(a restart cannot fix the outage). Use `/readyz` (**readiness**) to decide whether to send "
    "traffic.",
)
async def healthz() -> dict[str, str]:
    return {"status": "ok"}


@router.get(
    "/readyz",
    response_model=Readiness,
    summary="Readiness probe",
    description="**Readiness**: 200 when Redis answers PING and Kafka a metadata request (each "
    "within 2 s), 503 otherwise, with each dependency's state in `checks`. Unlike `/healthz` "
    "(**liveness**) it depends on Redis and Kafka.",
    responses={503: {"model": Readiness, "description": "Redis or Kafka unreachable"}},
)
async def readyz(request: Request, r: Redis) -> Response:
    checks: dict[str, str] = {}
    try:
        await asyncio.wait_for(r.ping(), 2.0)
        checks["redis"] = "ok"
    except Exception as exc:  # any failure means not ready; report it, don't crash the probe
        checks["redis"] = f"unreachable: {type(exc).__name__}: {exc}"
    bootstrap = request.app.state.settings.bootstrap_servers
    try:
        checks["kafka"] = await asyncio.wait_for(asyncio.to_thread(kafka_ping, bootstrap, 2.0), 3.0)
    except Exception as exc:
        checks["kafka"] = f"unreachable: {type(exc).__name__}: {exc}"
    ready = all(not v.startswith("unreachable") for v in checks.values())
    return OrjsonResponse({"ready": ready, "checks": checks}, status_code=200 if ready else 503)


@router.get("/metrics", response_class=Response)
async def metrics() -> Response:
    return Response(generate_latest(), media_type=CONTENT_TYPE_LATEST)
