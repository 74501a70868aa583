"""The API's alert schema is derived from the wire form (`fleetfence.contracts.AlertRecord`): it stays
the published one, and every record the processor writes is a valid response, returned unchanged."""

from __future__ import annotations

import orjson

from admin_api.read_schemas import Alert
from fleetfence.contracts import AlertType, alert_json, alert_record

_NULL = {"default": None}
T0 = 1_795_320_930_250
PUBLISHED_PROPERTIES = {
    "alert_id": {"title": "Alert Id", "type": "string"},
    "type": {"$ref": "#/$defs/AlertType"},
    "vehicle_id": {"title": "Vehicle Id", "type": "string"},
    "route_id": {"anyOf": [{"type": "string"}, {"type": "null"}], "title": "Route Id", **_NULL},
    "route_version": {"anyOf": [{"type": "integer"}, {"type": "null"}], "title": "Route Version", **_NULL},
    "seq": {"title": "Seq", "type": "integer"},
    "ts_ms": {"title": "Ts Ms", "type": "integer"},
    "ts": {"title": "Ts", "type": "string"},
    "lat": {"title": "Lat", "type": "number"},
    "lon": {"title": "Lon", "type": "number"},
    "details": {"additionalProperties": True, "title": "Details", "type": "object"},
}


def test_the_schema_is_the_published_one() -> None:
    for mode in ("validation", "serialization"):
        schema = Alert.model_json_schema(mode=mode)
        assert schema["title"] == "Alert"
        assert schema["additionalProperties"] is True
        assert list(schema["properties"]) == list(PUBLISHED_PROPERTIES)
        assert schema["properties"] == PUBLISHED_PROPERTIES
        assert schema["required"] == ["alert_id", "type", "vehicle_id", "seq", "ts_ms", "ts", "lat", "lon"]
        assert schema["$defs"]["AlertType"]["enum"] == [t.value for t in AlertType]


def test_a_written_record_is_returned_as_written() -> None:
    records = [
        alert_record(AlertType.OVERSPEED, "v1", 3, T0, 52.5, 13.4, "r1", 2, {"max_kmh": 88.0}, 9),
        alert_record(AlertType.ZONE_ENTER, "v2", 4, T0 + 1, 52.5, 13.4, None, 0, {}, 0, "z1", True),
    ]
    for record in records:
        on_the_wire = orjson.loads(alert_json(record))
        assert Alert.model_validate(on_the_wire).model_dump(mode="json") == on_the_wire
