"""CRUD for routes, zones, vehicles and assignments, and the bulk GeoJSON import.

Every entity has the same five operations: list (paged by id with `after`), create (POST, 409 if
it exists), read, replace-or-create (PUT; `If-Match` makes it conditional, 412 when stale) and
delete. Reads need a viewer key, writes an admin key. Responses carry the version as `ETag`.
"""

from __future__ import annotations

from typing import Annotated, Any

import redis.asyncio as aioredis
from fastapi import APIRouter, Body, Query, Request, Response

from admin_api.deps import Admin, EntityPath, IfMatch, Master, Redis, Viewer, etag, parse_if_match
from admin_api.problems import INVALID, READ_ERRORS, WRITE_ERRORS
from admin_api.readmodels import last_fix_ms
from admin_api.responses import OrjsonResponse
from admin_api.routers.credentials import revoke_on_delete
from admin_api.routers.trackers import unbind_on_delete
from admin_api.schemas import (
    CIRCLE_ZONE_EXAMPLE,
    ROUTE_EXAMPLE,
    ZONE_EXAMPLE,
    AssignmentIn,
    AssignmentOut,
    AssignmentPage,
    ImportResult,
    RouteCollection,
    RouteFeature,
    RouteFeatureIn,
    VehicleIn,
    VehicleOut,
    VehiclePage,
    ZoneCollection,
    ZoneFeature,
    ZoneFeatureIn,
    epoch_ms,
)
from fleetfence.contracts import VEHICLE_ID_RE, MasterEntity, ms_to_iso, utc_now_ms
from fleetfence.readmodels import ReadKeys
from vehicle_master.errors import MasterValidationError, NotFoundError
from vehicle_master.geojson import ImportProblem, feature_data, parse_feature_collection, render
from vehicle_master.models import AssignmentData, EntityData, RouteData, VehicleData, ZoneKind
from vehicle_master.store import AsyncVehicleMaster, Filter, MasterRecord, parse_entity

router = APIRouter(prefix="/api/v1")

ZONE_EXAMPLES: dict[str, Any] = {
    "depot": {"summary": "A depot zone", "value": ZONE_EXAMPLE},
    "circle": {"summary": "A circle zone (a Point with radius_m)", "value": CIRCLE_ZONE_EXAMPLE},
}

ID = VEHICLE_ID_RE.pattern
Limit = Annotated[int, Query(ge=1, le=1000, description="Page size.")]
After = Annotated[str | None, Query(pattern=ID, description="Return ids after this one (next_after).")]


# --------------------------------------------------------------------------- shared plumbing


def _render(rec: MasterRecord) -> dict[str, Any]:
    """The vehicle master's rendering, plus an assignment's planned times in ISO 8601 next to their
    epoch ms, as its validity window already is (what a person reads, and what AssignmentIn takes)."""
    body = render(rec)
    if rec.entity is MasterEntity.ASSIGNMENT:
        for name in ("planned_departure", "planned_arrival"):
            ms = body.get(f"{name}_ms")
            body[name] = None if ms is None else ms_to_iso(ms)
    return body


def _one(
    rec: MasterRecord, status: int = 200, location: str | None = None, warnings: list[str] | None = None
) -> Response:
    headers = {"ETag": etag(rec.version)}
    if location:
        headers["Location"] = location
    body = _render(rec)
    if warnings:
        body["warnings"] = warnings
    return OrjsonResponse(body, status_code=status, headers=headers)


def _page(recs: list[MasterRecord], limit: int, geo: bool) -> Response:
    nxt = recs[-1].id if len(recs) == limit else None
    body: dict[str, Any]
    if geo:
        body = {"type": "FeatureCollection", "features": [_render(r) for r in recs], "next_after": nxt}
    else:
        body = {"items": [_render(r) for r in recs], "next_after": nxt}
    return OrjsonResponse(body)


async def _create(
    master: AsyncVehicleMaster, data: EntityData, path: str, warnings: list[str] | None = None
) -> Response:
    res = await master.create(data)
    return _one(await master.get(res.entity, res.id), 201, f"/api/v1/{path}/{res.id}", warnings)


