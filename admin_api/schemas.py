"""Request and response bodies of the admin API, with OpenAPI examples.

Inputs reuse the vehicle master's models (one set of rules, whichever door the data comes in by);
the `...In` models only add what HTTP needs: a GeoJSON Feature wrapper and room for the read-only
properties (`version`, `updated`) a client echoes back from a GET.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field

from fleetfence.contracts import AlertType
from vehicle_master.models import (
    AssignmentData,
    EntityId,
    LineString,
    RouteProps,
    VehicleData,
    VehicleProps,
    ZoneGeometry,
    ZoneProps,
)

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


class Echoed(BaseModel):
    version: int | None = Field(default=None, description="Ignored on input; use If-Match.")
    updated: str | None = Field(default=None, description="Ignored on input.")


class RoutePropsIn(RouteProps, Echoed):
    route_id: EntityId | None = None


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
    type: Literal["Feature"]
    id: EntityId
    geometry: LineString
    properties: RoutePropsOut


class ZonePropsIn(ZoneProps, Echoed):
    zone_id: EntityId | None = None


class ZoneFeatureIn(BaseModel):
    model_config = ConfigDict(extra="forbid", json_schema_extra={"examples": [ZONE_EXAMPLE]})
    type: Literal["Feature"]
    id: EntityId | None = Field(default=None, description="The zone id (required on POST).")
    geometry: ZoneGeometry
    properties: ZonePropsIn


class ZonePropsOut(ZoneProps):
    zone_id: EntityId
    version: int
    updated: str


class ZoneFeature(BaseModel):
    type: Literal["Feature"]
    id: EntityId
    geometry: ZoneGeometry
    properties: ZonePropsOut


class RouteCollection(BaseModel):
    type: Literal["FeatureCollection"]
    features: list[RouteFeature]
    next_after: str | None = Field(description="Pass as `after` for the next page; null on the last.")


class ZoneCollection(BaseModel):
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


class VehicleOut(VehicleData):
    version: int
    updated: str


class VehiclePage(BaseModel):
    items: list[VehicleOut]
    next_after: str | None


class AssignmentIn(BaseModel):
    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "examples": [
                {"vehicle_id": "truck-042", "route_id": "r-berlin-1", "valid_from": "2026-11-22T06:00:00Z"}
            ]
        },
    )
    vehicle_id: EntityId | None = Field(default=None, description="Required on POST.")
    route_id: EntityId
    valid_from: AwareDatetime | None = Field(default=None, description="Default: now.")
    valid_to: AwareDatetime | None = Field(default=None, description="Open-ended when null.")
    version: int | None = Field(default=None, description="Ignored on input; use If-Match.")
    updated: str | None = None
    valid_from_ms: int | None = Field(default=None, description="Ignored on input (read-only).")
    valid_to_ms: int | None = Field(default=None, description="Ignored on input (read-only).")


class AssignmentOut(AssignmentData):
    valid_from: str
    valid_to: str | None
    version: int
    updated: str


class AssignmentPage(BaseModel):
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


class Alert(BaseModel):
    model_config = ConfigDict(extra="allow")
    alert_id: str
    type: AlertType
    vehicle_id: str
    route_id: str | None = None
    route_version: int | None = None
    seq: int
    ts_ms: int
    ts: str
    lat: float
    lon: float
    details: dict[str, Any] = Field(default_factory=dict)


class AlertPage(BaseModel):
    items: list[Alert]
    next_offset: int | None


class LiveState(BaseModel):
    model_config = ConfigDict(extra="allow")
    vehicle_id: str
    seq: int
    ts_ms: int
    lat: float
    lon: float
    speed_kmh: float
    status: Literal["on_route", "off_route", "unassigned"]
    overspeed: bool
    silent: bool
    route_id: str | None = None
    route_version: int | None = None
    progress_m: float | None = None
    progress_ratio: float | None = None
    zones: list[str] = Field(default_factory=list)
    h3: str | None = None
    updated_ms: int
    open_alerts: list[Alert] = Field(default_factory=list, description="Only on the single-vehicle read.")


class LivePage(BaseModel):
    items: list[LiveState]
    next_offset: int | None


class StreamToken(BaseModel):
    token: str = Field(description="Pass as `token` to GET /api/v1/stream; valid for expires_in_s.")
    expires_in_s: int
    role: Literal["viewer", "admin"] = Field(description="The role of the key the token was issued for.")


class Problem(BaseModel):
    detail: str
