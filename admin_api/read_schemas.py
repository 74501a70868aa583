"""The read side's answers: alerts from the history, the live state of each vehicle and the
token of the live stream. The alert is derived from its wire form (`fleetfence.contracts.AlertRecord`)
rather than written again."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal, get_type_hints

from pydantic import BaseModel, ConfigDict, Field, create_model

from fleetfence.contracts import AlertRecord

ALERT_EXAMPLE: dict[str, Any] = {  # docs/contracts.md, Kafka fleet.alerts
    "alert_id": "e4d18839cd0ee1adf3cd5858",  # alert_id("truck-042", "ROUTE_DEVIATION", 1817)
    "type": "ROUTE_DEVIATION",
    "vehicle_id": "truck-042",
    "route_id": "r-berlin-1",
    "route_version": 3,
    "seq": 1817,
    "ts_ms": 1_795_320_930_250,
    "ts": "2026-11-22T04:15:30.250Z",
    "lat": 52.5201,
    "lon": 13.4049,
    "details": {"outside_fixes": 3, "outside_s": 2.0},
}
LIVE_EXAMPLE: dict[str, Any] = {
    "vehicle_id": "truck-042",
    "seq": 1820,
    "ts_ms": 1_795_320_933_250,
    "lat": 52.5203,
    "lon": 13.4052,
    "speed_kmh": 43.5,
    "status": "off_route",
    "overspeed": False,
    "silent": False,
    "route_id": "r-berlin-1",
    "route_version": 3,
    "progress_m": 1250.0,
    "progress_ratio": 0.42,
    "distance_m": 212.4,
    "zones": [],
    "unassigned_fixes": 0,
    "wrong_way": False,
    "stop": None,
    "stopped_since_ms": None,
    "eta_ms": 1_795_321_850_000,
    "planned_arrival_ms": 1_795_321_200_000,
    "delay_s": 650.0,
    "arrival_at_risk": True,
    "completed": False,
    "off_route_m": 212.4,
    "h3": "891f1d48947ffff",
    "updated_ms": 1_795_320_933_300,
    "open_alerts": [ALERT_EXAMPLE],
}


# Alert history may hold records from a producer other than the processor, which the receivers accept
# without these (alerts.model.parse_alert): what their absence means.
_ALERT_MAY_LACK: dict[str, Any] = {
    "route_id": None,
    "route_version": None,
    "details": Field(default_factory=dict),
}
# On some alerts only, or not in older history: returned as additional properties, not promised.
_ALERT_UNLISTED = frozenset({"trigger_received_ms", "zone_id", "late"})


def _alert_model() -> type[BaseModel]:
    """The alert as the API returns it, derived from its wire form (`fleetfence.contracts.AlertRecord`),
    so a field the processor adds or retypes reaches the API's schema without a second definition."""
    fields: dict[str, Any] = {}
    for name, hint in get_type_hints(AlertRecord).items():
        if name in _ALERT_UNLISTED:
            continue
        if name not in _ALERT_MAY_LACK:
            fields[name] = (hint, ...)
        else:
            default = _ALERT_MAY_LACK[name]
            fields[name] = (hint | None if default is None else hint, default)
    return create_model(
        "Alert",
        __config__=ConfigDict(extra="allow", json_schema_extra={"examples": [ALERT_EXAMPLE]}),
        __module__=__name__,
        **fields,
    )


if TYPE_CHECKING:
    Alert = BaseModel
else:
    Alert = _alert_model()


class AlertPage(BaseModel):
    model_config = ConfigDict(json_schema_extra={"examples": [{"items": [ALERT_EXAMPLE], "next_offset": 1}]})
    items: list[Alert]
    next_offset: int | None


class LiveState(BaseModel):
    model_config = ConfigDict(extra="allow", json_schema_extra={"examples": [LIVE_EXAMPLE]})
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
    progress_m: float | None = Field(
        default=None,
        description="Metres along the route from its start, on the pass of the route the vehicle is "
        "driving (a street the route uses twice counts where this trip is, not the nearer pass).",
    )
    progress_ratio: float | None = Field(default=None, description="progress_m over the route's length, 0-1.")
    distance_m: float | None = Field(
        default=None, description="Metres from the route's line; null without a route."
    )
    zones: list[str] = Field(default_factory=list)
    unassigned_fixes: int = Field(
        default=0,
        ge=0,
        description="Fixes of this vehicle with no assignment valid at their event time (no route alerts "
        "for them): non-zero after back-filled or replayed telemetry older than the assignment's valid_from.",
    )
    # The trip along the assigned route. States written before these fields existed lack them:
    # the defaults below are what such a state means.
    wrong_way: bool = Field(
        default=False, description="Driving the route backwards (WRONG_DIRECTION open, not yet restored)."
    )
    stop: Literal["unplanned", "planned"] | None = Field(
        default=None,
        description="Standing still for at least the route's stop_min_s: `unplanned` (UNPLANNED_STOP "
        "open) or `planned` (in a zone marked as a stop); null when moving.",
    )
    stopped_since_ms: int | None = Field(
        default=None, description="Epoch ms UTC when the current stop began; null when not stopped."
    )
    eta_ms: int | None = Field(
        default=None,
        description="Estimated arrival at the route's end, epoch ms UTC (remaining distance at the "
        "trip's average speed); null before the trip has run long enough to tell, or without a route.",
    )
    planned_arrival_ms: int | None = Field(
        default=None,
        description="The trip's planned arrival, epoch ms UTC: the assignment's, else its planned "
        "departure (or the trip's start) plus the route's planned_duration_s; null when unplanned.",
    )
    delay_s: float | None = Field(
        default=None,
        description="Seconds the ETA is later than the planned arrival (negative: early); null without "
        "an ETA or a planned arrival.",
    )
    arrival_at_risk: bool = Field(
        default=False, description="ARRIVAL_AT_RISK open: delay_s beyond the route's arrival_risk_s."
    )
    completed: bool = Field(
        default=False, description="The trip reached the route's end (ROUTE_COMPLETED raised)."
    )
    off_route_m: float = Field(
        default=0.0, ge=0, description="Metres driven outside the corridor on this trip so far."
    )
    # docs/contracts.md lists both, but the processor's live rows (processor/core/live.py) carry neither:
    # optional here, so the schema does not promise what a client will not find.
    h3: str | None = Field(default=None, description="Resolution 9 H3 cell, when the writer records it.")
    updated_ms: int | None = Field(
        default=None, description="When the state was written, epoch ms UTC, when the writer records it."
    )
    open_alerts: list[Alert] = Field(default_factory=list, description="Only on the single-vehicle read.")


class LivePage(BaseModel):
    model_config = ConfigDict(
        json_schema_extra={
            "examples": [{"items": [{**LIVE_EXAMPLE, "open_alerts": []}], "next_offset": None}]
        }
    )
    items: list[LiveState]
    next_offset: int | None


class StreamToken(BaseModel):
    model_config = ConfigDict(
        json_schema_extra={
            "examples": [{"token": "fft_q3VnZ1x0cE9kRmJ3YWxsZXRz", "expires_in_s": 60, "role": "viewer"}]
        }
    )
    token: str = Field(description="Pass as `token` to GET /api/v1/stream; valid for expires_in_s.")
    expires_in_s: int
    role: Literal["viewer", "admin"] = Field(description="The role of the key the token was issued for.")
