"""Vehicle-to-vehicle proximity in event time: which pairs of vehicles come near each other and part.

Every other check is keyed by one vehicle; a pair has two, and comparing every vehicle with every
other costs n² per fix. H3 cells make it local. With cells whose average edge is at least four times
the rule's exit distance (`resolution_for`), two vehicles within that distance have their home cells
equal or neighbouring: hexagons that are not neighbours are at least one edge apart, and H3's edges
stay within about a factor of two of their average. So the work splits into two keyed stages that a
streaming engine can shard and checkpoint, each a pure function of its state and its input here:

1. keyed by H3 cell (`CellWindow`): a fix goes to its home cell and to the six around it
   (`fan_out`). A cell keeps the fixes it was sent for `tolerance_ms` of event time past the
   watermark, and reports a meeting (`Observation`) for every two fixes of two vehicles within the
   tolerance of each other. One cell reports each: the smaller of the two home cells, where the
   other fix is a visitor (or their shared home cell), when the second of the two arrives; so each
   pair of fixes is one meeting, whichever order and batches they come in.
2. keyed by the pair (`PairState`, `pair_step`): the pair's hysteresis. PROXIMITY_ENTER once the
   vehicles stayed within `enter_m` for `min_duration_ms`; PROXIMITY_EXIT once they are more than
   `exit_m` apart (larger, so GPS jitter at the boundary does not flap), or once no meeting was seen
   for `lost_after_ms` (a vehicle went silent or drove out of every shared cell): an event-time
   deadline (`PairState.deadline_ms`), which a timer keeps even when nothing arrives, and which a
   meeting after the gap also applies (the pair was lost in between, however the batches fell).

The pair is ordered (`pair_key`), so both vehicles' fixes drive one state and one alert id, whichever
of them reported. A pair with nothing open keeps only its latest meeting's time, until the
watermark passes it by the tolerance (`PairState.keep_until_ms`): the state is bounded by the pairs
near now, not by every pair that ever met.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from dataclasses import dataclass, field
from enum import StrEnum

import h3
import numpy as np

from fleetfence.contracts import AlertRecord, AlertType, ProximityExitReason, alert_record
from fleetfence.geo import haversine_m
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
MAX_EXIT_M = 5_000.0


@dataclass(frozen=True, slots=True)
class ProximityRule:
    """One proximity rule: when two vehicles count as near, and for how long.

    `enter_m` < `exit_m` is the hysteresis band; a meeting compares two fixes at most `tolerance_ms`
    apart in event time (the vehicles report at their own moments); `min_duration_ms` of continuous
    nearness before PROXIMITY_ENTER (two trucks passing each other at a junction are not a meeting);
    `lost_after_ms` without a meeting ends an open one. Deliberately no defaults: the distances are
    the operator's policy, spelled where the rule is configured."""

    rule_id: str
    enter_m: float
    exit_m: float
    min_duration_ms: int
    tolerance_ms: int
    lost_after_ms: int

    def __post_init__(self) -> None:
        if not 0 < self.enter_m < self.exit_m <= MAX_EXIT_M:
            raise ValueError(
                f"proximity rule {self.rule_id!r}: needs 0 < enter_m < exit_m <= {MAX_EXIT_M:g} "
                f"(got {self.enter_m:g} and {self.exit_m:g})"
            )
        if self.min_duration_ms < 0 or self.tolerance_ms < 0:
            raise ValueError(f"proximity rule {self.rule_id!r}: durations are never negative")
        if self.lost_after_ms <= self.tolerance_ms:
            raise ValueError(
                f"proximity rule {self.rule_id!r}: lost_after_ms must exceed tolerance_ms, or a "
                "meeting could be lost between two fixes that still match"
            )

    @property
    def resolution(self) -> int:
        return resolution_for(self.exit_m)


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


@dataclass(frozen=True, slots=True)
class CellPosition:
    """A position as sent to one cell: with its home cell, which decides who reports a meeting."""

    cell: str
    home: str
    position: Position


def fan_out(position: Position, resolution: int) -> list[CellPosition]:
    """The position for its home cell and for each neighbour (grid distance 1): where it can meet."""
    home = h3.latlng_to_cell(position.lat, position.lon, resolution)
    return [CellPosition(c, home, position) for c in sorted(h3.grid_disk(home, 1))]


