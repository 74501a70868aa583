"""Vehicle-to-vehicle proximity on Spark: the two stages of processor.core.proximity as two chained
`transformWithStateInPandas` operators keyed by bucket, in event time, their state in the state store.

    fixes (vehicle_id, seq, ts_ms, lat, lon, speed_kmh)
      -> mapInPandas(bucket_fan_out: a row per bucket of cells it can meet in, one clock row a task)
      + master data (vehicles and assignments: a row per bucket, `master_rows`)
      -> watermark on `ts` -> groupBy(bucket) -> CellProcessor (EventTime)    -> meetings, by rule
      -> bucket of the rule and pair -> groupBy(bucket) -> PairProcessor (EventTime) -> alert rows

Every rule of the query (`fleetfence.rules.ProximityRule`, each for the fleet, a route or a fleet
group) runs in the same two operators: a bucket of cells keeps a window per rule, admitting the fixes
of the vehicles in the rule's scope (processor.core.proximity_members, from the vehicle master's
events, which every bucket of cells folds); a bucket of pairs keeps each rule's pairs.

Why buckets: a state key costs a round trip to the state server and a Python call a batch, and a
batch touches thousands of cells and pairs (docs/benchmarks.md, "Proximity in the job"). A bucket's
state is one Arrow IPC blob (its cells' fixes, or its pairs' states) and its work is done
in columns. The buckets' keys are the job's kind of layout (processor.spark.layout), recorded in the
proximity checkpoint: the state of a bucket holds its cells' fixes, so the count is fixed for it.

Why the clock rows: Spark drops a stateful operator's input rows whose event time is behind the
watermark, before the operator sees them and without counting them. Data rows carry a null `ts`
(never dropped) and the true event time in `ts_ms`; one clock row per task carries the newest event
time the task saw and moves the watermark. A fix behind the watermark is still met with what its
bucket keeps (`CellWindow.step` counts it; the counts reach the commit markers: `ProximityCount`).

Why a meeting's `ts` may be later than its `ts_ms`: an operator chained before another may not emit
a row older than the watermark, and the next one drops rows at or behind it. A meeting is emitted
just past the watermark when its event time is not, for Spark's bookkeeping; the pair stage reads
`ts_ms`.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Iterator
from typing import Any

import numpy as np
import orjson
import pandas as pd
import pyarrow as pa
from pyspark.sql.streaming.stateful_processor import (
    ExpiredTimerInfo,
    StatefulProcessor,
    StatefulProcessorHandle,
    TimerValues,
)

from fleetfence.contracts import INVALID_ERRORS, alert_json
from fleetfence.rules import ProximityRule
from processor.core.codec import dump_state, load_state
from processor.core.proximity import (
    MEETING_FIELDS,
    CellStep,
    HomedFixes,
    Meetings,
    Observation,
    PairEvent,
    PairState,
    ProximityCount,
    RuleCells,
    RulePairs,
    bucket_fan_out,
    rules_resolution,
)
from processor.core.proximity_members import Members, scope_event
from processor.spark.parse import read_fix
from processor.spark.rows import OUTPUT_DDL, OutputKind, OutputRow, output_frame

CLOCK_KEY = -1  # the key of the clock rows: its operator instance only moves the watermark
_FIX_COLS = ["vehicle_id", "seq", "ts_ms", "lat", "lon", "speed_kmh"]  # `Position`'s fields
FIXES_DDL = "vehicle_id string, seq long, ts_ms long, lat double, lon double, speed_kmh double"
# A fix at a bucket of cells; or a master event (`master`: the record's value, the rest empty).
_CELL_COLS = ["bucket", "home", "vehicle_id", "seq", "ts", "ts_ms", "lat", "lon", "speed_kmh", "master"]
CELL_ROWS_DDL = (
    "bucket int, home long, vehicle_id string, seq long, ts timestamp, ts_ms long, lat double, "
    "lon double, speed_kmh double, master binary"
)
# A meeting: its rule's id, then `Observation`'s fields (MEETING_FIELDS), with `ts` for Spark's
# watermark after `ts_ms`.
_MEETING_COLS = ["rule", *MEETING_FIELDS[:3], "ts", *MEETING_FIELDS[3:]]
# Then a bucket's counts (`CellStep`): zero in a meeting's row; a counts row has empty vehicles
# (no vehicle id is empty), one per bucket and batch that counted something.
_COUNT_COLS = ["repeated", "behind_watermark"]
MEETINGS_DDL = (
    "rule string, a string, b string, ts_ms long, ts timestamp, distance_m double, skew_ms long, "
    "reach_m double, a_seq long, a_lat double, a_lon double, b_seq long, b_lat double, b_lon double, "
    "repeated long, behind_watermark long"
)
# A pair's state: `PairState` without its `last` meeting, then that meeting's fields (`has_last`).
_PAIR_COLS = ["rule", "a", "b", "near_since_ms", "entered", "last_ms", "has_last", *MEETING_FIELDS[3:]]
# The placeholder of a state without a meeting (never read), in the facts' types.
_NO_FACTS = [0.0 if f.type == "float" else 0 for f in dataclasses.fields(Observation)[3:]]


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


def cell_rows(resolution: int, keys: list[int]) -> Any:
    """The mapInPandas function: each fix as a row per bucket of cells it can meet in
    (`bucket_fan_out` at the query's `resolution`, the bucket's state key from `keys`), `ts` null,
    and one clock row (`bucket` CLOCK_KEY) with the newest event time of what the task read."""
    res = resolution
    key_of = np.asarray(keys, np.int32)

    def run(frames: Iterator[pd.DataFrame]) -> Iterator[pd.DataFrame]:
        newest = -1
        for df in frames:
            if df.empty:
                continue
            fixes = HomedFixes.located(df, res)
            newest = max(newest, int(fixes.ts_ms.max()))
            rows, bucket = bucket_fan_out(fixes.home, res, len(keys))
            out = pd.DataFrame(fixes.take(rows).columns())
            out.insert(0, "bucket", key_of[bucket])
            out.insert(4, "ts", pd.Series([None] * len(out), dtype="datetime64[us, UTC]"))
            out["master"] = None
            yield out[_CELL_COLS]  # null `ts`: Spark's late filter never drops a data row
        if newest >= 0:
            clock = pd.DataFrame(
                [(CLOCK_KEY, 0, "", 0, None, newest, 0.0, 0.0, 0.0, None)], columns=_CELL_COLS
            )
            clock["ts"] = _timestamps(clock["ts_ms"].to_numpy())
            yield clock

    return run


def master_rows(keys: list[int]) -> Any:
    """The mapInPandas function from the master topic's `value` column to CELL_ROWS_DDL: each
    vehicle or assignment event once per bucket of cells (a vehicle's fixes may reach any of them);
    routes and zones, which no scope reads, are left out. No clock row: master data has no event
    time, and its null `ts` is never dropped."""

    def run(frames: Iterator[pd.DataFrame]) -> Iterator[pd.DataFrame]:
        for df in frames:
            values = [v for v in df["value"] if v is not None and _scope_event(v)]
            if not values:
                continue
            n = len(values)
            yield pd.DataFrame(
                {
                    "bucket": np.repeat(np.asarray(keys, np.int32), n),
                    "home": 0,
                    "vehicle_id": "",
                    "seq": 0,
                    "ts": pd.Series([None] * (n * len(keys)), dtype="datetime64[us, UTC]"),
                    "ts_ms": 0,
                    "lat": 0.0,
                    "lon": 0.0,
                    "speed_kmh": 0.0,
                    "master": values * len(keys),
                }
            )[_CELL_COLS]

    return run


def _scope_event(value: bytes) -> bool:
    """Whether a master record is a vehicle's or an assignment's change event (`scope_event`); a
    record that is not is left to the job, which logs it."""
    try:
        return scope_event(orjson.loads(value))
    except orjson.JSONDecodeError:
        return False


# The latest `ts` a row for the next operator may carry: PySpark hands timestamps to pandas in
# nanoseconds, which end in 2262; the contracts accept event times to 2**53 ms. The stages read
# `ts_ms`; `ts` only moves Spark's watermark, which a far-future fix then moves to this cap.
_TS_CAP_MS = int(pd.Timestamp.max.value // 1_000_000) - 1


def _timestamps(ms: np.ndarray) -> pd.Series:
    """Event times (epoch ms) as Spark's timestamps (microseconds), capped at _TS_CAP_MS."""
    capped = np.minimum(np.asarray(ms, np.int64), _TS_CAP_MS)
    return pd.Series(capped.astype("datetime64[ms]").astype("datetime64[us]")).dt.tz_localize("UTC")


def _blob(columns: dict[str, Any]) -> bytes:
    """Columns as one Arrow IPC stream: a bucket's state in one value."""
    table = pa.table(columns)
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return bytes(sink.getvalue().to_pybytes())


def _columns(blob: bytes) -> dict[str, np.ndarray]:
    table = pa.ipc.open_stream(blob).read_all()
    return {n: table.column(n).to_numpy(zero_copy_only=False) for n in table.column_names}


class _Timer:
    """A bucket's one event-time timer, its time kept in a value state (Spark lists timers, but
    one read is cheaper than listing)."""

    def __init__(self, handle: StatefulProcessorHandle) -> None:
        self.handle = handle
        self.state = handle.getValueState("timer", "ms long")

    def set(self, due_ms: int | None, fired: bool = False) -> None:
        """Move the timer to `due_ms` (None: none); `fired`: the one set has just fired (Spark
        dropped it: not deleted again, and its time not kept)."""
        old = int(self.state.get()[0]) if self.state.exists() else -1  # type: ignore[index]
        new = -1 if due_ms is None else due_ms
        if new == old and not fired:
            return
        if old >= 0 and not fired:
            self.handle.deleteTimer(old)
        if new >= 0:
            self.handle.registerTimer(new)
            self.state.update((new,))
        else:
            self.state.clear()


class CellProcessor(StatefulProcessor):
    """Stage 1, keyed by bucket of cells: the bucket's `RuleCells` (each rule's fixes, until the
    watermark passes them by its tolerance) in one value state with an event-time timer to forget
    them, and the vehicle master's vehicles and assignments (`Members`) in another, read only when
    a rule has a scope or master data arrives."""

    def __init__(self, rules: tuple[ProximityRule, ...], keys: list[int]) -> None:
        self.rules = rules
        self.keys = keys
        self.resolution = rules_resolution(rules)
        self.scoped = any(not r.scope.fleet for r in rules)

    def init(self, handle: StatefulProcessorHandle) -> None:
        self.kept = handle.getValueState("kept", "blob binary")
        self.members = handle.getValueState("members", "blob binary")
        self.members_digest = handle.getValueState("members_digest", "digest string")
        self.timer = _Timer(handle)

    def handleInputRows(
        self, key: Any, rows: Iterator[Any], timerValues: TimerValues
    ) -> Iterator[pd.DataFrame]:
        if int(key[0]) == CLOCK_KEY:
            for _ in rows:
                pass
            return
        wm = max(0, int(timerValues.getCurrentWatermarkInMs()))
        df = pd.concat(list(rows), ignore_index=True)
        is_master = df["master"].notna().to_numpy()
        events = [orjson.loads(bytes(v)) for v in df["master"][is_master]] if is_master.any() else []
        members = self._members(events) if (events or self.scoped) else Members()
        if is_master.all():
            return
        cells = self._load(int(key[0]))
        arrivals = HomedFixes.from_columns(df[~is_master])
        steps = cells.step(arrivals, wm, members)
        self._save(cells)
        frame = meetings_frame(steps, wm)
        if len(frame):
            yield frame

    def handleExpiredTimer(
        self, key: Any, timerValues: TimerValues, expiredTimerInfo: ExpiredTimerInfo
    ) -> Iterator[pd.DataFrame]:
        cells = self._load(int(key[0]))
        cells.evict(int(timerValues.getCurrentWatermarkInMs()))
        self._save(cells, fired=True)
        return iter(())

    def _members(self, events: list[dict[str, Any]]) -> Members:
        """The bucket's master data, with `events` folded in (and saved when they changed it); decoded
        once per worker and version of it (`_MEMBERS`: every bucket holds the same)."""
        digest = str(self.members_digest.get()[0]) if self.members_digest.exists() else ""  # type: ignore[index]
        members = _MEMBERS.get(digest) if digest else Members()
        if members is None:
            value = self.members.get()
            assert value is not None, "a digest is saved with its blob"
            members = Members(load_state(bytes(value[0])))
            _MEMBERS[digest] = members
        if not events:
            return members
        changed = Members(load_state(dump_state(members.master)))  # the cached one stays as it was
        if not changed.apply_all(events):
            return members
        blob = dump_state(changed.master)
        digest = hashlib.blake2b(blob, digest_size=16).hexdigest()
        if len(_MEMBERS) >= _MEMBERS_KEPT:
            del _MEMBERS[next(iter(_MEMBERS))]
        _MEMBERS[digest] = changed
        self.members.update((blob,))
        self.members_digest.update((digest,))
        return changed

    def _load(self, key: int) -> RuleCells:
        cells = RuleCells(self.rules, self.resolution, self.keys.index(key), len(self.keys))
        if self.kept.exists():
            value = self.kept.get()
            assert value is not None
            cols = _columns(bytes(value[0]))
            cells.restore(np.asarray(cols.pop("rule"), object), HomedFixes.from_columns(cols))
        return cells

    def _save(self, cells: RuleCells, fired: bool = False) -> None:
        due = cells.expires_ms()
        self.timer.set(None if due is None else due + 1, fired)  # past it, every fix kept goes
        rule_ids, kept = cells.kept()
        if len(kept):
            self.kept.update((_blob({"rule": rule_ids, **kept.columns()}),))
        else:
            self.kept.clear()

    def close(self) -> None:
        pass


# A worker's decoded master data, by digest: every bucket of cells folds the same events, so a
# worker decodes each version once whichever buckets it runs.
_MEMBERS: dict[str, Members] = {}
_MEMBERS_KEPT = 64  # versions kept (buckets may fold one batch's events in different orders)


def meetings_frame(steps: list[tuple[str, CellStep]], watermark_ms: int) -> pd.DataFrame:
    """A bucket's meetings as rows, each with its rule's id, and the counts of all its rules' windows
    in a row of their own when they counted any (each fix counted once per rule it is compared under)."""
    parts = []
    for rule_id, step in steps:
        df = pd.DataFrame(step.meetings.columns())
        df.insert(0, "rule", rule_id)
        df.insert(4, "ts", _timestamps(np.maximum(step.meetings.ts_ms, watermark_ms + 1)))
        parts.append(df)
    df = pd.concat(parts, ignore_index=True)  # a part per rule, empty ones too: the columns' types
    df["repeated"] = 0
    df["behind_watermark"] = 0
    duplicates = sum(st.duplicates for _, st in steps)
    behind = sum(st.behind_watermark for _, st in steps)
    if duplicates or behind:
        counts = dict.fromkeys(df.columns, 0) | {"rule": "", "a": "", "b": "", "ts_ms": watermark_ms + 1}
        counts |= {"repeated": duplicates, "behind_watermark": behind}
        row = pd.DataFrame([counts]).astype(df.dtypes.drop("ts").to_dict())  # a meeting's types
        row["ts"] = _timestamps(row["ts_ms"].to_numpy())
        df = pd.concat([df, row], ignore_index=True)
    return df[[*_MEETING_COLS, *_COUNT_COLS]]


class PairProcessor(StatefulProcessor):
    """Stage 2, keyed by bucket of pairs: its pairs' `PairState`s under every rule (`RulePairs`) in
    one value state, one event-time timer at the earliest `PairState.keep_until_ms` (a lost deadline
    while a meeting is open); `RulePairs.step` folds a batch, `RulePairs.expire` the timer's. Emits
    the alert rows of the job's sink (processor.spark.rows.OUTPUT_DDL): two per event, one per
    vehicle (`PairEvent.alerts`)."""

    def __init__(self, rules: tuple[ProximityRule, ...]) -> None:
        self.rules = rules

    def init(self, handle: StatefulProcessorHandle) -> None:
        self.pairs = handle.getValueState("pairs", "blob binary")
        self.timer = _Timer(handle)

    def handleInputRows(
        self, key: Any, rows: Iterator[Any], timerValues: TimerValues
    ) -> Iterator[pd.DataFrame]:
        wm = int(timerValues.getCurrentWatermarkInMs())
        pairs = self._load()
        df = pd.concat(list(rows), ignore_index=True)
        counted = (df["a"] == "").to_numpy()
        met = df[~counted]
        meetings = Meetings(*(met[f].to_numpy() for f in MEETING_FIELDS))
        events, late = pairs.step(meetings, met["rule"].to_numpy(object), wm)
        self._save(pairs)
        counts = {
            ProximityCount.REPEATED: int(df["repeated"].sum()),
            ProximityCount.BEHIND_WATERMARK: int(df["behind_watermark"].sum()),
            ProximityCount.LATE_MEETINGS: late,
        }
        if events or any(counts.values()):
            yield alert_frame(events, counts)

    def handleExpiredTimer(
        self, key: Any, timerValues: TimerValues, expiredTimerInfo: ExpiredTimerInfo
    ) -> Iterator[pd.DataFrame]:
        pairs = self._load()
        events = pairs.expire(int(timerValues.getCurrentWatermarkInMs()))
        self._save(pairs, fired=True)
        if events:
            yield alert_frame(events)

    def _load(self) -> RulePairs:
        states: dict[str, dict[tuple[str, str], PairState]] = {}
        if self.pairs.exists():
            value = self.pairs.get()
            assert value is not None
            cols = _columns(bytes(value[0]))
            # `tolist`: Python ints and floats, as the alert records' JSON needs them.
            for rule, a, b, since, entered, last_ms, has_last, *facts in zip(
                *(cols[c].tolist() for c in _PAIR_COLS), strict=True
            ):
                last = Observation(a, b, last_ms, *facts) if has_last else None
                states.setdefault(rule, {})[(a, b)] = PairState(since, entered, last_ms, last)
        return RulePairs(self.rules, states)

    def _save(self, pairs: RulePairs, fired: bool = False) -> None:
        self.timer.set(pairs.due_ms(), fired)
        rows = []
        for rule, states in pairs.states.items():
            for (a, b), s in states.items():
                o = s.last
                facts = [getattr(o, f) for f in MEETING_FIELDS[3:]] if o else _NO_FACTS
                rows.append((rule, a, b, s.near_since_ms, s.entered, s.last_ms, o is not None, *facts))
        if not rows:
            self.pairs.clear()
            return
        self.pairs.update((_blob(dict(zip(_PAIR_COLS, map(list, zip(*rows, strict=True)), strict=True))),))

    def close(self) -> None:
        pass


def alert_frame(events: list[PairEvent], counts: dict[ProximityCount, int] | None = None) -> pd.DataFrame:
    """The events' alerts as the sink's rows: two per event, one per vehicle; and the stages' counts
    (summed into the batch's commit marker by the sink) when any is not zero."""
    rows = [
        OutputRow(OutputKind.ALERT, alert_json(r), vehicle_id=r["vehicle_id"], seq=r["seq"])
        for e in events
        for r in e.alerts()
    ]
    if counts and any(counts.values()):
        rows.append(OutputRow(OutputKind.STATS, orjson.dumps({str(k): v for k, v in counts.items()})))
    return output_frame(rows)


def proximity_alerts(
    fixes: Any, master: Any, rules: tuple[ProximityRule, ...], lateness_ms: int, keys: list[int]
) -> Any:
    """The streaming DataFrame of the rules' alert rows (processor.spark.rows.OUTPUT_DDL, for the
    job's exactly-once sink) from a streaming DataFrame of fixes (FIXES_DDL) and one of the master
    topic's records (`value`); `lateness_ms` is the watermark's delay behind the newest event time;
    `keys` the buckets' state keys (both stages)."""
    from pyspark.sql import functions as F

    cells = (
        fixes.mapInPandas(cell_rows(rules_resolution(rules), keys), CELL_ROWS_DDL)
        .unionByName(master.mapInPandas(master_rows(keys), CELL_ROWS_DDL))
        .withWatermark("ts", f"{lateness_ms} milliseconds")
    )
    meetings = cells.groupBy("bucket").transformWithStateInPandas(
        statefulProcessor=CellProcessor(rules, keys),
        outputStructType=MEETINGS_DDL,
        outputMode="Append",
        timeMode="EventTime",
        eventTimeColumnName="ts",
    )
    # A pair's bucket: Spark's own hash of the rule and the pair (stable: its hash partitioning
    # rests on it).
    index = F.pmod(F.hash("rule", "a", "b"), F.lit(len(keys))) + 1
    by_pair = meetings.withColumn("bucket", F.element_at(F.array(*map(F.lit, keys)), index.cast("int")))
    return by_pair.groupBy("bucket").transformWithStateInPandas(
        statefulProcessor=PairProcessor(rules),
        outputStructType=OUTPUT_DDL,
        outputMode="Append",
        timeMode="EventTime",
    )
