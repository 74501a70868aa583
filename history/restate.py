"""Rewind & restatement: re-run the live geofence logic over the archive, as a Spark batch job.

    archive telemetry in [T1 - warmup, T2) -> event-time slices (regular ticks, split at every
    master change) -> groupBy(vehicle bucket).applyInPandas: per bucket, slice after slice,
    `processor.core.engine.process_bucket` (the live job's pure code) with the master state as of the
    slice and the watermark the live job would have had -> restated alerts in [T1, T2)
    -> DIR/alerts.parquet (GeoParquet) and DIR/diff.json against the archived (live) alerts.

Nothing is written to Kafka. The semantics and their differences from the live job are in
docs/history.md ("Restatement").
"""

from __future__ import annotations

import json
import logging
import math
import os
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import orjson
import pandas as pd
import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq
from pyarrow import fs as pafs

from history.errors import RestateError
from history.schema import (
    ALERTS,
    MASTER,
    SCHEMAS,
    TELEMETRY,
    date_of_ms,
    filesystem,
    to_table,
    write_geoparquet,
)
from processor.core.columns import Fixes, empty_states
from processor.core.domain import EngineConfig, RawFix
from processor.core.engine import process_bucket
from processor.core.master import Catalog, MasterState, takes_effect_ms

logger = logging.getLogger(__name__)

ALERT_COLUMNS = [f.name for f in SCHEMAS[ALERTS] if f.name not in ("ts", "geometry")]
ALERT_DDL = (
    "alert_id string, type string, vehicle_id string, route_id string, route_version long, zone_id string, "
    "seq long, ts_ms long, lat double, lon double, details string"
)
# What "the same alert" means in the diff: every archived column except the derived ones.
COMPARED = [
    "type",
    "vehicle_id",
    "route_id",
    "route_version",
    "zone_id",
    "seq",
    "ts_ms",
    "lat",
    "lon",
    "details",
]


@dataclass
class RestateRequest:
    from_ms: int
    to_ms: int
    out_dir: str
    routes_geojson: dict[str, Any] | None = None
    route_versions: dict[str, int] = field(default_factory=dict)
    batch_ms: int = 10_000
    warmup_ms: int = 0


@dataclass
class RestateResult:
    restated: pd.DataFrame
    live: pd.DataFrame
    only_live: list[str]
    only_restated: list[str]
    changed: list[str]
    same: list[str]
    fixes: int


# --------------------------------------------------------------------------- master data


def load_master_events(root: str) -> list[dict[str, Any]]:
    """Every archived master event once per (entity, id, version), in the order it takes effect
    (`effective_ms`: `processor.core.master.takes_effect_ms`, the event time or a backdated
    assignment's valid_from), then position on the single-partition fleet.master topic. Applied in
    that order, an older version that takes effect after a newer one is ignored (`MasterState`)."""
    fs, base = filesystem(root)
    info = fs.get_file_info(f"{base}/{MASTER}")
    if info.type == pafs.FileType.NotFound:  # NotFound
        return []
    t = ds.dataset(f"{base}/{MASTER}", filesystem=fs, format="parquet", schema=SCHEMAS[MASTER]).to_table()
    seen: set[tuple[str, str, int]] = set()
    out: list[tuple[tuple[int, int], dict[str, Any]]] = []
    for r in sorted(t.to_pylist(), key=lambda r: r["kafka_offset"]):
        k = (r["entity"], r["id"], r["version"])
        if k in seen:
            continue
        seen.add(k)
        event = {
            "entity": r["entity"],
            "id": r["id"],
            "version": r["version"],
            "op": r["op"],
            "data": None if r["data"] is None else orjson.loads(r["data"]),
            "event_ts_ms": r["event_ts_ms"],
        }
        out.append(((takes_effect_ms(event), r["kafka_offset"]), event))
    out.sort(key=lambda pair: pair[0])
    return [{**event, "effective_ms": at} for (at, _offset), event in out]


