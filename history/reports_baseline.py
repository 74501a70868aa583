"""The same six reports in plain Shapely 2 + pandas/numpy: the benchmark's peer and a cross-check.

Independent of the SQL in history/reports.py for everything that matters: fixes are read with
pyarrow, routes are compiled with the live processor's own code (processor/core/geometry.py
`compile_route`, tested with `corridor_tests`), zones are tested with `shapely.contains_xy` (circle
zones with `fleetfence.geo.circle_distance_m`), and
runs are found with numpy on the fixes sorted by (vehicle, time, seq). Only the decoding of master
events into validity intervals and the final shaping of the tables are shared with the SedonaDB
implementation, so both produce comparable tables.

Memory: the columns used (vehicle as a dictionary code, seq, ts, lon, lat, speed) of the whole
range are held at once, ~60 bytes per fix (~0.6 GB for 10M fixes, plus temporaries).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import shapely
from shapely.geometry import mapping

from fleetfence.geo import circle_distance_m, haversine_m
from history.report_inputs import NEVER_MS, ReportRange, master_tables, read_master_events, telemetry_files
from history.report_params import DEFAULT_MOTION, MotionParams
from history.reports import (
    DEFAULT_H3_RESOLUTION,
    TRACK_COLUMNS,
    finish_adherence,
    finish_speeding,
    finish_stops,
    finish_tracks,
    finish_trips,
    finish_visits,
    h3_counts,
    speed_step_m,
)
from processor.core.geometry import CompiledRoute, compile_route, corridor_tests

DAY_MS = 86_400_000
COLUMNS = ["vehicle_id", "seq", "ts_ms", "lon", "lat", "speed_kmh"]


class BaselineReports:
    """Reports over one archive and range, computed in memory with numpy/Shapely."""

    def __init__(self, root: str | Path, rng: ReportRange, buckets: int) -> None:
        self.root = Path(root)
        self.rng = rng
        self.buckets = buckets
        self._ready = False

    # ----------------------------------------------------------------- shared enrichment

    def prepare(self) -> None:
        """Read fixes in range, sort per vehicle, attach route version, speed limit, corridor test."""
        if self._ready:
            return
        files = telemetry_files(self.root, self.rng, self.buckets)
        flt = (pc.field("ts_ms") >= self.rng.from_ms) & (pc.field("ts_ms") < self.rng.to_ms)
        if self.rng.vehicle_id is not None:
            flt = flt & (pc.field("vehicle_id") == self.rng.vehicle_id)
        tables = [pq.read_table(f, columns=COLUMNS, filters=flt) for f in files]
        t = pa.concat_tables(tables) if tables else pa.table({c: [] for c in COLUMNS})
        vid = t.column("vehicle_id").combine_chunks().cast(pa.string()).dictionary_encode()
        self.vehicles = np.asarray(vid.dictionary.to_pylist(), dtype=object)
        vcode = vid.indices.to_numpy(zero_copy_only=False).astype(np.int64)
        # Order vehicles by id so codes sort like the ids.
        rank = (
            np.argsort(np.argsort(self.vehicles, kind="stable"), kind="stable")
            if len(self.vehicles)
            else vcode
        )
        vcode = rank[vcode] if len(vcode) else vcode
        self.vehicles = np.sort(self.vehicles) if len(self.vehicles) else self.vehicles
        seq = t.column("seq").to_numpy().astype(np.int64)
        ts = t.column("ts_ms").to_numpy().astype(np.int64)
        order = np.lexsort((seq, ts, vcode))
        self.v = vcode[order]
        self.ts = ts[order]
        self.lon = t.column("lon").to_numpy()[order]
        self.lat = t.column("lat").to_numpy()[order]
        self.speed = t.column("speed_kmh").to_numpy()[order]
        del t, tables
        n = len(self.v)
        # same_next[i]: fix i+1 belongs to the same vehicle (the "next fix" of fix i exists).
        self.same_next = np.zeros(n, dtype=bool)
        if n > 1:
            self.same_next[:-1] = self.v[1:] == self.v[:-1]
        # Vehicle slices in the sorted arrays.
        self.vstart = np.searchsorted(self.v, np.arange(len(self.vehicles)), side="left")
        self.vend = np.searchsorted(self.v, np.arange(len(self.vehicles)), side="right")
        self.master = master_tables(read_master_events(self.root))
        self._routes()
        self._ready = True

    def _routes(self) -> None:
        n = len(self.v)
        code_of = {str(v): i for i, v in enumerate(self.vehicles)}
        route_of = np.full(n, -1, dtype=np.int64)  # index into route_ids
        route_ids = sorted(set(self.master.routes.column("route_id").to_pylist()))
        rid_index = {r: i for i, r in enumerate(route_ids)}
        for a in self.master.assignments.to_pylist():
            c = code_of.get(a["vehicle_id"])
            r = rid_index.get(a["route_id"])
            if c is None or r is None:
                continue
            s, e = self.vstart[c], self.vend[c]
            lo = s + np.searchsorted(self.ts[s:e], a["from_ms"], side="left")
            hi = s + np.searchsorted(self.ts[s:e], a["to_ms"], side="left")
            route_of[lo:hi] = r
        compiled: list[CompiledRoute | None] = []
        rv = np.full(n, -1, dtype=np.int64)  # index into `compiled` (route version)
        self.route_id_of_fix = np.full(n, None, dtype=object)
        for row in self.master.routes.to_pylist():
            r = rid_index[row["route_id"]]
            sel = (route_of == r) & (self.ts >= row["from_ms"]) & (self.ts < row["to_ms"])
            if not sel.any():
                continue
            data = {
                "geometry": mapping(shapely.from_wkb(row["line_wkb"])),
                "corridor_width_m": row["corridor_width_m"],
                "speed_limit_kmh": row["speed_limit_kmh"],
            }
            rv[sel] = len(compiled)
            compiled.append(compile_route(row["route_id"], row["version"], data, hysteresis_m=0.0))
            self.route_id_of_fix[sel] = row["route_id"]
        inside, _ = corridor_tests(compiled, rv, self.lon, self.lat, inner_mask=np.zeros(n, dtype=bool))
        self.assigned = rv >= 0
        self.inside = inside & self.assigned
        limits = np.array([c.rules.speed_limit_kmh for c in compiled if c is not None] + [np.inf])
        self.limit = limits[rv]  # rv == -1 picks the trailing inf: never speeding

    # ----------------------------------------------------------------- reports

    def adherence(self) -> pd.DataFrame:
        self.prepare()
        n = len(self.v)
        nxt_ts = np.zeros(n, dtype=np.int64)
        nxt_lon = np.zeros(n)
        nxt_lat = np.zeros(n)
        if n > 1:
            nxt_ts[:-1], nxt_lon[:-1], nxt_lat[:-1] = self.ts[1:], self.lon[1:], self.lat[1:]
        counted = self.assigned & ~self.inside & self.same_next
        dt_s = np.where(counted, (nxt_ts - self.ts) / 1000.0, 0.0)
        dist = np.where(counted, haversine_m(self.lon, self.lat, nxt_lon, nxt_lat), 0.0)
        df = pd.DataFrame(
            {
                "v": self.v,
                "day": self.ts // DAY_MS,
                "fixes": 1,
                "assigned_fixes": self.assigned.astype(np.int64),
                "inside_fixes": self.inside.astype(np.int64),
                "off_route_s": dt_s,
                "off_route_m": dist,
            }
        )
        g = df.groupby(["v", "day"], sort=True).sum().reset_index()
        g["vehicle_id"] = self.vehicles[g["v"].to_numpy()] if len(g) else []
        return finish_adherence(g)

    def _runs(self, mask: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Start and end (inclusive) indices of runs of consecutive True fixes of one vehicle.

        Runs are contiguous index ranges of the (vehicle, time)-sorted arrays, so per-run
        aggregates are `np.<ufunc>.reduceat(values, start)` over `values[start:end+1]` ranges.
        """
        idx = np.flatnonzero(mask)
        if not len(idx):
            return idx, idx
        brk = np.r_[True, (np.diff(idx) != 1) | (self.v[idx[1:]] != self.v[idx[:-1]])]
        starts = np.flatnonzero(brk)
        ends = np.r_[starts[1:], len(idx)] - 1
        return idx[starts], idx[ends]

    @staticmethod
    def _run_max(values: np.ndarray, s: np.ndarray, e: np.ndarray) -> np.ndarray:
        """Max of values[s[k]:e[k]+1] per run, vectorized (reduceat over the interleaved bounds)."""
        if not len(s):
            return np.zeros(0)
        bounds = np.column_stack([s, e + 1]).ravel()
        padded = np.r_[values, -np.inf]  # e + 1 may equal len(values)
        return np.maximum.reduceat(padded, bounds)[::2]

    def zone_visits(self) -> pd.DataFrame:
        self.prepare()
        n = len(self.v)
        order = np.argsort(self.lon, kind="stable")
        lon_sorted = self.lon[order]
        members: dict[str, np.ndarray] = {}
        for row in self.master.zones.to_pylist():
            poly = shapely.from_wkb(row["poly_wkb"])
            minx, miny, maxx, maxy = poly.bounds
            lo = np.searchsorted(lon_sorted, minx, side="left")
            cand = order[lo : np.searchsorted(lon_sorted, maxx, side="right")]
            cand = cand[
                (self.lat[cand] >= miny)
                & (self.lat[cand] <= maxy)
                & (self.ts[cand] >= row["from_ms"])
                & (self.ts[cand] < row["to_ms"])
            ]
            hit = cand[shapely.contains_xy(poly, self.lon[cand], self.lat[cand])]
            if row["radius_m"] is not None:  # a circle: its polygon is a pre-filter, the distance decides
                d = circle_distance_m(self.lon[hit], self.lat[hit], row["cx"], row["cy"])
                hit = hit[d <= row["radius_m"]]
            m = members.setdefault(row["zone_id"], np.zeros(n, dtype=bool))
            m[hit] = True
        frames = []
        for zone_id, m in members.items():
            s, e = self._runs(m)
            if not len(s):
                continue
            has_exit = self.same_next[e]
            exit_ts = np.where(has_exit, self.ts[np.minimum(e + 1, n - 1)], NEVER_MS)
            fixes = e - s + 1
            frames.append(
                pd.DataFrame(
                    {
                        "vehicle_id": self.vehicles[self.v[s]],
                        "zone_id": zone_id,
                        "entry_ts_ms": self.ts[s],
                        "last_inside_ts_ms": self.ts[e],
                        "exit_or_never": exit_ts,
                        "fixes": fixes,
                        "entry_lon": self.lon[s],
                        "entry_lat": self.lat[s],
                    }
                )
            )
        df = pd.concat(frames, ignore_index=True) if frames else _empty_visits()
        return finish_visits(df)

    def speeding(self) -> pd.DataFrame:
        self.prepare()
        s, e = self._runs(self.speed > self.limit)
        max_kmh = self._run_max(self.speed, s, e)
        df = pd.DataFrame(
            {
                "vehicle_id": self.vehicles[self.v[s]] if len(s) else np.zeros(0, dtype=object),
                "route_id": self.route_id_of_fix[s],
                "speed_limit_kmh": self.limit[s],
                "start_ts_ms": self.ts[s],
                "end_ts_ms": self.ts[e],
                "fixes": e - s + 1,
                "max_kmh": max_kmh,
            }
        )
        return finish_speeding(df)

    # ----------------------------------------------------------------- stops and trips

    def _islands(self, mask: np.ndarray, linked: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Start and end (inclusive) indices of the runs of True fixes where each fix is `linked`
        to the next one (same vehicle, no gap)."""
        idx = np.flatnonzero(mask)
        if not len(idx):
            return idx, idx
        brk = np.r_[True, (np.diff(idx) != 1) | ~linked[idx[:-1]]]
        starts = np.flatnonzero(brk)
        ends = np.r_[starts[1:], len(idx)] - 1
        return idx[starts], idx[ends]

    def _linked(self, motion: MotionParams) -> np.ndarray:
        """linked[i]: fix i+1 is the same vehicle's next fix and follows within max_gap_s."""
        self.prepare()
        linked = self.same_next.copy()
        if len(linked) > 1:
            linked[:-1] &= (self.ts[1:] - self.ts[:-1]) <= motion.max_gap_ms
        return linked

    def _motion(self, motion: MotionParams) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """The stops (start and end index, end time) and which fixes are in a stop."""
        linked = self._linked(motion)
        n = len(self.v)
        s, e = self._islands(self.speed <= motion.stop_speed_kmh, linked)
        # A stop lasts until the first fix after it when that one follows without a gap.
        end_ts = np.where(linked[e], self.ts[np.minimum(e + 1, max(n - 1, 0))], self.ts[e]) if n else e
        keep = (end_ts - self.ts[s]) >= motion.min_stop_ms
        s, e, end_ts = s[keep], e[keep], end_ts[keep]
        mark = np.zeros(n + 1, dtype=np.int64)
        np.add.at(mark, s, 1)
        np.add.at(mark, e + 1, -1)
        in_stop = np.cumsum(mark)[:n] > 0
        return s, e, end_ts, in_stop

    def stops(self, motion: MotionParams = DEFAULT_MOTION) -> pd.DataFrame:
        s, e, end_ts, _ = self._motion(motion)
        df = pd.DataFrame(
            {
                "vehicle_id": self.vehicles[self.v[s]] if len(s) else np.zeros(0, dtype=object),
                "start_ts_ms": self.ts[s],
                "end_ts_ms": end_ts,
                "fixes": e - s + 1,
                "lon": self.lon[s],
                "lat": self.lat[s],
            }
        )
        return finish_stops(df)

    def _trip_runs(self, motion: MotionParams) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Start and end indices of the trips (>= 2 fixes), and which fix links to the next."""
        _, _, _, in_stop = self._motion(motion)
        linked = self._linked(motion)
        s, e = self._islands(~in_stop, linked)
        keep = e > s
        return s[keep], e[keep], linked

    def trips(self, motion: MotionParams = DEFAULT_MOTION) -> pd.DataFrame:
        s, e, linked = self._trip_runs(motion)
        n = len(self.v)
        step = np.zeros(n)
        if n > 1:
            step[:-1] = np.where(
                linked[:-1], speed_step_m(self.speed[:-1], self.speed[1:], self.ts[1:] - self.ts[:-1]), 0.0
            )
        # Metres along each trip: the steps of its fixes but the last, step[s:e] (e > s).
        distance = np.add.reduceat(step, np.column_stack([s, e]).ravel())[::2] if len(s) else np.zeros(0)
        df = pd.DataFrame(
            {
                "vehicle_id": self.vehicles[self.v[s]] if len(s) else np.zeros(0, dtype=object),
                "start_ts_ms": self.ts[s],
                "end_ts_ms": self.ts[e],
                "fixes": e - s + 1,
                "distance_m": distance,
                "max_kmh": self._run_max(self.speed, s, e),
                "start_lon": self.lon[s],
                "start_lat": self.lat[s],
                "end_lon": self.lon[e],
                "end_lat": self.lat[e],
            }
        )
        return finish_trips(df)

    def trip_tracks(self, motion: MotionParams = DEFAULT_MOTION) -> pd.DataFrame:
        s, e, _ = self._trip_runs(motion)
        lengths = e - s + 1
        first = np.repeat(s, lengths)
        idx = first + (np.arange(lengths.sum()) - np.repeat(np.cumsum(lengths) - lengths, lengths))
        df = pd.DataFrame(
            {
                "vehicle_id": self.vehicles[self.v[idx]] if len(idx) else np.zeros(0, dtype=object),
                "start_ts_ms": self.ts[first],
                "ts_ms": self.ts[idx],
                "lon": self.lon[idx],
                "lat": self.lat[idx],
                "speed_kmh": self.speed[idx],
            },
            columns=TRACK_COLUMNS,
        )
        return finish_tracks(df)

    def heatmap(self, resolution: int = DEFAULT_H3_RESOLUTION) -> pd.DataFrame:
        self.prepare()
        off = self.assigned & ~self.inside
        return h3_counts(self.lat[off], self.lon[off], resolution)


def _empty_visits() -> pd.DataFrame:
    return pd.DataFrame(
        {
            "vehicle_id": pd.Series([], dtype=object),
            "zone_id": pd.Series([], dtype=object),
            "entry_ts_ms": pd.Series([], dtype="int64"),
            "last_inside_ts_ms": pd.Series([], dtype="int64"),
            "exit_or_never": pd.Series([], dtype="int64"),
            "fixes": pd.Series([], dtype="int64"),
            "entry_lon": pd.Series([], dtype="float64"),
            "entry_lat": pd.Series([], dtype="float64"),
        }
    )
