"""Vehicle-to-vehicle proximity in event time: which pairs of vehicles come near each other and part.

Every other check is keyed by one vehicle; a pair has two, and comparing every vehicle with every
other costs n² per fix. H3 cells make it local. With cells whose average edge is at least four times
the largest exit distance of the rules (`resolution_for`, `rules_resolution`), two vehicles within a
rule's exit distance have their home cells
equal or neighbouring: hexagons that are not neighbours are at least one edge apart, and H3's edges
stay within about a factor of two of their average. So the work splits into two keyed stages that a
streaming engine can shard and checkpoint, each a pure function of its state and its input here:

1. the cells (`CellWindow`): a meeting of two fixes is reported at the smaller of their two home
   cells (`reports`), so a fix is needed at its home cell and at the neighbours below it. Cells are
   grouped into buckets (`cell_buckets`, by their parent cell: neighbours mostly share one) and a
   bucket is the engine's key: a fix goes to each bucket holding one of those cells
   (`bucket_fan_out`, one or two for most fixes). A bucket keeps the fixes it was sent for
   `tolerance_ms` of event time past the watermark, and reports a meeting for every two fixes of two
   vehicles within the tolerance of each other, as a join on the reporting cell in columns
   (`Meetings`): each pair of fixes is one meeting, whichever order and batches they come in. A key
   per cell would cost a state round trip per cell a batch; a bucket costs one.
2. the pairs (`PairState`, `pair_step`), also bucketed (`pairs_step`): the pair's hysteresis.
   PROXIMITY_ENTER once the vehicles stayed within `enter_m` for `min_duration_ms`; PROXIMITY_EXIT
   once they are more than `exit_m` apart (larger, so GPS jitter at the boundary does not flap), or
   once no meeting was seen for `lost_after_ms` (a vehicle went silent or drove out of every shared
   cell): an event-time deadline (`PairState.deadline_ms`), which a timer keeps even when nothing
   arrives, and which a meeting after the gap also applies (the pair was lost in between, however
   the batches fell). Only pairs with a state or a meeting within `enter_m` are used (`_usable`):
   the far meetings of everyone else are dropped in columns; an entered pair that stays near is
   moved on in columns too (`_entered_and_held`), and the rest go through `pair_step`.

The pair is ordered (`pair_key`), so both vehicles' fixes drive one state and one alert id, whichever
of them reported. A pair with nothing open keeps only its latest meeting's time, until the
watermark passes it by the tolerance (`PairState.keep_until_ms`): the state is bounded by the pairs
near now, not by every pair that ever met.

Several rules run at once (each for the fleet, a route or a fleet group: `ProximityRule.scope`): a
bucket of cells keeps a window per rule (`RuleCells`), which admits the fixes of the vehicles in the
rule's scope (processor.core.proximity_members) and meets them with the rule's tolerance and watch
distance; a bucket of pairs keeps each rule's pairs (`RulePairs`). Both stages above are then the
same functions, rule by rule.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Container, Iterable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

import h3
import numpy as np
import pandas as pd
from h3.api import basic_int as h3i

from fleetfence.contracts import AlertRecord, AlertType, ProximityExitReason, alert_record
from fleetfence.geo import haversine_m
from fleetfence.rules import ProximityRule, proximity_rule_set
from processor.core.proximity_members import Members
from processor.core.zones import h3_cells_int

# The finest H3 resolution used: cells of about 29 m average edge (resolution 11).
_FINEST = 11
# A reported speed above this is taken as this for how far a vehicle may have driven between two
# fixes (`Observation.reach_m`): no fleet vehicle is faster, and a wild value must not make a pair
# look near for ever.
MAX_SPEED_KMH = 300.0
# How many average edges a cell's edge spans at least the exit distance by (see the module's
# docstring: a factor of two for H3's distortion, two more of margin).
EDGE_FACTOR = 4.0


@functools.cache
def resolution_for(exit_m: float) -> int:
    """The finest H3 resolution whose average edge is at least EDGE_FACTOR times `exit_m`."""
    for res in range(_FINEST, -1, -1):
        if h3.average_hexagon_edge_length(res, "m") >= EDGE_FACTOR * exit_m:
            return res
    raise ValueError(f"no H3 resolution has cells large enough for {exit_m} m")


@dataclass(frozen=True, slots=True)
class Position:
    """A fix as the proximity stages need it: the wire's fields in their order, no more
    (tests/processor/test_fix_records.py)."""

    vehicle_id: str
    seq: int  # the fix's, for its alert's id
    ts_ms: int
    lat: float
    lon: float
    speed_kmh: float  # how far the vehicle may have moved before the other's fix (`Observation`)


def pair_key(a: str, b: str) -> tuple[str, str]:
    """The pair in one order, so either vehicle's report reaches the same state."""
    return (a, b) if a < b else (b, a)


@dataclass(frozen=True, slots=True)
class Observation:
    """Two vehicles' fixes within the tolerance of each other: how far apart, and when (the later
    of the two event times: the moment both positions were known). Fixes of a moving pair taken
    at different moments are further apart than the vehicles ever were (at 30 m/s, fixes 1.5 s
    apart put a convoy 45 m apart along its road), so the meeting keeps how far apart in time
    (`skew_ms`) and how far the earlier fix's vehicle may have driven since, at its speed
    (`reach_m`): the pair stage judges `gap_m`, the least the vehicles can have been apart at the
    later moment. `a` < `b`; each vehicle's fix (seq, where) is kept: its alert is raised there."""

    a: str
    b: str
    ts_ms: int
    distance_m: float
    skew_ms: int
    reach_m: float
    a_seq: int
    a_lat: float
    a_lon: float
    b_seq: int
    b_lat: float
    b_lon: float

    @property
    def gap_m(self) -> float:
        return max(0.0, self.distance_m - self.reach_m)


