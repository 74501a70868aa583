"""The alert record on `fleet.alerts` (`fleetfence.contracts.AlertRecord`): the bytes the processor
writes are held to a golden copy, because receivers de-duplicate on the ids and keep the bytes, and
stored history holds this form. Every reader of the contract accepts what its writer writes."""

from __future__ import annotations

import orjson

from alerts.model import Alert as ReceivedAlert
from alerts.model import parse_alert
from fleetfence.contracts import AlertRecord, AlertType, alert_id
from history.schema import ALERT_SCHEMA
from processor.core.domain import Alert

# Written by the processor before the record had its definition in fleetfence.contracts: the route
# deviation of docs/contracts.md, a late zone exit (zone_id and late present), and an alert whose
# details are empty, at lat 0.0 and lon -0.0.
ALERTS = (
    Alert(
        type=AlertType.ROUTE_DEVIATION,
        vehicle_id="truck-042",
        seq=1817,
        ts_ms=1_795_320_930_250,
        lat=52.5201,
        lon=13.4049,
        route_id="r-berlin-1",
        route_version=3,
        subject="",
        received_ms=1_795_320_930_301,
        details=(("outside_fixes", 3), ("outside_s", 2.0)),
    ),
    Alert(
        type=AlertType.ZONE_EXIT,
        vehicle_id="v1",
        seq=5,
        ts_ms=1_795_320_930_000,
        lat=-33.1,
        lon=151.0,
        route_id=None,
        route_version=0,
        subject="z-depot",
        received_ms=0,
        details=(("dwell_s", 12.5),),
        late=True,
    ),
    Alert(
        type=AlertType.VEHICLE_SILENT,
        vehicle_id="v2",
        seq=9,
        ts_ms=1_795_320_930_001,
        lat=0.0,
        lon=-0.0,
        route_id="r",
        route_version=1,
        subject="",
        received_ms=7,
        details=(),
        late=False,
    ),
)
GOLDEN = (
    b'{"alert_id":"e4d18839cd0ee1adf3cd5858","type":"ROUTE_DEVIATION","vehicle_id":"truck-042",'
    b'"route_id":"r-berlin-1","route_version":3,"seq":1817,"ts_ms":1795320930250,'
    b'"ts":"2026-11-22T04:15:30.250Z","lat":52.5201,"lon":13.4049,'
    b'"details":{"outside_fixes":3,"outside_s":2.0},"trigger_received_ms":1795320930301}',
    b'{"alert_id":"92790e79bc78b0143f080546","type":"ZONE_EXIT","vehicle_id":"v1","route_id":null,'
    b'"route_version":0,"seq":5,"ts_ms":1795320930000,"ts":"2026-11-22T04:15:30.000Z","lat":-33.1,'
    b'"lon":151.0,"details":{"dwell_s":12.5},"trigger_received_ms":0,"zone_id":"z-depot","late":true}',
    b'{"alert_id":"162455aa80bf6a76450e1861","type":"VEHICLE_SILENT","vehicle_id":"v2","route_id":"r",'
    b'"route_version":1,"seq":9,"ts_ms":1795320930001,"ts":"2026-11-22T04:15:30.001Z","lat":0.0,'
    b'"lon":-0.0,"details":{},"trigger_received_ms":7}',
)


def test_the_processor_writes_the_same_bytes_as_before() -> None:
    assert tuple(a.to_json() for a in ALERTS) == GOLDEN
    assert tuple(orjson.dumps(a.to_dict()) for a in ALERTS) == GOLDEN


def test_the_record_has_the_contract_keys_in_order() -> None:
    keys = list(AlertRecord.__annotations__)
    for a in ALERTS:
        written = list(a.to_dict())
        assert written == [k for k in keys if k in written]
        assert AlertRecord.__required_keys__ <= set(written)
        assert set(written) - AlertRecord.__required_keys__ <= AlertRecord.__optional_keys__


def test_the_id_is_the_contract_hash() -> None:
    for a in ALERTS:
        assert a.to_dict()["alert_id"] == alert_id(a.vehicle_id, a.type.value, a.seq, a.subject)


def test_the_receivers_read_the_contract_names() -> None:
    read = {f for f in ReceivedAlert.__dataclass_fields__ if f not in ("raw", "data")}
    assert read <= set(AlertRecord.__annotations__)


def test_the_archive_keeps_contract_fields() -> None:
    """The archive's alert table is a projection of the record (plus the point it derives)."""
    assert set(ALERT_SCHEMA.names) - {"geometry"} <= set(AlertRecord.__annotations__)


def test_receivers_read_what_the_processor_writes() -> None:
    for a, raw in zip(ALERTS, GOLDEN, strict=True):
        got = parse_alert(raw)
        assert (got.alert_id, got.type, got.vehicle_id, got.seq, got.ts_ms) == (
            a.alert_id,
            a.type,
            a.vehicle_id,
            a.seq,
            a.ts_ms,
        )
        assert (got.route_id, got.zone_id or "", got.lat, got.lon) == (a.route_id, a.subject, a.lat, a.lon)
        assert got.raw == raw
