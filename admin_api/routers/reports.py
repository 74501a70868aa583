"""History reports over the telemetry archive (SedonaDB): JSON, GeoJSON and file exports (CSV,
GeoParquet or Parquet, GPX, KML; history/report_formats.py).

The format is chosen by the `Accept` header, or by the `format` query parameter, which wins (a plain
link can download a file). A report that gives none of the accepted media types answers 406 with
those it offers; files come with `Content-Disposition: attachment`. Every negotiated answer says
`Vary: Accept`.

The reports read the archive directly (`FLEETFENCE_HISTORY_ARCHIVE_PATH`, default
`<state_dir>/archive`), not Redis. They are CPU-bound and synchronous, so the endpoints are plain
`def`: FastAPI runs them in its thread pool and the event loop keeps serving the live endpoints.
"""

from __future__ import annotations

import logging
from typing import Annotated, Any, Literal

import pandas as pd
from fastapi import APIRouter, Depends, HTTPException, Query, Request, Response

from admin_api.deps import Viewer
from admin_api.negotiation import negotiate
from admin_api.problems import INVALID, UNAUTHORIZED, Problem
from admin_api.responses import GeoJsonResponse, OrjsonResponse
from fleetfence.contracts import VEHICLE_ID_RE, ms_to_iso
from fleetfence.geo import haversine_m
from history.errors import ReportError
from history.report_formats import (
    BINARY,
    MEDIA_TYPES,
    OFFERED,
    export,
    filename,
    geojson,
    heatmap_geojson,
    records,
    visits_geojson,
    wants_tracks,
)
from history.report_inputs import ReportRange, report_range
from history.report_params import DEFAULT_MOTION, MotionParams
from history.reports import DEFAULT_H3_RESOLUTION, ReportData, finish_trips, report_data
from history.settings import HistorySettings

logger = logging.getLogger(__name__)
router = APIRouter(prefix="/api/v1/reports", tags=["reports"])


def _offered_media(name: str) -> list[str]:
    return [MEDIA_TYPES[f] for f in OFFERED[name]]


def not_acceptable_body(name: str, accept: str | None) -> dict[str, Any]:
    """The 406's body: the Problem shape, plus the media types the report does offer."""
    offered = _offered_media(name)
    return {
        "detail": f"the {name} report gives none of the accepted types ({accept}); "
        f"it offers: {', '.join(offered)}",
        "offered": offered,
    }