@dataclass(frozen=True, slots=True)
class HomedFixes:
    """Fixes as columns (`Position`'s fields), each with its home cell: the H3 cell of the rules'
    resolution (`rules_resolution`) it lies in, as an integer (every H3 index is below 2**63, and
    at one resolution the integers order as the cells' names do)."""

    vehicle_id: np.ndarray  # object (str)
    seq: np.ndarray  # int64
    ts_ms: np.ndarray  # int64
    lat: np.ndarray  # float64
    lon: np.ndarray  # float64
    speed_kmh: np.ndarray  # float64
    home: np.ndarray  # int64

    @staticmethod
    def located(columns: Mapping[str, Any] | pd.DataFrame, resolution: int) -> HomedFixes:
        """Fixes from columns named as `Position`'s fields, their home cells in one native call
        (`h3_cells_int`)."""
        lat = np.asarray(columns["lat"], np.float64)
        lon = np.asarray(columns["lon"], np.float64)
        home = h3_cells_int(lat, lon, resolution).astype(np.int64)
        return HomedFixes.from_columns({**{f: columns[f] for f in _POSITION_FIELDS}, "home": home})

    @staticmethod
    def from_columns(columns: Mapping[str, Any] | pd.DataFrame) -> HomedFixes:
        """Fixes from columns named as its fields (a frame, a state's table), in their types."""
        return HomedFixes(*(np.asarray(columns[f], dtype=t) for f, t in _FIXES_TYPES.items()))

    @staticmethod
    def from_positions(positions: Iterable[Position], resolution: int) -> HomedFixes:
        ps = list(positions)
        return HomedFixes.located({f: [getattr(p, f) for p in ps] for f in _POSITION_FIELDS}, resolution)

    @staticmethod
    def empty() -> HomedFixes:
        return HomedFixes.from_columns({f: [] for f in _FIXES_FIELDS})

    def __len__(self) -> int:
        return len(self.ts_ms)

    def columns(self) -> dict[str, np.ndarray]:
        return {f: getattr(self, f) for f in _FIXES_FIELDS}

    def take(self, index: np.ndarray) -> HomedFixes:
        return HomedFixes(*(getattr(self, f)[index] for f in _FIXES_FIELDS))

    def concat(self, other: HomedFixes) -> HomedFixes:
        return HomedFixes(*(np.concatenate([getattr(self, f), getattr(other, f)]) for f in _FIXES_FIELDS))


_POSITION_FIELDS = tuple(f.name for f in dataclasses.fields(Position))
_FIXES_FIELDS = tuple(f.name for f in dataclasses.fields(HomedFixes))
_F8, _I8 = np.float64, np.int64
_FIXES_TYPES = dict(zip(_FIXES_FIELDS, (object, _I8, _I8, _F8, _F8, _F8, _I8), strict=True))
_MIX = np.uint64(0x9E3779B97F4A7C15)  # Fibonacci hashing's multiplier
_MAX_SPAN_MS = 1 << 36  # about two years of event time: the time part of `_expand`'s keys


def cell_buckets(cells: np.ndarray, resolution: int, buckets: int) -> np.ndarray:
    """The bucket (0 .. buckets-1) each cell's meetings are found in: a hash of the cell's parent one
    resolution coarser (its index with its last digit dropped), so that a cell's neighbours mostly
    share its bucket and a fix is sent to few. Part of a checkpoint's identity: the state of a bucket
    holds its cells' fixes."""
    shift = np.uint64(3 * min(15, 16 - resolution))
    with np.errstate(over="ignore"):
        mixed = (np.asarray(cells).astype(np.uint64) >> shift) * _MIX
    return ((mixed >> np.uint64(32)) % np.uint64(buckets)).astype(np.int64)


@functools.lru_cache(maxsize=1 << 16)
def _reporting_cells(home: int) -> tuple[int, ...]:
    """The cells that may report a meeting of a fix homed in `home` (`reports`): itself and the
    neighbours below it."""
    return tuple(sorted(c for c in h3i.grid_disk(home, 1) if c <= home))


@functools.lru_cache(maxsize=1 << 16)
def _home_buckets(home: int, resolution: int, buckets: int) -> tuple[int, ...]:
    cells = np.array(_reporting_cells(home), np.int64)
    return tuple(np.unique(cell_buckets(cells, resolution, buckets)).tolist())


def _per_home(home: np.ndarray, values: Any) -> tuple[np.ndarray, np.ndarray]:
    """For each fix, by its home cell, each of `values(home)` (a tuple of ints, cached per home):
    (fix index, value) pairs, by fix; one call per distinct home, none per fix."""
    homes, inverse = np.unique(np.asarray(home, np.int64), return_inverse=True)
    per_home = [values(h) for h in homes.tolist()]
    sizes = np.array([len(v) for v in per_home], np.int64)
    counts = sizes[inverse]
    rows = np.repeat(np.arange(len(inverse)), counts)
    starts = (np.cumsum(sizes) - sizes)[inverse]
    place = np.arange(len(rows)) - np.repeat(np.cumsum(counts) - counts, counts)
    flat = np.fromiter((v for vs in per_home for v in vs), np.int64, int(sizes.sum()))
    return rows, flat[np.repeat(starts, counts) + place]


def bucket_fan_out(home: np.ndarray, resolution: int, buckets: int) -> tuple[np.ndarray, np.ndarray]:
    """Which buckets each fix goes to, by its home cell: those of every cell that may report its
    meetings (`_reporting_cells`), each bucket once. Returns (fix index, bucket) pairs, by fix."""
    return _per_home(home, lambda h: _home_buckets(h, resolution, buckets))