async def _put(
    master: AsyncVehicleMaster, data: EntityData, if_match: str | None, warnings: list[str] | None = None
) -> Response:
    version, must_exist = parse_if_match(if_match)
    if must_exist:
        res = await master.update(data, if_version=version)
    else:
        res = await master.upsert(data)
    return _one(await master.get(res.entity, res.id), 201 if res.created else 200, warnings=warnings)


async def _delete(
    master: AsyncVehicleMaster, entity: MasterEntity, eid: str, if_match: str | None
) -> Response:
    version, _ = parse_if_match(if_match)
    await master.delete(entity, eid, if_version=version)
    return Response(status_code=204)


def _feature(entity: MasterEntity, body: RouteFeatureIn | ZoneFeatureIn, eid: str | None) -> EntityData:
    return parse_entity(entity, feature_data(entity, body.model_dump(mode="json"), eid))


def _doc(entity: MasterEntity, raw: dict[str, Any], eid: str | None) -> EntityData:
    id_field = "vehicle_id"
    given = raw.get(id_field)
    if eid is not None and given is not None and given != eid:
        raise MasterValidationError(f"body {id_field} {given!r} differs from the path's {eid!r}", (id_field,))
    raw[id_field] = eid or given
    if raw[id_field] is None:
        raise MasterValidationError(f"{id_field} is required", (id_field,))
    for k in ("version", "updated"):
        raw.pop(k, None)
    return parse_entity(entity, raw)


# --------------------------------------------------------------------------- routes


@router.get("/routes", response_model=RouteCollection, responses=READ_ERRORS, tags=["routes"])
async def list_routes(
    _: Viewer,
    master: Master,
    limit: Limit = 100,
    after: After = None,
    name_contains: Annotated[str | None, Query(max_length=200, description="Case-insensitive.")] = None,
) -> Response:
    """Routes as a GeoJSON FeatureCollection, ordered by id."""
    where: Filter | None = None
    if name_contains:
        needle = name_contains.lower()
        where = lambda d: needle in d["name"].lower()  # noqa: E731
    return _page(await master.list(MasterEntity.ROUTE, after=after, limit=limit, where=where), limit, True)


@router.post("/routes", status_code=201, response_model=RouteFeature, responses=WRITE_ERRORS, tags=["routes"])
async def create_route(
    _: Admin,
    master: Master,
    body: Annotated[
        RouteFeatureIn, Body(openapi_examples={"berlin": {"summary": "A route", "value": ROUTE_EXAMPLE}})
    ],
) -> Response:
    """Create a route from a GeoJSON LineString Feature (its `id` is the route id)."""
    return await _create(master, _feature(MasterEntity.ROUTE, body, None), "routes")


@router.get("/routes/{route_id}", response_model=RouteFeature, responses=READ_ERRORS, tags=["routes"])
async def get_route(_: Viewer, master: Master, route_id: EntityPath) -> Response:
    return _one(await master.get(MasterEntity.ROUTE, route_id))


@router.put("/routes/{route_id}", response_model=RouteFeature, responses=WRITE_ERRORS, tags=["routes"])
async def put_route(
    _: Admin,
    master: Master,
    route_id: EntityPath,
    body: Annotated[
        RouteFeatureIn, Body(openapi_examples={"berlin": {"summary": "A route", "value": ROUTE_EXAMPLE}})
    ],
    if_match: IfMatch = None,
) -> Response:
    """Replace (200) or create (201) a route; with If-Match only the named version is replaced."""
    return await _put(master, _feature(MasterEntity.ROUTE, body, route_id), if_match)


@router.delete("/routes/{route_id}", status_code=204, responses=WRITE_ERRORS, tags=["routes"])
async def delete_route(_: Admin, master: Master, route_id: EntityPath, if_match: IfMatch = None) -> Response:
    """Delete a route that no assignment references (409 otherwise)."""
    return await _delete(master, MasterEntity.ROUTE, route_id, if_match)


