"""GeoJSON in and out of the vehicle master (pure functions, no I/O).

Routes and zones travel as GeoJSON Features (geometry + properties), so an admin can draw them in
any GIS tool and import a FeatureCollection; vehicles and assignments have no geometry and appear in
a bulk import as Features with `"geometry": null`. Inside, every entity is its wire `data`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from fleetfence.contracts import MasterEntity, ms_to_iso
from vehicle_master.errors import MasterValidationError
from vehicle_master.models import ID_FIELD, EntityData
from vehicle_master.store import MasterRecord, parse_entity

# Read-only properties a client may echo back from a GET; they are ignored on input.
ECHOED = frozenset({"version", "updated", "entity"})
GEOMETRY_ENTITIES = (MasterEntity.ROUTE, MasterEntity.ZONE)
# Import order: what an assignment refers to is written before the assignment.
IMPORT_ORDER = (MasterEntity.VEHICLE, MasterEntity.ROUTE, MasterEntity.ZONE, MasterEntity.ASSIGNMENT)


def to_feature(rec: MasterRecord) -> dict[str, Any]:
    """A route or zone record as a GeoJSON Feature; version and update time in the properties."""
    props = {k: v for k, v in rec.data.items() if k != "geometry"}
    props["version"] = rec.version
    props["updated"] = ms_to_iso(rec.updated_ms)
    return {"type": "Feature", "id": rec.id, "geometry": rec.data["geometry"], "properties": props}


def to_document(rec: MasterRecord) -> dict[str, Any]:
    """A vehicle or assignment record as plain JSON (assignments also get ISO times)."""
    doc = dict(rec.data)
    if rec.entity is MasterEntity.ASSIGNMENT:
        doc["valid_from"] = ms_to_iso(doc["valid_from_ms"])
        doc["valid_to"] = None if doc.get("valid_to_ms") is None else ms_to_iso(doc["valid_to_ms"])
    doc["version"] = rec.version
    doc["updated"] = ms_to_iso(rec.updated_ms)
    return doc


def render(rec: MasterRecord) -> dict[str, Any]:
    return to_feature(rec) if rec.entity in GEOMETRY_ENTITIES else to_document(rec)


def feature_data(entity: MasterEntity, feature: dict[str, Any], entity_id: str | None) -> dict[str, Any]:
    """The wire `data` dict of a Feature: properties minus echoed fields, plus id and geometry."""
    props = feature.get("properties") or {}
    if not isinstance(props, dict):
        raise MasterValidationError("feature properties must be an object", ("properties",))
    id_field = ID_FIELD[entity]
    data = {k: v for k, v in props.items() if k not in ECHOED}
    given = [x for x in (entity_id, feature.get("id"), props.get(id_field)) if x is not None]
    # RFC 7946 allows a string or a number; only an integer reads back as the same id (str(1e400)
    # is "inf", str(NaN) "nan").
    if any(isinstance(x, bool) or not isinstance(x, str | int) for x in given):
        raise MasterValidationError(f"the {entity.value} id must be a string or an integer", ("id",))
    candidates = {str(x) for x in given}
    if len(candidates) > 1:
        raise MasterValidationError(f"conflicting ids for the {entity.value}: {sorted(candidates)}", ("id",))
    if not candidates:
        raise MasterValidationError(f"the {entity.value} needs an id (Feature `id`)", ("id",))
    data[id_field] = candidates.pop()
    if entity in GEOMETRY_ENTITIES:
        data["geometry"] = feature.get("geometry")
    return data


@dataclass(frozen=True)
class ImportProblem:
    index: int
    loc: tuple[str | int, ...]
    msg: str


def infer_entity(feature: dict[str, Any]) -> MasterEntity:
    props = feature.get("properties") or {}
    named = props.get("entity") if isinstance(props, dict) else None
    if named is not None:
        try:
            return MasterEntity(named)
        except ValueError:
            raise MasterValidationError(
                f"properties.entity must be one of {[e.value for e in MasterEntity]}, got {named!r}",
                ("properties", "entity"),
            ) from None
    geometry = feature.get("geometry")
    kind = geometry.get("type") if isinstance(geometry, dict) else None
    if kind == "LineString":
        return MasterEntity.ROUTE
    if kind in ("Polygon", "MultiPolygon", "Point"):  # a Point is a circle zone (with radius_m)
        return MasterEntity.ZONE
    raise MasterValidationError(
        "cannot tell the entity: set properties.entity (route, zone, vehicle, assignment)",
        ("properties", "entity"),
    )


def parse_feature_collection(fc: Any) -> tuple[list[tuple[int, EntityData]], list[ImportProblem]]:
    """Validate a whole FeatureCollection; returns (feature index, entity) in import order and
    every error.

    All features are checked before anything is written so a bad file changes nothing and the
    admin gets the full list of problems at once.
    """
    if not isinstance(fc, dict) or fc.get("type") != "FeatureCollection":
        return [], [ImportProblem(-1, ("type",), "body must be a GeoJSON FeatureCollection")]
    features = fc.get("features")
    if not isinstance(features, list):
        return [], [ImportProblem(-1, ("features",), "features must be a list")]
    items: list[tuple[int, int, EntityData]] = []
    errors: list[ImportProblem] = []
    for i, f in enumerate(features):
        try:
            if not isinstance(f, dict) or f.get("type") != "Feature":
                raise MasterValidationError("each item must be a GeoJSON Feature", ("type",))
            entity = infer_entity(f)
            data = parse_entity(entity, feature_data(entity, f, None))
            items.append((IMPORT_ORDER.index(entity), i, data))
        except MasterValidationError as exc:
            errors.append(ImportProblem(i, exc.loc, str(exc)))
    items.sort(key=lambda t: t[0])  # stable: file order kept within an entity kind
    return [(i, d) for _, i, d in items], errors
