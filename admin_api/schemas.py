"""Request and response bodies of the admin API, with OpenAPI examples.

Inputs reuse the vehicle master's models (one set of rules, whichever door the data comes in by);
the `...In` models only add what HTTP needs: a GeoJSON Feature wrapper and room for the read-only
properties (`version`, `updated`) a client echoes back from a GET.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any, Literal

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field, RootModel, model_validator

from fleetfence.devices import TrackerProtocol
from vehicle_master.models import (
    MAX_MS,
    AssignmentData,
    EntityId,
    LineString,
    Name,
    RouteProps,
    VehicleData,
    VehicleProps,
    ZoneGeometry,
    ZoneProps,
)

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def epoch_ms(t: datetime) -> int:
    """An aware time as epoch ms, exactly: `int(t.timestamp() * 1000)` goes through a float and
    lands a millisecond early for about one time in a hundred, so a time read back from a GET
    (`.123Z`) and sent again would not name the same instant."""
    return (t - EPOCH) // timedelta(milliseconds=1)


ROUTE_EXAMPLE: dict[str, Any] = {
    "type": "Feature",
    "id": "r-berlin-1",
    "geometry": {"type": "LineString", "coordinates": [[13.40, 52.52], [13.41, 52.53], [13.43, 52.53]]},
    "properties": {
        "name": "Berlin loop",
        "corridor_width_m": 100,
        "speed_limit_kmh": 50,
        "deviation_min_fixes": 3,
        "deviation_min_s": 0,
        "overspeed_min_s": 10,
        "silent_after_s": 120,
        "wrong_way_min_m": 100,
        "stop_min_s": 300,
        "arrival_risk_s": 600,
        "planned_duration_s": 1800,
    },
}
ZONE_EXAMPLE: dict[str, Any] = {
    "type": "Feature",
    "id": "z-depot-1",
    "geometry": {
        "type": "Polygon",
        "coordinates": [[[13.39, 52.51], [13.40, 52.51], [13.40, 52.52], [13.39, 52.52], [13.39, 52.51]]],
    },
    "properties": {"name": "Main depot", "kind": "depot", "dwell_limit_s": 3600},
}
CIRCLE_ZONE_EXAMPLE: dict[str, Any] = {
    "type": "Feature",
    "id": "z-customer-7",
    # A circle: its centre as a Point and its radius as the geometry's `radius_m`.
    "geometry": {"type": "Point", "coordinates": [13.4105, 52.5235], "radius_m": 150},
    "properties": {"name": "Customer 7", "kind": "customer", "dwell_limit_s": 1800},
}

UPDATED_EXAMPLE = "2026-11-22T06:00:00.000Z"
ROUTE_OUT_EXAMPLE: dict[str, Any] = {
    **ROUTE_EXAMPLE,
    "properties": {
        **ROUTE_EXAMPLE["properties"],
        "route_id": "r-berlin-1",
        "version": 3,
        "updated": UPDATED_EXAMPLE,
    },
}
ZONE_OUT_EXAMPLE: dict[str, Any] = {
    **ZONE_EXAMPLE,
    "properties": {
        **ZONE_EXAMPLE["properties"],
        "zone_id": "z-depot-1",
        "version": 1,
        "updated": UPDATED_EXAMPLE,
    },
}
VEHICLE_OUT_EXAMPLE: dict[str, Any] = {
    "vehicle_id": "truck-042",
    "label": "Truck 42",
    "attributes": {"plate": "B-FF 42"},
    "version": 1,
    "updated": UPDATED_EXAMPLE,
}
ASSIGNMENT_OUT_EXAMPLE: dict[str, Any] = {
    "vehicle_id": "truck-042",
    "route_id": "r-berlin-1",
    "valid_from_ms": 1_795_327_200_000,
    "valid_to_ms": None,
    "planned_departure_ms": 1_795_327_200_000,
    "planned_arrival_ms": 1_795_329_000_000,
    "valid_from": UPDATED_EXAMPLE,
    "valid_to": None,
    "planned_departure": UPDATED_EXAMPLE,
    "planned_arrival": "2026-11-22T06:30:00.000Z",
    "version": 2,
    "updated": UPDATED_EXAMPLE,
}


class Echoed(BaseModel):
    version: int | None = Field(default=None, description="Ignored on input; use If-Match.")
    updated: str | None = Field(default=None, description="Ignored on input.")


class RoutePropsIn(RouteProps, Echoed):
    route_id: EntityId | None = None
    name: Name | None = Field(default=None, description="Default: the route id.")  # type: ignore[assignment]


class RouteFeatureIn(BaseModel):
    model_config = ConfigDict(extra="forbid", json_schema_extra={"examples": [ROUTE_EXAMPLE]})
    type: Literal["Feature"]
    id: EntityId | None = Field(default=None, description="The route id (required on POST).")
    geometry: LineString
    properties: RoutePropsIn


class RoutePropsOut(RouteProps):
    route_id: EntityId
    version: int
    updated: str


class RouteFeature(BaseModel):
    model_config = ConfigDict(json_schema_extra={"examples": [ROUTE_OUT_EXAMPLE]})
    type: Literal["Feature"]
    id: EntityId
    geometry: LineString
    properties: RoutePropsOut


class ZonePropsIn(ZoneProps, Echoed):
    zone_id: EntityId | None = None
    name: Name | None = Field(default=None, description="Default: the zone id.")  # type: ignore[assignment]


class ZoneFeatureIn(BaseModel):
    model_config = ConfigDict(
        extra="forbid", json_schema_extra={"examples": [ZONE_EXAMPLE, CIRCLE_ZONE_EXAMPLE]}
    )
    type: Literal["Feature"]
    id: EntityId | None = Field(default=None, description="The zone id (required on POST).")
    geometry: ZoneGeometry
    properties: ZonePropsIn


class ZonePropsOut(ZoneProps):
    zone_id: EntityId
    version: int
    updated: str


class ZoneFeature(BaseModel):
    model_config = ConfigDict(json_schema_extra={"examples": [ZONE_OUT_EXAMPLE]})
    type: Literal["Feature"]
    id: EntityId
    geometry: ZoneGeometry
    properties: ZonePropsOut


class RouteCollection(BaseModel):
    model_config = ConfigDict(
        json_schema_extra={
            "examples": [{"type": "FeatureCollection", "features": [ROUTE_OUT_EXAMPLE], "next_after": None}]
        }
    )
    type: Literal["FeatureCollection"]
    features: list[RouteFeature]
    next_after: str | None = Field(description="Pass as `after` for the next page; null on the last.")


class ZoneCollection(BaseModel):
    model_config = ConfigDict(
        json_schema_extra={
            "examples": [{"type": "FeatureCollection", "features": [ZONE_OUT_EXAMPLE], "next_after": None}]
        }
    )
    type: Literal["FeatureCollection"]
    features: list[ZoneFeature]
    next_after: str | None


class VehicleIn(VehicleProps, Echoed):
    model_config = ConfigDict(
        json_schema_extra={
            "examples": [{"vehicle_id": "truck-042", "label": "Truck 42", "attributes": {"plate": "B-FF 42"}}]
        }
    )
    vehicle_id: EntityId | None = Field(default=None, description="Required on POST.")
    label: Name | None = Field(default=None, description="Default: the vehicle id.")  # type: ignore[assignment]


class VehicleOut(VehicleData):
    model_config = ConfigDict(json_schema_extra={"examples": [VEHICLE_OUT_EXAMPLE]})
    version: int
    updated: str


class VehiclePage(BaseModel):
    model_config = ConfigDict(
        json_schema_extra={"examples": [{"items": [VEHICLE_OUT_EXAMPLE], "next_after": "truck-042"}]}
    )
    items: list[VehicleOut]
    next_after: str | None


CREDENTIALS_EXAMPLE: dict[str, Any] = {
    "vehicle_id": "truck-042",
    "username": "truck-042",
    "status": "active",
    "issued_at": "2026-11-25T08:00:00.000Z",
    "rotated_at": None,
    "disabled_at": None,
    "revoked_at": None,
}


class CredentialsOut(BaseModel):
    """A vehicle's MQTT credential status; the secret is never shown here."""

    model_config = ConfigDict(json_schema_extra={"examples": [CREDENTIALS_EXAMPLE]})
    vehicle_id: str
    username: str = Field(description="The MQTT username: the vehicle id.")
    status: Literal["none", "active", "disabled", "revoked"] = Field(
        description="none: never issued; active; disabled (cannot log in until enabled); revoked."
    )
    issued_at: str | None
    rotated_at: str | None
    disabled_at: str | None
    revoked_at: str | None


