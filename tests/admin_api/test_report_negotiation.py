"""Content negotiation of the report routes, without services: the `Accept` parsing, the choice
(and the 406) the routes make before any report runs, and the media types the OpenAPI document
lists. The negotiated responses themselves, over a real archive and a real key, are in
tests/history/test_history_reports.py."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from fastapi import HTTPException, Response

from admin_api.negotiation import negotiate
from admin_api.routers.reports import choose_format, not_acceptable_body
from history.report_formats import MEDIA_TYPES, OFFERED

JSON, GEOJSON, CSV = "application/json", "application/geo+json", "text/csv"
PARQUET, GPX, KML = (
    "application/vnd.apache.parquet",
    "application/gpx+xml",
    "application/vnd.google-earth.kml+xml",
)
ALL = [JSON, GEOJSON, CSV, PARQUET, GPX, KML]


@pytest.mark.parametrize(
    ("accept", "chosen"),
    [
        (None, JSON),  # no header: anything, the route's first
        ("", JSON),
        ("*/*", JSON),
        ("application/*", JSON),
        ("text/*", CSV),
        (GPX, GPX),
        ("APPLICATION/GPX+XML", GPX),  # media types are case-insensitive
        ("text/csv; charset=utf-8", CSV),  # parameters other than q are not compared
        (f"{CSV};q=0.5, {KML}", KML),
        (f"{CSV};q=0.5, {KML};q=0.4", CSV),
        (f"{CSV}, {KML}", CSV),  # a tie: the route's order
        ("text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8", JSON),  # a browser
        (f"*/*;q=0.1, {PARQUET}", PARQUET),
        (f"{JSON};q=0, */*", GEOJSON),  # the most specific range decides: JSON refused
        (f"application/*;q=0, {CSV}", CSV),
        ("image/png", None),
        (f"{GPX};q=0", None),
        (f"{GPX};q=nonsense", None),
        ("nonsense", None),
    ],
)
def test_negotiate(accept: str | None, chosen: str | None) -> None:
    assert negotiate(accept, ALL) == chosen


def test_negotiate_among_what_a_report_offers() -> None:
    heatmap = [MEDIA_TYPES[f] for f in OFFERED["heatmap"]]
    assert negotiate(GPX, heatmap) is None
    assert negotiate(f"{GPX}, {GEOJSON};q=0.2", heatmap) == GEOJSON
    assert negotiate(PARQUET, [MEDIA_TYPES[f] for f in OFFERED["adherence"]]) == PARQUET


def _body(resp: Response) -> Any:
    return orjson.loads(bytes(resp.body))


def test_a_report_that_gives_none_of_the_accepted_types_is_a_406_listing_those_it_gives() -> None:
    resp = choose_format("heatmap", f"{GPX}, {KML}", None)
    assert isinstance(resp, Response)
    assert resp.status_code == 406
    assert resp.headers["vary"] == "Accept"
    body = _body(resp)
    assert body["offered"] == [JSON, GEOJSON, CSV, PARQUET]
    assert "the heatmap report gives none of the accepted types" in body["detail"]
    assert body == not_acceptable_body("heatmap", f"{GPX}, {KML}")  # as the OpenAPI example shows it
    assert isinstance(choose_format("adherence", GPX, None), Response)
    assert choose_format("speeding", GPX, None) == "gpx"
    assert choose_format("zone_visits", KML, None) == "kml"
    assert choose_format("adherence", PARQUET, None) == "parquet"
    assert choose_format("heatmap", PARQUET, None) == "geoparquet"
    assert choose_format("stops", GPX, None) == "gpx"
    assert choose_format("trips", f"{KML}, {GPX};q=0.9", None) == "kml"
    assert choose_format("trips", PARQUET, None) == "geoparquet"


def test_the_format_parameter_wins_and_is_checked() -> None:
    assert choose_format("speeding", JSON, "kml") == "kml"
    with pytest.raises(HTTPException) as exc:
        choose_format("heatmap", None, "gpx")
    assert exc.value.status_code == 422
    assert "it can be: json, geojson, csv, geoparquet" in str(exc.value.detail)


def test_openapi_lists_each_reports_media_types() -> None:
    from admin_api.app import create_app
    from admin_api.settings import ApiSettings
    from fleetfence.settings import Settings

    spec = create_app(ApiSettings.from_base(Settings(), api_run_relay=False)).openapi()
    for path, name in (
        ("/api/v1/reports/adherence", "adherence"),
        ("/api/v1/reports/zone-visits", "zone_visits"),
        ("/api/v1/reports/speeding", "speeding"),
        ("/api/v1/reports/heatmap", "heatmap"),
        ("/api/v1/reports/stops", "stops"),
        ("/api/v1/reports/trips", "trips"),
    ):
        responses = spec["paths"][path]["get"]["responses"]
        content = responses["200"]["content"]
        assert list(content) == [MEDIA_TYPES[f] for f in OFFERED[name]], path
        for media, entry in content.items():
            if media == PARQUET:
                assert entry["schema"] == {"type": "string", "format": "binary"}
            else:
                assert entry.get("example"), (path, media)  # made by the exporters themselves
        assert list(responses["406"]["content"]) == [JSON]
        assert responses["406"]["content"][JSON]["example"]["offered"]
        params = {p["name"]: p for p in spec["paths"][path]["get"]["parameters"]}
        assert "gpx" in str(params["format"]["schema"])
    speeding = spec["paths"]["/api/v1/reports/speeding"]["get"]["responses"]["200"]["content"]
    assert speeding[GPX]["example"].startswith("<?xml")
    assert "<trkseg>" in speeding[GPX]["example"]
    assert "<LineString>" in speeding[KML]["example"]
    trips = spec["paths"]["/api/v1/reports/trips"]["get"]
    assert "<type>trip</type>" in trips["responses"]["200"]["content"][GPX]["example"]
    stops = spec["paths"]["/api/v1/reports/stops"]["get"]
    assert "<type>stop</type>" in stops["responses"]["200"]["content"][GPX]["example"]
    for op in (trips, stops):  # the parameters with their defaults, written once (MotionParams)
        defaults = {p["name"]: p["schema"].get("default") for p in op["parameters"]}
        assert (defaults["stop_speed_kmh"], defaults["min_stop_s"], defaults["max_gap_s"]) == (
            5.0,
            300.0,
            600.0,
        )