ERRORS: dict[int | str, dict[str, Any]] = {
    401: UNAUTHORIZED,
    422: {**INVALID, "description": "Bad date range, vehicle id or parameter"},
}
# The 200s of these routes have several media types (or application/geo+json only); FastAPI would
# file the error models under those too, but errors are plain JSON, so they are spelled out.
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
NEGOTIATED_ERRORS: dict[int | str, dict[str, Any]] = {
    **GEOJSON_ERRORS,
    406: {
        "model": Problem,
        "description": "The report gives none of the media types in `Accept`: `offered` lists those it gives",
        "content": {
            "application/json": {
                "schema": {"$ref": "#/components/schemas/Problem"},
                "example": not_acceptable_body("heatmap", "application/gpx+xml"),
            }
        },
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
# A speeding episode's track (the example's 15 fixes, one a second, eastwards).
_TRACK = pd.DataFrame(
    {
        "vehicle_id": "truck-042",
        "start_ts_ms": 1_795_158_600_000,
        "ts_ms": [1_795_158_600_000 + 1000 * i for i in range(15)],
        "lon": [13.4 + 0.00025 * i for i in range(15)],
        "lat": 52.52,
        "speed_kmh": [51.0 + 0.8 * i for i in range(15)],
    }
)
_SPEEDING_ROWS = pd.DataFrame(SPEEDING_EXAMPLE["items"]).drop(columns=["start_ts", "end_ts"])
_MOTION_EXTRA = {
    "stop_speed_kmh": DEFAULT_MOTION.stop_speed_kmh,
    "min_stop_s": DEFAULT_MOTION.min_stop_s,
    "max_gap_s": DEFAULT_MOTION.max_gap_s,
}
# A stop at the depot, then the trip that leaves it (three fixes a minute apart, eastwards).
_STOPS = pd.DataFrame(
    [
        {
            "vehicle_id": "truck-042",
            "start_ts_ms": 1_795_154_400_000,
            "end_ts_ms": 1_795_156_200_000,
            "duration_s": 1800.0,
            "fixes": 180,
            "lon": 13.395,
            "lat": 52.515,
        }
    ]
)
_TRIP_TRACK = pd.DataFrame(
    {
        "vehicle_id": "truck-042",
        "start_ts_ms": 1_795_156_200_000,
        "ts_ms": [1_795_156_200_000 + 60_000 * i for i in range(3)],
        "lon": [13.395 + 0.01 * i for i in range(3)],
        "lat": 52.515,
        "speed_kmh": [30.0, 42.0, 38.0],
    }
)
_TRIPS = finish_trips(
    pd.DataFrame(
        [
            {
                "vehicle_id": "truck-042",
                "start_ts_ms": 1_795_156_200_000,
                "end_ts_ms": 1_795_156_320_000,
                "fixes": 3,
                "distance_m": 2 * float(haversine_m(13.395, 52.515, 13.405, 52.515)),
                "max_kmh": 42.0,
                "start_lon": 13.395,
                "start_lat": 52.515,
                "end_lon": 13.415,
                "end_lat": 52.515,
            }
        ]
    )
)
EXAMPLE_DATA = {
    "adherence": ReportData("adherence", pd.DataFrame(ADHERENCE_EXAMPLE["items"])),
    "zone_visits": ReportData("zone_visits", _VISITS),
    "speeding": ReportData("speeding", _SPEEDING_ROWS, tracks=_TRACK),
    "heatmap": ReportData("heatmap", _CELLS),
    "stops": ReportData("stops", _STOPS),
    "trips": ReportData("trips", _TRIPS, tracks=_TRIP_TRACK),
}
JSON_EXAMPLES = {
    "adherence": ADHERENCE_EXAMPLE,
    "zone_visits": VISITS_EXAMPLE,
    "speeding": SPEEDING_EXAMPLE,
    "heatmap": HEATMAP_EXAMPLE,
    "stops": _envelope_example("stops", records(_STOPS), **_MOTION_EXTRA),
    "trips": _envelope_example("trips", records(_TRIPS), **_MOTION_EXTRA),
}


def _ok(name: str) -> dict[int | str, dict[str, Any]]:
    """The 200 of a report: one entry per media type it offers, each with an example made by the
    same functions as the real responses (Parquet is binary: described, not shown)."""
    data = EXAMPLE_DATA[name]
    content: dict[str, Any] = {}
    for fmt in OFFERED[name]:
        media = MEDIA_TYPES[fmt]
        if fmt == "json":
            content[media] = {"example": JSON_EXAMPLES[name]}
        elif fmt == "geojson":
            content[media] = {"example": geojson(data)}
        elif fmt in BINARY:
            content[media] = {"schema": {"type": "string", "format": "binary"}}
        else:
            content[media] = {"schema": {"type": "string"}, "example": export(data, fmt).decode()}
    offered = ", ".join(f"`{MEDIA_TYPES[f]}` ({f})" for f in OFFERED[name])
    return {
        200: {
            "description": f"The report as `Accept` (or `format`) asks: {offered}. Files (CSV, Parquet, "
            "GPX, KML) come with `Content-Disposition: attachment`.",
            "content": content,
        }
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
Format = Annotated[
    Literal["json", "geojson", "csv", "geoparquet", "parquet", "gpx", "kml"] | None,
    Query(
        description="Instead of the `Accept` header: `json`, `geojson` (a FeatureCollection), `csv`,"
        " `geoparquet` (`parquet` for adherence), `gpx`, `kml`, among those the report offers (the media"
        " types of its 200)."
    ),
]
Resolution = Annotated[int, Query(ge=0, le=15, description="H3 resolution of the heat map cells.")]
StopSpeed = Annotated[float, Query(description="A fix is stationary at or below this speed, km/h (>= 0).")]
MinStop = Annotated[float, Query(description="A stop lasts at least this many seconds (> 0).")]
MaxGap = Annotated[
    float, Query(description="Two fixes further apart than this many seconds end a trip and a stop (> 0).")
]


def motion_params(
    stop_speed_kmh: StopSpeed = DEFAULT_MOTION.stop_speed_kmh,
    min_stop_s: MinStop = DEFAULT_MOTION.min_stop_s,
    max_gap_s: MaxGap = DEFAULT_MOTION.max_gap_s,
) -> MotionParams:
    """The stops/trips parameters, validated by MotionParams itself (a 422 whose message names the
    parameter)."""
    try:
        return MotionParams(stop_speed_kmh, min_stop_s, max_gap_s)
    except ReportError as exc:
        raise HTTPException(422, [{"loc": ["query"], "msg": str(exc), "type": "value_error"}]) from exc


Motion = Annotated[MotionParams, Depends(motion_params)]


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


def choose_format(name: str, accept: str | None, query: str | None) -> str | Response:
    """The format to answer in: the `format` parameter if given (a 422 if the report cannot give
    it), else the offered type `Accept` prefers; a 406 response when it accepts none of them."""
    offered = OFFERED[name]
    if query is not None:
        if query not in offered:
            msg = f"the {name} report cannot be given as {query}; it can be: {', '.join(offered)}"
            raise HTTPException(422, [{"loc": ["query", "format"], "msg": msg, "type": "value_error"}])
        return query
    by_media = {MEDIA_TYPES[f]: f for f in offered}
    media = negotiate(accept, list(by_media))
    if media is None:
        return OrjsonResponse(not_acceptable_body(name, accept), status_code=406, headers={"Vary": "Accept"})
    return by_media[media]


def _envelope(
    name: str, rng: ReportRange, df: pd.DataFrame, headers: dict[str, str], **extra: Any
) -> Response:
    return OrjsonResponse(
        {
            "report": name,
            "from": ms_to_iso(rng.from_ms),
            "to": ms_to_iso(rng.to_ms),
            "vehicle_id": rng.vehicle_id,
            **extra,
            "items": records(df),
        },
        headers=headers,
    )


def _respond(
    request: Request,
    name: str,
    rng: ReportRange,
    fmt: str | Response,
    resolution: int = DEFAULT_H3_RESOLUTION,
    motion: MotionParams = DEFAULT_MOTION,
) -> Response:
    """Run the report and answer in `fmt`: the JSON envelope, GeoJSON, or a file to download."""
    if isinstance(fmt, Response):
        return fmt  # the 406
    hs = _history(request)
    data = report_data(
        name,
        hs.archive_root,
        rng,
        hs.history_buckets,
        resolution=resolution,
        tracks=wants_tracks(name, fmt),
        motion=motion,
    )
    vary = {"Vary": "Accept"}
    if fmt == "json":
        extra: dict[str, Any] = {"resolution": resolution} if name == "heatmap" else {}
        if name in ("stops", "trips"):
            extra = {f: getattr(motion, f) for f in ("stop_speed_kmh", "min_stop_s", "max_gap_s")}
        return _envelope(name, rng, data.rows, vary, **extra)
    if fmt == "geojson":
        return GeoJsonResponse(geojson(data), headers=vary)
    media = MEDIA_TYPES[fmt] + ("; charset=utf-8; header=present" if fmt == "csv" else "")
    disposition = f'attachment; filename="{filename(name, rng.from_ms, rng.to_ms, fmt)}"'
    return Response(export(data, fmt), media_type=media, headers={**vary, "Content-Disposition": disposition})


def _accept(request: Request) -> str | None:
    return request.headers.get("accept")


@router.get("/adherence", responses={**NEGOTIATED_ERRORS, **_ok("adherence")})
def adherence(
    request: Request, _: Viewer, start: From, end: To, vehicle_id: VehicleQ = None, format: Format = None
) -> Response:
    """Route adherence per vehicle and UTC day: share of fixes inside the corridor, time and
    distance off-route. No geometry: JSON, CSV or plain Parquet."""
    fmt = choose_format("adherence", _accept(request), format)
    return _respond(request, "adherence", _range(start, end, vehicle_id), fmt)


@router.get("/zone-visits", responses={**NEGOTIATED_ERRORS, **_ok("zone_visits")})
def zone_visits(
    request: Request, _: Viewer, start: From, end: To, vehicle_id: VehicleQ = None, format: Format = None
) -> Response:
    """Zone visits (runs of consecutive fixes inside a zone) with entry, exit and dwell time; with a
    geometry, the entry fix (GPX waypoints, KML Point placemarks with the visit's time span)."""
    fmt = choose_format("zone_visits", _accept(request), format)
    return _respond(request, "zone_visits", _range(start, end, vehicle_id), fmt)


@router.get(
    "/zone-visits.geojson",
    response_class=GeoJsonResponse,
    responses={
        **GEOJSON_ERRORS,
        200: {"content": {"application/geo+json": {"example": VISITS_GEOJSON_EXAMPLE}}},
    },
)
def zone_visits_geojson(
    request: Request, _: Viewer, start: From, end: To, vehicle_id: VehicleQ = None
) -> Response:
    """Zone visits as GeoJSON Points at the first fix inside."""
    return _respond(request, "zone_visits", _range(start, end, vehicle_id), "geojson")


@router.get("/speeding", responses={**NEGOTIATED_ERRORS, **_ok("speeding")})
def speeding(
    request: Request, _: Viewer, start: From, end: To, vehicle_id: VehicleQ = None, format: Format = None
) -> Response:
    """Speeding episodes: runs of fixes above the assigned route's speed limit; with a geometry
    (GeoJSON, CSV, GeoParquet, GPX, KML), each episode's track along its fixes."""
    fmt = choose_format("speeding", _accept(request), format)
    return _respond(request, "speeding", _range(start, end, vehicle_id), fmt)


@router.get("/heatmap", responses={**NEGOTIATED_ERRORS, **_ok("heatmap")})
def heatmap(
    request: Request,
    _: Viewer,
    start: From,
    end: To,
    vehicle_id: VehicleQ = None,
    resolution: Resolution = DEFAULT_H3_RESOLUTION,
    format: Format = None,
) -> Response:
    """Off-route fixes counted per H3 cell (the cell polygons in GeoJSON, CSV and GeoParquet)."""
    fmt = choose_format("heatmap", _accept(request), format)
    return _respond(request, "heatmap", _range(start, end, vehicle_id), fmt, resolution)


@router.get(
    "/heatmap.geojson",
    response_class=GeoJsonResponse,
    responses={
        **GEOJSON_ERRORS,
        200: {"content": {"application/geo+json": {"example": HEATMAP_GEOJSON_EXAMPLE}}},
    },
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
    return _respond(request, "heatmap", _range(start, end, vehicle_id), "geojson", resolution)


@router.get("/stops", responses={**NEGOTIATED_ERRORS, **_ok("stops")})
def stops(
    request: Request,
    _: Viewer,
    start: From,
    end: To,
    motion: Motion,
    vehicle_id: VehicleQ = None,
    format: Format = None,
) -> Response:
    """Stops: runs of consecutive stationary fixes (`speed_kmh <= stop_speed_kmh`) lasting at least
    `min_stop_s`, from the first fix to the first one after; with a geometry, the first fix (GPX
    waypoints, KML Point placemarks with the stop's time span)."""
    fmt = choose_format("stops", _accept(request), format)
    return _respond(request, "stops", _range(start, end, vehicle_id), fmt, motion=motion)


@router.get("/trips", responses={**NEGOTIATED_ERRORS, **_ok("trips")})
def trips(
    request: Request,
    _: Viewer,
    start: From,
    end: To,
    motion: Motion,
    vehicle_id: VehicleQ = None,
    format: Format = None,
) -> Response:
    """Trips: runs of consecutive fixes in no stop (at least 2; a gap over `max_gap_s` ends one) with
    distance, duration, max and average speed; with a geometry (GeoJSON, CSV, GeoParquet, GPX, KML),
    each trip's track along its fixes."""
    fmt = choose_format("trips", _accept(request), format)
    return _respond(request, "trips", _range(start, end, vehicle_id), fmt, motion=motion)
