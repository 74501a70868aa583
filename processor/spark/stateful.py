"""The Spark stateful operator: `transformWithStateInPandas` keyed by vehicle bucket.

State per bucket, in Spark's RocksDB state store (checkpointed, restored on restart):
- `vehicles`: the bucket's vehicle state table and reorder buffer (one blob: written once per batch,
  so the per-key cost is paid per bucket, not per vehicle);
- `master`: routes, zones and assignments as of this batch (changes rarely; a worker keeps the
  decoded copy in memory keyed by its digest, so it is only decoded when it changed);
- `meta`: the master digest and the registered event-time timer;
- `parked`: one value per parked vehicle (silent, nothing pending: processor.core.parking), so that the
  blob, and what every batch rewrites, holds only the vehicles that are active (unless
  `FLEETFENCE_PROCESSOR_PARKING` is off).

An event-time timer per bucket fires at the next silence deadline or held-fix release, so a bucket
that receives no data still reports silent vehicles when the watermark moves on.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import orjson
import pandas as pd
from pyspark.sql.streaming.stateful_processor import (
    ExpiredTimerInfo,
    StatefulProcessor,
    StatefulProcessorHandle,
    TimerValues,
)

from processor.core.codec import dump_state, load_state
from processor.core.columns import StateTable, empty_states
from processor.core.domain import EngineConfig, RawFix
from processor.core.engine import process_bucket, silent_after_s
from processor.core.master import Catalog, MasterState
from processor.core.parking import ParkingLot, pack_rows, split_parked, unpack_rows, wake
from processor.spark.rows import (
    InputKind,
    OutputKind,
    OutputRow,
    decode_chunks,
    late_rows,
    output_frame,
    pack_live,
)

logger = logging.getLogger(__name__)

# Worker-process caches: decoded master data by digest, compiled geometry by (id, version).
_MASTER_CACHE: dict[str, MasterState] = {}
_CATALOGS: dict[EngineConfig, Catalog] = {}


def _digest(blob: bytes) -> str:
    return hashlib.blake2b(blob, digest_size=16).hexdigest()


class GeofenceProcessor(StatefulProcessor):
    """The job's stateful operator: each bucket's state in Spark's value and map states, folded by
    `bucket_step`."""

    def __init__(self, cfg: EngineConfig, watermark_floor_ms: int = 0, *, parking: bool = True) -> None:
        self.cfg = cfg
        # A re-bucketed checkpoint's Spark watermark starts again from nothing; the engine keeps
        # judging lateness and releasing held fixes from the old checkpoint's (processor.spark.rebucket).
        self.watermark_floor_ms = watermark_floor_ms
        # Whether vehicles with nothing pending are parked (ProcessorSettings.processor_parking).
        self.parking = parking

    def init(self, handle: StatefulProcessorHandle) -> None:
        self.handle = handle
        self.vehicles = handle.getValueState("vehicles", "blob binary")
        self.master = handle.getValueState("master", "blob binary")
        self.meta = handle.getValueState("meta", "master_digest string, timer_ms long")
        self.lot = MapStateLot(handle.getMapState("parked", "vehicle_id string", "row binary"))
        self.catalog = catalog_for(self.cfg)

    def handleInputRows(
        self, key: Any, rows: Iterator[Any], timerValues: TimerValues
    ) -> Iterator[pd.DataFrame]:
        frames = list(rows)
        df = pd.concat(frames, ignore_index=True) if len(frames) > 1 else frames[0]
        yield self._run(df, timerValues.getCurrentWatermarkInMs())

    def handleInitialState(self, key: Any, initialState: Any, timerValues: TimerValues) -> None:
        """A re-bucketed checkpoint's first batch: this bucket's seed state (processor.spark.rebucket);
        `transformWithStateInPandas` hands it over as a pandas DataFrame of one row."""
        row = initialState.iloc[0]
        vehicles, master_blob = bytes(row["vehicles"]), bytes(row["master"])
        master: MasterState = load_state(master_blob)
        digest = _digest(master_blob)
        _MASTER_CACHE.setdefault(digest, master)
        states, held = load_state(vehicles)
        self.vehicles.update((vehicles,))
        self.master.update((master_blob,))
        timer = next_timer_ms(states, held, master, self.catalog, self.cfg)
        if timer > 0:
            self.handle.registerTimer(timer)
        self.meta.update((digest, timer))

    def handleExpiredTimer(
        self, key: Any, timerValues: TimerValues, expiredTimerInfo: ExpiredTimerInfo
    ) -> Iterator[pd.DataFrame]:
        yield self._run(None, timerValues.getCurrentWatermarkInMs())

    def close(self) -> None:
        pass

    # ------------------------------------------------------------------ the work

    @staticmethod
    def _get(state: Any) -> bytes:
        value = state.get()
        assert value is not None, "state checked with exists() first"
        return bytes(value[0])

    def _load_master(self) -> tuple[MasterState, str, int]:
        meta = self.meta.get() if self.meta.exists() else None
        digest, timer_ms = (meta[0], int(meta[1])) if meta else ("", -1)
        return cached_master(digest, lambda: self._get(self.master)), digest, timer_ms

    def _run(self, df: pd.DataFrame | None, watermark_ms: int) -> pd.DataFrame:
        wm = max(int(watermark_ms), 0, self.watermark_floor_ms)
        master, digest, timer_ms = self._load_master()
        vehicles = self._get(self.vehicles) if self.vehicles.exists() else None
        step = bucket_step(
            vehicles, master, digest, df, wm, self.cfg, self.catalog, self.lot, park=self.parking
        )
        if step.master_blob is not None:
            self.master.update((step.master_blob,))
        self.vehicles.update((step.vehicles,))
        if step.next_timer_ms != timer_ms:
            if timer_ms > 0:
                self.handle.deleteTimer(timer_ms)
            if step.next_timer_ms > 0:
                self.handle.registerTimer(step.next_timer_ms)
        self.meta.update((step.digest, step.next_timer_ms))
        return step.out


class MapStateLot:
    """The parking lot of the bucket in hand: the operator's `MapState`, keyed by vehicle.

    Each call is a round trip from the Python worker to the JVM, so the lot is asked only for
    reporters that are not in the blob, and only when it holds anyone (`exists`: one call for the
    whole batch)."""

    def __init__(self, state: Any) -> None:
        self.state = state

    def fetch(self, vehicle_ids: list[str]) -> StateTable:
        if not self.state.exists():
            return StateTable()
        found: list[str] = []
        values: list[bytes] = []
        for v in vehicle_ids:
            value = self.state.getValue((v,))
            if value is not None:
                found.append(v)
                values.append(bytes(value[0]))
                self.state.removeKey((v,))
        return unpack_rows(found, values)

    def park(self, table: StateTable) -> None:
        for v, value in zip(table.ids, pack_rows(table), strict=True):
            self.state.updateValue((v,), (value,))


def catalog_for(cfg: EngineConfig) -> Catalog:
    """This worker's compiled geometry for `cfg` (kept across batches and buckets)."""
    return _CATALOGS.setdefault(cfg, Catalog(cfg))