# --------------------------------------------------------------------------- zones


@router.get("/zones", response_model=ZoneCollection, responses=READ_ERRORS, tags=["zones"])
async def list_zones(
    _: Viewer, master: Master, limit: Limit = 100, after: After = None, kind: ZoneKind | None = None
) -> Response:
    """Zones as a GeoJSON FeatureCollection, ordered by id, optionally of one kind."""
    where: Filter | None = None
    if kind is not None:
        wanted = kind.value
        where = lambda d: d["kind"] == wanted  # noqa: E731
    return _page(await master.list(MasterEntity.ZONE, after=after, limit=limit, where=where), limit, True)


@router.post("/zones", status_code=201, response_model=ZoneFeature, responses=WRITE_ERRORS, tags=["zones"])
async def create_zone(
    _: Admin,
    master: Master,
    body: Annotated[ZoneFeatureIn, Body(openapi_examples=ZONE_EXAMPLES)],
) -> Response:
    """Create a zone from a GeoJSON Polygon or MultiPolygon Feature, or a circle: a Point Feature
    whose geometry carries `radius_m` (metres, > 0, at most 50 km)."""
    return await _create(master, _feature(MasterEntity.ZONE, body, None), "zones")


@router.get("/zones/{zone_id}", response_model=ZoneFeature, responses=READ_ERRORS, tags=["zones"])
async def get_zone(_: Viewer, master: Master, zone_id: EntityPath) -> Response:
    return _one(await master.get(MasterEntity.ZONE, zone_id))


@router.put("/zones/{zone_id}", response_model=ZoneFeature, responses=WRITE_ERRORS, tags=["zones"])
async def put_zone(
    _: Admin,
    master: Master,
    zone_id: EntityPath,
    body: Annotated[ZoneFeatureIn, Body(openapi_examples=ZONE_EXAMPLES)],
    if_match: IfMatch = None,
) -> Response:
    return await _put(master, _feature(MasterEntity.ZONE, body, zone_id), if_match)


@router.delete("/zones/{zone_id}", status_code=204, responses=WRITE_ERRORS, tags=["zones"])
async def delete_zone(_: Admin, master: Master, zone_id: EntityPath, if_match: IfMatch = None) -> Response:
    return await _delete(master, MasterEntity.ZONE, zone_id, if_match)


# --------------------------------------------------------------------------- vehicles


@router.get("/vehicles", response_model=VehiclePage, responses=READ_ERRORS, tags=["vehicles"])
async def list_vehicles(
    _: Viewer,
    master: Master,
    limit: Limit = 100,
    after: After = None,
    attribute: Annotated[
        str | None, Query(pattern=r"^[^=]{1,64}=.{0,200}$", description="`key=value` attribute filter.")
    ] = None,
) -> Response:
    where: Filter | None = None
    if attribute is not None:
        key, _sep, value = attribute.partition("=")
        where = lambda d: d["attributes"].get(key) == value  # noqa: E731
    return _page(await master.list(MasterEntity.VEHICLE, after=after, limit=limit, where=where), limit, False)


@router.post(
    "/vehicles", status_code=201, response_model=VehicleOut, responses=WRITE_ERRORS, tags=["vehicles"]
)
async def create_vehicle(_: Admin, master: Master, body: VehicleIn) -> Response:
    return await _create(master, _doc(MasterEntity.VEHICLE, body.model_dump(), None), "vehicles")


@router.get("/vehicles/{vehicle_id}", response_model=VehicleOut, responses=READ_ERRORS, tags=["vehicles"])
async def get_vehicle(_: Viewer, master: Master, vehicle_id: EntityPath) -> Response:
    return _one(await master.get(MasterEntity.VEHICLE, vehicle_id))


@router.put("/vehicles/{vehicle_id}", response_model=VehicleOut, responses=WRITE_ERRORS, tags=["vehicles"])
async def put_vehicle(
    _: Admin, master: Master, vehicle_id: EntityPath, body: VehicleIn, if_match: IfMatch = None
) -> Response:
    return await _put(master, _doc(MasterEntity.VEHICLE, body.model_dump(), vehicle_id), if_match)


