"""Report output formats, for the API and the CLI alike: JSON-ready rows, GeoJSON, CSV, (Geo)Parquet,
GPX 1.1 and KML 2.2.

Which report gives which format (`OFFERED`) follows from the geometry its rows hold:

- `adherence`: none (one row per vehicle and UTC day): JSON, CSV and plain Parquet (GeoParquet
  needs a geometry column);
- `zone_visits`: a point, the first fix inside the zone, and a time span (entry to exit, or to the
  last fix inside when the data ends inside). A visit is a stop at a zone: a GPX `<wpt>`, a KML Point
  Placemark with a TimeSpan;
- `speeding`: a track, the fixes of the episode (`ReportData.tracks`, read from the same SedonaDB
  session): a GPX `<trk>`, a KML LineString Placemark with a TimeSpan (a Point for a one-fix
  episode, or one whose fixes share one position), a LineString elsewhere;
- `heatmap`: an H3 cell polygon: GeoJSON, CSV (WKT), GeoParquet; no GPX or KML;
- `stops`: a point, the stop's first fix, and its time span: like a zone visit, a GPX `<wpt>` and a
  KML Point Placemark with a TimeSpan;
- `trips`: a track, the trip's fixes (`ReportData.tracks`, like speeding): a GPX `<trk>`, a KML
  LineString Placemark with a TimeSpan, a LineString elsewhere.

Coordinates are lon/lat on WGS 84 (OGC:CRS84, axis order lon, lat) everywhere. Every `*_ts_ms`
column gets an ISO-8601 UTC twin `*_ts` (JSON and CSV: text; Parquet: a UTC timestamp).
"""

from __future__ import annotations

import csv
import io
import json
import xml.etree.ElementTree as ET
from collections.abc import Callable, Iterator
from typing import Any

import h3
import numpy as np
import orjson
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import shapely

from fleetfence.contracts import ms_to_iso
from history.errors import ReportError
from history.reports import SCHEMAS, TRACK_SCHEMA, ReportData

# What each format is, as a media type (the API's Accept header) and a file suffix.
MEDIA_TYPES = {
    "json": "application/json",
    "geojson": "application/geo+json",
    "csv": "text/csv",
    "geoparquet": "application/vnd.apache.parquet",
    "parquet": "application/vnd.apache.parquet",
    "gpx": "application/gpx+xml",
    "kml": "application/vnd.google-earth.kml+xml",
}
SUFFIXES = {
    "json": "json",
    "geojson": "geojson",
    "csv": "csv",
    "geoparquet": "parquet",
    "parquet": "parquet",
    "gpx": "gpx",
    "kml": "kml",
}
BINARY = frozenset({"geoparquet", "parquet"})
# The formats each report can give, in order of preference (the first is the API's default).
OFFERED: dict[str, tuple[str, ...]] = {
    "adherence": ("json", "csv", "parquet"),
    "zone_visits": ("json", "geojson", "csv", "geoparquet", "gpx", "kml"),
    "speeding": ("json", "geojson", "csv", "geoparquet", "gpx", "kml"),
    "heatmap": ("json", "geojson", "csv", "geoparquet"),
    "stops": ("json", "geojson", "csv", "geoparquet", "gpx", "kml"),
    "trips": ("json", "geojson", "csv", "geoparquet", "gpx", "kml"),
}
# The formats that draw the speeding episodes' or trips' tracks (everything with a geometry).
NEEDS_TRACKS = frozenset({"geojson", "csv", "geoparquet", "gpx", "kml"})
# The reports whose rows are tracks: each row's fixes in `ReportData.tracks`, keyed by
# (vehicle_id, start_ts_ms).
TRACKED = frozenset({"speeding", "trips"})

GPX_NS = "http://www.topografix.com/GPX/1/1"
KML_NS = "http://www.opengis.net/kml/2.2"
CREATOR = "FleetFence"


def check_format(name: str, fmt: str) -> None:
    """Raise a ReportError naming what the report can give when it cannot give `fmt`."""
    offered = OFFERED.get(name)
    if offered is None:
        raise ReportError(f"unknown report {name!r}; one of {', '.join(OFFERED)}")
    if fmt not in offered:
        raise ReportError(f"the {name} report cannot be given as {fmt}; it can be: {', '.join(offered)}")


def wants_tracks(name: str, fmt: str) -> bool:
    return name in TRACKED and fmt in NEEDS_TRACKS


