"""orjson responses and the mapping of vehicle-master errors (and an unreachable Redis) to HTTP
statuses."""

from __future__ import annotations

import logging
import math
from typing import Any

import orjson
from fastapi import Request
from fastapi.encoders import jsonable_encoder
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response

from vehicle_master.errors import (
    AlreadyExistsError,
    InUseError,
    MasterError,
    MasterValidationError,
    NotFoundError,
    VersionConflictError,
)

logger = logging.getLogger(__name__)


class OrjsonResponse(JSONResponse):
    """orjson is several times faster than json.dumps, which matters on the read path."""

    def render(self, content: Any) -> bytes:
        return orjson.dumps(content)


class GeoJsonResponse(OrjsonResponse):
    """`application/geo+json` (RFC 7946), so GIS tools recognise the body and the docs say so."""

    media_type = "application/geo+json"


def problem(status: int, detail: str, headers: dict[str, str] | None = None) -> Response:
    return OrjsonResponse({"detail": detail}, status_code=status, headers=headers)


def validation_problem(exc: MasterValidationError, where: str = "body") -> Response:
    """Same shape as FastAPI's own 422s, so clients parse one format."""
    return OrjsonResponse(
        {"detail": [{"loc": [where, *exc.loc], "msg": str(exc), "type": "value_error"}]}, status_code=422
    )


# What JSON carries: a number beyond this (or a float that is not finite) is echoed as the text the
# client sent, not as a number, so the 422 that names the field can always be written.
_MAX_JSON_INT = 2**63 - 1


def json_safe(value: Any) -> Any:
    """`value` with every number JSON cannot carry (NaN, Infinity, integers past 64 bits) as text."""
    if isinstance(value, float) and not math.isfinite(value):
        return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) > _MAX_JSON_INT:
        return str(value)
    if isinstance(value, dict):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [json_safe(v) for v in value]
    return value


async def request_validation_handler(_request: Request, exc: Exception) -> Response:
    """FastAPI's own 422 shape, written so that it cannot fail: its default echoes each field's
    input, and a request body with `NaN` or `Infinity` (which Python's JSON parser accepts) then
    made the error handler itself raise, answering 500 to a malformed request."""
    assert isinstance(exc, RequestValidationError)
    return OrjsonResponse({"detail": json_safe(jsonable_encoder(exc.errors()))}, status_code=422)


async def master_error_handler(_request: Request, exc: Exception) -> Response:
    if isinstance(exc, MasterValidationError):
        return validation_problem(exc)
    if isinstance(exc, NotFoundError):
        return problem(404, str(exc))
    if isinstance(exc, VersionConflictError):
        return problem(412, str(exc), {"ETag": f'"{exc.current_version}"'})
    if isinstance(exc, AlreadyExistsError | InUseError):
        return problem(409, str(exc))
    assert isinstance(exc, MasterError)
    return problem(400, str(exc))


async def redis_unavailable_handler(request: Request, exc: Exception) -> Response:
    """503 with Retry-After when Redis cannot be reached, is restarting or still loading its data,
    or does not answer within the socket timeout. A 500 tells a client the API is broken and the
    request pointless to repeat; here the same request succeeds once Redis is back, which is
    what 503 and Retry-After say.

    A write whose connection broke after Redis ran it is answered 503 too, as the API cannot
    tell: sent again, an unconditional PUT changes nothing, a DELETE answers 404 and a POST 409.
    """
    retry_after: int = request.app.state.settings.api_redis_retry_after_s
    logger.warning(
        "redis unavailable method=%s path=%s error=%s: %s",
        request.method,
        request.url.path,
        type(exc).__name__,
        exc,
    )
    return problem(
        503,
        f"Redis, which holds the API's data, is not answering ({type(exc).__name__}); "
        f"send the request again in {retry_after} s",
        {"Retry-After": str(retry_after)},
    )
