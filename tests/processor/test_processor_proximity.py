"""Vehicle-to-vehicle proximity's pure stages (processor.core.proximity): the cell stage finds every
meeting the all-pairs answer finds, each once, in one batch or many, in order or not; the pair
stage's hysteresis, minimum duration, loss by deadline (by timer or by a meeting after the gap),
lateness and order independence."""

from __future__ import annotations

import random
from collections import Counter, defaultdict
from collections.abc import Iterable
from typing import Any

import h3
import numpy as np
import pytest

from fleetfence.contracts import ProximityExitReason
from fleetfence.geo import haversine_m
from fleetfence.rules import ProximityRule
from processor.core.proximity import (
    EDGE_FACTOR,
    MAX_SPEED_KMH,
    MEETING_FIELDS,
    CellWindow,
    HomedFixes,
    Meetings,
    Observation,
    PairEvent,
    PairEventKind,
    PairState,
    Position,
    bucket_fan_out,
    cell_buckets,
    pair_expire,
    pair_inputs,
    pair_step,
    pairs_expire,
    pairs_step,
    reports,
    resolution_for,
)

RULE = ProximityRule(
    "convoy", enter_m=50, exit_m=80, min_duration_ms=10_000, tolerance_ms=5_000, lost_after_ms=60_000
)
T0 = 1_795_320_000_000
BERLIN = (52.52, 13.405)


def test_a_rule_needs_a_band_and_a_loss_longer_than_its_tolerance() -> None:
    with pytest.raises(ValueError, match="enter_m < exit_m"):
        ProximityRule("r", enter_m=80, exit_m=80, min_duration_ms=0, tolerance_ms=0, lost_after_ms=1)
    with pytest.raises(ValueError, match="exit_m <= 5000"):
        ProximityRule("r", enter_m=80, exit_m=6000, min_duration_ms=0, tolerance_ms=0, lost_after_ms=1)
    with pytest.raises(ValueError, match="lost_after_ms must exceed"):
        ProximityRule("r", enter_m=50, exit_m=80, min_duration_ms=0, tolerance_ms=5000, lost_after_ms=5000)


@pytest.mark.parametrize("exit_m", [10, 80, 300, 1200, 5000])
def test_the_resolution_is_the_finest_whose_cells_span_the_exit_distance(exit_m: float) -> None:
    res = resolution_for(exit_m)
    assert h3.average_hexagon_edge_length(res, "m") >= EDGE_FACTOR * exit_m
    if res < 11:
        assert h3.average_hexagon_edge_length(res + 1, "m") < EDGE_FACTOR * exit_m


def fleet(seed: int, vehicles: int, steps: int, spread_m: float) -> list[Position]:
    """Vehicles wandering in a square of `spread_m` around Berlin, each reporting every ~2 s with
    its own clock offset: many meetings, across many cell boundaries."""
    rng = random.Random(seed)
    dlat = spread_m / 111_320
    dlon = spread_m / (111_320 * 0.6088)
    out = []
    for v in range(vehicles):
        lat = BERLIN[0] + rng.uniform(0, dlat)
        lon = BERLIN[1] + rng.uniform(0, dlon)
        t = T0 + rng.randrange(0, 2000)
        for seq in range(steps):
            lat += rng.uniform(-1, 1) * 15 / 111_320  # up to 15 m a step
            lon += rng.uniform(-1, 1) * 15 / 67_770
            out.append(Position(f"v{v:03d}", seq, t, lat, lon, 25.0))  # up to 7.5 m/s
            t += 2000 + rng.randrange(-300, 300)
    return out


Meeting = tuple[str, str, int, float, int, int]  # a, b, moment, distance (to the µm), a's seq, b's


def expected_meetings(fixes: list[Position], rule: ProximityRule) -> set[Meeting]:
    """The all-pairs answer: of every two fixes of two vehicles within the tolerance of each other
    and the watch distance, at the later one's event time (the moment), per pair and moment the one
    `pair_step` takes (closest in time, then the smallest gap), those within the exit distance."""
    moments: dict[tuple[str, str, int], list[tuple[int, float, Meeting]]] = defaultdict(list)
    for i, f in enumerate(fixes):
        for g in fixes[i + 1 :]:
            if g.vehicle_id == f.vehicle_id or abs(f.ts_ms - g.ts_ms) > rule.tolerance_ms:
                continue
            d = float(haversine_m(f.lon, f.lat, g.lon, g.lat))
            if d > rule.watch_m:
                continue
            skew = abs(f.ts_ms - g.ts_ms)
            earlier = min((f, g), key=lambda p: p.ts_ms)
            gap = max(0.0, d - min(earlier.speed_kmh, MAX_SPEED_KMH) / 3.6 * skew / 1000)
            x, y = sorted((f, g), key=lambda p: p.vehicle_id)
            when = max(f.ts_ms, g.ts_ms)
            m = (x.vehicle_id, y.vehicle_id, when, round(d, 6), x.seq, y.seq)
            moments[(x.vehicle_id, y.vehicle_id, when)].append((skew, gap, m))
    return {m for m in (min(c)[2] for c in moments.values()) if m[3] <= rule.exit_m}