@dataclass(frozen=True, slots=True)
class Meetings:
    """Observations as columns (`Observation`'s fields, in its order): what the cell stage emits,
    with no Python object per meeting."""

    a: np.ndarray
    b: np.ndarray
    ts_ms: np.ndarray
    distance_m: np.ndarray
    skew_ms: np.ndarray
    reach_m: np.ndarray
    a_seq: np.ndarray
    a_lat: np.ndarray
    a_lon: np.ndarray
    b_seq: np.ndarray
    b_lat: np.ndarray
    b_lon: np.ndarray

    def __len__(self) -> int:
        return len(self.ts_ms)

    def columns(self) -> dict[str, np.ndarray]:
        return {f: getattr(self, f) for f in MEETING_FIELDS}

    def observations(self) -> list[Observation]:
        cols = (getattr(self, f).tolist() for f in MEETING_FIELDS)
        return [Observation(*row) for row in zip(*cols, strict=True)]

    def take(self, index: np.ndarray) -> Meetings:
        return Meetings(*(getattr(self, f)[index] for f in MEETING_FIELDS))

    @staticmethod
    def concat(parts: list[Meetings]) -> Meetings:
        """The meetings of `parts` in one table (an empty one when there are none)."""
        if not parts:
            return Meetings(*(np.zeros(0, _MEETING_TYPES[f]) for f in MEETING_FIELDS))
        return Meetings(*(np.concatenate([getattr(x, f) for x in parts]) for f in MEETING_FIELDS))


MEETING_FIELDS = tuple(f.name for f in dataclasses.fields(Observation))
_MEETING_TYPES = {
    f.name: {"str": object, "int": _I8, "float": _F8}[str(f.type)] for f in dataclasses.fields(Observation)
}


@dataclass
class CellStep:
    """A bucket's batch: the meetings, the fixes it already had (the same vehicle and event time: a
    re-delivered fix, met once), and the fixes behind the watermark (still met with what the bucket
    keeps; a partner older than the watermark minus the tolerance may be forgotten already). The
    counts are of the fixes homed in the bucket's cells, so that each fix is counted once."""

    meetings: Meetings
    duplicates: int = 0
    behind_watermark: int = 0


@dataclass
class CellWindow:
    """What one bucket of cells keeps (`cell_buckets`): the fixes sent to it (`bucket_fan_out`) that
    a fix on time can still meet (event time at or after the watermark minus the tolerance)."""

    resolution: int
    bucket: int = 0
    buckets: int = 1
    watch_m: float = math.inf  # meetings farther apart are not reported (`ProximityRule.watch_m`)
    kept: HomedFixes = field(default_factory=HomedFixes.empty)

    def step(self, arrivals: HomedFixes, watermark_ms: int, tolerance_ms: int) -> CellStep:
        """Meet each arrival with every kept fix and every other arrival of another vehicle within
        the tolerance whose home cell is the same or a neighbour, keep it, then forget what the
        watermark has passed by more than the tolerance.

        Each such pair of fixes is reported exactly once: at the smaller of the two home cells
        (`reports`), in that cell's bucket, when the second of the two arrives, whatever the order
        and the batches they arrive in, as long as neither arrives behind the watermark (then its
        partner may be forgotten: counted, not dropped)."""
        kept = self.kept
        # Vehicles as codes in the order of their names (np.unique sorts), once for the step.
        _, codes = np.unique(np.concatenate([kept.vehicle_id, arrivals.vehicle_id]), return_inverse=True)
        codes = codes.astype(np.int64)
        arrived = codes[len(kept) :]
        order = np.lexsort((arrived, arrivals.ts_ms))  # by event time, then vehicle
        arrivals, arrived = arrivals.take(order), arrived[order]
        # A fix whose vehicle and event time the bucket kept or an earlier arrival had: a duplicate.
        vs = np.concatenate([codes[: len(kept)], arrived])
        ts = np.concatenate([kept.ts_ms, arrivals.ts_ms])
        by = np.lexsort((np.arange(len(ts)), ts, vs))
        repeat = np.zeros(len(ts), bool)
        repeat[by[1:]] = (vs[by[1:]] == vs[by[:-1]]) & (ts[by[1:]] == ts[by[:-1]])
        fresh_mask = ~repeat[len(kept) :]
        fresh = arrivals.take(np.nonzero(fresh_mask)[0])
        # Counted once per fix, by the bucket of its home cell (a fix goes to that one and others).
        mine = cell_buckets(arrivals.home, self.resolution, self.buckets) == self.bucket
        out = CellStep(
            _meetings(
                kept,
                fresh,
                tolerance_ms,
                self.resolution,
                self.bucket,
                self.buckets,
                self.watch_m,
                np.concatenate([codes[: len(kept)], arrived[fresh_mask]]),
            ),
            duplicates=int((~fresh_mask & mine).sum()),
            behind_watermark=int(((arrivals.ts_ms < watermark_ms) & fresh_mask & mine).sum()),
        )
        self.kept = kept.concat(fresh)
        self.evict(watermark_ms - tolerance_ms)
        return out

    def evict(self, before_ms: int) -> None:
        stale = self.kept.ts_ms < before_ms
        if stale.any():
            self.kept = self.kept.take(np.nonzero(~stale)[0])

    def expires_ms(self, tolerance_ms: int) -> int | None:
        """When the watermark lets the bucket forget everything it keeps (None: it keeps nothing)."""
        if not len(self.kept):
            return None
        return int(self.kept.ts_ms.max()) + tolerance_ms