def filename(name: str, from_ms: int, to_ms: int, fmt: str) -> str:
    """`<report>_<from>_<to>.<suffix>`, the instants as compact UTC times (safe in any file system)."""

    def stamp(ms: int) -> str:
        return ms_to_iso(ms).replace("-", "").replace(":", "").replace(".000", "")

    return f"{name}_{stamp(from_ms)}_{stamp(to_ms)}.{SUFFIXES[fmt]}"


# --------------------------------------------------------------------------- rows


def table(data: ReportData) -> pa.Table:
    """The rows as the report's arrow schema: fails (ArrowInvalid/KeyError) if the columns drifted."""
    return pa.Table.from_pandas(data.rows, schema=SCHEMAS[data.name], preserve_index=False)


def records(df: pd.DataFrame) -> list[dict[str, Any]]:
    """JSON-ready rows: NaN/NA -> None, numpy scalars -> Python, `*_ts_ms` get an ISO twin `*_ts`."""
    rows: list[dict[str, Any]] = []
    ts_cols = [c for c in df.columns if c.endswith("_ts_ms")]
    for row in df.astype(object).where(df.notna(), None).to_dict(orient="records"):
        clean = {str(k): (v.item() if isinstance(v, np.generic) else v) for k, v in row.items()}
        for c in ts_cols:
            v = clean[c]
            clean[c[: -len("_ms")]] = None if v is None else ms_to_iso(int(v))
        rows.append(clean)
    return rows


def _iso(v: Any) -> str:
    return ms_to_iso(int(v))


def _tracks_by_episode(data: ReportData) -> dict[tuple[str, int], pd.DataFrame]:
    if data.tracks is None:
        raise ReportError(f"the {data.name} export needs the tracks (report_data(..., tracks=True))")
    tracks = pa.Table.from_pandas(data.tracks, schema=TRACK_SCHEMA, preserve_index=False).to_pandas()
    return {(str(k[0]), int(k[1])): g for k, g in tracks.groupby(["vehicle_id", "start_ts_ms"], sort=False)}


def _episodes(data: ReportData) -> Iterator[tuple[dict[str, Any], pd.DataFrame]]:
    """Each speeding episode's (or trip's) JSON-ready row with its fixes, in the rows' order."""
    by_episode = _tracks_by_episode(data)
    for row in records(data.rows):
        g = by_episode.get((row["vehicle_id"], row["start_ts_ms"]))
        if g is None:
            vid, at = row["vehicle_id"], row["start_ts"]
            raise ReportError(f"no track for the {data.name} row of {vid} at {at}")
        yield row, g


def _lonlat(g: pd.DataFrame) -> list[tuple[float, float]]:
    return list(zip(g["lon"].astype(float), g["lat"].astype(float), strict=True))


def _is_line(points: list[tuple[float, float]]) -> bool:
    """A track is a LineString when its fixes hold two positions at least; otherwise (one fix, or a
    vehicle that reported one position throughout) a Point: a LineString of one repeated position
    is invalid, and readers collapse it (pygeoif, behind fastkml, to a one-point line)."""
    return len(set(points)) > 1


def _cell_ring(cell: str) -> list[tuple[float, float]]:
    ring = [(lng, lat) for lat, lng in h3.cell_to_boundary(cell)]
    return [*ring, ring[0]]


def geometries(data: ReportData) -> np.ndarray | None:
    """One shapely geometry per row (lon/lat), or None for a report without geometry."""
    df = data.rows
    if data.name == "zone_visits":
        return np.asarray(shapely.points(df["entry_lon"].to_numpy(float), df["entry_lat"].to_numpy(float)))
    if data.name == "stops":
        return np.asarray(shapely.points(df["lon"].to_numpy(float), df["lat"].to_numpy(float)))
    if data.name == "heatmap":
        return np.asarray([shapely.Polygon(_cell_ring(c)) for c in df["h3_cell"]], dtype=object)
    if data.name in TRACKED:
        return np.asarray(
            [
                shapely.LineString(c) if _is_line(c) else shapely.Point(c[0])
                for c in (_lonlat(g) for _, g in _episodes(data))
            ],
            dtype=object,
        )
    return None


# --------------------------------------------------------------------------- GeoJSON