def taken(found: Iterable[Observation], rule: ProximityRule) -> set[Meeting]:
    """Of reported meetings, per pair and moment the one `pair_step` takes, within the exit
    distance (a moment may be reported by two buckets, or in two batches: the best counts)."""
    best: dict[tuple[str, str, int], tuple[int, float, Meeting]] = {}
    for o in found:
        m = (o.a, o.b, o.ts_ms, round(o.distance_m, 6), o.a_seq, o.b_seq)
        best[(o.a, o.b, o.ts_ms)] = min(
            best.get((o.a, o.b, o.ts_ms), (o.skew_ms, o.gap_m, m)), (o.skew_ms, o.gap_m, m)
        )
    return {m for _, _, m in best.values() if m[3] <= rule.exit_m}


def run_cells(
    batches: Iterable[list[Position]], rule: ProximityRule, lateness_ms: int, buckets: int = 1
) -> tuple[list[Observation], int]:
    """The cell stage as a streaming engine runs it: each batch fanned out to its buckets, each
    bucket stepped with its own window; the watermark is the newest event time so far minus
    `lateness_ms`. Returns the meetings and how many arrivals were behind the watermark."""
    res = resolution_for(rule.exit_m)
    windows = [CellWindow(res, b, buckets, rule.watch_m) for b in range(buckets)]
    out: list[Observation] = []
    behind = 0
    watermark = 0
    for batch in batches:
        fixes = HomedFixes.from_positions(batch, res)
        rows, bucket = bucket_fan_out(fixes.home, res, buckets)
        for b, w in enumerate(windows):
            step = w.step(fixes.take(rows[bucket == b]), watermark, rule.tolerance_ms)
            out.extend(step.meetings.observations())
            behind += step.behind_watermark
        watermark = max(watermark, max(f.ts_ms for f in batch) - lateness_ms)
    return out, behind


@pytest.mark.parametrize(("seed", "buckets"), [(1, 1), (2, 3), (3, 8)])
def test_the_cells_find_every_meeting_the_all_pairs_answer_finds_and_each_once(
    seed: int, buckets: int
) -> None:
    fixes = fleet(seed, vehicles=40, steps=30, spread_m=1500)
    expected = expected_meetings(fixes, RULE)
    assert len(expected) > 50  # a test with few meetings proves little
    one, behind = run_cells([fixes], RULE, 0, buckets)
    assert behind == 0
    assert taken(one, RULE) == expected
    # Each pair of fixes once (a moment's best in two buckets is two pairs of fixes).
    dupes = [k for k, n in Counter((o.a, o.b, o.a_seq, o.b_seq) for o in one).items() if n > 1]
    assert dupes == []
    for o in one:
        assert o.a < o.b
    # Cut into batches of 10 s of event time, in order: the same meetings.
    ordered = sorted(fixes, key=lambda f: f.ts_ms)
    batches = [[f for f in ordered if T0 + i * 10_000 <= f.ts_ms < T0 + (i + 1) * 10_000] for i in range(8)]
    assert sum(map(len, batches)) == len(fixes)
    many, behind = run_cells([b for b in batches if b], RULE, 0, buckets)
    assert behind == 0
    assert taken(many, RULE) == expected
    # Out of order within 8 s (as partitions read at different paces deliver), in batches of 50
    # arrivals, with a watermark 8 s behind: still the same meetings.
    rng = random.Random(seed)
    jittered = sorted(fixes, key=lambda f: f.ts_ms + rng.uniform(0, 8_000))
    shuffled, behind = run_cells(
        [jittered[i : i + 50] for i in range(0, len(jittered), 50)], RULE, 8_000, buckets
    )
    assert behind == 0
    assert taken(shuffled, RULE) == expected


def test_a_dense_fleet_meets_all_pairs_in_one_bucket_or_many() -> None:
    """Forty vehicles within 400 m: one cell and its ring hold them all (a depot)."""
    fixes = sorted(fleet(4, vehicles=40, steps=10, spread_m=400), key=lambda f: f.ts_ms)
    expected = expected_meetings(fixes, RULE)
    assert len(expected) > 100
    for buckets in (1, 4):
        found, _ = run_cells([fixes[i : i + 97] for i in range(0, len(fixes), 97)], RULE, 0, buckets)
        assert taken(found, RULE) == expected


def test_the_cells_report_no_meeting_beyond_the_watch_distance() -> None:
    """`watch_m`: the exit distance and what two vehicles parting at 144 km/h each add within the
    tolerance; farther meetings are not reported, nearer ones are."""
    assert RULE.watch_m == RULE.exit_m + 2 * 40.0 * RULE.tolerance_ms / 1000
    w = CellWindow(resolution_for(RULE.exit_m), watch_m=RULE.watch_m)

    def north_m(v: str, m: float) -> Position:
        return Position(v, 1, T0, BERLIN[0] + m / 111_320, BERLIN[1], 0.0)

    fixes = [north_m("a", 0), north_m("b", RULE.watch_m + 1), north_m("c", 2 * RULE.watch_m + 2)]
    found = w.step(
        HomedFixes.from_positions(fixes, resolution_for(RULE.exit_m)), 0, RULE.tolerance_ms
    ).meetings
    assert found.observations() == []
    inside = north_m("d", RULE.watch_m - 1)
    found = w.step(
        HomedFixes.from_positions([inside], resolution_for(RULE.exit_m)), 0, RULE.tolerance_ms
    ).meetings
    assert sorted((o.a, o.b) for o in found.observations()) == [("a", "d"), ("b", "d")]