TRACKER_EXAMPLE: dict[str, Any] = {
    "vehicle_id": "truck-042",
    "protocol": "teltonika",
    "tracker_id": "356307042441013",
}


class TrackerOut(BaseModel):
    """A tracker bound to a vehicle: the device edge admits it by this binding."""

    model_config = ConfigDict(json_schema_extra={"examples": [TRACKER_EXAMPLE]})
    vehicle_id: str
    protocol: TrackerProtocol = Field(description="The tracker's protocol.")
    tracker_id: str = Field(description="Its id in that protocol: a Teltonika unit's IMEI, 15 digits.")


class TrackersOut(RootModel[list[TrackerOut]]):
    """A vehicle's trackers."""

    model_config = ConfigDict(json_schema_extra={"examples": [[TRACKER_EXAMPLE]]})


HEARD_EXAMPLE: dict[str, Any] = {
    "vehicle_id": "truck-042",
    "protocol": "teltonika",
    "heard_at": "2026-12-07T14:03:21.512Z",
    "replica": "fleetfence-gw-1",
}


class HeardOut(BaseModel):
    """How the device edge last heard the vehicle (rewritten every 30 s, at once on a change): its
    protocol, when and through which edge replica; nulls when it has not been heard."""

    model_config = ConfigDict(json_schema_extra={"examples": [HEARD_EXAMPLE]})
    vehicle_id: str
    protocol: str | None = Field(
        description="`mqtt` (FleetFence's own JSON over MQTT), `teltonika`, `osmand` or `owntracks`."
    )
    heard_at: str | None = Field(description="UTC, ISO 8601, when that fix was received.")
    replica: str | None = Field(description="The edge replica (its client id) that received it.")