def cached_master(digest: str, blob: Callable[[], bytes]) -> MasterState:
    """The master data of `digest`, unpickled from `blob()` only when this worker has not seen it."""
    if not digest:
        return MasterState()
    cached = _MASTER_CACHE.get(digest)
    if cached is None:
        cached = load_state(blob())
        _MASTER_CACHE[digest] = cached
    return cached


@dataclass(frozen=True)
class BucketStep:
    """One bucket's batch, whichever Spark state API holds its state: the rows for the sink and
    the state to write back."""

    out: pd.DataFrame
    vehicles: bytes
    master_blob: bytes | None  # the new master blob when this batch changed it, else None
    digest: str
    next_timer_ms: int  # -1: nothing to do until data arrives


def bucket_step(
    vehicles: bytes | None,
    master: MasterState,
    digest: str,
    df: pd.DataFrame | None,
    wm: int,
    cfg: EngineConfig,
    catalog: Catalog,
    lot: ParkingLot | None = None,
    *,
    park: bool = True,
) -> BucketStep:
    """Advance one bucket by a batch of its rows (`df`; None when only its timer fired) at
    watermark `wm`: master events first, dead letters for invalid records, then the engine. With a
    `lot`, the reporters parked there are woken first, and (if `park`) the rows with nothing
    pending parked after; without one, every vehicle stays in the blob.

    Kept apart from the operator so that a Spark state API is a thin adapter around one fold:
    `GeofenceProcessor` keeps three value states, a map state and a timer; an operator under
    `applyInPandasWithState` would keep one row and a timeout and fold exactly this."""
    out: list[OutputRow] = []
    stats = {"received": 0, "invalid": 0, "accepted": 0, "duplicates": 0, "master_events": 0}
    master_blob: bytes | None = None

    if df is not None and len(df):
        m_rows = df[df["kind"] == InputKind.MASTER_EVENT]
        if len(m_rows):
            # Copy before applying: the cached object must keep matching its digest if this
            # batch fails and is retried.
            new_master = load_state(dump_state(master))
            changed = False
            for payload in m_rows.sort_values("kafka_offset")["payload"]:
                changed |= new_master.apply(orjson.loads(payload))
            stats["master_events"] = len(m_rows)
            if changed:
                master_blob = dump_state(new_master)
                digest = _digest(master_blob)
                _MASTER_CACHE[digest] = new_master
                master = new_master
        bad = df[df["kind"] == InputKind.INVALID_RECORD]
        r: Any
        for r in bad.itertuples(index=False):
            out.append(
                OutputRow(
                    OutputKind.DEAD_LETTER,
                    bytes(r.payload or b""),
                    seq=-1,
                    detail=str(r.error),
                    topic=str(r.topic),
                    kafka_partition=int(r.kafka_partition),
                    kafka_offset=int(r.kafka_offset),
                )
            )
        stats["invalid"] = len(bad)
        chunks = df.loc[df["kind"] == InputKind.FIXES, "payload"].tolist()
    else:
        chunks = []

    states, held = load_state(vehicles) if vehicles is not None else (empty_states(), {})
    fx = decode_chunks(chunks)
    stats["received"] = len(fx)
    if lot is not None and len(fx):
        n_before = len(states)
        states = wake(states, lot, fx.vehicle_id)
        stats["woken"] = len(states) - n_before
    res = process_bucket(states, held, master, fx, wm, cfg, catalog)
    kept = res.states
    if lot is not None and park:
        kept, parked = split_parked(res.states, res.held)
        if len(parked):
            lot.park(parked)
        stats["parked"] = len(parked)
    stats["accepted"], stats["duplicates"] = res.accepted, res.dropped_duplicates
    stats["unassigned"] = res.unassigned
    stats["late"] = len(res.late)
    out.extend(late_rows(res.late, wm, cfg.late_bound_ms))
    stats["held"] = sum(len(v) for v in res.held.values())

    for a in res.alerts:
        out.append(OutputRow(OutputKind.ALERT, a.to_json(), vehicle_id=a.vehicle_id, seq=a.seq))
    if res.live:
        # One row for the whole bucket: per-row conversion in the JVM is the cost to avoid.
        out.append(OutputRow(OutputKind.LIVE_STATES, pack_live(res.live), seq=len(res.live)))
    out.append(OutputRow(OutputKind.STATS, orjson.dumps(stats)))
    return BucketStep(
        out=output_frame(out),
        vehicles=dump_state((kept, res.held)),
        master_blob=master_blob,
        digest=digest,
        next_timer_ms=next_timer_ms(kept, res.held, master, catalog, cfg),
    )


def next_timer_ms(
    states: StateTable,
    held: dict[str, list[RawFix]],
    master: MasterState,
    catalog: Catalog,
    cfg: EngineConfig,
) -> int:
    """The next event time at which this bucket has something to do without new data."""
    due: list[int] = []
    if len(states):
        c = states.cols
        active = ~c["silent"] & (c["last_seq"] >= 0)
        if active.any():
            after = silent_after_s(states, master, catalog, cfg)
            due.append(int((c["last_ts_ms"][active] + (after[active] * 1000).astype(np.int64)).min()))
    for waiting in held.values():
        due.extend(f.ts_ms for f in waiting)
    return min(due) if due else -1