def fan_out_columns(
    vehicle_id: np.ndarray,
    seq: np.ndarray,
    ts_ms: np.ndarray,
    lat: np.ndarray,
    lon: np.ndarray,
    speed_kmh: np.ndarray,
    resolution: int,
) -> dict[str, np.ndarray]:
    """`fan_out` of many fixes as columns (`cell`, `home` and the fixes' own, a row per cell each
    can meet in, in `fan_out`'s order): the home cells in one native call (`h3_cells_int`), the
    rings once per distinct home, and no Python call per fix."""
    n = len(lat)
    homes, inverse = np.unique(h3_cells_int(lat, lon, resolution), return_inverse=True)
    home_names = [h3.int_to_str(int(c)) for c in homes]
    disks = [sorted(h3.grid_disk(h, 1)) for h in home_names]
    sizes = np.array([len(d) for d in disks], dtype=np.int64)  # 7; 6 around a pentagon
    counts = sizes[inverse]
    rows = np.repeat(np.arange(n), counts)
    # Each row's place in its fix's ring, and where that home's ring starts among all the rings.
    place = np.arange(len(rows)) - np.repeat(np.cumsum(counts) - counts, counts)
    ring_start = (np.cumsum(sizes) - sizes)[inverse]
    cells = np.array([c for d in disks for c in d], dtype=object)
    return {
        "cell": cells[np.repeat(ring_start, counts) + place],
        "home": np.array(home_names, dtype=object)[inverse][rows],
        "vehicle_id": np.asarray(vehicle_id)[rows],
        "seq": np.asarray(seq)[rows],
        "ts_ms": np.asarray(ts_ms)[rows],
        "lat": np.asarray(lat)[rows],
        "lon": np.asarray(lon)[rows],
        "speed_kmh": np.asarray(speed_kmh)[rows],
    }


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


@dataclass
class CellStep:
    """A cell's batch: the meetings, the arrivals it already had (the same vehicle and event time:
    a re-delivered fix, met once), and the arrivals behind the watermark (still met with what the
    cell keeps; a partner older than the watermark minus the tolerance may be forgotten already)."""

    meetings: list[Observation]
    duplicates: int = 0
    behind_watermark: int = 0


@dataclass
class CellWindow:
    """What one cell keeps: each vehicle's fixes sent to it that a fix on time can still meet
    (event time at or after the watermark minus the tolerance), each with its home cell."""

    kept: dict[str, list[CellPosition]] = field(default_factory=dict)

    def step(self, arrivals: Iterable[CellPosition], watermark_ms: int, tolerance_ms: int) -> CellStep:
        """Meet each arrival (all of this cell) with every kept fix of another vehicle within the
        tolerance, keep it, then forget what the watermark has passed by more than the tolerance.

        Every pair of fixes of two vehicles within the tolerance whose home cells are equal or
        neighbours is reported exactly once: by the smaller home cell (`reports`), when the second
        of the two arrives, whatever the order and the batches they arrive in, as long as neither
        arrives behind the watermark (then its partner may be forgotten: counted, not dropped)."""
        out = CellStep([])
        seen = {(v, cf.position.ts_ms) for v, fs in self.kept.items() for cf in fs}
        fresh: list[CellPosition] = []
        for cf in sorted(arrivals, key=lambda c: (c.position.ts_ms, c.position.vehicle_id)):
            key = (cf.position.vehicle_id, cf.position.ts_ms)
            if key in seen:
                out.duplicates += 1
                continue
            seen.add(key)
            fresh.append(cf)
            if cf.position.ts_ms < watermark_ms:
                out.behind_watermark += 1
        if fresh:
            kept = [cf for fs in self.kept.values() for cf in fs]
            out.meetings = _meetings(fresh, kept, tolerance_ms)
            for cf in fresh:
                self.kept.setdefault(cf.position.vehicle_id, []).append(cf)
        self.evict(watermark_ms - tolerance_ms)
        return out

    def evict(self, before_ms: int) -> None:
        for v in list(self.kept):
            left = [cf for cf in self.kept[v] if cf.position.ts_ms >= before_ms]
            if left:
                self.kept[v] = left
            else:
                del self.kept[v]

    def expires_ms(self, tolerance_ms: int) -> int | None:
        """When the watermark lets the cell forget everything it keeps (None: it keeps nothing)."""
        if not self.kept:
            return None
        return max(cf.position.ts_ms for fs in self.kept.values() for cf in fs) + tolerance_ms