@functools.lru_cache(maxsize=1 << 18)
def _cells_in_bucket(home: int, resolution: int, bucket: int, buckets: int) -> tuple[int, ...]:
    cells = np.array(_reporting_cells(home), np.int64)
    return tuple(cells[cell_buckets(cells, resolution, buckets) == bucket].tolist())


def _expand(
    fixes: HomedFixes, resolution: int, bucket: int, buckets: int, tolerance_ms: int
) -> tuple[np.ndarray, ...]:
    """Each fix at each of its reporting cells (`_reporting_cells`) that is in `bucket`: (key, fix
    index, whether the cell is the fix's home), sorted by key. The key orders by cell, then by event
    time, and keeps each cell's times at least the tolerance from the next cell's: the fixes of a
    cell within the tolerance of a time are then one range of keys."""
    rows, cell = _per_home(fixes.home, lambda h: _cells_in_bucket(h, resolution, bucket, buckets))
    _, rank = np.unique(cell, return_inverse=True)
    ts = fixes.ts_ms[rows]
    # A wild event time (a clock years off) would stretch every cell's range: the time part is
    # bounded around the batch's median, and a time clipped to its ends only widens its own
    # candidates (clipping never brings two times further apart; `_meetings` checks the tolerance).
    # Each cell's keys lie in [rank * span + tolerance, (rank + 1) * span - tolerance - 1]: a search
    # within the tolerance of one never reaches another cell's.
    t0 = int(np.median(ts)) - _MAX_SPAN_MS // 2 if len(ts) else 0
    part = np.clip(ts - t0, 0, _MAX_SPAN_MS)
    span = int(part.max(initial=0)) + 2 * tolerance_ms + 1
    key = rank.astype(np.int64) * span + part + tolerance_ms
    order = np.argsort(key, kind="stable")
    rows = rows[order]
    return key[order], rows, cell[order] == fixes.home[rows]


def _meetings(
    kept: HomedFixes,
    fresh: HomedFixes,
    tolerance_ms: int,
    resolution: int,
    bucket: int,
    buckets: int,
    watch_m: float,
    vcode: np.ndarray,
) -> Meetings:
    """The meetings a bucket reports among `fresh` and between them and `kept`, as a join on the
    reporting cell and the tolerance (a range of `_expand`'s keys): a fix goes to its home and the
    neighbours below it; at a cell, two fixes of two vehicles within the tolerance meet when the
    cell is one's home (so it is the smaller home, the other's home being at or above it:
    `reports`). Each unordered pair once: with a kept fix, or with a later arrival. A depot's cell
    holds the whole fleet: then every pair is a candidate.

    Only meetings within `watch_m` (`ProximityRule.watch_m`): most pairs of fixes a bucket joins are
    of vehicles in neighbouring cells, far apart. Of those of a pair at one moment (the later fix's
    time) only the one `pair_step` takes is reported: closest in time, then the smallest gap; the
    rest could change nothing (they come in the same batch). Filtered before the choice, so that
    the choice is the same however the moment's meetings fall into buckets. `vcode`: the vehicles
    of `kept` then `fresh` as codes in the order of their names (no string compared per pair)."""
    allf = kept.concat(fresh)
    n_kept = len(kept)
    key, row, at_home = _expand(allf, resolution, bucket, buckets, tolerance_ms)
    is_fresh = row >= n_kept
    lo = np.searchsorted(key, key[is_fresh] - tolerance_ms, "left")
    hi = np.searchsorted(key, key[is_fresh] + tolerance_ms, "right")
    counts = hi - lo
    x = np.repeat(np.nonzero(is_fresh)[0], counts)  # positions in the expanded rows
    y = np.repeat(lo, counts) + (np.arange(counts.sum()) - np.repeat(np.cumsum(counts) - counts, counts))
    xi, yi = row[x], row[y]  # fix indexes in `allf`
    ts = allf.ts_ms
    keep = (
        (at_home[x] | at_home[y])
        & ((yi < n_kept) | (yi > xi))
        & (vcode[xi] != vcode[yi])
        & (np.abs(ts[xi] - ts[yi]) <= tolerance_ms)
    )
    xi, yi = xi[keep], yi[keep]
    swap = vcode[xi] > vcode[yi]
    a_i, b_i = np.where(swap, yi, xi), np.where(swap, xi, yi)
    d = np.asarray(haversine_m(allf.lon[a_i], allf.lat[a_i], allf.lon[b_i], allf.lat[b_i]), np.float64)
    skew = np.abs(ts[a_i] - ts[b_i])
    mps = np.minimum(allf.speed_kmh, MAX_SPEED_KMH) / 3.6
    # The earlier fix's vehicle, at that fix's speed, until the later fix.
    reach = np.where(ts[a_i] <= ts[b_i], mps[a_i], mps[b_i]) * skew / 1000
    when = np.maximum(ts[a_i], ts[b_i])
    pair = vcode[a_i] * (int(vcode.max(initial=0)) + 1) + vcode[b_i]
    watched = np.flatnonzero(d <= watch_m)
    w = (np.maximum(0.0, d - reach), skew, when, pair)
    by = watched[np.lexsort(tuple(c[watched] for c in w))]
    taken = np.ones(len(by), bool)
    taken[1:] = (pair[by[1:]] != pair[by[:-1]]) | (when[by[1:]] != when[by[:-1]])
    m = by[taken]
    a_i, b_i = a_i[m], b_i[m]
    return Meetings(
        allf.vehicle_id[a_i],
        allf.vehicle_id[b_i],
        when[m],
        d[m],
        skew[m],
        reach[m],
        allf.seq[a_i],
        allf.lat[a_i],
        allf.lon[a_i],
        allf.seq[b_i],
        allf.lat[b_i],
        allf.lon[b_i],
    )