class IssuedCredentials(CredentialsOut):
    """Credentials just issued or rotated: the secret is in this answer and nowhere else (the
    broker keeps only its hash)."""

    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {
                    **CREDENTIALS_EXAMPLE,
                    "password": "q3l0P1n8Zr5xYVJm2GkT0dA7sWc9eHuB4fNiKoLpQ6E",
                    "topic": "fleet/truck-042/telemetry",
                }
            ]
        }
    )

    password: str = Field(description="The MQTT password. Shown once: store it in the vehicle now.")
    topic: str = Field(description="The only topic this vehicle may publish to.")


class AssignmentIn(BaseModel):
    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "examples": [
                {"vehicle_id": "truck-042", "route_id": "r-berlin-1", "valid_from": "2026-11-22T06:00:00Z"},
                {
                    "vehicle_id": "truck-042",
                    "route_id": "r-berlin-1",
                    "valid_from": "2026-11-22T06:00:00Z",
                    "planned_departure": "2026-11-22T06:00:00Z",
                    "planned_arrival": "2026-11-22T06:30:00Z",
                },
            ]
        },
    )
    vehicle_id: EntityId | None = Field(default=None, description="Required on POST.")
    route_id: EntityId
    valid_from: AwareDatetime | None = Field(
        default=None,
        description="Default: now. A fix is on the route when its event time is in [valid_from, valid_to): "
        "fixes before valid_from stay unassigned (counted, no route alerts), so back-filled or replayed "
        "telemetry needs an earlier valid_from.",
    )
    valid_to: AwareDatetime | None = Field(default=None, description="Open-ended when null.")
    planned_departure: AwareDatetime | None = Field(
        default=None,
        description="Optional: when the trip is planned to start. With the route's planned_duration_s "
        "it gives the planned arrival when the assignment names none. Or send planned_departure_ms.",
    )
    planned_arrival: AwareDatetime | None = Field(
        default=None,
        description="Optional: when the trip is planned to end; must be after planned_departure. "
        "ARRIVAL_AT_RISK compares the trip's ETA with it (no arrival alerts without a planned arrival "
        "or a route planned_duration_s). Or send planned_arrival_ms.",
    )
    planned_departure_ms: int | None = Field(
        default=None,
        ge=0,
        le=MAX_MS,
        description="planned_departure as epoch ms UTC (as a GET returns it); if both are sent they must "
        "name the same millisecond.",
    )
    planned_arrival_ms: int | None = Field(
        default=None,
        ge=0,
        le=MAX_MS,
        description="planned_arrival as epoch ms UTC (as a GET returns it); if both are sent they must "
        "name the same millisecond.",
    )
    version: int | None = Field(default=None, description="Ignored on input; use If-Match.")
    updated: str | None = None
    valid_from_ms: int | None = Field(default=None, description="Ignored on input (read-only).")
    valid_to_ms: int | None = Field(default=None, description="Ignored on input (read-only).")

    @model_validator(mode="after")
    def _one_planned_time_each(self) -> AssignmentIn:
        """A planned time may come as ISO or as epoch ms (a GET body sent back has both): two values
        that disagree are refused rather than one silently winning."""
        for name in ("planned_departure", "planned_arrival"):
            iso: datetime | None = getattr(self, name)
            ms: int | None = getattr(self, f"{name}_ms")
            if iso is not None and ms is not None and epoch_ms(iso) != ms:
                raise ValueError(
                    f"{name} ({iso.isoformat()}) and {name}_ms ({ms}) name different times: send one"
                )
        return self

    def planned_ms(self, name: Literal["planned_departure", "planned_arrival"]) -> int | None:
        """The planned time `name` in epoch ms, from whichever form was sent (None: not planned)."""
        iso: datetime | None = getattr(self, name)
        ms: int | None = getattr(self, f"{name}_ms")
        return ms if iso is None else epoch_ms(iso)