def route_overrides(
    events: list[dict[str, Any]], geojson: dict[str, Any] | None, pins: dict[str, int]
) -> dict[str, dict[str, Any]]:
    """route_id -> the route definition to use instead of the archived one, for the whole window.

    `pins` name an archived version; `geojson` is a FeatureCollection in the admin API's bulk
    import format, validated by the vehicle master's own parser (only routes are taken from it).
    """
    out: dict[str, dict[str, Any]] = {}
    for rid, ver in pins.items():
        match = [
            e
            for e in events
            if e["entity"] == "route" and e["id"] == rid and e["version"] == ver and e["data"]
        ]
        if not match:
            raise RestateError(f"route {rid!r} version {ver} is not in the archive's master data")
        out[rid] = match[0]["data"]
    if geojson is not None:
        from fleetfence.contracts import MasterEntity
        from vehicle_master.geojson import parse_feature_collection
        from vehicle_master.models import entity_id, entity_of, to_wire

        items, problems = parse_feature_collection(geojson)
        if problems:
            raise RestateError(
                "proposed routes are not valid: "
                + "; ".join(f"feature {p.index}: {'.'.join(map(str, p.loc))}: {p.msg}" for p in problems)
            )
        for _, data in items:
            if entity_of(data) is MasterEntity.ROUTE:
                out[entity_id(data)] = to_wire(data)
    return out


def _apply(master: MasterState, event: dict[str, Any], overrides: dict[str, dict[str, Any]]) -> None:
    if event["entity"] == "route" and event["id"] in overrides and event["op"] != "delete":
        # Same version as the event it replaces: alerts stay comparable with the live ones. The
        # catalog of a restatement only ever compiles the proposal under that (id, version).
        event = {**event, "data": overrides[event["id"]]}
    master.apply(event)


# --------------------------------------------------------------------------- the per-bucket work


def restate_bucket(
    df: pd.DataFrame,
    events: list[dict[str, Any]],
    overrides: dict[str, dict[str, Any]],
    watermarks: dict[int, int],
    final_watermark_ms: int,
    start_ms: int,
    report_from_ms: int,
    cfg: EngineConfig,
) -> pd.DataFrame:
    """All fixes of one vehicle bucket, slice by slice through the live engine (pure)."""
    master = MasterState()
    pending = deque(events)
    while pending and pending[0]["effective_ms"] <= start_ms:
        _apply(master, pending.popleft(), overrides)
    catalog = Catalog(cfg)
    states = empty_states()
    held: dict[str, list[RawFix]] = {}
    alerts = []
    df = df.sort_values(["slice", "ts_ms", "seq"], kind="stable")
    slices = df["slice"].to_numpy()
    bounds = np.flatnonzero(np.diff(slices)) + 1
    for part in np.split(np.arange(len(df)), bounds) if len(df) else []:
        sl = int(slices[part[0]])
        while pending and pending[0]["effective_ms"] <= sl:
            _apply(master, pending.popleft(), overrides)
        fx = Fixes.from_frame(df.iloc[part])
        res = process_bucket(states, held, master, fx, watermarks.get(sl, 0), cfg, catalog)
        states, held = res.states, res.held
        alerts.extend(res.alerts)
    res = process_bucket(states, held, master, Fixes.empty(), final_watermark_ms, cfg, catalog)
    alerts.extend(res.alerts)
    rows = [alert_row(a.to_dict()) for a in alerts if a.ts_ms >= report_from_ms]
    return pd.DataFrame(rows, columns=ALERT_COLUMNS)