def at_home_window() -> CellWindow:
    """The window of the bucket holding Berlin's home cell."""
    home = HomedFixes.from_positions([Position("a", 1, T0, *BERLIN, 0.0)], resolution_for(RULE.exit_m)).home
    return CellWindow(
        resolution_for(RULE.exit_m), int(cell_buckets(home, resolution_for(RULE.exit_m), 8)[0]), 8
    )


def test_a_fix_delivered_twice_meets_once_and_one_behind_the_watermark_is_counted() -> None:
    w = at_home_window()
    a_b = HomedFixes.from_positions(
        [Position("a", 1, T0, *BERLIN, 0.0), Position("b", 1, T0 + 1000, *BERLIN, 0.0)],
        resolution_for(RULE.exit_m),
    )
    first = w.step(a_b, 0, RULE.tolerance_ms)
    assert (len(first.meetings), first.duplicates) == (1, 0)
    again = w.step(a_b.concat(a_b), 0, RULE.tolerance_ms)
    assert (len(again.meetings), again.duplicates) == (0, 4)
    old = HomedFixes.from_positions([Position("c", 1, T0 - 500, *BERLIN, 0.0)], resolution_for(RULE.exit_m))
    late = w.step(old, T0, RULE.tolerance_ms)
    assert (len(late.meetings), late.behind_watermark) == (2, 1)  # met with what is still kept


def test_a_bucket_forgets_what_the_watermark_passed_by_the_tolerance() -> None:
    w = at_home_window()
    w.step(
        HomedFixes.from_positions([Position("a", 1, T0, *BERLIN, 0.0)], resolution_for(RULE.exit_m)),
        0,
        RULE.tolerance_ms,
    )
    assert w.expires_ms(RULE.tolerance_ms) == T0 + RULE.tolerance_ms
    none = HomedFixes.empty()
    w.step(none, T0 + RULE.tolerance_ms, RULE.tolerance_ms)
    assert len(w.kept) == 1  # at the tolerance exactly, a fix on time can still meet it
    w.step(none, T0 + RULE.tolerance_ms + 1, RULE.tolerance_ms)
    assert len(w.kept) == 0
    assert w.expires_ms(RULE.tolerance_ms) is None


def obs(
    t_s: float, d_m: float, a: str = "a", b: str = "b", skew_ms: int = 0, reach_m: float = 0.0
) -> Observation:
    """A meeting at t_s seconds; a's fix seq is its second, b's that plus 100 (the alerts' seq)."""
    seq = int(t_s)
    where = (seq, *BERLIN, seq + 100, BERLIN[0], BERLIN[1] + 0.001)
    return Observation(a, b, T0 + int(t_s * 1000), d_m, skew_ms, reach_m, *where)


