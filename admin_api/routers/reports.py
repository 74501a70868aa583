"""History reports over the telemetry archive (SedonaDB), as JSON and GeoJSON.

The reports read the archive directly (`FLEETFENCE_HISTORY_ARCHIVE_PATH`, default
`<state_dir>/archive`), not Redis. They are CPU-bound and synchronous, so the endpoints are plain
`def`: FastAPI runs them in its thread pool and the event loop keeps serving the live endpoints.
"""

from __future__ import annotations

import logging
from typing import Annotated, Any, Literal

import pandas as pd
from fastapi import APIRouter, HTTPException, Query, Request, Response

from admin_api.deps import Viewer
from admin_api.responses import OrjsonResponse
from admin_api.schemas import Problem
from fleetfence.contracts import VEHICLE_ID_RE, ms_to_iso
from history.reports import (
    DEFAULT_H3_RESOLUTION,
    ReportError,
    ReportRange,
    heatmap_geojson,
    records,
    report_range,
    run_report,
    visits_geojson,
)
from history.settings import HistorySettings

logger = logging.getLogger(__name__)
router = APIRouter(prefix="/api/v1/reports", tags=["reports"])

ERRORS: dict[int | str, dict[str, Any]] = {
    401: {"model": Problem, "description": "No or unknown API key"},
    422: {"description": "Bad date range, vehicle id or parameter"},
}
From = Annotated[
    str,
    Query(
        alias="from", description="Start: a UTC date (YYYY-MM-DD, whole day) or an ISO-8601 time with offset."
    ),
]
To = Annotated[
    str,
    Query(alias="to", description="End: a UTC date (inclusive, whole day) or an ISO-8601 time (exclusive)."),
]
VehicleQ = Annotated[str | None, Query(pattern=VEHICLE_ID_RE.pattern, description="Only this vehicle.")]
Format = Annotated[Literal["json", "geojson"], Query(description="`geojson`: a FeatureCollection.")]
Resolution = Annotated[int, Query(ge=0, le=15, description="H3 resolution of the heat map cells.")]


def _history(request: Request) -> HistorySettings:
    """History settings derived once from the app's settings (plus FLEETFENCE_HISTORY_*)."""
    hs: HistorySettings | None = getattr(request.app.state, "history_settings", None)
    if hs is None:
        hs = HistorySettings.from_settings(request.app.state.settings)
        request.app.state.history_settings = hs
    return hs


def _range(start: str, end: str, vehicle_id: str | None) -> ReportRange:
    try:
        return report_range(start, end, vehicle_id)
    except ReportError as exc:
        raise HTTPException(
            422, [{"loc": ["query", "from"], "msg": str(exc), "type": "value_error"}]
        ) from exc


def _run(
    request: Request, name: str, rng: ReportRange, resolution: int = DEFAULT_H3_RESOLUTION
) -> pd.DataFrame:
    hs = _history(request)
    return run_report(name, hs.archive_root, rng, hs.buckets, resolution=resolution)


def _envelope(name: str, rng: ReportRange, df: pd.DataFrame, **extra: Any) -> Response:
    return OrjsonResponse(
        {
            "report": name,
            "from": ms_to_iso(rng.from_ms),
            "to": ms_to_iso(rng.to_ms),
            "vehicle_id": rng.vehicle_id,
            **extra,
            "items": records(df),
        }
    )


@router.get("/adherence", responses=ERRORS)
def adherence(request: Request, _: Viewer, start: From, end: To, vehicle_id: VehicleQ = None) -> Response:
    """Route adherence per vehicle and UTC day: share of fixes inside the corridor, time and
    distance off-route."""
    rng = _range(start, end, vehicle_id)
    return _envelope("adherence", rng, _run(request, "adherence", rng))


def _zone_visits(request: Request, rng: ReportRange, fmt: str) -> Response:
    df = _run(request, "zone_visits", rng)
    if fmt == "geojson":
        return OrjsonResponse(visits_geojson(df), media_type="application/geo+json")
    return _envelope("zone_visits", rng, df)


@router.get("/zone-visits", responses=ERRORS)
def zone_visits(
    request: Request, _: Viewer, start: From, end: To, vehicle_id: VehicleQ = None, format: Format = "json"
) -> Response:
    """Zone visits (runs of consecutive fixes inside a zone) with entry, exit and dwell time."""
    return _zone_visits(request, _range(start, end, vehicle_id), format)


@router.get("/zone-visits.geojson", responses=ERRORS)
def zone_visits_geojson(
    request: Request, _: Viewer, start: From, end: To, vehicle_id: VehicleQ = None
) -> Response:
    """Zone visits as GeoJSON Points at the first fix inside."""
    return _zone_visits(request, _range(start, end, vehicle_id), "geojson")


@router.get("/speeding", responses=ERRORS)
def speeding(request: Request, _: Viewer, start: From, end: To, vehicle_id: VehicleQ = None) -> Response:
    """Speeding episodes: runs of fixes above the assigned route's speed limit."""
    rng = _range(start, end, vehicle_id)
    return _envelope("speeding", rng, _run(request, "speeding", rng))


def _heatmap(request: Request, rng: ReportRange, resolution: int, fmt: str) -> Response:
    df = _run(request, "heatmap", rng, resolution)
    if fmt == "geojson":
        return OrjsonResponse(heatmap_geojson(df, resolution), media_type="application/geo+json")
    return _envelope("heatmap", rng, df, resolution=resolution)


@router.get("/heatmap", responses=ERRORS)
def heatmap(
    request: Request,
    _: Viewer,
    start: From,
    end: To,
    vehicle_id: VehicleQ = None,
    resolution: Resolution = DEFAULT_H3_RESOLUTION,
    format: Format = "json",
) -> Response:
    """Off-route fixes counted per H3 cell."""
    return _heatmap(request, _range(start, end, vehicle_id), resolution, format)


@router.get("/heatmap.geojson", responses=ERRORS)
def heatmap_geojson_path(
    request: Request,
    _: Viewer,
    start: From,
    end: To,
    vehicle_id: VehicleQ = None,
    resolution: Resolution = DEFAULT_H3_RESOLUTION,
) -> Response:
    """The heat map as GeoJSON: one H3 cell polygon per feature, `off_route_fixes` in properties."""
    return _heatmap(request, _range(start, end, vehicle_id), resolution, "geojson")