def alert_row(d: Mapping[str, Any]) -> dict[str, Any]:
    """An alert as on fleet.alerts -> an archive row (the archive writer's normalisation)."""
    return {
        "alert_id": d["alert_id"],
        "type": d["type"],
        "vehicle_id": d["vehicle_id"],
        "route_id": d.get("route_id"),
        "route_version": int(d.get("route_version") or 0),
        "zone_id": d.get("zone_id"),
        "seq": int(d["seq"]),
        "ts_ms": int(d["ts_ms"]),
        "lat": float(d["lat"]),
        "lon": float(d["lon"]),
        "details": orjson.dumps(d.get("details") or {}, option=orjson.OPT_SORT_KEYS).decode(),
    }


# --------------------------------------------------------------------------- the job (driver)


def read_archived_alerts(root: str, from_ms: int, to_ms: int) -> pd.DataFrame:
    """The live alerts of the window, as archived."""
    fs, base = filesystem(root)
    if fs.get_file_info(f"{base}/{ALERTS}").type == pafs.FileType.NotFound:
        return pd.DataFrame(columns=ALERT_COLUMNS)
    dset = ds.dataset(f"{base}/{ALERTS}", filesystem=fs, format="parquet", partitioning="hive")
    t = dset.to_table(
        columns=ALERT_COLUMNS,
        filter=(ds.field("ts_ms") >= from_ms) & (ds.field("ts_ms") < to_ms),
    )
    df: pd.DataFrame = t.to_pandas()
    return df


def run_restatement(spark: Any, root: str, req: RestateRequest, cfg: EngineConfig) -> RestateResult:
    """Restate [from, to) and write DIR/alerts.parquet and DIR/diff.json."""
    from pyspark.sql import functions as F

    if req.to_ms <= req.from_ms:
        raise RestateError("--to must be after --from")
    start_ms = req.from_ms - req.warmup_ms
    events = load_master_events(root)
    if not events:
        raise RestateError(f"no master data in the archive at {root}: nothing to restate against")
    overrides = route_overrides(events, req.routes_geojson, req.route_versions)
    fs, base = filesystem(root)
    if fs.get_file_info(f"{base}/{TELEMETRY}").type == pafs.FileType.NotFound:
        raise RestateError(f"no telemetry in the archive at {root}")

    tel = (
        spark.read.parquet(f"{root.rstrip('/')}/{TELEMETRY}")
        .where(
            F.col("date").between(
                F.lit(date_of_ms(start_ms)).cast("date"), F.lit(date_of_ms(req.to_ms)).cast("date")
            )
        )
        .where((F.col("ts_ms") >= start_ms) & (F.col("ts_ms") < req.to_ms))
        .select("bucket", "vehicle_id", "seq", "ts_ms", "lat", "lon", "speed_kmh", "received_ms")
        .fillna({"received_ms": 0})
    )
    # Slice start: the regular tick, moved up to the last master change at or before the fix, so a
    # fix is processed with every master change of its event time already applied.
    tick = F.floor((F.col("ts_ms") - F.lit(start_ms)) / F.lit(req.batch_ms)) * F.lit(req.batch_ms) + F.lit(
        start_ms
    )
    changes = sorted({e["effective_ms"] for e in events if start_ms < e["effective_ms"] < req.to_ms})
    slice_col = (
        F.greatest(tick.cast("long"), *[F.when(F.col("ts_ms") >= b, F.lit(b)) for b in changes])
        if changes
        else tick.cast("long")
    )
    tel = tel.withColumn("slice", slice_col)
    stats = tel.groupBy("slice").agg(F.max("ts_ms").alias("max_ts"), F.count("*").alias("n")).collect()
    per_slice = sorted((int(r["slice"]), int(r["max_ts"])) for r in stats)
    fixes = sum(int(r["n"]) for r in stats)
    # The live job's watermark in a batch: the largest event time of the earlier batches minus the
    # allowed lateness (global over all buckets), never negative.
    watermarks: dict[int, int] = {}
    seen_max = -(2**62)
    for sl, mx in per_slice:
        watermarks[sl] = max(seen_max - cfg.lateness_ms, 0)
        seen_max = max(seen_max, mx)
    final_wm = max(seen_max - cfg.lateness_ms, 0)
    logger.info(
        "restating window=[%d, %d) warmup_ms=%d slices=%d fixes=%d overrides=%s",
        req.from_ms,
        req.to_ms,
        req.warmup_ms,
        len(per_slice),
        fixes,
        sorted(overrides),
    )
    report_from, to_ms = req.from_ms, req.to_ms

    def fn(pdf: pd.DataFrame) -> pd.DataFrame:
        out = restate_bucket(pdf, events, overrides, watermarks, final_wm, start_ms, report_from, cfg)
        keep = (out["ts_ms"] >= report_from) & (out["ts_ms"] < to_ms)
        return pd.DataFrame(out[keep])

    restated = tel.groupBy("bucket").applyInPandas(fn, ALERT_DDL).toPandas()
    restated = restated.sort_values("alert_id").reset_index(drop=True)
    live = read_archived_alerts(root, req.from_ms, req.to_ms).sort_values("alert_id").reset_index(drop=True)
    result = diff_alerts(live, restated, fixes)
    write_outputs(req.out_dir, req, result)
    return result