def reports(cell: int, home_a: int, home_b: int) -> bool:
    """Whether `cell` is the one cell that reports a meeting of fixes homed in `home_a` and `home_b`:
    the smaller home cell (every cell sees two neighbouring homes' fixes, some as visitors only)."""
    return cell == min(home_a, home_b)


class ProximityCount(StrEnum):
    """What the stages count besides their meetings and alerts: the keys of the proximity query's
    commit markers and the outcomes of its metric (processor.ops.markers)."""

    REPEATED = "proximity_repeated"  # a fix its home cell's bucket already had (`CellStep.duplicates`)
    BEHIND_WATERMARK = "proximity_behind_watermark"  # `CellStep.behind_watermark`
    LATE_MEETINGS = "proximity_late_meetings"  # meetings `pair_step` ignored as late

    @property
    def outcome(self) -> str:
        """The metric's `outcome` label."""
        return self.removeprefix("proximity_")


class PairEventKind(StrEnum):
    ENTER = "PROXIMITY_ENTER"
    EXIT = "PROXIMITY_EXIT"


@dataclass(frozen=True, slots=True)
class PairEvent:
    """A proximity alert of the pair under one rule, at the meeting `at` that decided it (for an
    exit by loss: the last meeting, at the deadline's event time): `reason` on an exit only;
    `since_ms` is when the nearness began. Each vehicle of the pair gets its alert (`alerts`)."""

    kind: PairEventKind
    rule_id: str
    at: Observation
    since_ms: int
    reason: ProximityExitReason | None = None

    def alerts(self) -> list[AlertRecord]:
        """The two alert records of the event, one per vehicle, each at that vehicle's own fix
        and naming the other: a receiver, a map or a history keyed by vehicle sees both sides.
        The id's subject is the rule, the other vehicle and when the nearness began: each side of
        each event has one id however often it is replayed, and two runs of nearness decided at
        one fix (a minimum duration shorter than the tolerance) have two."""
        o = self.at
        details: dict[str, object] = {
            "rule_id": self.rule_id,
            "gap_m": round(o.gap_m, 1),
            "distance_m": round(o.distance_m, 1),
            "skew_s": round(o.skew_ms / 1000, 1),
            "near_s": round((o.ts_ms - self.since_ms) / 1000, 1),
        }
        if self.reason is not None:
            details["reason"] = self.reason.value
        out: list[AlertRecord] = []
        for me, seq, lat, lon, other in (
            (o.a, o.a_seq, o.a_lat, o.a_lon, o.b),
            (o.b, o.b_seq, o.b_lat, o.b_lon, o.a),
        ):
            out.append(
                alert_record(
                    AlertType(self.kind.value),
                    vehicle_id=me,
                    seq=seq,
                    ts_ms=o.ts_ms,
                    lat=lat,
                    lon=lon,
                    route_id=None,
                    route_version=0,
                    details={"other_vehicle_id": other, **details},
                    trigger_received_ms=0,  # the pair's, not one fix's: no ingest latency to measure
                    subject=f"{self.rule_id}:{other}:{self.since_ms}",
                )
            )
        return out


@dataclass(frozen=True, slots=True)
class PairState:
    """A pair's hysteresis. `near_since_ms`: the event time the current run of nearness began (-1:
    not near); `entered`: PROXIMITY_ENTER went out and no exit yet; `last_ms`: the latest meeting
    folded in (older ones are late and ignored); `last`: that meeting, while something is open (an
    exit by loss is raised at it)."""

    near_since_ms: int = -1
    entered: bool = False
    last_ms: int = -1
    last: Observation | None = None

    @property
    def empty(self) -> bool:
        """Nothing open or pending: only the latest meeting's time is worth keeping (`keep_until_ms`)."""
        return not self.entered and self.near_since_ms < 0

    def deadline_ms(self, rule: ProximityRule) -> int | None:
        """The event time at which the pair is lost without a further meeting (None: nothing open)."""
        return None if self.empty else self.last_ms + rule.lost_after_ms

    def keep_until_ms(self, rule: ProximityRule) -> int | None:
        """Until when the state is needed: its deadline while something is open; else until the
        watermark passes its latest meeting by the tolerance (None: no state at all). A cell meets
        a fix, even one behind the watermark, only with fixes it keeps, which are at most the
        tolerance behind the watermark; so no meeting older than the latest can come after that."""
        deadline = self.deadline_ms(rule)
        if deadline is not None:
            return deadline
        return self.last_ms + rule.tolerance_ms + 1 if self.last_ms >= 0 else None