def kinds(events: Iterable[PairEvent]) -> list[tuple[str, int, str]]:
    return [(str(e.kind), (e.at.ts_ms - T0) // 1000, str(e.reason or "")) for e in events]


def test_enter_after_the_minimum_duration_exit_past_the_larger_distance_no_flap() -> None:
    # Approach; near from t=10 s; jitter between 50 and 80 m does not flap; apart at t=60 s.
    track = [obs(0, 300), obs(5, 120), obs(10, 45), obs(15, 40), obs(20, 30), obs(25, 70)]
    track += [obs(30, 48), obs(35, 79), obs(40, 20), obs(55, 60), obs(60, 81), obs(65, 75), obs(70, 200)]
    s, events, late = pair_step(PairState(), track, RULE)
    assert late == 0
    assert kinds(events) == [("PROXIMITY_ENTER", 20, ""), ("PROXIMITY_EXIT", 60, "apart")]
    assert [e.kind for e in events] == [PairEventKind.ENTER, PairEventKind.EXIT]
    assert events[0].since_ms == T0 + 10_000
    assert events[1].since_ms == T0 + 10_000
    assert s.empty  # parted, nothing pending: the pair keeps no state


def test_passing_by_is_no_meeting_and_a_gap_in_nearness_starts_the_duration_again() -> None:
    s, events, _ = pair_step(PairState(), [obs(0, 40), obs(5, 30), obs(8, 45), obs(9, 200)], RULE)
    assert events == []
    assert s.empty
    # Near, then beyond enter_m once (not yet entered: the run of nearness starts again), near again.
    s, events, _ = pair_step(
        PairState(), [obs(0, 40), obs(8, 60), obs(9, 40), obs(15, 40), obs(19, 40)], RULE
    )
    assert kinds(events) == [("PROXIMITY_ENTER", 19, "")]
    assert events[0].since_ms == T0 + 9_000


def test_the_order_of_meetings_and_their_batches_does_not_change_the_alerts() -> None:
    track = [obs(t, d) for t, d in [(0, 45), (4, 30), (8, 49), (12, 20), (16, 60), (20, 90), (24, 30)]]
    _, whole, _ = pair_step(PairState(), track, RULE)
    _, shuffled, _ = pair_step(PairState(), random.Random(7).sample(track, len(track)), RULE)
    s1, first, _ = pair_step(PairState(), track[:3], RULE)
    _, second, _ = pair_step(s1, track[3:], RULE)
    assert whole == shuffled == first + second
    assert kinds(whole) == [("PROXIMITY_ENTER", 12, ""), ("PROXIMITY_EXIT", 20, "apart")]


def test_a_meeting_older_than_the_pairs_latest_is_late_and_ignored() -> None:
    s, _, _ = pair_step(PairState(), [obs(0, 40), obs(20, 40)], RULE)
    assert s.entered
    s2, events, late = pair_step(s, [obs(10, 500)], RULE)
    assert (events, late, s2) == ([], 1, s)
    # After the exit nothing is open, and the latest meeting's time is still kept: a late meeting
    # cannot open the pair again in the past.
    apart, events, _ = pair_step(s, [obs(30, 200)], RULE)
    assert kinds(events) == [("PROXIMITY_EXIT", 30, "apart")]
    assert apart.empty
    assert apart.keep_until_ms(RULE) == T0 + 30_000 + RULE.tolerance_ms + 1
    after, events, late = pair_step(apart, [obs(15, 10), obs(29, 10)], RULE)
    assert (events, late, after) == ([], 2, apart)


def test_a_meeting_after_a_gap_longer_than_the_loss_ends_the_old_meeting_first() -> None:
    """Whether the timer fired in between or the next meeting came first (the batches decide),
    the alerts are the same."""
    track = [obs(0, 40), obs(12, 35), obs(200, 30), obs(205, 30), obs(212, 30)]
    _, together, _ = pair_step(PairState(), track, RULE)
    s, first, _ = pair_step(PairState(), track[:2], RULE)
    s, lost = pair_expire(s, T0 + 100_000, RULE)
    _, rest, _ = pair_step(s, track[2:], RULE)
    expected = [("PROXIMITY_ENTER", 12, ""), ("PROXIMITY_EXIT", 72, "lost"), ("PROXIMITY_ENTER", 212, "")]
    assert kinds(together) == kinds(first + lost + rest) == expected
    assert [e.reason for e in together] == [None, ProximityExitReason.LOST, None]


def test_a_pair_no_longer_seen_is_lost_at_its_deadline() -> None:
    s, events, _ = pair_step(PairState(), [obs(0, 40), obs(12, 35)], RULE)
    assert kinds(events) == [("PROXIMITY_ENTER", 12, "")]
    deadline = s.deadline_ms(RULE)
    assert deadline == T0 + 12_000 + RULE.lost_after_ms
    same, none = pair_expire(s, deadline - 1, RULE)
    assert (same, none) == (s, [])
    gone, lost = pair_expire(s, deadline + 5_000, RULE)
    assert gone.empty
    assert kinds(lost) == [("PROXIMITY_EXIT", 72, "lost")]
    assert lost[0].at.distance_m == 35
    assert (lost[0].at.a_seq, lost[0].at.b_seq) == (12, 112)  # at the last meeting's fixes
    # Near but not yet long enough when lost: forgotten, no alert.
    pending, events, _ = pair_step(PairState(), [obs(0, 40)], RULE)
    assert events == []
    assert pending.deadline_ms(RULE) == T0 + RULE.lost_after_ms
    gone, lost = pair_expire(pending, T0 + RULE.lost_after_ms, RULE)
    assert (gone.empty, lost) == (True, [])


def test_a_fix_goes_to_the_buckets_of_the_cells_that_may_report_its_meetings_each_once() -> None:
    """Fix by fix: the buckets of its home cell and of the neighbours below it (`reports`: the
    smaller home reports), no other and none twice; in a city, fewer than two a fix on average."""
    fixes = HomedFixes.from_positions(
        fleet(4, vehicles=300, steps=2, spread_m=20_000), resolution_for(RULE.exit_m)
    )
    rows, bucket = bucket_fan_out(fixes.home, resolution_for(RULE.exit_m), 16)
    for i, home in enumerate(fixes.home.tolist()):
        ring = [int(h3.str_to_int(c)) for c in h3.grid_disk(h3.int_to_str(home), 1)]
        reporting = [c for c in ring if any(reports(c, home, other) for other in ring)]
        want = set(cell_buckets(np.array(reporting, np.int64), resolution_for(RULE.exit_m), 16).tolist())
        got = bucket[rows == i].tolist()
        assert sorted(got) == sorted(want)
        assert len(got) == len(set(got))
    assert len(rows) < 2 * len(fixes)  # neighbours mostly share their parent's bucket: not 7 rows a fix
    assert len(set(bucket.tolist())) == 16  # and the buckets spread over a city


def test_each_vehicle_of_the_pair_gets_its_alert_at_its_own_fix_naming_the_other() -> None:
    from alerts.model import condition_change, parse_alert
    from fleetfence.contracts import AlertType, alert_json

    # At 12 s the fixes are 1.5 s apart: 50 m, of which the earlier one's vehicle may have driven 15.
    track = [obs(0, 40), obs(12, 50, skew_ms=1500, reach_m=15), obs(30, 200)]
    _, events, _ = pair_step(PairState(), track, RULE)
    enter, exit_ = (e.alerts() for e in events)
    assert [(r["type"], r["vehicle_id"], r["seq"], r["details"]["other_vehicle_id"]) for r in enter] == [
        (AlertType.PROXIMITY_ENTER, "a", 12, "b"),
        (AlertType.PROXIMITY_ENTER, "b", 112, "a"),
    ]
    assert [(r["lat"], r["lon"]) for r in enter] == [BERLIN, (BERLIN[0], BERLIN[1] + 0.001)]
    assert enter[0]["details"] == {
        "other_vehicle_id": "b",
        "rule_id": "convoy",
        "gap_m": 35.0,
        "distance_m": 50.0,
        "skew_s": 1.5,
        "near_s": 12.0,
    }
    assert exit_[1]["details"]["reason"] == "apart"
    ids = [r["alert_id"] for r in enter + exit_]
    assert len(set(ids)) == 4
    # The same ids however the meetings are cut into batches (a replay's batches differ).
    s1, first, _ = pair_step(PairState(), track[:1], RULE)
    _, rest, _ = pair_step(s1, track[1:], RULE)
    assert ids == [r["alert_id"] for e in first + rest for r in e.alerts()]
    # The receivers' open conditions: per other vehicle, opened by the enter, closed by the exit.
    opened = condition_change(parse_alert(alert_json(enter[0])))
    closed = condition_change(parse_alert(alert_json(exit_[0])))
    key = f"PROXIMITY:{RULE.rule_id}:b"
    assert (opened.opens, closed.closes) == (key, (key, "PROXIMITY:b", "VEHICLE_SILENT"))
    # A pair lost at its deadline closes its own condition only: no proof that the vehicle spoke.
    s, _, _ = pair_step(PairState(), track[:2], RULE)
    _, lost = pair_expire(s, T0 + 12_000 + RULE.lost_after_ms, RULE)
    assert condition_change(parse_alert(alert_json(lost[0].alerts()[1]))).closes == (
        f"PROXIMITY:{RULE.rule_id}:a",
        "PROXIMITY:a",  # the key before rules were in it: an upgrade leaves nothing open
    )


def test_of_each_moment_the_fixes_closest_in_time_count() -> None:
    """A moment (a fix of one vehicle) met with several fixes of the other within the tolerance:
    the one closest in time decides, whatever the order and however near the others are."""
    track = [obs(0, 40, skew_ms=500), obs(0, 130, skew_ms=2500), obs(12, 30, skew_ms=500)]
    track += [obs(12, 10, skew_ms=4500), obs(14, 120, skew_ms=300), obs(14, 20, skew_ms=2300)]
    _, events, late = pair_step(PairState(), random.Random(3).sample(track, len(track)), RULE)
    assert kinds(events) == [("PROXIMITY_ENTER", 12, ""), ("PROXIMITY_EXIT", 14, "apart")]
    assert [e.at.distance_m for e in events] == [30, 120]
    assert late == 0


def run_pairs(
    batches: list[list[Position]], rule: ProximityRule, lateness_ms: int, buckets: int = 1
) -> list[PairEvent]:
    """Both stages as the streaming engine runs them: the cells' buckets, then each bucket of pairs
    with the batch's meetings at the batch's watermark (`pairs_step`); at the end, the pairs whose
    deadline the last watermark passed (the timers)."""
    res = resolution_for(rule.exit_m)
    windows = [CellWindow(res, b, buckets, rule.watch_m) for b in range(buckets)]
    pairs: list[dict[tuple[str, str], PairState]] = [{} for _ in range(buckets)]
    events: list[PairEvent] = []
    watermark = 0
    for batch in batches:
        fixes = HomedFixes.from_positions(batch, res)
        rows, bucket = bucket_fan_out(fixes.home, res, buckets)
        tol = rule.tolerance_ms
        steps = [w.step(fixes.take(rows[bucket == b]), watermark, tol) for b, w in enumerate(windows)]
        meetings = [o for step in steps for o in step.meetings.observations()]
        for b, states in enumerate(pairs):  # a pair's bucket: any function of the pair will do
            mine = [o for o in meetings if sum(map(ord, o.a + o.b)) % buckets == b]
            events.extend(pairs_step(states, meetings_of(mine), watermark, rule)[0])
        watermark = max(watermark, max(f.ts_ms for f in batch) - lateness_ms)
    for states in pairs:
        events.extend(pairs_expire(states, watermark, rule))
    return events


def meetings_of(observations: list[Observation]) -> Meetings:
    return Meetings(*(np.array([getattr(o, f) for o in observations]) for f in MEETING_FIELDS))


@pytest.mark.parametrize("seed", [7, 8])
def test_the_pair_buckets_alert_as_each_pair_folding_every_meeting_would(seed: int) -> None:
    """`pairs_step` drops far meetings of pairs with nothing open and keeps one per moment, in
    columns, and moves entered pairs that stay near on in columns: the alerts must be those of
    `pair_step` fed every meeting the cells report without a watch distance, with the deadlines
    applied after each batch, for one bucket of pairs or several."""
    rule = ProximityRule(
        "r", enter_m=40, exit_m=60, min_duration_ms=4_000, tolerance_ms=3_000, lost_after_ms=8_000
    )
    fixes = fleet(seed, vehicles=30, steps=40, spread_m=300)
    rng = random.Random(seed)
    jittered = sorted(fixes, key=lambda f: f.ts_ms + rng.uniform(0, 4_000))
    batches = [jittered[i : i + 40] for i in range(0, len(jittered), 40)]
    windows = [CellWindow(resolution_for(rule.exit_m))]
    states: dict[tuple[str, str], PairState] = {}
    want: list[PairEvent] = []
    watermark = 0
    for batch in batches:
        step = windows[0].step(
            HomedFixes.from_positions(batch, resolution_for(rule.exit_m)), watermark, rule.tolerance_ms
        )
        by_pair: dict[tuple[str, str], list[Observation]] = defaultdict(list)
        for o in step.meetings.observations():
            by_pair[(o.a, o.b)].append(o)
        for key in sorted(by_pair):
            states[key], new, _ = pair_step(states.get(key, PairState()), by_pair[key], rule)
            want.extend(new)
        watermark = max(watermark, max(f.ts_ms for f in batch) - 5_000)
        for key in sorted(states):
            states[key], lost = pair_expire(states[key], watermark, rule)
            want.extend(lost)
    assert len(want) > 50
    for buckets in (1, 3):
        got = run_pairs(batches, rule, 5_000, buckets)
        assert Counter(r["alert_id"] for e in got for r in e.alerts()) == Counter(
            r["alert_id"] for e in want for r in e.alerts()
        )


def test_only_pairs_with_a_state_or_a_near_moment_reach_the_fold() -> None:
    far, near = obs(0, 300), obs(1, 45)
    moment = [obs(2, 45, skew_ms=2000), obs(2, 300, a="c", b="d"), obs(2, 90, skew_ms=100)]
    inputs = pair_inputs(meetings_of([far, near, *moment]), {("c", "d")}, RULE)
    # The pair (a, b): every moment it had, one each (at 2 s the closest in time, 90 m);
    # (c, d): its state is open, so its far moment counts.
    assert {k: [(o.ts_ms - T0, o.distance_m) for o in v] for k, v in inputs.items()} == {
        ("a", "b"): [(0, 300), (1_000, 45), (2_000, 90)],
        ("c", "d"): [(2_000, 300)],
    }
    assert pair_inputs(meetings_of([far, obs(2, 60, a="c", b="d")]), set(), RULE) == {}


@pytest.mark.parametrize("speed_mps", [3, 14, 25, 33])
def test_a_convoy_at_speed_is_near_until_it_parts(speed_mps: float) -> None:
    """Two trucks 20 m apart across a road, reporting every 2 s half a second apart, at any speed:
    near once, no flapping while together, apart once when one turns off (its fixes before ts 60 s
    beside the other, then 10 m/s further across the road each second)."""
    fixes = []
    for i in range(45):
        for v, offset_ms, lane_m in (("a", 0, 0.0), ("b", 500, 20.0)):
            t_s = 2 * i + offset_ms / 1000
            x = speed_mps * t_s
            turned = v == "b" and t_s > 60
            y = lane_m + (10 * (t_s - 60) if turned else 0.0)
            kmh = 3.6 * (speed_mps**2 + 10**2) ** 0.5 if turned else 3.6 * speed_mps
            lat, lon = BERLIN[0] + y / 111_320, BERLIN[1] + x / 67_770
            fixes.append(Position(v, i, T0 + int(t_s * 1000), lat, lon, kmh))
    fixes.sort(key=lambda f: f.ts_ms)
    batches = [fixes[k : k + 7] for k in range(0, len(fixes), 7)]
    events = run_pairs(batches, RULE, 3_000)
    assert [(str(e.kind), str(e.reason or "")) for e in events] == [
        ("PROXIMITY_ENTER", ""),
        ("PROXIMITY_EXIT", "apart"),
    ]
    assert events[0].at.ts_ms - T0 <= 11_000  # near from the first fixes: entered after 10 s
    assert 60_000 < events[1].at.ts_ms - T0 < 70_000


@pytest.mark.parametrize(("seed", "buckets"), [(5, 1), (6, 3)])
def test_each_sides_alerts_alternate_and_go_forward_in_seq(seed: int, buckets: int) -> None:
    """A dense wandering fleet, read in batches out of order within the lateness: for each vehicle
    and each other, its alerts alternate ENTER, EXIT, and their fixes' seqs never go back (the
    receivers close a condition only with an alert at a later or equal seq); ids are unique."""
    rule = ProximityRule(
        "r", enter_m=40, exit_m=60, min_duration_ms=4_000, tolerance_ms=3_000, lost_after_ms=8_000
    )
    fixes = fleet(seed, vehicles=30, steps=40, spread_m=300)
    rng = random.Random(seed)
    jittered = sorted(fixes, key=lambda f: f.ts_ms + rng.uniform(0, 4_000))
    events = run_pairs([jittered[i : i + 40] for i in range(0, len(jittered), 40)], rule, 5_000, buckets)
    records = [r for e in events for r in e.alerts()]
    assert len(records) > 50  # many meetings and partings: a fleet with few proves little
    assert len({r["alert_id"] for r in records}) == len(records)
    sides: dict[tuple[str, str], list[tuple[str, int]]] = defaultdict(list)
    for r in records:
        sides[(r["vehicle_id"], r["details"]["other_vehicle_id"])].append((r["type"].value, r["seq"]))
    for side, seen in sides.items():
        kinds_ = [k for k, _ in seen]
        assert (
            kinds_
            == ["PROXIMITY_ENTER", "PROXIMITY_EXIT"] * (len(kinds_) // 2) + kinds_[len(kinds_) // 2 * 2 :]
        ), side
        seqs = [q for _, q in seen]
        assert seqs == sorted(seqs), (side, seen)


@pytest.mark.parametrize("road_gap_m", [70, 90, 130])
def test_vehicles_on_parallel_roads_wider_apart_than_the_rule_never_meet(road_gap_m: float) -> None:
    """Two vehicles at 30 m/s on parallel roads, reporting every 10 s, 5 s apart: their fixes' gap
    (less what one may have driven in 5 s, 150 m) is small, but no two of their fixes were ever
    within the enter distance, so no nearness starts."""
    rule = ProximityRule(
        "r", enter_m=50, exit_m=100, min_duration_ms=0, tolerance_ms=5_000, lost_after_ms=60_000
    )
    fixes = []
    for i in range(12):
        for v, offset_ms, y in (("a", 0, 0.0), ("b", 5_000, road_gap_m)):
            t_ms = 10_000 * i + offset_ms
            lat, lon = BERLIN[0] + y / 111_320, BERLIN[1] + 30 * t_ms / 1000 / 67_770
            fixes.append(Position(v, i, T0 + t_ms, lat, lon, 108.0))
    fixes.sort(key=lambda f: f.ts_ms)
    assert run_pairs([fixes[k : k + 4] for k in range(0, len(fixes), 4)], rule, 3_000) == []


def test_the_reach_is_the_earlier_fixs_vehicle_at_its_speed_capped() -> None:
    """How far the earlier fix's vehicle may have driven until the later fix: its own speed (not
    the later one's), and a wild reported speed capped, so that a parted pair still parts."""
    w = at_home_window()

    def at_home(p: Position) -> HomedFixes:
        return HomedFixes.from_positions([p], resolution_for(RULE.exit_m))

    first = w.step(at_home(Position("a", 1, T0, *BERLIN, 72.0)), 0, RULE.tolerance_ms)
    assert len(first.meetings) == 0
    (o,) = w.step(at_home(Position("b", 1, T0 + 2_000, *BERLIN, 1e308)), 0, 5_000).meetings.observations()
    assert (o.skew_ms, o.reach_m) == (2_000, 40.0)  # a, at 72 km/h, for 2 s
    (o,) = w.step(at_home(Position("a", 2, T0 + 3_000, *BERLIN, 0.0)), 0, 5_000).meetings.observations()
    assert o.skew_ms == 1_000
    assert o.reach_m == pytest.approx(MAX_SPEED_KMH / 3.6)  # b's wild speed, capped


def test_the_proximity_checkpoint_stays_beside_the_jobs_when_the_job_moves() -> None:
    from processor.settings import ProcessorSettings

    moved = ProcessorSettings(
        processor_checkpoint="hdfs://nn/ff/ck/processor-b8/", processor_proximity_enter_m=50
    )
    assert moved.proximity_checkpoint == "hdfs://nn/ff/ck/proximity"
    with pytest.raises(ValueError, match="needs the enter distance"):
        ProcessorSettings(processor_proximity_exit_m=80)
    with pytest.raises(ValueError, match="enter_m < exit_m"):
        ProcessorSettings(processor_proximity_enter_m=80, processor_proximity_exit_m=60)


def test_the_rows_for_spark_hold_any_event_time_the_contracts_accept() -> None:
    """A fix of the year 287,396 is valid telemetry. The rows for the next operator carry its time
    in `ts_ms`, and in `ts` (what moves Spark's watermark) capped where PySpark's nanoseconds end:
    the cast it makes on the way into the next operator must not fail."""
    import pyarrow as pa
    import pyarrow.compute as pc

    from fleetfence.contracts import MAX_TS_MS
    from processor.spark.proximity import _TS_CAP_MS, meetings_frame

    w = CellWindow(resolution_for(RULE.exit_m), watch_m=RULE.watch_m)
    far_future = [
        Position("a", 1, MAX_TS_MS - 1_000, *BERLIN, 0.0),
        Position("b", 1, MAX_TS_MS, *BERLIN, 0.0),
    ]
    step = w.step(HomedFixes.from_positions(far_future, resolution_for(RULE.exit_m)), 0, RULE.tolerance_ms)
    step.duplicates = 1  # and a counts row
    frame = meetings_frame([(RULE.rule_id, step)], MAX_TS_MS - 10)
    assert frame["ts_ms"].tolist() == [MAX_TS_MS, MAX_TS_MS - 9]
    assert frame["repeated"].tolist() == [0, 1]
    ts = pa.Array.from_pandas(frame["ts"])
    assert ts.type == pa.timestamp("us", tz="UTC")
    as_ns = pc.cast(ts, pa.timestamp("ns", tz="UTC"))  # what PySpark does before pandas sees it
    assert as_ns.cast(pa.int64()).to_pylist() == [_TS_CAP_MS * 1_000_000] * 2


def test_each_fix_is_counted_once_however_many_buckets_it_goes_to() -> None:
    """A batch over many cells and eight buckets delivered again, and fixes behind the watermark:
    the buckets' counts add up to the fixes, not to their copies in the buckets they go to."""
    fixes = sorted(fleet(9, vehicles=60, steps=4, spread_m=20_000), key=lambda f: f.ts_ms)
    res, buckets = resolution_for(RULE.exit_m), 8
    windows = [CellWindow(res, b, buckets, RULE.watch_m) for b in range(buckets)]
    located = HomedFixes.from_positions(fixes, res)
    rows, _ = bucket_fan_out(located.home, res, buckets)
    assert len(rows) > len(fixes)  # some fixes go to two buckets or more
    counted = {"duplicates": 0, "behind": 0}

    def deliver(batch: HomedFixes, watermark: int) -> None:
        rows, bucket = bucket_fan_out(batch.home, res, buckets)
        for b, w in enumerate(windows):
            step = w.step(batch.take(rows[bucket == b]), watermark, RULE.tolerance_ms)
            counted["duplicates"] += step.duplicates
            counted["behind"] += step.behind_watermark

    deliver(located, 0)
    deliver(located, 0)  # every fix again, each still kept
    assert counted == {"duplicates": len(fixes), "behind": 0}
    old = HomedFixes.from_positions(
        [Position(f"late{i}", 0, f.ts_ms - 1, f.lat, f.lon, 0.0) for i, f in enumerate(fixes[:25])], res
    )
    deliver(old, max(f.ts_ms for f in fixes))
    assert counted == {"duplicates": len(fixes), "behind": 25}


def test_entered_pairs_that_stay_near_skip_the_fold_and_end_in_the_same_state(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The columnar path for entered pairs is taken, and leaves each pair's state (its latest
    meeting, where a lost exit is raised) as `pair_step` would."""
    from processor.core import proximity

    rule = ProximityRule(
        "r", enter_m=40, exit_m=60, min_duration_ms=4_000, tolerance_ms=3_000, lost_after_ms=8_000
    )
    fixes = sorted(fleet(7, vehicles=30, steps=40, spread_m=300), key=lambda f: f.ts_ms)
    batches = [fixes[i : i + 40] for i in range(0, len(fixes), 40)]
    window = CellWindow(resolution_for(rule.exit_m), watch_m=rule.watch_m)
    meetings = [
        window.step(HomedFixes.from_positions(b, resolution_for(rule.exit_m)), 0, rule.tolerance_ms).meetings
        for b in batches
    ]
    folded: dict[tuple[str, str], PairState] = {}
    for m in meetings:
        for key, obs in pair_inputs(m, folded, rule).items():
            folded[key], _, _ = pair_step(folded.get(key, PairState()), obs, rule)
    held = Counter[str]()
    real = proximity._entered_and_held

    def counting(m: Any, states: Any, rule: ProximityRule) -> Any:
        holds = real(m, states, rule)
        held["pairs"] += int(holds.sum())
        return holds

    monkeypatch.setattr(proximity, "_entered_and_held", counting)
    states: dict[tuple[str, str], PairState] = {}
    for m in meetings:
        pairs_step(states, m, 0, rule)
    assert held["pairs"] > 50  # entered pairs moved on without the fold
    assert states == {k: folded[k] for k in states}
    assert set(states) == {k for k, s in folded.items() if s.keep_until_ms(rule) is not None}
    assert any(s.entered for s in states.values())


class _FakeValueState:
    def __init__(self) -> None:
        self.value: tuple[int] | None = None

    def exists(self) -> bool:
        return self.value is not None

    def get(self) -> tuple[int] | None:
        return self.value

    def update(self, value: tuple[int]) -> None:
        self.value = value

    def clear(self) -> None:
        self.value = None


class _FakeHandle:
    """Spark's processor handle, for its timers only: a fault-free stand-in that records calls."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, int]] = []
        self.state = _FakeValueState()

    def getValueState(self, name: str, schema: str) -> _FakeValueState:  # noqa: N802 (Spark's name)
        return self.state

    def registerTimer(self, ms: int) -> None:  # noqa: N802
        self.calls.append(("register", ms))

    def deleteTimer(self, ms: int) -> None:  # noqa: N802
        self.calls.append(("delete", ms))


def test_a_buckets_timer_moves_and_one_that_fired_is_not_deleted_again() -> None:
    from processor.spark.proximity import _Timer

    handle = _FakeHandle()
    timer = _Timer(handle)  # type: ignore[arg-type]
    timer.set(100)
    timer.set(100)  # unchanged: no call
    timer.set(200)
    timer.set(None, fired=True)  # 200 fired: Spark dropped it, nothing to delete, nothing kept
    timer.set(200)  # the same time again is a new timer
    timer.set(300, fired=True)
    assert handle.calls == [
        ("register", 100),
        ("delete", 100),
        ("register", 200),
        ("register", 200),
        ("register", 300),
    ]
    assert handle.state.value == (300,)