def _records(df: pd.DataFrame) -> list[dict[str, Any]]:
    """Rows as plain dicts, missing values as None (pandas gives NaN for a null string)."""
    return [
        {str(k): (None if isinstance(v, float) and math.isnan(v) else v) for k, v in rec.items()}
        for rec in df.astype(object).to_dict("records")
    ]


def _canon(row: dict[str, Any]) -> tuple[Any, ...]:
    return tuple(None if isinstance(row[c], float) and math.isnan(row[c]) else row[c] for c in COMPARED)


def diff_alerts(live: pd.DataFrame, restated: pd.DataFrame, fixes: int = 0) -> RestateResult:
    """Match by alert_id (deterministic: vehicle, type, seq, zone); compare every other column."""
    lv = {r["alert_id"]: r for r in _records(live)}
    rs = {r["alert_id"]: r for r in _records(restated)}
    both = sorted(lv.keys() & rs.keys())
    changed = [a for a in both if _canon(lv[a]) != _canon(rs[a])]
    return RestateResult(
        restated,
        live,
        sorted(lv.keys() - rs.keys()),
        sorted(rs.keys() - lv.keys()),
        changed,
        [a for a in both if a not in set(changed)],
        fixes,
    )


def write_outputs(out_dir: str, req: RestateRequest, r: RestateResult) -> None:
    os.makedirs(out_dir, exist_ok=True)
    cols = {c: r.restated[c].tolist() for c in ALERT_COLUMNS}
    write_geoparquet(to_table(ALERTS, cols), os.path.join(out_dir, "alerts.parquet"))

    def records(df: pd.DataFrame, ids: list[str]) -> list[dict[str, Any]]:
        return _records(df[df["alert_id"].isin(ids)])

    diff = {
        "window": {
            "from_ms": req.from_ms,
            "to_ms": req.to_ms,
            "warmup_ms": req.warmup_ms,
            "batch_ms": req.batch_ms,
        },
        "overrides": {"route_versions": req.route_versions, "proposed_routes": bool(req.routes_geojson)},
        "counts": {
            "fixes": r.fixes,
            "live": len(r.live),
            "restated": len(r.restated),
            "same": len(r.same),
            "changed": len(r.changed),
            "only_live": len(r.only_live),
            "only_restated": len(r.only_restated),
        },
        "only_live": records(r.live, r.only_live),
        "only_restated": records(r.restated, r.only_restated),
        "changed": [
            {"alert_id": a, "live": records(r.live, [a])[0], "restated": records(r.restated, [a])[0]}
            for a in r.changed
        ],
        "same": r.same,
    }
    with open(os.path.join(out_dir, "diff.json"), "w") as f:
        json.dump(diff, f, indent=2, default=int)


def read_restated(out_dir: str) -> pa.Table:
    return pq.read_table(os.path.join(out_dir, "alerts.parquet"))