def pair_step(
    state: PairState, observations: Iterable[Observation], rule: ProximityRule
) -> tuple[PairState, list[PairEvent], int]:
    """Fold a pair's meetings into its state: those of one call in event time, those of later
    calls after them. Returns the new state, the alerts, and how many meetings were ignored as
    late: not after the state's latest moment (the pair's history is already past them).

    One meeting per moment counts: the one whose fixes are closest in time (then the nearest). A
    moment is a fix of one vehicle, met with each fix of the other within the tolerance before
    it; of two vehicles driving together, only the closest in time tells how far apart they are
    (at 25 m/s, fixes 4 s apart are 100 m apart along the road). Its fix of the other vehicle is
    then that vehicle's newest at that moment (of those read so far: a closer one read in a later
    batch is late), so each side's alerts go forward in `seq`.

    A run of nearness starts with two fixes within `enter_m` of each other, and goes on while the
    gap (`Observation.gap_m`: the distance less how far the earlier fix's vehicle may have driven
    since) stays within it; an entered pair parts when the gap exceeds `exit_m`. Judging the start
    by the gap would let two vehicles on parallel roads wider apart than `enter_m` meet whenever
    their fixes are far apart in time; judging the run by the distance would break a convoy's
    nearness at every moment whose fixes are not simultaneous.

    A meeting beyond `enter_m` while nothing is open changes nothing and is not remembered: most
    meetings a cell reports are of vehicles in neighbouring cells, far apart, and they cost no
    state. The price: a near meeting that arrives in a later batch than a far one of the same
    moment (a partition read late) can start a nearness the far one would have broken."""
    events: list[PairEvent] = []
    late = 0
    near_since, entered, last, last_o = state.near_since_ms, state.entered, state.last_ms, state.last
    moment = -1
    for o in sorted(observations, key=lambda x: (x.ts_ms, x.skew_ms, x.gap_m)):
        if o.ts_ms == moment:
            continue  # a fix of this moment further in time from it than the one taken
        moment = o.ts_ms
        if o.ts_ms <= last:
            late += 1
            continue
        open_ = entered or near_since >= 0
        if not open_ and o.distance_m > rule.enter_m:
            continue  # nothing open, not near: nothing to remember
        if open_ and o.ts_ms >= last + rule.lost_after_ms:
            # Lost in the gap before this meeting: as the timer would have had it, had the batches
            # fallen otherwise.
            gone = PairState(near_since, entered, last, last_o)
            _, lost = pair_expire(gone, last + rule.lost_after_ms, rule)
            events.extend(lost)
            near_since, entered = -1, False
        last, last_o = o.ts_ms, o
        if entered:
            if o.gap_m > rule.exit_m:
                events.append(_event(PairEventKind.EXIT, rule, o, near_since, ProximityExitReason.APART))
                entered, near_since = False, -1
            continue
        if near_since >= 0 and o.gap_m <= rule.enter_m:
            pass  # the run of nearness goes on
        elif o.distance_m <= rule.enter_m:
            near_since = o.ts_ms  # two fixes that close: a run of nearness starts
        else:
            near_since = -1
        if near_since >= 0 and o.ts_ms - near_since >= rule.min_duration_ms:
            events.append(_event(PairEventKind.ENTER, rule, o, near_since))
            entered = True
    open_ = entered or near_since >= 0
    return PairState(near_since, entered, last, last_o if open_ else None), events, late


def pair_expire(
    state: PairState, watermark_ms: int, rule: ProximityRule
) -> tuple[PairState, list[PairEvent]]:
    """The watermark has moved to `watermark_ms`: a pair whose deadline it reached is lost. An open
    meeting ends with PROXIMITY_EXIT (reason `lost`, at the deadline's event time, where the pair was
    last seen); a nearness not yet long enough is forgotten. The latest meeting's time stays
    (`keep_until_ms`)."""
    deadline = state.deadline_ms(rule)
    if deadline is None or watermark_ms < deadline:
        return state, []
    events: list[PairEvent] = []
    if state.entered:
        if state.last is None:
            raise ValueError("an entered pair keeps its last meeting")
        o = dataclasses.replace(state.last, ts_ms=deadline)
        events.append(_event(PairEventKind.EXIT, rule, o, state.near_since_ms, ProximityExitReason.LOST))
    return PairState(last_ms=state.last_ms), events


def _event(
    kind: PairEventKind,
    rule: ProximityRule,
    o: Observation,
    since_ms: int,
    reason: ProximityExitReason | None = None,
) -> PairEvent:
    return PairEvent(kind, rule.rule_id, o, since_ms, reason)


@dataclass(frozen=True, slots=True)
class _Moments:
    """A batch's usable meetings (`_usable`) sorted by pair, then time: one row a moment, each
    pair's rows from `starts[i]` for `counts[i]`, with its key in `keys[i]`."""

    frame: pd.DataFrame
    keys: list[tuple[str, str]]
    starts: np.ndarray
    counts: np.ndarray

    def observations(self, i: int, columns: list[list[Any]]) -> list[Observation]:
        """Pair i's moments as objects, from `columns` (the frame's MEETING_FIELDS as lists)."""
        start = int(self.starts[i])
        return [Observation(*(c[j] for c in columns)) for j in range(start, start + int(self.counts[i]))]


def _usable(meetings: Meetings, known: Container[tuple[str, str]], rule: ProximityRule) -> _Moments:
    """Of a batch's meetings, per pair, those `pair_step` can act on, chosen by columns: of each
    moment the one it takes (closest in time, then the smallest gap), and only for pairs with a
    state (`known`) or with a moment within the enter distance. For every other pair `pair_step`
    would change nothing: most meetings a cell reports are of vehicles in neighbouring cells, far
    apart, and they cost no Python object."""
    df = pd.DataFrame(meetings.columns())
    df["gap"] = np.maximum(0.0, df["distance_m"].to_numpy() - df["reach_m"].to_numpy())
    df = df.sort_values(["a", "b", "ts_ms", "skew_ms", "gap"], kind="stable")
    df = df.drop_duplicates(["a", "b", "ts_ms"], ignore_index=True)
    a, b = df["a"].to_numpy(), df["b"].to_numpy()
    new_pair = np.ones(len(df), bool)
    new_pair[1:] = (a[1:] != a[:-1]) | (b[1:] != b[:-1])
    starts = np.flatnonzero(new_pair)
    counts = np.diff(np.append(starts, len(df)))
    keys = list(zip(a[starts].tolist(), b[starts].tolist(), strict=True))
    nearest = np.minimum.reduceat(df["distance_m"].to_numpy(), starts) if len(df) else np.zeros(0)
    use = (nearest <= rule.enter_m) | np.fromiter((k in known for k in keys), bool, len(keys))
    kept = np.flatnonzero(use)
    rows = np.repeat(use, counts)
    counts = counts[kept]
    return _Moments(
        df[rows].reset_index(drop=True),
        [keys[i] for i in kept.tolist()],
        np.cumsum(counts) - counts,
        counts,
    )