def _columns(cps: list[CellPosition], codes: dict[str, int], cell: str) -> tuple[np.ndarray, ...]:
    """Columns of fixes for the masks: vehicles as integer codes (no string compared per pair),
    whether each is homed in `cell`, and whether its home is not below it (`reports`)."""
    n = len(cps)
    vid = np.fromiter((codes.setdefault(c.position.vehicle_id, len(codes)) for c in cps), np.int64, n)
    seq = np.fromiter((c.position.seq for c in cps), np.int64, n)
    ts = np.fromiter((c.position.ts_ms for c in cps), np.int64, n)
    lat = np.fromiter((c.position.lat for c in cps), np.float64, n)
    lon = np.fromiter((c.position.lon for c in cps), np.float64, n)
    kmh = np.fromiter((c.position.speed_kmh for c in cps), np.float64, n)
    mps = np.minimum(kmh, MAX_SPEED_KMH) / 3.6
    at_home = np.fromiter((c.home == cell for c in cps), np.bool_, n)
    not_below = np.fromiter((c.home >= cell for c in cps), np.bool_, n)
    return vid, seq, ts, lat, lon, mps, at_home, not_below


def _reported(x: tuple[np.ndarray, ...], y: tuple[np.ndarray, ...], tolerance_ms: int) -> np.ndarray:
    """The mask of the (x, y) fix pairs this cell reports: two vehicles within the tolerance, and
    `reports` (the cell is the smaller home: both homes not below it, one of them it)."""
    xv, xts, x_home, x_ge = x
    yv, yts, y_home, y_ge = y
    mask: np.ndarray = (
        (np.abs(xts[:, None] - yts[None, :]) <= tolerance_ms)
        & (xv[:, None] != yv[None, :])
        & (x_home[:, None] | y_home[None, :])
        & x_ge[:, None]
        & y_ge[None, :]
    )
    return mask


def _meetings(fresh: list[CellPosition], kept: list[CellPosition], tolerance_ms: int) -> list[Observation]:
    """The meetings one cell reports among `fresh` (its arrivals, in event-time order) and between
    them and `kept`, vectorised over all candidate pairs: within the tolerance, two vehicles, and
    `reports` as a mask (the cell is the smaller home: both homes not below it, one of them it). A
    cell's own fixes and visitors are few; a depot's cell holds the whole fleet."""
    cell = fresh[0].cell
    if any(c.cell != cell for c in fresh):
        raise ValueError("a cell's window steps its own arrivals only")
    codes: dict[str, int] = {}
    fv, fseq, fts, flat, flon, fmps, f_home, f_ge = _columns(fresh, codes, cell)
    names = [c.position.vehicle_id for c in fresh]
    pairs: list[tuple[np.ndarray, np.ndarray, list[str], tuple[np.ndarray, ...]]] = []
    if kept:
        kv, kseq, kts, klat, klon, kmps, k_home, k_ge = _columns(kept, codes, cell)
        i, j = np.nonzero(_reported((fv, fts, f_home, f_ge), (kv, kts, k_home, k_ge), tolerance_ms))
        pairs.append((i, j, [c.position.vehicle_id for c in kept], (kseq, kts, klat, klon, kmps)))
    # Among the arrivals: each unordered pair once (i < j).
    arrivals = (fv, fts, f_home, f_ge)
    i, j = np.nonzero(np.triu(_reported(arrivals, arrivals, tolerance_ms), 1))
    pairs.append((i, j, names, (fseq, fts, flat, flon, fmps)))
    out: list[Observation] = []
    for i, j, other, (oseq, ots, olat, olon, omps) in pairs:
        if len(i) == 0:
            continue
        d = haversine_m(flon[i], flat[i], olon[j], olat[j])
        t = np.maximum(fts[i], ots[j])
        skew = np.abs(fts[i] - ots[j])
        # The earlier fix's vehicle, at that fix's speed, until the later fix.
        reach = np.where(fts[i] <= ots[j], fmps[i], omps[j]) * skew / 1000
        for n in range(len(i)):
            x, y = i[n], j[n]
            mine = (int(fseq[x]), float(flat[x]), float(flon[x]))
            theirs = (int(oseq[y]), float(olat[y]), float(olon[y]))
            a, b = names[x], other[y]
            when = (int(t[n]), float(d[n]), int(skew[n]), float(reach[n]))
            if a < b:
                out.append(Observation(a, b, *when, *mine, *theirs))
            else:
                out.append(Observation(b, a, *when, *theirs, *mine))
    return out


def reports(cell: str, home_a: str, home_b: str) -> bool:
    """Whether `cell` is the one cell that reports a meeting of fixes homed in `home_a` and `home_b`:
    the smaller home cell (every cell sees two neighbouring homes' fixes, some as visitors only)."""
    return cell == min(home_a, home_b)


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