def _feature_collection(data: ReportData, **extra: Any) -> dict[str, Any]:
    geoms = geometries(data)
    if geoms is None:
        raise ReportError(f"the {data.name} report has no geometry")
    features = []
    for row, geom in zip(records(data.rows), geoms, strict=True):
        feature: dict[str, Any] = {"type": "Feature"}
        if data.name == "heatmap":
            feature["id"] = row["h3_cell"]
        feature["geometry"] = shapely.geometry.mapping(geom)
        feature["properties"] = {**row, **extra}
        features.append(feature)
    return {"type": "FeatureCollection", "features": features}


def heatmap_geojson(df: pd.DataFrame, resolution: int) -> dict[str, Any]:
    """One Polygon feature per H3 cell, the count in the properties."""
    return _feature_collection(ReportData("heatmap", df, resolution), resolution=resolution)


def visits_geojson(df: pd.DataFrame) -> dict[str, Any]:
    """One Point feature per visit, at the first fix inside the zone."""
    return _feature_collection(ReportData("zone_visits", df))


def geojson(data: ReportData) -> dict[str, Any]:
    """RFC 7946 FeatureCollection; speeding episodes and trips are LineStrings along their fixes."""
    if data.name == "heatmap":
        return heatmap_geojson(data.rows, data.resolution)
    return _feature_collection(data)


# --------------------------------------------------------------------------- CSV


def to_csv(data: ReportData) -> bytes:
    """UTF-8 CSV with a header: the report's columns, an ISO UTC `*_ts` after each `*_ts_ms`, and a
    `geometry_wkt` (lon/lat) last for the reports with a geometry. Nulls are empty fields."""
    rows = table(data).to_pandas()
    out = pd.DataFrame(index=rows.index)
    for c in rows.columns:
        out[c] = rows[c]
        if c.endswith("_ts_ms"):
            out[c[: -len("_ms")]] = [None if pd.isna(v) else _iso(v) for v in rows[c]]
    geoms = geometries(data)
    if geoms is not None:
        out["geometry_wkt"] = shapely.to_wkt(geoms, rounding_precision=-1) if len(geoms) else []
    buf = io.StringIO()
    out.to_csv(buf, index=False, lineterminator="\n", quoting=csv.QUOTE_MINIMAL)
    return buf.getvalue().encode("utf-8")


# --------------------------------------------------------------------------- (Geo)Parquet


def _geo_metadata(geoms: np.ndarray) -> dict[str, Any]:
    """GeoParquet 1.1 `geo` metadata; `crs` omitted, which the spec defines as OGC:CRS84 (lon/lat)."""
    col: dict[str, Any] = {"encoding": "WKB", "geometry_types": sorted({g.geom_type for g in geoms})}
    if len(geoms):
        xmin, ymin, xmax, ymax = shapely.total_bounds(geoms).tolist()
        col["bbox"] = [xmin, ymin, xmax, ymax]
    return {"version": "1.1.0", "primary_column": "geometry", "columns": {"geometry": col}}


def to_parquet(data: ReportData) -> bytes:
    """Parquet of the report's rows (its arrow schema) with a UTC timestamp `*_ts` after each
    `*_ts_ms`; for a report with a geometry, a WKB `geometry` column and the GeoParquet `geo` key."""
    base = table(data)
    cols: list[tuple[str, pa.Array | pa.ChunkedArray]] = []
    for name in base.column_names:
        cols.append((name, base.column(name)))
        if name.endswith("_ts_ms"):
            cols.append((name[: -len("_ms")], base.column(name).cast(pa.timestamp("ms", tz="UTC"))))
    geoms = geometries(data)
    meta: dict[bytes, bytes] = {}
    if geoms is not None:
        wkb = shapely.to_wkb(geoms, output_dimension=2, byte_order=1) if len(geoms) else []
        cols.append(("geometry", pa.array(list(wkb), type=pa.binary())))
        meta[b"geo"] = json.dumps(_geo_metadata(geoms)).encode()
    out = pa.table(dict(cols)).replace_schema_metadata(meta or None)
    buf = io.BytesIO()
    pq.write_table(out, buf, compression="zstd")
    return buf.getvalue()


# --------------------------------------------------------------------------- GPX 1.1 and KML 2.2


def _sub(parent: ET.Element, tag: str, text: str | None = None, **attrs: str) -> ET.Element:
    el = ET.SubElement(parent, tag, attrs)
    if text is not None:
        el.text = text
    return el