def pair_inputs(
    meetings: Meetings, known: Container[tuple[str, str]], rule: ProximityRule
) -> dict[tuple[str, str], list[Observation]]:
    """Per pair, the meetings of a batch that `pair_step` can act on (`_usable`)."""
    m = _usable(meetings, known, rule)
    # `tolist`: Python ints and floats, as the alert records' JSON needs them.
    columns = [m.frame[f].tolist() for f in MEETING_FIELDS]
    return {key: m.observations(i, columns) for i, key in enumerate(m.keys)}


def pairs_step(
    states: dict[tuple[str, str], PairState], meetings: Meetings, watermark_ms: int, rule: ProximityRule
) -> tuple[list[PairEvent], int]:
    """A batch of a bucket of pairs as the engine runs it: each pair's usable meetings folded in
    (`_usable`, `pair_step`), then the pairs whose deadline the watermark reached lost
    (`pairs_expire`). `states` is updated in place. Returns the alerts and how many meetings came late.

    An entered pair whose moments all hold it (none late, no pause as long as the loss, no gap past
    the exit distance) only moves its latest meeting on: that is decided in columns, and only its
    last moment becomes an object. Vehicles that stay together (a convoy, a depot) are most of the
    near meetings of a dense fleet."""
    events: list[PairEvent] = []
    late = 0
    if len(meetings):
        m = _usable(meetings, states, rule)
        columns = [m.frame[f].tolist() for f in MEETING_FIELDS]
        holds = _entered_and_held(m, states, rule)
        for i, key in enumerate(m.keys):
            if holds[i]:
                last = int(m.starts[i] + m.counts[i] - 1)
                o = Observation(*(c[last] for c in columns))
                states[key] = dataclasses.replace(states[key], last_ms=o.ts_ms, last=o)
                continue
            states[key], new, n = pair_step(states.get(key, PairState()), m.observations(i, columns), rule)
            events.extend(new)
            late += n
    events.extend(pairs_expire(states, watermark_ms, rule))
    return events, late


def _entered_and_held(
    m: _Moments, states: dict[tuple[str, str], PairState], rule: ProximityRule
) -> np.ndarray:
    """Per pair of `m`: entered, and each of its moments after the state's latest, within the loss of
    the one before, and with a gap within the exit distance, so that `pair_step` would only move
    the latest meeting on."""
    if not m.keys:
        return np.zeros(0, bool)
    entered = np.fromiter((k in states and states[k].entered for k in m.keys), bool, len(m.keys))
    ts = m.frame["ts_ms"].to_numpy(np.int64)
    before = np.empty_like(ts)
    before[1:] = ts[:-1]
    before[m.starts] = [states[k].last_ms if k in states else -1 for k in m.keys]
    pause = ts - before
    widest = np.maximum.reduceat(m.frame["gap"].to_numpy(), m.starts)
    holds: np.ndarray = (
        entered
        & (np.minimum.reduceat(pause, m.starts) > 0)
        & (np.maximum.reduceat(pause, m.starts) < rule.lost_after_ms)
        & (widest <= rule.exit_m)
    )
    return holds


def pairs_expire(
    states: dict[tuple[str, str], PairState], watermark_ms: int, rule: ProximityRule
) -> list[PairEvent]:
    """`pair_expire` for every pair of a bucket, in place; a state goes once nothing needs it: nothing
    open and the watermark past its latest meeting by the tolerance (`PairState.keep_until_ms`)."""
    events: list[PairEvent] = []
    for key in sorted(states):
        state, lost = pair_expire(states[key], watermark_ms, rule)
        events.extend(lost)
        until = state.keep_until_ms(rule)
        if until is None or (state.empty and until <= watermark_ms):
            del states[key]
        else:
            states[key] = state
    return events


def pairs_due_ms(states: dict[tuple[str, str], PairState], rule: ProximityRule) -> int | None:
    """The earliest event time at which `pairs_expire` would change a bucket's states (None: none)."""
    due = [u for s in states.values() if (u := s.keep_until_ms(rule)) is not None]
    return min(due) if due else None


def pair_buckets(a: np.ndarray, b: np.ndarray, buckets: int) -> np.ndarray:
    """Each pair's bucket of pairs, in one vectorised pass (pandas' hash of the two ids): how a
    process without an engine shares pairs out (Spark hashes them with its own function)."""
    if not len(a):
        return np.zeros(0, np.int64)
    mixed = pd.util.hash_array(np.asarray(a, object)) * np.uint64(0x9E3779B97F4A7C15)
    mixed ^= pd.util.hash_array(np.asarray(b, object))
    return (mixed % np.uint64(buckets)).astype(np.int64)


def rules_resolution(rules: Iterable[ProximityRule]) -> int:
    """The H3 resolution a query of `rules` keeps its fixes in: the one of the largest exit distance
    (cells that large hold every smaller rule's meetings too: its neighbours are still enough)."""
    return resolution_for(max(r.exit_m for r in rules))


