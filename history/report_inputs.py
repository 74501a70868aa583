"""What a report reads: its time range (`ReportRange`, validated by `report_range`) and its inputs
from the archive, the telemetry files of the range (pruned by date and bucket path) and the master
data as it was over time (`master_tables`: each version with the interval it was valid).

Both report engines (SedonaDB in `history.reports`, the pandas baseline in
`history.reports_baseline`) read through these, so they cannot disagree about which data a report
covers.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.parquet as pq
import shapely
from shapely.geometry import shape

from fleetfence.contracts import VEHICLE_ID_RE
from fleetfence.geo import EARTH_RADIUS_M, LocalProjection, circle_polygon_m
from history.errors import ReportError
from history.schema import MASTER, MASTER_SCHEMA, TELEMETRY, bucket_of
from processor.core.master import takes_effect_ms

DAY_MS = 86_400_000
MAX_RANGE_DAYS = 366
NEVER_MS = 2**62  # "no end": far beyond any epoch-ms timestamp, still safe in int64 arithmetic


@dataclass(frozen=True)
class ReportRange:
    """Half-open UTC interval [from_ms, to_ms) of fix times, with an optional vehicle filter."""

    from_ms: int
    to_ms: int
    vehicle_id: str | None = None

    def days(self) -> list[str]:
        first = self.from_ms // DAY_MS
        last = (self.to_ms - 1) // DAY_MS
        return [(date(1970, 1, 1) + timedelta(days=d)).isoformat() for d in range(int(first), int(last) + 1)]


def _parse_instant(value: str | date | datetime, *, end: bool) -> int:
    """A date means the whole UTC day (its start, or for `end` the start of the next day)."""
    if isinstance(value, datetime):
        dt = value
    elif isinstance(value, date):
        dt = datetime(value.year, value.month, value.day, tzinfo=UTC) + (
            timedelta(days=1) if end else timedelta()
        )
    else:
        text = value.strip()
        try:
            if re.fullmatch(r"\d{4}-\d{2}-\d{2}", text):
                return _parse_instant(date.fromisoformat(text), end=end)
            dt = datetime.fromisoformat(text.replace("Z", "+00:00") if text.endswith("Z") else text)
        except ValueError as exc:
            raise ReportError(f"{value!r} is neither a date (YYYY-MM-DD) nor an ISO-8601 time") from exc
    if dt.tzinfo is None:
        raise ReportError(f"time {value!r} must carry a UTC offset (e.g. Z)")
    return int(dt.astimezone(UTC).timestamp() * 1000)


def report_range(
    start: str | date | datetime, end: str | date | datetime, vehicle_id: str | None = None
) -> ReportRange:
    """Validate a requested range: dates are whole UTC days, `end` is inclusive for dates."""
    from_ms = _parse_instant(start, end=False)
    to_ms = _parse_instant(end, end=True)
    if to_ms <= from_ms:
        raise ReportError(f"empty range: {start} .. {end} (the end must be after the start)")
    if to_ms - from_ms > MAX_RANGE_DAYS * DAY_MS:
        raise ReportError(f"range longer than {MAX_RANGE_DAYS} days")
    if vehicle_id is not None and not VEHICLE_ID_RE.match(vehicle_id):
        raise ReportError(f"vehicle id {vehicle_id!r} is not allowed")
    return ReportRange(from_ms, to_ms, vehicle_id)


def telemetry_files(root: str | Path, rng: ReportRange, buckets: int) -> list[str]:
    """Parquet files of the days in range (and of the vehicle's bucket): partition pruning by path."""
    base = Path(root) / TELEMETRY
    files: list[str] = []
    only = None if rng.vehicle_id is None else f"bucket={bucket_of(rng.vehicle_id, buckets):02d}"
    for day in rng.days():
        day_dir = base / f"date={day}"
        if not day_dir.is_dir():
            continue
        for bdir in sorted(day_dir.iterdir()):
            if bdir.is_dir() and (only is None or bdir.name == only):
                files.extend(str(p) for p in sorted(bdir.glob("*.parquet")))
    return files


def circle_zone_columns(geometry: dict[str, Any]) -> dict[str, Any]:
    """A zone's columns in the zones table. A polygon: its WKB, the circle columns null. A circle:
    a polygon containing its disc (chords tangent to a circle 1 m larger, in its frame) as the
    spatial pre-filter, and what the exact test needs: the centre, the metres per degree of its
    local projection (the same expressions as `fleetfence.geo.circle_distance_m`) and the radius."""
    if geometry.get("type") != "Point":
        none = {"cx": None, "cy": None, "kx": None, "ky": None, "radius_m": None}
        return {"poly_wkb": shapely.to_wkb(shape(geometry)), **none}
    cx, cy = (float(v) for v in geometry["coordinates"][:2])
    radius = float(geometry["radius_m"])
    ring = circle_polygon_m(radius + 1.0, outside=True)
    lon, lat = LocalProjection(cx, cy).inverse(ring[:, 0], ring[:, 1])
    return {
        "poly_wkb": shapely.to_wkb(shapely.polygons(np.column_stack((lon, lat)))),
        "cx": cx,
        "cy": cy,
        "kx": float(np.radians(1.0) * EARTH_RADIUS_M * np.cos(np.radians(cy))),
        "ky": float(np.radians(1.0) * EARTH_RADIUS_M),
        "radius_m": radius,
    }


@dataclass(frozen=True)
class MasterTables:
    """Master data as validity intervals [from_ms, to_ms) of each entity version.

    routes: route_id, version, from_ms, to_ms, corridor_width_m, speed_limit_kmh, line_wkb
    zones: zone_id, version, from_ms, to_ms, poly_wkb, and for a circle zone its centre (cx, cy),
        its projection's metres per degree (kx, ky) and radius_m (null for a polygon); its poly_wkb
        is then a polygon around the disc, a pre-filter only (`circle_zone_columns`)
    assignments: vehicle_id, route_id, from_ms, to_ms
    """

    routes: pa.Table
    zones: pa.Table
    assignments: pa.Table


def read_master_events(root: str | Path) -> pa.Table:
    files = sorted((Path(root) / MASTER).glob("*.parquet"))
    if not files:
        return MASTER_SCHEMA.empty_table()
    return pa.concat_tables([pq.read_table(f, schema=MASTER_SCHEMA) for f in files])


def _intervals(events: list[dict[str, Any]]) -> list[tuple[int, dict[str, Any], int, int]]:
    """(version, data, from, to) of each live version of one entity: it holds from the moment it
    takes effect (`processor.core.master.takes_effect_ms`: its event time, or a backdated
    assignment's valid_from) until a newer version takes effect."""
    events = sorted(events, key=lambda e: e["version"])
    decoded = [{**e, "data": None if e["data"] is None else orjson.loads(e["data"])} for e in events]
    starts = [takes_effect_ms(e) for e in decoded]
    out = []
    end = NEVER_MS
    for i in range(len(decoded) - 1, -1, -1):  # newest first: each ends where any newer one starts
        e = decoded[i]
        if e["op"] != "delete" and e["data"] is not None and end > starts[i]:
            out.append((int(e["version"]), e["data"], starts[i], int(end)))
        end = min(end, starts[i])
    return out[::-1]


def master_tables(events: pa.Table) -> MasterTables:
    """Decode master change events (deduplicated by entity, id, version) into validity intervals.

    An assignment applies over its own [valid_from_ms, valid_to_ms) window intersected with the
    time its version was in force (a newer assignment replaces it, as in the live processor; a
    backdated one from its valid_from).
    """
    by_entity: dict[tuple[str, str], dict[int, dict[str, Any]]] = {}
    for e in events.to_pylist():
        by_entity.setdefault((e["entity"], e["id"]), {})[int(e["version"])] = e
    routes: list[dict[str, Any]] = []
    zones: list[dict[str, Any]] = []
    assignments: list[dict[str, Any]] = []
    for (entity, eid), versions in sorted(by_entity.items()):
        evs = sorted(versions.values(), key=lambda e: e["version"])
        for version, data, lo, hi in _intervals(evs):
            if entity == "route":
                routes.append(
                    {
                        "route_id": eid,
                        "version": version,
                        "from_ms": lo,
                        "to_ms": hi,
                        "corridor_width_m": float(data["corridor_width_m"]),
                        "speed_limit_kmh": float(data["speed_limit_kmh"]),
                        "line_wkb": shapely.to_wkb(shape(data["geometry"])),
                    }
                )
            elif entity == "zone":
                zones.append(
                    {
                        "zone_id": eid,
                        "version": version,
                        "from_ms": lo,
                        "to_ms": hi,
                        **circle_zone_columns(data["geometry"]),
                    }
                )
            elif entity == "assignment" and data.get("route_id"):
                a_lo = max(lo, int(data.get("valid_from_ms") or 0))
                vt = data.get("valid_to_ms")
                a_hi = min(hi, NEVER_MS if vt is None else int(vt))
                if a_hi > a_lo:
                    assignments.append(
                        {"vehicle_id": eid, "route_id": str(data["route_id"]), "from_ms": a_lo, "to_ms": a_hi}
                    )
    return MasterTables(
        pa.Table.from_pylist(routes, schema=ROUTES_SCHEMA),
        pa.Table.from_pylist(zones, schema=ZONES_SCHEMA),
        pa.Table.from_pylist(assignments, schema=ASSIGNMENTS_SCHEMA),
    )


ROUTES_SCHEMA = pa.schema(
    [
        ("route_id", pa.string()),
        ("version", pa.int64()),
        ("from_ms", pa.int64()),
        ("to_ms", pa.int64()),
        ("corridor_width_m", pa.float64()),
        ("speed_limit_kmh", pa.float64()),
        ("line_wkb", pa.binary()),
    ]
)
ZONES_SCHEMA = pa.schema(
    [
        ("zone_id", pa.string()),
        ("version", pa.int64()),
        ("from_ms", pa.int64()),
        ("to_ms", pa.int64()),
        ("poly_wkb", pa.binary()),
        ("cx", pa.float64()),
        ("cy", pa.float64()),
        ("kx", pa.float64()),
        ("ky", pa.float64()),
        ("radius_m", pa.float64()),
    ]
)
ASSIGNMENTS_SCHEMA = pa.schema(
    [("vehicle_id", pa.string()), ("route_id", pa.string()), ("from_ms", pa.int64()), ("to_ms", pa.int64())]
)