def _xml(root: ET.Element) -> bytes:
    ET.indent(root)
    body: bytes = ET.tostring(root, encoding="utf-8", xml_declaration=True)
    return body + b"\n"


def _num(v: float) -> str:
    """The shortest text that reads back as the same float, never in exponent notation (GPX's
    coordinates are xsd:decimal, which has none: repr(1e-05) would be invalid)."""
    return np.format_float_positional(float(v), unique=True, trim="-")


def _visit_end_ms(row: dict[str, Any]) -> int:
    return int(row["exit_ts_ms"] if row["exit_ts_ms"] is not None else row["last_inside_ts_ms"])


def _visit_desc(row: dict[str, Any]) -> str:
    exit_ = "data ends inside" if row["exit_ts"] is None else f"exit {row['exit_ts']}"
    return (
        f"{row['vehicle_id']} in zone {row['zone_id']}: entry {row['entry_ts']}, {exit_}, "
        f"dwell {row['dwell_s']:g} s, {row['fixes']} fixes"
    )


def _speeding_desc(row: dict[str, Any]) -> str:
    return (
        f"{row['vehicle_id']} on route {row['route_id']} above {row['speed_limit_kmh']:g} km/h: "
        f"{row['start_ts']} to {row['end_ts']}, {row['duration_s']:g} s, {row['fixes']} fixes, "
        f"max {row['max_kmh']:g} km/h"
    )


def _stop_desc(row: dict[str, Any]) -> str:
    return (
        f"{row['vehicle_id']} stopped: {row['start_ts']} to {row['end_ts']}, {row['duration_s']:g} s, "
        f"{row['fixes']} fixes"
    )


def _trip_desc(row: dict[str, Any]) -> str:
    avg = "-" if row["avg_kmh"] is None else f"{row['avg_kmh']:.1f}"
    return (
        f"{row['vehicle_id']} trip: {row['start_ts']} to {row['end_ts']}, {row['duration_s']:g} s, "
        f"{row['distance_m']:.0f} m, {row['fixes']} fixes, max {row['max_kmh']:g} km/h, avg {avg} km/h"
    )


# Per tracked report: what a track is (its GPX `<type>`, and in its name "<vehicle> <kind> <start>")
# and its description.
_TRACK_KIND: dict[str, tuple[str, Callable[[dict[str, Any]], str]]] = {
    "speeding": ("speeding", _speeding_desc),
    "trips": ("trip", _trip_desc),
}


def to_gpx(data: ReportData) -> bytes:
    """GPX 1.1: a zone visit is a `<wpt>` at the entry fix (time = entry), a stop one at its first
    fix (time = start); a speeding episode or a trip is a `<trk>` with one `<trkseg>` of its fixes
    (GPX 1.1 has no speed element: the figures are in `<desc>`)."""
    ET.register_namespace("", GPX_NS)
    q = f"{{{GPX_NS}}}"
    root = ET.Element(f"{q}gpx", {"version": "1.1", "creator": CREATOR})
    meta = _sub(root, f"{q}metadata")
    _sub(meta, f"{q}name", f"FleetFence {data.name} report")
    if data.name == "zone_visits":
        for row in records(data.rows):
            wpt = _sub(root, f"{q}wpt", lat=_num(row["entry_lat"]), lon=_num(row["entry_lon"]))
            _sub(wpt, f"{q}time", row["entry_ts"])
            _sub(wpt, f"{q}name", f"{row['vehicle_id']} @ {row['zone_id']}")
            _sub(wpt, f"{q}desc", _visit_desc(row))
            _sub(wpt, f"{q}type", "zone_visit")
    elif data.name == "stops":
        for row in records(data.rows):
            wpt = _sub(root, f"{q}wpt", lat=_num(row["lat"]), lon=_num(row["lon"]))
            _sub(wpt, f"{q}time", row["start_ts"])
            _sub(wpt, f"{q}name", f"{row['vehicle_id']} stop {row['start_ts']}")
            _sub(wpt, f"{q}desc", _stop_desc(row))
            _sub(wpt, f"{q}type", "stop")
    elif data.name in TRACKED:
        kind, desc_of = _TRACK_KIND[data.name]
        for row, g in _episodes(data):
            trk = _sub(root, f"{q}trk")
            _sub(trk, f"{q}name", f"{row['vehicle_id']} {kind} {row['start_ts']}")
            _sub(trk, f"{q}desc", desc_of(row))
            _sub(trk, f"{q}type", kind)
            seg = _sub(trk, f"{q}trkseg")
            for ts, lon, lat in zip(g["ts_ms"], g["lon"], g["lat"], strict=True):
                pt = _sub(seg, f"{q}trkpt", lat=_num(lat), lon=_num(lon))
                _sub(pt, f"{q}time", _iso(ts))
    else:
        check_format(data.name, "gpx")
    return _xml(root)