@dataclass
class RuleCells:
    """One bucket of cells under every rule of a query: a `CellWindow` per rule (the fixes of the
    vehicles in the rule's scope, `Members.admitted`), so that each rule meets its own vehicles with
    its own tolerance and watch distance, and tags its meetings with its id. All windows share the
    query's resolution (`rules_resolution`) and the bucket's place in the layout."""

    rules: tuple[ProximityRule, ...]
    resolution: int
    bucket: int = 0
    buckets: int = 1
    windows: dict[str, CellWindow] = field(default_factory=dict)

    def __post_init__(self) -> None:
        proximity_rule_set(self.rules)
        for r in self.rules:
            if r.rule_id not in self.windows:
                self.windows[r.rule_id] = CellWindow(self.resolution, self.bucket, self.buckets, r.watch_m)

    def step(self, arrivals: HomedFixes, watermark_ms: int, members: Members) -> list[tuple[str, CellStep]]:
        """Each rule's window steps on the arrivals in its scope; returns (rule id, its step)."""
        out: list[tuple[str, CellStep]] = []
        for r in self.rules:
            mine = members.admitted(r, arrivals.vehicle_id, arrivals.ts_ms)
            fixes = arrivals if mine.all() else arrivals.take(np.flatnonzero(mine))
            out.append((r.rule_id, self.windows[r.rule_id].step(fixes, watermark_ms, r.tolerance_ms)))
        return out

    def evict(self, watermark_ms: int) -> None:
        for r in self.rules:
            self.windows[r.rule_id].evict(watermark_ms - r.tolerance_ms)

    def expires_ms(self) -> int | None:
        """When the watermark lets some window forget what it keeps (None: they keep nothing)."""
        due = [d for r in self.rules if (d := self.windows[r.rule_id].expires_ms(r.tolerance_ms)) is not None]
        return min(due) if due else None

    def kept(self) -> tuple[np.ndarray, HomedFixes]:
        """Every window's fixes in one table, with each fix's rule id: a bucket's state."""
        ids = [np.full(len(self.windows[r.rule_id].kept), r.rule_id, object) for r in self.rules]
        fixes = HomedFixes.empty()
        for r in self.rules:
            fixes = fixes.concat(self.windows[r.rule_id].kept)
        return (np.concatenate(ids) if ids else np.zeros(0, object)), fixes

    def restore(self, rule_ids: np.ndarray, fixes: HomedFixes) -> None:
        """Refill the windows from `kept`'s table; the fixes of a rule no longer run are dropped."""
        for r in self.rules:
            self.windows[r.rule_id].kept = fixes.take(np.flatnonzero(rule_ids == r.rule_id))


@dataclass
class RulePairs:
    """One bucket of pairs under every rule of a query: each rule's pairs (`pairs_step`), keyed by
    the rule's id."""

    rules: tuple[ProximityRule, ...]
    states: dict[str, dict[tuple[str, str], PairState]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        proximity_rule_set(self.rules)
        for r in self.rules:
            self.states.setdefault(r.rule_id, {})
        for gone in set(self.states) - {r.rule_id for r in self.rules}:
            del self.states[gone]  # a rule no longer run: its pairs end without an alert

    def step(
        self, meetings: Meetings, rule_ids: np.ndarray, watermark_ms: int
    ) -> tuple[list[PairEvent], int]:
        """A batch: each rule's meetings (`rule_ids`, one per meeting) folded into its pairs, then every
        rule's pairs whose deadline the watermark reached lost. Returns the alerts and the late count."""
        events: list[PairEvent] = []
        late = 0
        for r in self.rules:
            mine = np.flatnonzero(rule_ids == r.rule_id)
            found, n = pairs_step(self.states[r.rule_id], meetings.take(mine), watermark_ms, r)
            events.extend(found)
            late += n
        return events, late

    def expire(self, watermark_ms: int) -> list[PairEvent]:
        return [e for r in self.rules for e in pairs_expire(self.states[r.rule_id], watermark_ms, r)]

    def due_ms(self) -> int | None:
        due = [d for r in self.rules if (d := pairs_due_ms(self.states[r.rule_id], r)) is not None]
        return min(due) if due else None


class BucketedStages:
    """Both stages in one process, each on `buckets` keys as an engine shards them: a batch's fixes
    fanned out to their buckets of cells (`bucket_fan_out`), each bucket stepped in columns per rule
    (`RuleCells.step`), the meetings folded per bucket of pairs (`RulePairs.step`). The Spark query
    folds the same functions in its own operators; this fold is the one the benchmark times and the
    simulator's ground truth is held to. `members`: the vehicle master's data the scopes read."""

    def __init__(
        self, rules: tuple[ProximityRule, ...], buckets: int, members: Members | None = None
    ) -> None:
        self.rules, self.buckets = rules, buckets
        self.members = members or Members()
        self.resolution = rules_resolution(rules)
        self.cells = [RuleCells(rules, self.resolution, b, buckets) for b in range(buckets)]
        self.pairs = [RulePairs(rules) for _ in range(buckets)]

    def step(self, fixes: HomedFixes, watermark_ms: int) -> tuple[Meetings, np.ndarray, list[PairEvent]]:
        """One batch: every meeting the cells report (under every rule), each meeting's rule id, and
        the pairs' alerts."""
        rows, bucket = bucket_fan_out(fixes.home, self.resolution, self.buckets)
        found: list[Meetings] = []
        rule_ids: list[np.ndarray] = []
        for b, cells in enumerate(self.cells):
            for rule_id, step in cells.step(fixes.take(rows[bucket == b]), watermark_ms, self.members):
                found.append(step.meetings)
                rule_ids.append(np.full(len(step.meetings), rule_id, object))
        m = Meetings.concat(found)
        rules = np.concatenate(rule_ids) if rule_ids else np.zeros(0, object)
        by_pair = pair_buckets(m.a, m.b, self.buckets)
        events: list[PairEvent] = []
        for b, pairs in enumerate(self.pairs):
            mine = np.flatnonzero(by_pair == b)
            found_events, _late = pairs.step(m.take(mine), rules[mine], watermark_ms)
            events.extend(found_events)
        return m, rules, events
