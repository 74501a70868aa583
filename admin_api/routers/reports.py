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
from admin_api.responses import GeoJsonResponse, OrjsonResponse
from admin_api.schemas import INVALID, UNAUTHORIZED
from fleetfence.contracts import VEHICLE_ID_RE, ms_to_iso
from history.errors import ReportError
from history.report_formats import heatmap_geojson, records, visits_geojson
from history.report_inputs import ReportRange, report_range
from history.reports import DEFAULT_H3_RESOLUTION, run_report
from history.settings import HistorySettings

logger = logging.getLogger(__name__)
router = APIRouter(prefix="/api/v1/reports", tags=["reports"])

ERRORS: dict[int | str, dict[str, Any]] = {
    401: UNAUTHORIZED,
    422: {**INVALID, "description": "Bad date range, vehicle id or parameter"},
}
# The GeoJSON routes document their 200 as application/geo+json; FastAPI would file the error
# models under that media type too, but errors are plain JSON, so those are spelled out.
GEOJSON_ERRORS: dict[int | str, dict[str, Any]] = {
    401: {
        "description": UNAUTHORIZED["description"],
        "content": {
            "application/json": {
                "schema": {"$ref": "#/components/schemas/Problem"},
                **UNAUTHORIZED["content"]["application/json"],
            }
        },
    },
    422: {
        "description": ERRORS[422]["description"],
        "content": {"application/json": {"schema": {"$ref": "#/components/schemas/ValidationProblem"}}},
    },
}

# Examples for the docs, shaped by the same functions as the real responses.
_RANGE = ReportRange(from_ms=1_795_132_800_000, to_ms=1_795_305_600_000, vehicle_id=None)  # 2026-11-20..21
_VISITS = pd.DataFrame(
    [
        {
            "vehicle_id": "truck-042",
            "zone_id": "z-depot-1",
            "entry_ts_ms": 1_795_154_400_000,
            "exit_ts_ms": 1_795_156_200_000,
            "last_inside_ts_ms": 1_795_156_199_000,
            "dwell_s": 1800.0,
            "fixes": 1800,
            "entry_lon": 13.395,
            "entry_lat": 52.515,
        }
    ]
)
_CELLS = pd.DataFrame([{"h3_cell": "891f1d48947ffff", "off_route_fixes": 42}])


def _envelope_example(name: str, items: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
    return {
        "report": name,
        "from": ms_to_iso(_RANGE.from_ms),
        "to": ms_to_iso(_RANGE.to_ms),
        "vehicle_id": _RANGE.vehicle_id,
        **extra,
        "items": items,
    }


def _ok(content: dict[str, Any]) -> dict[int | str, dict[str, Any]]:
    """A 200 with one example per media type."""
    return {200: {"content": {media: {"example": example} for media, example in content.items()}}}


ADHERENCE_EXAMPLE = _envelope_example(
    "adherence",
    [
        {
            "vehicle_id": "truck-042",
            "date": "2026-11-20",
            "fixes": 8640,
            "assigned_fixes": 8600,
            "inside_fixes": 8411,
            "inside_share": 0.978,
            "off_route_s": 378.0,
            "off_route_m": 4120.5,
        }
    ],
)
VISITS_EXAMPLE = _envelope_example("zone_visits", records(_VISITS))
VISITS_GEOJSON_EXAMPLE = visits_geojson(_VISITS)
SPEEDING_EXAMPLE = _envelope_example(
    "speeding",
    records(
        pd.DataFrame(
            [
                {
                    "vehicle_id": "truck-042",
                    "route_id": "r-berlin-1",
                    "speed_limit_kmh": 50.0,
                    "start_ts_ms": 1_795_158_600_000,
                    "end_ts_ms": 1_795_158_614_000,
                    "duration_s": 14.0,
                    "fixes": 15,
                    "max_kmh": 63.2,
                }
            ]
        )
    ),
)
HEATMAP_EXAMPLE = _envelope_example("heatmap", records(_CELLS), resolution=DEFAULT_H3_RESOLUTION)
HEATMAP_GEOJSON_EXAMPLE = heatmap_geojson(_CELLS, DEFAULT_H3_RESOLUTION)
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
        hs = HistorySettings.from_base(request.app.state.settings)
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
    return run_report(name, hs.archive_root, rng, hs.history_buckets, resolution=resolution)


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


@router.get("/adherence", responses={**ERRORS, **_ok({"application/json": ADHERENCE_EXAMPLE})})
def adherence(request: Request, _: Viewer, start: From, end: To, vehicle_id: VehicleQ = None) -> Response:
    """Route adherence per vehicle and UTC day: share of fixes inside the corridor, time and
    distance off-route."""
    rng = _range(start, end, vehicle_id)
    return _envelope("adherence", rng, _run(request, "adherence", rng))


def _zone_visits(request: Request, rng: ReportRange, fmt: str) -> Response:
    df = _run(request, "zone_visits", rng)
    if fmt == "geojson":
        return GeoJsonResponse(visits_geojson(df))
    return _envelope("zone_visits", rng, df)


@router.get(
    "/zone-visits",
    responses={
        **ERRORS,
        **_ok({"application/json": VISITS_EXAMPLE, "application/geo+json": VISITS_GEOJSON_EXAMPLE}),
    },
)
def zone_visits(
    request: Request, _: Viewer, start: From, end: To, vehicle_id: VehicleQ = None, format: Format = "json"
) -> Response:
    """Zone visits (runs of consecutive fixes inside a zone) with entry, exit and dwell time."""
    return _zone_visits(request, _range(start, end, vehicle_id), format)


@router.get(
    "/zone-visits.geojson",
    response_class=GeoJsonResponse,
    responses={**GEOJSON_ERRORS, **_ok({"application/geo+json": VISITS_GEOJSON_EXAMPLE})},
)
def zone_visits_geojson(
    request: Request, _: Viewer, start: From, end: To, vehicle_id: VehicleQ = None
) -> Response:
    """Zone visits as GeoJSON Points at the first fix inside."""
    return _zone_visits(request, _range(start, end, vehicle_id), "geojson")


@router.get("/speeding", responses={**ERRORS, **_ok({"application/json": SPEEDING_EXAMPLE})})
def speeding(request: Request, _: Viewer, start: From, end: To, vehicle_id: VehicleQ = None) -> Response:
    """Speeding episodes: runs of fixes above the assigned route's speed limit."""
    rng = _range(start, end, vehicle_id)
    return _envelope("speeding", rng, _run(request, "speeding", rng))


def _heatmap(request: Request, rng: ReportRange, resolution: int, fmt: str) -> Response:
    df = _run(request, "heatmap", rng, resolution)
    if fmt == "geojson":
        return GeoJsonResponse(heatmap_geojson(df, resolution))
    return _envelope("heatmap", rng, df, resolution=resolution)


@router.get(
    "/heatmap",
    responses={
        **ERRORS,
        **_ok({"application/json": HEATMAP_EXAMPLE, "application/geo+json": HEATMAP_GEOJSON_EXAMPLE}),
    },
)
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


@router.get(
    "/heatmap.geojson",
    response_class=GeoJsonResponse,
    responses={**GEOJSON_ERRORS, **_ok({"application/geo+json": HEATMAP_GEOJSON_EXAMPLE})},
)
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