def _extended_data(pm: ET.Element, q: str, row: dict[str, Any]) -> None:
    """Every column of the row as a `<Data>`; a null one is left out (an empty `<value/>` reads as
    no value at all in KML readers)."""
    ext = _sub(pm, f"{q}ExtendedData")
    for k, v in row.items():
        if v is not None:
            d = _sub(ext, f"{q}Data", name=k)
            _sub(d, f"{q}value", str(v))


def _kml_coords(points: list[tuple[float, float]]) -> str:
    return " ".join(f"{_num(lon)},{_num(lat)}" for lon, lat in points)


def to_kml(data: ReportData) -> bytes:
    """KML 2.2: a zone visit is a Point Placemark at the entry fix, a stop one at its first fix; a
    speeding episode or a trip a LineString Placemark along its fixes (a Point when they hold one
    position); each with a TimeSpan and every column of its row in ExtendedData."""
    ET.register_namespace("", KML_NS)
    q = f"{{{KML_NS}}}"
    root = ET.Element(f"{q}kml")
    doc = _sub(root, f"{q}Document")
    _sub(doc, f"{q}name", f"FleetFence {data.name} report")
    if data.name == "zone_visits":
        for row in records(data.rows):
            pm = _sub(doc, f"{q}Placemark")
            _sub(pm, f"{q}name", f"{row['vehicle_id']} @ {row['zone_id']}")
            _sub(pm, f"{q}description", _visit_desc(row))
            span = _sub(pm, f"{q}TimeSpan")
            _sub(span, f"{q}begin", row["entry_ts"])
            _sub(span, f"{q}end", _iso(_visit_end_ms(row)))
            _extended_data(pm, q, row)
            pt = _sub(pm, f"{q}Point")
            _sub(pt, f"{q}coordinates", _kml_coords([(row["entry_lon"], row["entry_lat"])]))
    elif data.name == "stops":
        for row in records(data.rows):
            pm = _sub(doc, f"{q}Placemark")
            _sub(pm, f"{q}name", f"{row['vehicle_id']} stop {row['start_ts']}")
            _sub(pm, f"{q}description", _stop_desc(row))
            span = _sub(pm, f"{q}TimeSpan")
            _sub(span, f"{q}begin", row["start_ts"])
            _sub(span, f"{q}end", row["end_ts"])
            _extended_data(pm, q, row)
            pt = _sub(pm, f"{q}Point")
            _sub(pt, f"{q}coordinates", _kml_coords([(row["lon"], row["lat"])]))
    elif data.name in TRACKED:
        kind, desc_of = _TRACK_KIND[data.name]
        for row, g in _episodes(data):
            pm = _sub(doc, f"{q}Placemark")
            _sub(pm, f"{q}name", f"{row['vehicle_id']} {kind} {row['start_ts']}")
            _sub(pm, f"{q}description", desc_of(row))
            span = _sub(pm, f"{q}TimeSpan")
            _sub(span, f"{q}begin", row["start_ts"])
            _sub(span, f"{q}end", row["end_ts"])
            _extended_data(pm, q, row)
            coords = _lonlat(g)
            line = _is_line(coords)
            geom = _sub(pm, f"{q}LineString" if line else f"{q}Point")
            if line:
                _sub(geom, f"{q}tessellate", "1")
            _sub(geom, f"{q}coordinates", _kml_coords(coords if line else coords[:1]))
    else:
        check_format(data.name, "kml")
    return _xml(root)


# --------------------------------------------------------------------------- one entry point


def export(data: ReportData, fmt: str) -> bytes:
    """The report in `fmt` (one of its OFFERED formats, else a ReportError listing them)."""
    check_format(data.name, fmt)
    if fmt == "json":
        return orjson.dumps(records(data.rows))
    if fmt == "geojson":
        return orjson.dumps(geojson(data))
    if fmt == "csv":
        return to_csv(data)
    if fmt in BINARY:
        return to_parquet(data)
    if fmt == "gpx":
        return to_gpx(data)
    return to_kml(data)