@router.delete("/vehicles/{vehicle_id}", status_code=204, responses=WRITE_ERRORS, tags=["vehicles"])
async def delete_vehicle(
    _: Admin, master: Master, r: Redis, request: Request, vehicle_id: EntityPath, if_match: IfMatch = None
) -> Response:
    """Delete a vehicle without an assignment (409 otherwise); its MQTT credentials are revoked
    with it (a connected vehicle is cut off at once), and its trackers unbound."""
    response = await _delete(master, MasterEntity.VEHICLE, vehicle_id, if_match)
    await unbind_on_delete(request, vehicle_id)
    await revoke_on_delete(r, request, vehicle_id)
    return response


# --------------------------------------------------------------------------- assignments


def _assignment(body: AssignmentIn, eid: str | None) -> EntityData:
    raw: dict[str, Any] = {
        "vehicle_id": body.vehicle_id,
        "route_id": body.route_id,
        "valid_from_ms": utc_now_ms() if body.valid_from is None else epoch_ms(body.valid_from),
        "valid_to_ms": None if body.valid_to is None else epoch_ms(body.valid_to),
        "planned_departure_ms": body.planned_ms("planned_departure"),
        "planned_arrival_ms": body.planned_ms("planned_arrival"),
    }
    return _doc(MasterEntity.ASSIGNMENT, raw, eid)


async def _coverage_warnings(data: EntityData, r: aioredis.Redis, request: Request) -> list[str]:
    """A warning when the vehicle's telemetry so far precedes the assignment: those fixes stay
    unassigned (no route alerts for them)."""
    if not isinstance(data, AssignmentData):
        return []
    keys: ReadKeys = request.app.state.read_keys
    last = await last_fix_ms(r, keys, data.vehicle_id)
    if last is None or last >= data.valid_from_ms:
        return []
    return [
        f"{data.vehicle_id} already sent telemetry up to {ms_to_iso(last)}, before valid_from "
        f"{ms_to_iso(data.valid_from_ms)}: those fixes stay unassigned (no route alerts); set an "
        "earlier valid_from to cover them"
    ]


@router.get("/assignments", response_model=AssignmentPage, responses=READ_ERRORS, tags=["assignments"])
async def list_assignments(
    _: Viewer,
    master: Master,
    limit: Limit = 100,
    after: After = None,
    route_id: Annotated[str | None, Query(pattern=ID, description="Only this route's vehicles.")] = None,
) -> Response:
    """Current assignments (one per vehicle), ordered by vehicle id."""
    where: Filter | None = None
    if route_id is not None:
        where = lambda d: d["route_id"] == route_id  # noqa: E731
    recs = await master.list(MasterEntity.ASSIGNMENT, after=after, limit=limit, where=where)
    return _page(recs, limit, False)


@router.post(
    "/assignments",
    status_code=201,
    response_model=AssignmentOut,
    responses=WRITE_ERRORS,
    tags=["assignments"],
)
async def create_assignment(
    _: Admin, master: Master, r: Redis, request: Request, body: AssignmentIn
) -> Response:
    """Assign a vehicle to a route (409 if it has one: PUT replaces). 422 for an unknown vehicle or route.

    `planned_departure` and `planned_arrival` (or their `_ms` forms) plan the trip: ARRIVAL_AT_RISK
    compares its ETA with the planned arrival. `warnings` names telemetry the vehicle already sent
    before `valid_from`: it stays unassigned."""
    data = _assignment(body, None)
    return await _create(master, data, "assignments", await _coverage_warnings(data, r, request))


@router.get(
    "/assignments/{vehicle_id}", response_model=AssignmentOut, responses=READ_ERRORS, tags=["assignments"]
)
async def get_assignment(_: Viewer, master: Master, vehicle_id: EntityPath) -> Response:
    return _one(await master.get(MasterEntity.ASSIGNMENT, vehicle_id))


