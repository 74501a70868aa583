"""The live read model (docs/contracts.md, Redis `live:{vehicle_id}`) of the vehicles a batch
touched: position, status, route progress and distance from the route. Pure, no I/O; the sink
writes what this returns.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd
import shapely

from processor.core.columns import StateTable
from processor.core.geometry import CompiledRoute
from processor.core.master import Catalog, MasterState, assignment_ms, compiled_route
from processor.core.trip import planned_arrival_ms


def live_rows(
    states: StateTable, rows: np.ndarray, master: MasterState, catalog: Catalog
) -> list[dict[str, Any]]:
    """The live read model (docs/contracts.md) for the vehicles a batch touched."""
    if not len(rows):
        return []
    c = states.cols
    routes = c["route_id"][rows]
    lon, lat = c["lon"][rows], c["lat"][rows]
    progress = np.zeros(len(rows))
    ratio = np.zeros(len(rows))
    dist = np.full(len(rows), np.nan)
    codes, uniq = pd.factorize(routes, use_na_sentinel=True)
    compiled = [compiled_route(master, catalog, rid) for rid in uniq.tolist()]
    ok = np.array([cr is not None for cr in compiled] + [False], dtype=bool)[codes]
    if ok.any():
        # One vectorized call over every vehicle, each against its own route's metric projection.
        crs = [cr for cr in compiled if cr is not None]
        pos = np.cumsum([cr is not None for cr in compiled]) - 1
        ri = pos[codes[ok]]
        lon0 = np.array([cr.projection.lon0 for cr in crs])[ri]
        lat0 = np.array([cr.projection.lat0 for cr in crs])[ri]
        kx = np.array([cr.projection.kx for cr in crs])[ri]
        ky = np.array([cr.projection.ky for cr in crs])[ri]
        lines = np.array([cr.line_m for cr in crs], dtype=object)[ri]
        length = np.array([cr.length_m for cr in crs])[ri]
        pts = shapely.points((lon[ok] - lon0) * kx, (lat[ok] - lat0) * ky)
        # The state machine's progress where it has one: it follows the pass the vehicle is on, where
        # the nearest point of the whole line may lie on another pass of the same street (and costs
        # nothing, where locating a point on a long line walks all of it). Located only where it has none.
        p = c["progress_m"][rows][ok].copy()
        none = p < 0
        if none.any():
            p[none] = shapely.line_locate_point(lines[none], pts[none])
        progress[ok], dist[ok] = p, shapely.distance(lines, pts)
        ratio[ok] = np.where(length > 0, p / np.maximum(length, 1e-9), 0.0)
    cols = [
        c[f][rows].tolist()
        for f in (
            "last_seq",
            "last_ts_ms",
            "lat",
            "lon",
            "speed_kmh",
            "off_route",
            "overspeed",
            "silent",
            "route_version",
            "unassigned_fixes",
            "wrong_way",
            "stop_phase",
            "stop_since_ms",
            "eta_ms",
            "at_risk",
            "completed",
            "off_route_m",
            "trip_start_ms",
        )
    ]
    zones = c["zones"][rows].tolist()
    rl = routes.tolist()
    route_of = [compiled[i] if i >= 0 else None for i in codes.tolist()]
    prog, rat, dis = np.round(progress, 1).tolist(), np.round(ratio, 4).tolist(), np.round(dist, 1).tolist()
    out = []
    for k, row in enumerate(rows.tolist()):
        rid = rl[k]
        out.append(
            {
                "vehicle_id": states.ids[row],
                "seq": cols[0][k],
                "ts_ms": cols[1][k],
                "lat": cols[2][k],
                "lon": cols[3][k],
                "speed_kmh": cols[4][k],
                "status": "unassigned" if rid is None else ("off_route" if cols[5][k] else "on_route"),
                "overspeed": cols[6][k],
                "silent": cols[7][k],
                "route_id": rid,
                "route_version": cols[8][k],
                "progress_m": prog[k],
                "progress_ratio": rat[k],
                "distance_m": None if dis[k] != dis[k] else dis[k],
                "zones": sorted(zones[k]) if zones[k] else [],
                "unassigned_fixes": cols[9][k],
                **_trip_fields(master, route_of[k], states.ids[row], cols, k),
            }
        )
    return out


STOP_LABEL = {0: None, 1: "unplanned", 2: "planned"}


def _trip_fields(
    master: MasterState,
    cr: CompiledRoute | None,
    vehicle_id: str,
    cols: list[list[Any]],
    k: int,
) -> dict[str, Any]:
    """The trip part of a live row: direction, stop, ETA and delay against the plan, completion.
    `cr`: the vehicle's route, compiled (None without one)."""
    wrong_way, stop_phase, stop_since, eta = cols[10][k], cols[11][k], cols[12][k], cols[13][k]
    at_risk, completed, off_m, start_ms = cols[14][k], cols[15][k], cols[16][k], cols[17][k]
    planned = -1
    if cr is not None:
        a = master.assignments.get(vehicle_id)
        data = a[1] if a is not None else None
        if data is not None:
            planned = planned_arrival_ms(
                assignment_ms(data, "planned_arrival_ms"),
                assignment_ms(data, "planned_departure_ms"),
                start_ms,
                cr.rules.planned_duration_s,
            )
    return {
        "wrong_way": wrong_way,
        "stop": STOP_LABEL.get(stop_phase) if stop_since >= 0 and stop_phase else None,
        "stopped_since_ms": stop_since if stop_since >= 0 and stop_phase else None,
        "eta_ms": eta if eta >= 0 else None,
        "planned_arrival_ms": planned if planned >= 0 else None,
        "delay_s": round((eta - planned) / 1000.0, 1) if eta >= 0 and planned >= 0 else None,
        "arrival_at_risk": at_risk,
        "completed": completed,
        "off_route_m": round(off_m, 1),
    }
