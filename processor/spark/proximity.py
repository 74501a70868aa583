"""Vehicle-to-vehicle proximity on Spark: the two keyed stages of processor.core.proximity as two
chained `transformWithStateInPandas` operators, in event time, their state in the state store.

    fixes (vehicle_id, seq, ts_ms, lat, lon, speed_kmh)
      -> mapInPandas(fan_out_columns: a row per cell it can meet in, plus one clock row per task)
      -> watermark on `ts` -> groupBy(cell) -> CellProcessor (EventTime)      -> meetings
      -> groupBy(a, b)                    -> PairProcessor (EventTime)        -> alert rows

Why the clock rows: Spark drops a stateful operator's input rows whose event time is behind the
watermark, before the operator sees them and without counting them. Data rows carry a null `ts`
(never dropped) and the true event time in `ts_ms`; one clock row per task carries the newest event
time the task saw and moves the watermark. A fix behind the watermark is still met with what its
cells keep (`CellWindow.step` counts it; the counts reach no metric yet: issue #40).

Why a meeting's `ts` may be later than its `ts_ms`: an operator chained before another may not emit
a row older than the watermark, and the next one drops rows at or behind it. A meeting is emitted
just past the watermark when its event time is not, for Spark's bookkeeping; the pair stage reads
`ts_ms`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
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

from fleetfence.contracts import INVALID_ERRORS, alert_json
from processor.core.proximity import (
    CellPosition,
    CellWindow,
    Observation,
    PairEvent,
    PairState,
    Position,
    ProximityRule,
    fan_out_columns,
    pair_expire,
    pair_step,
)
from processor.spark.parse import read_fix
from processor.spark.rows import OUTPUT_DDL, OutputKind, OutputRow, output_frame

CLOCK_CELL = ""  # the key of the clock rows: its operator instance only moves the watermark
_FIX_COLS = ["vehicle_id", "seq", "ts_ms", "lat", "lon", "speed_kmh"]  # `Position`'s fields
FIXES_DDL = "vehicle_id string, seq long, ts_ms long, lat double, lon double, speed_kmh double"
_CELL_COLS = ["cell", "home", "vehicle_id", "seq", "ts", "ts_ms", "lat", "lon", "speed_kmh"]
CELL_ROWS_DDL = (
    "cell string, home string, vehicle_id string, seq long, ts timestamp, ts_ms long, lat double, "
    "lon double, speed_kmh double"
)
# What a meeting row and a pair's state hold of an `Observation` besides its pair and moment, in
# its order (the DDLs below spell their types), and those facts' zero values for a state without one.
_FACTS = [f.name for f in dataclasses.fields(Observation)][3:]
_NO_FACTS = tuple(0.0 if f.type == "float" else 0 for f in dataclasses.fields(Observation)[3:])
# A meeting: `Observation`'s fields, with `ts` for Spark's watermark after `ts_ms`.
_MEETING_COLS = ["a", "b", "ts", "ts_ms", *_FACTS]
MEETINGS_DDL = (
    "a string, b string, ts timestamp, ts_ms long, distance_m double, skew_ms long, reach_m double, "
    "a_seq long, a_lat double, a_lon double, b_seq long, b_lat double, b_lon double"
)
# A pair's state: `PairState`, its `last` meeting's fields after `has_last`, and the timer set.
_PAIR_STATE_DDL = (
    "near_since_ms long, entered boolean, last_ms long, timer_ms long, has_last boolean, "
    "distance_m double, skew_ms long, reach_m double, a_seq long, a_lat double, a_lon double, "
    "b_seq long, b_lat double, b_lon double"
)


def telemetry_fixes(frames: Iterator[pd.DataFrame]) -> Iterator[pd.DataFrame]:
    """The mapInPandas function from the telemetry topic's `value` column to FIXES_DDL: each record
    read as the main job reads it (`read_fix`). A record that is not canonical is skipped here: the
    main job, reading the same topic, dead-letters it and counts it."""
    for df in frames:
        rows: list[tuple[str, int, int, float, float, float]] = []
        for value in df["value"]:
            try:
                f, _received = read_fix(value)
            except INVALID_ERRORS:
                continue
            rows.append((f.vehicle_id, f.seq, f.ts_ms, f.lat, f.lon, f.speed_kmh))
        if rows:
            yield pd.DataFrame(rows, columns=_FIX_COLS)


def cell_rows(rule: ProximityRule) -> Any:
    """The mapInPandas function: each fix as a row per cell it can meet in (`fan_out_columns`), `ts` null,
    and one clock row (`cell` CLOCK_CELL) with the newest event time of what the task read."""
    res = rule.resolution

    def run(frames: Iterator[pd.DataFrame]) -> Iterator[pd.DataFrame]:
        newest = -1
        for df in frames:
            if df.empty:
                continue
            ts_ms = df["ts_ms"].to_numpy(np.int64)
            newest = max(newest, int(ts_ms.max()))
            cols = fan_out_columns(
                df["vehicle_id"].to_numpy(object),
                df["seq"].to_numpy(np.int64),
                ts_ms,
                df["lat"].to_numpy(np.float64),
                df["lon"].to_numpy(np.float64),
                df["speed_kmh"].to_numpy(np.float64),
                res,
            )
            out = pd.DataFrame(cols)
            out.insert(4, "ts", None)  # null: Spark's late filter never drops a data row
            yield out
        if newest >= 0:
            clock = pd.Timestamp(newest, unit="ms", tz="UTC")
            yield pd.DataFrame([(CLOCK_CELL, "", "", 0, clock, newest, 0.0, 0.0, 0.0)], columns=_CELL_COLS)

    return run


def _ts(ms: int) -> pd.Timestamp:
    return pd.Timestamp(ms, unit="ms", tz="UTC")


class CellProcessor(StatefulProcessor):
    """Stage 1, keyed by H3 cell: the cell's `CellWindow` in one value state (the fixes sent here,
    until the watermark passes them by the tolerance), an event-time timer to forget them then."""

    def __init__(self, rule: ProximityRule) -> None:
        self.rule = rule

    def init(self, handle: StatefulProcessorHandle) -> None:
        self.handle = handle
        self.kept = handle.getValueState("kept", "blob binary")
        self.timer = handle.getValueState("timer", "ms long")

    def handleInputRows(
        self, key: Any, rows: Iterator[Any], timerValues: TimerValues
    ) -> Iterator[pd.DataFrame]:
        cell = str(key[0])
        if cell == CLOCK_CELL:
            for _ in rows:
                pass
            return
        wm = max(0, int(timerValues.getCurrentWatermarkInMs()))
        window = self._load()
        arrivals = [
            CellPosition(cell, str(h), Position(str(v), int(q), int(t), float(la), float(lo), float(sp)))
            for df in rows
            for h, v, q, t, la, lo, sp in zip(
                df["home"],
                df["vehicle_id"],
                df["seq"],
                df["ts_ms"],
                df["lat"],
                df["lon"],
                df["speed_kmh"],
                strict=True,
            )
        ]
        step = window.step(arrivals, wm, self.rule.tolerance_ms)
        self._save(window)
        if step.meetings:
            yield meetings_frame(step.meetings, wm)

    def handleExpiredTimer(
        self, key: Any, timerValues: TimerValues, expiredTimerInfo: ExpiredTimerInfo
    ) -> Iterator[pd.DataFrame]:
        window = self._load()
        window.evict(int(timerValues.getCurrentWatermarkInMs()) - self.rule.tolerance_ms)
        self.timer.clear()  # the timer that fired is gone
        self._save(window)
        return iter(())

    def _load(self) -> CellWindow:
        if not self.kept.exists():
            return CellWindow()
        value = self.kept.get()
        assert value is not None
        window = CellWindow()
        for c, h, v, q, t, la, lo, sp in orjson.loads(bytes(value[0])):
            window.kept.setdefault(v, []).append(CellPosition(c, h, Position(v, q, t, la, lo, sp)))
        return window

    def _save(self, window: CellWindow) -> None:
        old = int(self.timer.get()[0]) if self.timer.exists() else -1  # type: ignore[index]
        due = window.expires_ms(self.rule.tolerance_ms)
        new = -1 if due is None else due + 1  # past it: the watermark then evicts every fix kept
        if new != old:
            if old >= 0:
                self.handle.deleteTimer(old)
            if new >= 0:
                self.handle.registerTimer(new)
                self.timer.update((new,))
            else:
                self.timer.clear()
        if not window.kept:
            self.kept.clear()
            return
        blob = orjson.dumps(
            [
                [
                    cf.cell,
                    cf.home,
                    cf.position.vehicle_id,
                    cf.position.seq,
                    cf.position.ts_ms,
                    cf.position.lat,
                    cf.position.lon,
                    cf.position.speed_kmh,
                ]
                for fs in window.kept.values()
                for cf in fs
            ]
        )
        self.kept.update((blob,))

    def close(self) -> None:
        pass


def _facts(o: Observation) -> tuple[Any, ...]:
    return tuple(getattr(o, f) for f in _FACTS)


def meetings_frame(meetings: list[Observation], watermark_ms: int) -> pd.DataFrame:
    return pd.DataFrame(
        [(o.a, o.b, _ts(max(o.ts_ms, watermark_ms + 1)), o.ts_ms, *_facts(o)) for o in meetings],
        columns=_MEETING_COLS,
    )


class PairProcessor(StatefulProcessor):
    """Stage 2, keyed by the pair (a, b): its `PairState` in one value state and an event-time timer
    at `PairState.keep_until_ms` (the lost deadline while a meeting is open); the state goes once the
    watermark has passed its latest meeting with nothing open. Emits the alert rows of the job's
    sink (processor.spark.rows.OUTPUT_DDL): two per event, one per vehicle (`PairEvent.alerts`)."""

    def __init__(self, rule: ProximityRule) -> None:
        self.rule = rule

    def init(self, handle: StatefulProcessorHandle) -> None:
        self.handle = handle
        self.pair = handle.getValueState("pair", _PAIR_STATE_DDL)

    def handleInputRows(
        self, key: Any, rows: Iterator[Any], timerValues: TimerValues
    ) -> Iterator[pd.DataFrame]:
        a, b = str(key[0]), str(key[1])
        state, timer = self._load(a, b)
        # `tolist`: Python ints and floats, as the alert records' JSON needs them.
        meetings = [
            Observation(a, b, *row)
            for df in rows
            for row in zip(*(df[c].tolist() for c in ["ts_ms", *_FACTS]), strict=True)
        ]
        state, events, _late = pair_step(state, meetings, self.rule)
        self._save(state, timer, int(timerValues.getCurrentWatermarkInMs()))
        if events:
            yield alert_frame(events)

    def handleExpiredTimer(
        self, key: Any, timerValues: TimerValues, expiredTimerInfo: ExpiredTimerInfo
    ) -> Iterator[pd.DataFrame]:
        a, b = str(key[0]), str(key[1])
        wm = int(timerValues.getCurrentWatermarkInMs())
        state, _timer = self._load(a, b)
        state, events = pair_expire(state, wm, self.rule)
        self._save(state, -1, wm)  # the timer that fired is gone
        if events:
            yield alert_frame(events)

    def _load(self, a: str, b: str) -> tuple[PairState, int]:
        if not self.pair.exists():
            return PairState(), -1
        v = self.pair.get()
        assert v is not None
        near_since, entered, last_ms, timer, has_last = (
            int(v[0]),
            bool(v[1]),
            int(v[2]),
            int(v[3]),
            bool(v[4]),
        )
        last = Observation(a, b, last_ms, *v[5 : 5 + len(_FACTS)]) if has_last else None
        return PairState(near_since, entered, last_ms, last), timer

    def _save(self, state: PairState, timer: int, watermark_ms: int) -> None:
        until = state.keep_until_ms(self.rule)
        if until is not None and state.empty and until <= watermark_ms:
            until = None  # nothing open, and no meeting older than the latest can come (keep_until_ms)
        new = -1 if until is None else until
        if new != timer:
            if timer >= 0:
                self.handle.deleteTimer(timer)
            if new >= 0:
                self.handle.registerTimer(new)
        if until is None:
            self.pair.clear()
            return
        o = state.last
        last = (False, *_NO_FACTS) if o is None else (True, *_facts(o))
        self.pair.update((state.near_since_ms, state.entered, state.last_ms, new, *last))

    def close(self) -> None:
        pass


def alert_frame(events: list[PairEvent]) -> pd.DataFrame:
    """The events' alerts as the sink's rows: two per event, one per vehicle."""
    return output_frame(
        [
            OutputRow(OutputKind.ALERT, alert_json(r), vehicle_id=r["vehicle_id"], seq=r["seq"])
            for e in events
            for r in e.alerts()
        ]
    )


def proximity_alerts(fixes: Any, rule: ProximityRule, lateness_ms: int) -> Any:
    """The streaming DataFrame of a rule's alert rows (processor.spark.rows.OUTPUT_DDL, for the
    job's exactly-once sink) from a streaming DataFrame of fixes (FIXES_DDL); `lateness_ms` is the
    watermark's delay behind the newest event time."""
    cells = fixes.mapInPandas(cell_rows(rule), CELL_ROWS_DDL).withWatermark(
        "ts", f"{lateness_ms} milliseconds"
    )
    meetings = cells.groupBy("cell").transformWithStateInPandas(
        statefulProcessor=CellProcessor(rule),
        outputStructType=MEETINGS_DDL,
        outputMode="Append",
        timeMode="EventTime",
        eventTimeColumnName="ts",
    )
    return meetings.groupBy("a", "b").transformWithStateInPandas(
        statefulProcessor=PairProcessor(rule),
        outputStructType=OUTPUT_DDL,
        outputMode="Append",
        timeMode="EventTime",
    )