@router.put(
    "/assignments/{vehicle_id}", response_model=AssignmentOut, responses=WRITE_ERRORS, tags=["assignments"]
)
async def put_assignment(
    _: Admin,
    master: Master,
    r: Redis,
    request: Request,
    vehicle_id: EntityPath,
    body: AssignmentIn,
    if_match: IfMatch = None,
) -> Response:
    """Assign or re-assign the vehicle; the new assignment replaces the old one (`warnings` as on
    POST)."""
    data = _assignment(body, vehicle_id)
    return await _put(master, data, if_match, await _coverage_warnings(data, r, request))


@router.delete("/assignments/{vehicle_id}", status_code=204, responses=WRITE_ERRORS, tags=["assignments"])
async def delete_assignment(
    _: Admin, master: Master, vehicle_id: EntityPath, if_match: IfMatch = None
) -> Response:
    return await _delete(master, MasterEntity.ASSIGNMENT, vehicle_id, if_match)


# --------------------------------------------------------------------------- bulk import

IMPORT_EXAMPLE = {
    "type": "FeatureCollection",
    "features": [
        ROUTE_EXAMPLE,
        ZONE_EXAMPLE,
        {
            "type": "Feature",
            "id": "truck-042",
            "geometry": None,
            "properties": {"entity": "vehicle", "label": "Truck 42", "attributes": {}},
        },
        {
            "type": "Feature",
            "id": "truck-042",
            "geometry": None,
            "properties": {"entity": "assignment", "route_id": "r-berlin-1", "valid_from_ms": 1795320000000},
        },
    ],
}


@router.post(
    "/import",
    response_model=ImportResult,
    responses={
        **WRITE_ERRORS,
        422: {**INVALID, "description": "Every invalid feature, with its index; nothing written"},
    },
    tags=["import"],
)
async def import_features(
    _: Admin,
    master: Master,
    body: Annotated[
        dict[str, Any],
        Body(openapi_examples={"mixed": {"summary": "One of each entity", "value": IMPORT_EXAMPLE}}),
    ],
) -> Response:
    """Create or replace many entities from one GeoJSON FeatureCollection.

    LineStrings are routes, (Multi)Polygons and Points with `radius_m` (circles) zones; vehicles
    and assignments are Features with `"geometry": null` and `properties.entity`. The whole
    collection is validated (including that every assignment names a vehicle and route that exist
    or are in the file) before anything is written; identical entities are left at their version.
    """
    items, problems = parse_feature_collection(body)
    if not problems:
        problems = await _dangling(master, items)
    if problems:
        return OrjsonResponse(
            {
                "detail": [
                    {"loc": ["body", "features", p.index, *p.loc], "msg": p.msg, "type": "value_error"}
                    for p in problems
                ]
            },
            status_code=422,
        )
    counts = {"created": 0, "updated": 0, "unchanged": 0}
    by_entity: dict[str, int] = {}
    for _index, item in items:
        res = await master.upsert(item)
        counts["created" if res.created else "updated" if res.changed else "unchanged"] += 1
        by_entity[res.entity.value] = by_entity.get(res.entity.value, 0) + 1
    return OrjsonResponse({"received": len(items), **counts, "by_entity": by_entity})


async def _dangling(master: AsyncVehicleMaster, items: list[tuple[int, EntityData]]) -> list[ImportProblem]:
    """Assignments whose vehicle or route is neither in the file nor in the store."""
    have = {(MasterEntity.VEHICLE, d.vehicle_id) for _, d in items if isinstance(d, VehicleData)} | {
        (MasterEntity.ROUTE, d.route_id) for _, d in items if isinstance(d, RouteData)
    }
    out = []
    for index, item in items:
        if not isinstance(item, AssignmentData):
            continue
        for ent, ref in ((MasterEntity.VEHICLE, item.vehicle_id), (MasterEntity.ROUTE, item.route_id)):
            if (ent, ref) in have:
                continue
            try:
                await master.get(ent, ref)
            except NotFoundError:
                out.append(ImportProblem(index, (f"{ent.value}_id",), f"unknown {ent.value} {ref!r}"))
    return out