class AssignmentOut(AssignmentData):
    model_config = ConfigDict(json_schema_extra={"examples": [ASSIGNMENT_OUT_EXAMPLE]})
    valid_from: str
    valid_to: str | None
    planned_departure: str | None = Field(default=None, description="planned_departure_ms as ISO 8601 UTC.")
    planned_arrival: str | None = Field(default=None, description="planned_arrival_ms as ISO 8601 UTC.")
    version: int
    updated: str
    warnings: list[str] = Field(
        default_factory=list,
        description="On a write only: what the assignment will not cover, e.g. telemetry the vehicle "
        "already sent before `valid_from` (those fixes stay unassigned: no route alerts for them).",
    )


class AssignmentPage(BaseModel):
    model_config = ConfigDict(
        json_schema_extra={"examples": [{"items": [ASSIGNMENT_OUT_EXAMPLE], "next_after": None}]}
    )
    items: list[AssignmentOut]
    next_after: str | None


class ImportResult(BaseModel):
    model_config = ConfigDict(
        json_schema_extra={"examples": [{"received": 3, "created": 2, "updated": 1, "unchanged": 0}]}
    )
    received: int = Field(description="Features in the collection; equals created + updated + unchanged.")
    created: int
    updated: int
    unchanged: int
    by_entity: dict[str, int] = Field(default_factory=dict)


class Health(BaseModel):
    model_config = ConfigDict(json_schema_extra={"examples": [{"status": "ok"}]})
    status: Literal["ok"]


class Readiness(BaseModel):
    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {"ready": True, "checks": {"redis": "ok", "kafka": "1 broker(s), 12 topic(s)"}},
                {
                    "ready": False,
                    "checks": {
                        "redis": "unreachable: ConnectionError: Error 111 connecting to 127.0.0.1:6379. "
                        "Connect call failed ('127.0.0.1', 6379).",
                        "kafka": "1 broker(s), 12 topic(s)",
                    },
                },
            ]
        }
    )
    ready: bool
    checks: dict[str, str] = Field(
        description='Per dependency (`redis`, `kafka`): "unreachable: <why>" when it failed, else "ok" '
        "or a short summary."
    )
