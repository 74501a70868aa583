"""The four master entities in their wire form: exactly the `data` of a `fleet.master` event.

These pydantic models are pure (no I/O): the store, the admin API and the simulator all validate
through them, so a route that passes here is one the processor can trust, whichever door it came
in by. Field bounds are the contract's (docs/contracts.md, "fleet.master") plus sanity caps that
keep absurd numbers out of the processor.
"""

from __future__ import annotations

import math
from dataclasses import MISSING, fields
from enum import StrEnum
from typing import TYPE_CHECKING, Annotated, Any, Literal, get_type_hints

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, create_model, model_validator

from fleetfence.contracts import VEHICLE_ID_RE, MasterEntity
from fleetfence.geo import MAX_CIRCLE_RADIUS_M
from fleetfence.rules import RouteRules, spec_of
from vehicle_master.geometry import validate_circle, validate_line_string, validate_zone_geometry

EntityId = Annotated[str, StringConstraints(pattern=VEHICLE_ID_RE.pattern)]
Name = Annotated[str, StringConstraints(min_length=1, max_length=200)]
Coordinate = Annotated[list[float], Field(min_length=2, max_length=3)]


class _Strict(BaseModel):
    """Unknown fields are errors (a typo such as `corridor_witdh_m` must not pass silently)."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


class LineString(_Strict):
    type: Literal["LineString"]
    coordinates: list[Coordinate] = Field(min_length=2)

    @model_validator(mode="after")
    def _valid(self) -> LineString:
        self.coordinates = validate_line_string(self.model_dump())["coordinates"]
        return self


class Polygon(_Strict):
    type: Literal["Polygon"]
    coordinates: list[list[Coordinate]] = Field(min_length=1)

    @model_validator(mode="after")
    def _valid(self) -> Polygon:
        self.coordinates = validate_zone_geometry(self.model_dump())["coordinates"]
        return self


class MultiPolygon(_Strict):
    type: Literal["MultiPolygon"]
    coordinates: list[list[list[Coordinate]]] = Field(min_length=1)

    @model_validator(mode="after")
    def _valid(self) -> MultiPolygon:
        self.coordinates = validate_zone_geometry(self.model_dump())["coordinates"]
        return self


class Circle(_Strict):
    """A circle zone: its centre as a GeoJSON Point, and its radius as the geometry's foreign member
    `radius_m` (Tile38, Traccar and Amazon Location model circles the same way). Inside means within
    `radius_m` of the centre, exactly (`fleetfence.geo.circle_distance_m`), not a polygon of it."""

    type: Literal["Point"]
    coordinates: Coordinate
    radius_m: float = Field(gt=0, le=MAX_CIRCLE_RADIUS_M, strict=True, description="Metres from the centre.")

    @model_validator(mode="after")
    def _valid(self) -> Circle:
        self.coordinates = validate_circle(self.model_dump())["coordinates"]
        return self


ZoneGeometry = Annotated[Polygon | MultiPolygon | Circle, Field(discriminator="type")]


class ZoneKind(StrEnum):
    DEPOT = "depot"
    RESTRICTED = "restricted"
    CUSTOMER = "customer"
    REST_AREA = "rest_area"
    OTHER = "other"


class _RouteName(_Strict):
    name: Name


def _route_props() -> type[_RouteName]:
    """`RouteProps`, built from `fleetfence.rules.RouteRules`: one field per rule, with the rule's
    default (a rule that is off by default, or may be switched off, takes null), bounds and words
    from its `RuleSpec`. The API's schema carries `x-rule` (`route` or `trip`) on each, from which the
    map builds its route form."""
    hints = get_type_hints(RouteRules)
    rules: dict[str, Any] = {}
    for f in fields(RouteRules):
        spec = spec_of(f)
        kind = hints[f.name] | None if spec.off else hints[f.name]
        if f.default is MISSING:
            default: Any = ...
        else:
            default = None if isinstance(f.default, float) and math.isinf(f.default) else f.default
        rules[f.name] = (
            kind,
            Field(
                default=default,
                gt=spec.gt,
                ge=spec.ge,
                le=spec.le,
                title=spec.title,
                description=spec.about,
                json_schema_extra={"x-rule": "trip" if spec.trip else "route"},
            ),
        )
    return create_model(
        "RouteProps",
        __base__=_RouteName,
        __module__=__name__,
        __doc__="A route's rules; the `properties` of its GeoJSON Feature.",
        **rules,
    )


if TYPE_CHECKING:
    RouteProps = _RouteName
else:
    RouteProps = _route_props()


def default_to_id(data: Any, field: str, id_field: str) -> Any:
    """A name or label left out (or null) is the entity's id, as Traccar and Tile38 need no more
    than an id and a geometry: one rule for the API, the import and the CLI."""
    if isinstance(data, dict) and data.get(field) is None and data.get(id_field) is not None:
        return {**data, field: data[id_field]}
    return data


class RouteData(RouteProps):
    route_id: EntityId
    geometry: LineString

    @model_validator(mode="before")
    @classmethod
    def _name(cls, data: Any) -> Any:
        return default_to_id(data, "name", "route_id")


class ZoneProps(_Strict):
    name: Name
    kind: ZoneKind = ZoneKind.OTHER
    dwell_limit_s: float | None = Field(default=None, gt=0, le=30 * 86_400)
    planned_stop: bool | None = Field(
        default=None,
        description="Stopping here is planned (no UNPLANNED_STOP); null: depot, customer and rest_area are.",
    )


class ZoneData(ZoneProps):
    zone_id: EntityId
    geometry: ZoneGeometry

    @model_validator(mode="before")
    @classmethod
    def _name(cls, data: Any) -> Any:
        return default_to_id(data, "name", "zone_id")


class VehicleProps(_Strict):
    label: Name
    attributes: dict[Annotated[str, StringConstraints(min_length=1, max_length=64)], str] = Field(
        default_factory=dict, max_length=64
    )


class VehicleData(VehicleProps):
    vehicle_id: EntityId

    @model_validator(mode="before")
    @classmethod
    def _label(cls, data: Any) -> Any:
        return default_to_id(data, "label", "vehicle_id")


MAX_MS = 2**53


class AssignmentData(_Strict):
    vehicle_id: EntityId
    route_id: EntityId
    valid_from_ms: int = Field(ge=0, le=MAX_MS)
    valid_to_ms: int | None = Field(default=None, ge=0, le=MAX_MS)
    planned_departure_ms: int | None = Field(default=None, ge=0, le=MAX_MS)
    planned_arrival_ms: int | None = Field(
        default=None, ge=0, le=MAX_MS, description="ARRIVAL_AT_RISK compares the ETA with this."
    )

    @model_validator(mode="after")
    def _window(self) -> AssignmentData:
        if self.valid_to_ms is not None and self.valid_to_ms <= self.valid_from_ms:
            raise ValueError("valid_to_ms must be after valid_from_ms")
        if (
            self.planned_arrival_ms is not None
            and self.planned_departure_ms is not None
            and self.planned_arrival_ms <= self.planned_departure_ms
        ):
            raise ValueError("planned_arrival_ms must be after planned_departure_ms")
        return self


EntityData = RouteData | ZoneData | VehicleData | AssignmentData

DATA_MODELS: dict[MasterEntity, type[EntityData]] = {
    MasterEntity.ROUTE: RouteData,
    MasterEntity.ZONE: ZoneData,
    MasterEntity.VEHICLE: VehicleData,
    MasterEntity.ASSIGNMENT: AssignmentData,
}

ID_FIELD: dict[MasterEntity, str] = {
    MasterEntity.ROUTE: "route_id",
    MasterEntity.ZONE: "zone_id",
    MasterEntity.VEHICLE: "vehicle_id",
    MasterEntity.ASSIGNMENT: "vehicle_id",
}


def entity_of(data: EntityData) -> MasterEntity:
    for entity, model in DATA_MODELS.items():
        if type(data) is model:
            return entity
    raise TypeError(f"not a master entity: {type(data).__name__}")


def entity_id(data: EntityData) -> str:
    return str(getattr(data, ID_FIELD[entity_of(data)]))


def to_wire(data: EntityData) -> dict[str, Any]:
    """The event's `data` object (enums as strings, optional fields present as null)."""
    return data.model_dump(mode="json")
