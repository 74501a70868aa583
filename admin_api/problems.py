"""The API's error answers: the bodies of its 4xx responses and the `responses=` entries that
document them on each route, so the docs show the message a client will actually read."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field


class Problem(BaseModel):
    """The body of every error but a validation error (FastAPI's `{"detail": "..."}`)."""

    model_config = ConfigDict(json_schema_extra={"examples": [{"detail": "unknown or revoked API key"}]})
    detail: str


class ValidationIssue(BaseModel):
    model_config = ConfigDict(extra="allow")
    loc: list[str | int] = Field(description="Where: `body`, `query` or `path`, then the field path.")
    msg: str
    type: str


class ValidationProblem(BaseModel):
    """A 422: every problem found, each with its location (FastAPI's own shape, also used for the
    vehicle master's semantic checks, so clients parse one format)."""

    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {
                    "detail": [
                        {
                            "loc": ["body", "geometry"],
                            "msg": "Value error, point 0: longitude 181.0 outside [-180, 180]",
                            "type": "value_error",
                        }
                    ]
                }
            ]
        }
    )
    detail: list[ValidationIssue]


def problem_doc(description: str, detail: str) -> dict[str, Any]:
    """A `responses=` entry: the Problem body with this status's real message as the example, so
    the docs show what a client will actually read."""
    return {
        "model": Problem,
        "description": description,
        "content": {"application/json": {"example": {"detail": detail}}},
    }


UNAUTHORIZED = problem_doc("No or unknown API key", "missing API key: send it in the X-API-Key header")
REDIS_DOWN = problem_doc(
    "Redis is down or restarting: send the request again after Retry-After seconds",
    "Redis, which holds the API's data, is not answering (ConnectionError); send the request again in 1 s",
)
INVALID: dict[str, Any] = {
    "model": ValidationProblem,
    "description": "Invalid parameters or body; every problem is listed",
}
# The answers of every route that reads or writes one master entity (and its credentials).
READ_ERRORS: dict[int | str, dict[str, Any]] = {
    401: UNAUTHORIZED,
    404: problem_doc("No such entity", "route 'r-berlin-1' does not exist"),
    422: INVALID,
    503: REDIS_DOWN,
}
WRITE_ERRORS: dict[int | str, dict[str, Any]] = {
    401: UNAUTHORIZED,
    403: problem_doc(
        "A viewer key cannot write", "this operation needs an admin API key; yours is a viewer key"
    ),
    404: problem_doc("No such entity (update/delete)", "route 'r-berlin-1' does not exist"),
    409: problem_doc(
        "Exists already (POST) or still referenced (DELETE)", "route 'r-berlin-1' already exists (version 3)"
    ),
    412: problem_doc(
        "If-Match does not name the current version",
        "route 'r-berlin-1' is at version 4, not the expected one",
    ),
    413: problem_doc("Body too large", "request body larger than 5242880 bytes"),
    422: INVALID,
    503: REDIS_DOWN,
}
