"""The simulator's pure parts: routes, kinematics, injections, faults and the ground truth.

The strongest check here needs no services: the processor's own pure engine, fed the simulator's
messages in publish order as micro-batches with an advancing watermark, must produce exactly the
ground truth the simulator derived from its plan (two independent derivations agree).
"""

from __future__ import annotations

import dataclasses
import math
from collections import Counter, defaultdict
from typing import Any

import numpy as np
import pytest
import shapely
import shapely.ops
from shapely.geometry import Point, Polygon

from fleetfence.contracts import AlertType, alert_id
from fleetfence.errors import ConfigError
from fleetfence.rules import ProximityRule, ProximityScope, RouteRules
from simulator.config import Injections, ScenarioConfig
from simulator.routes import DEFAULT_BBOX
from simulator.scenario import Scenario
from simulator.verify import compare
from tests.simulator.helpers import engine_alerts, positions, proximity_alerts, run, small


@pytest.mark.parametrize("ticks_per_batch", [1, 7])
def test_processor_engine_reproduces_the_ground_truth_exactly(ticks_per_batch: int) -> None:
    sc, batches, truth = run(small())
    kinds = Counter(a.type for a in truth)
    # Every behaviour really happened, and faults were injected.
    # (The simulator's silent vehicles never come back, so it raises no VEHICLE_RESUMED; that one is
    # held by tests/processor/test_processor_domain.py.)
    # Pairs come with a proximity rule, which this scenario runs without: the pair types are held
    # by test_proximity_stages_reproduce_the_ground_truth_exactly.
    pairs = {t for t in AlertType if t.meta.pair}
    for t in set(AlertType) - {AlertType.VEHICLE_RESUMED} - pairs:
        assert kinds[t.value] > 0, f"no {t} in the scenario"
    assert kinds[AlertType.VEHICLE_RESUMED.value] == 0
    assert sc.stats.duplicates > 0
    assert sc.stats.out_of_order > 0
    assert sc.stats.late > 0
    res = compare(truth, engine_alerts(sc, batches, ticks_per_batch))
    assert res.missing == []
    assert res.unexpected == []
    assert res.overall.precision == 1.0
    assert res.overall.recall == 1.0
    # Truth ts are the alerts' event times, so matching on keys also held them to the right fix.
    assert {a.key: a.ts_ms for a in truth} == {
        o.key: o.ts_ms for o in engine_alerts(sc, batches, ticks_per_batch)
    }


def test_same_seed_same_scenario_other_seed_differs() -> None:
    def digest(seed: int) -> tuple[Any, ...]:
        _sc, batches, truth = run(small(seed=seed, vehicles=6, duration_s=120))
        return (
            tuple(np.concatenate([b.lat for b in batches]).round(9).tolist()),
            tuple(a.key for a in truth),
        )

    assert digest(5) == digest(5)
    assert digest(5) != digest(6)


def test_routes_are_road_like_and_in_the_box() -> None:
    sc = Scenario(small(route_length_m=8000, vehicles=3, routes=3, duration_s=30))
    lon0, lat0, lon1, lat1 = sc.cfg.bbox
    for r in sc.city.routes:
        coords = np.asarray(r.coords_lonlat)
        assert 150 <= len(coords) <= 600
        assert (coords[:, 0] >= lon0).all()
        assert (coords[:, 0] <= lon1).all()
        assert (coords[:, 1] >= lat0).all()
        assert (coords[:, 1] <= lat1).all()
        assert r.line.length_m == pytest.approx(8000, rel=0.05)
        seg = np.diff(r.line.cum_m)
        assert seg.max() <= 60  # a vertex at least every 60 m
        ux, uy = r.line.ux, r.line.uy
        cross = ux[:-1] * uy[1:] - uy[:-1] * ux[1:]
        turns = np.degrees(np.abs(np.arctan2(cross, ux[:-1] * ux[1:] + uy[:-1] * uy[1:])))
        assert (turns < 46).all()  # corners are rounded: no single vertex turns sharply
        assert (turns > 5).sum() >= 10  # but the route does turn


def test_kinematics_noise_is_bounded_and_seq_contiguous() -> None:
    cfg = small(inject=Injections(0, 0, 0, 0, 0, 0, 0), noise_sigma_m=4.0)
    sc, batches, _truth = run(cfg)
    proj = sc.city.projection
    bound = cfg.noise_bound_m + 1.5  # the zone-edge clamp may add up to 1.5 m along the route
    per_vehicle: dict[int, list[int]] = defaultdict(list)
    speeds: dict[int, list[float]] = defaultdict(list)
    dists = []
    for b in batches:
        x, y = proj.forward(b.lon, b.lat)
        for v, s, xi, yi, sp in zip(
            b.vehicle.tolist(), b.seq.tolist(), x.tolist(), y.tolist(), b.speed_kmh.tolist(), strict=True
        ):
            per_vehicle[v].append(s)
            speeds[v].append(sp)
            dists.append(sc.city.routes[int(sc.route_idx[v])].line_m.distance(Point(xi, yi)))
    assert max(dists) <= bound
    assert np.std(dists) > 0.5  # there is noise
    for v, seqs in per_vehicle.items():
        assert seqs == list(range(seqs[0], seqs[0] + cfg.n_ticks)), v
        dv = np.abs(np.diff(speeds[v])) / 3.6
        assert dv.max() <= 3.0 + 0.05  # never brakes harder than 3 m/s^2 per 1 s tick
        assert max(speeds[v]) <= cfg.rules.speed_limit_kmh - cfg.assume.overspeed_hysteresis_kmh


def test_deviation_places_fixes_far_outside_the_corridor_and_alerts_at_the_right_fix() -> None:
    cfg = small(
        inject=Injections(deviation=1.0, overspeed=0, dwell=0, silent=0, duplicate=0, out_of_order=0, late=0)
    )
    sc, batches, truth = run(cfg)
    half = cfg.rules.corridor_width_m / 2
    by_vehicle: dict[int, list[tuple[int, float]]] = defaultdict(list)
    points: dict[tuple[int, int], tuple[float, float]] = {}
    for b in batches:
        x, y = sc.city.projection.forward(b.lon, b.lat)
        for v, s, xi, yi in zip(b.vehicle.tolist(), b.seq.tolist(), x.tolist(), y.tolist(), strict=True):
            by_vehicle[v].append((s, sc.city.routes[int(sc.route_idx[v])].line_m.distance(Point(xi, yi))))
            points[(v, s)] = (xi, yi)
    dev = {a.vehicle_id: a for a in truth if a.type == "ROUTE_DEVIATION"}
    ret = {a.vehicle_id: a for a in truth if a.type == "ROUTE_RETURN"}
    assert len(dev) == sc.stats.deviations >= cfg.vehicles * 0.8
    vids = sc.vehicle_ids()
    per_s = 1000 / cfg.period_ms
    j_star = max(cfg.rules.deviation_min_fixes, math.ceil(cfg.rules.deviation_min_s * per_s) + 1)
    for v, fixes in by_vehicle.items():
        if vids[v] not in dev:
            continue
        outside = [(s, d) for s, d in fixes if d > half]
        # No fix in the ambiguous band: either within the noise of the line or clearly outside.
        assert all(d <= cfg.noise_bound_m + 1.5 or d >= half + 3 for _s, d in fixes)
        # ... and at >= 0.6 x (3 x half width + 5 sigma) from where it left the route.
        route = sc.city.routes[int(sc.route_idx[v])]
        ax, ay, _tx, _ty = route.line.at(np.array([sc.fleet.dev_s[v]]))
        far = [math.hypot(points[(v, s)][0] - ax[0], points[(v, s)][1] - ay[0]) for s, _d in outside]
        assert min(far) >= 0.6 * cfg.excursion_m - cfg.noise_bound_m
        seqs = [s for s, _d in outside]
        assert seqs == list(range(seqs[0], seqs[-1] + 1))  # one contiguous excursion
        assert dev[vids[v]].seq == seqs[0] + j_star - 1
        assert ret[vids[v]].seq == seqs[-1] + cfg.assume.return_min_fixes


def test_zones_are_clean_rectangles_and_enter_exit_follow_the_plan() -> None:
    sc, batches, truth = run(
        small(inject=Injections(0, 0, dwell=1.0, silent=0, duplicate=0, out_of_order=0, late=0))
    )
    zones = {z.zone_id: Polygon(z.ring_lonlat) for z in sc.city.zones}
    assert len(zones) >= 3
    grown = {z.zone_id: shapely.buffer(z.polygon_m, sc.cfg.assume.hysteresis_m) for z in sc.city.zones}
    fixes = positions(sc, batches)
    enters = [a for a in truth if a.type == "ZONE_ENTER"]
    exits = [a for a in truth if a.type == "ZONE_EXIT"]
    assert enters
    assert exits
    assert sc.stats.dwells > 0
    for a in enters:
        assert a.zone_id is not None
        lon, lat = fixes[(a.vehicle_id, a.seq)]
        assert zones[a.zone_id].contains(Point(lon, lat))
        if (a.vehicle_id, a.seq - 1) in fixes:
            assert not zones[a.zone_id].contains(Point(*fixes[(a.vehicle_id, a.seq - 1)]))
    for a in exits:
        assert a.zone_id is not None
        x, y = sc.city.projection.forward(*fixes[(a.vehicle_id, a.seq)])
        assert not grown[a.zone_id].contains(Point(float(x), float(y)))


CIRCLES = Injections(0.2, 0.2, dwell=1.0, silent=0.1, duplicate=0.03, out_of_order=0.03, late=0.03)


@pytest.mark.parametrize(
    ("share", "noise_sigma_m", "ticks_per_batch"),
    # All circles under the largest noise the inner band allows (its sideways noise shortens a
    # circle's chord by metres), and a mix of circles and rectangles.
    [(1.0, 10.0, 3), (0.5, 3.0, 7)],
)
def test_processor_engine_reproduces_the_ground_truth_with_circle_zones(
    share: float, noise_sigma_m: float, ticks_per_batch: int
) -> None:
    sc, batches, truth = run(small(circle_zones=share, seed=5, noise_sigma_m=noise_sigma_m, inject=CIRCLES))
    circles = [z for z in sc.city.zones if z.circle is not None]
    assert len(circles) >= 3
    if share < 1:
        assert len(circles) < len(sc.city.zones)
    entered = {a.zone_id for a in truth if a.type == "ZONE_ENTER"}
    assert entered & {z.zone_id for z in circles}
    observed = engine_alerts(sc, batches, ticks_per_batch)
    res = compare(truth, observed)
    assert res.missing == []
    assert res.unexpected == []
    assert {a.key: a.ts_ms for a in truth} == {o.key: o.ts_ms for o in observed}


def test_circle_zones_enter_within_the_radius_and_exit_beyond_the_band() -> None:
    """Checked on the published fixes with the circle's one distance, independently of the plan:
    an enter fix is within the radius (its previous fix not), an exit fix beyond radius + band."""
    from fleetfence.geo import circle_distance_m

    sc, batches, truth = run(
        small(
            circle_zones=1.0,
            noise_sigma_m=10.0,
            inject=Injections(0, 0, dwell=1.0, silent=0, duplicate=0, out_of_order=0, late=0),
        )
    )
    circles = {z.zone_id: z.circle for z in sc.city.zones if z.circle is not None}
    h = sc.cfg.assume.hysteresis_m
    fixes = positions(sc, batches)

    def distance(key: tuple[str, int], zone_id: str) -> float:
        lon0, lat0, _r = circles[zone_id]
        return float(circle_distance_m(*fixes[key], lon0, lat0))

    enters = [a for a in truth if a.type == "ZONE_ENTER" and a.zone_id in circles]
    exits = [a for a in truth if a.type == "ZONE_EXIT" and a.zone_id in circles]
    assert enters
    assert exits
    for a in enters:
        assert a.zone_id is not None
        assert distance((a.vehicle_id, a.seq), a.zone_id) <= circles[a.zone_id][2]
        if (a.vehicle_id, a.seq - 1) in fixes:
            assert distance((a.vehicle_id, a.seq - 1), a.zone_id) > circles[a.zone_id][2]
    for a in exits:
        assert a.zone_id is not None
        assert distance((a.vehicle_id, a.seq), a.zone_id) > circles[a.zone_id][2] + h


def test_no_circle_share_draws_nothing_more() -> None:
    """At circle_zones=0 no random draw is made for circles: the seed's zones and fleet are the
    ones it had before circles existed (fixed seeds are what the other tests rely on)."""
    sc, batches, truth = run(small(seed=5, vehicles=6, duration_s=120, circle_zones=0.0))
    assert all(z.circle is None for z in sc.city.zones)
    _sc2, batches2, truth2 = run(small(seed=5, vehicles=6, duration_s=120))
    assert [a.key for a in truth] == [a.key for a in truth2]
    assert np.array_equal(np.concatenate([b.lat for b in batches]), np.concatenate([b.lat for b in batches2]))
    with pytest.raises(ConfigError, match="circle_zones"):
        ScenarioConfig(circle_zones=1.5).validate()


def test_faults_are_exactly_the_injected_ones() -> None:
    cfg = small(inject=Injections(0, 0, 0, 0, duplicate=0.05, out_of_order=0.05, late=0.05))
    sc, batches, _truth = run(cfg)
    seqs: dict[int, list[int]] = defaultdict(list)
    for b in batches:
        for v, s in zip(b.vehicle.tolist(), b.seq.tolist(), strict=True):
            seqs[v].append(s)
    dups = sum(len(s) - len(set(s)) for s in seqs.values())
    assert dups == sc.stats.duplicates > 0
    inversions = 0
    for s in seqs.values():
        uniq = list(dict.fromkeys(s))  # first occurrences in publish order
        assert sorted(uniq) == list(range(uniq[0], uniq[0] + cfg.n_ticks))  # nothing lost
        inversions += sum(1 for i in range(1, len(uniq)) if uniq[i] < uniq[i - 1])
    assert inversions == sc.stats.out_of_order + sc.stats.late
    assert sc.stats.messages == sum(len(b) for b in batches)


def test_silence_truth_is_last_seq_and_due_time() -> None:
    cfg = small(inject=Injections(0, 0, 0, silent=0.25, duplicate=0, out_of_order=0, late=0))
    sc, batches, truth = run(cfg)
    last: dict[str, tuple[int, int]] = {}
    vids = sc.vehicle_ids()
    for b in batches:
        for v, s, t in zip(b.vehicle.tolist(), b.seq.tolist(), b.ts.tolist(), strict=True):
            last[vids[v]] = (s, t)
    silent = [a for a in truth if a.type == "VEHICLE_SILENT"]
    assert len(silent) == 6
    end = max(t for _s, t in last.values())
    for a in silent:
        s, t = last[a.vehicle_id]
        assert (a.seq, a.ts_ms) == (s, t + int(cfg.rules.silent_after_s * 1000))
        assert a.ts_ms + cfg.assume.lateness_ms <= end


def test_invalid_configurations_are_refused() -> None:
    with pytest.raises(ConfigError, match="inner corridor"):
        Scenario(small(noise_sigma_m=20))
    with pytest.raises(ConfigError, match="vehicles"):
        Scenario(small(vehicles=0))
    with pytest.raises(ConfigError, match="more than 1"):
        Scenario(small(inject=Injections(duplicate=0.6, out_of_order=0.6)))


def test_hundred_thousand_vehicles_are_generated_vectorized() -> None:
    sc = Scenario(ScenarioConfig(vehicles=100_000, duration_s=3, seed=1))
    total = sum(len(b) for b in sc.ticks())
    assert total >= 3 * 100_000 * 0.99


def test_no_zone_lies_where_the_completion_rule_moves_fixes() -> None:
    """Near a route's end the completion rule replaces a fix's noise (simulator.trips.end_nudge),
    which would undo the zone edges' clamp and put a fix the truth counts inside on the edge. The
    load test's own map (seed 11) has a route that loops back past its end point 5 km before
    its end, where a depot once lay: every zone keeps clear of every route's end in the plane."""
    cfg = ScenarioConfig(
        vehicles=40,
        routes=20,
        seed=11,
        route_length_m=6000.0,
        rules=RouteRules(
            corridor_width_m=60.0, speed_limit_kmh=50.0, overspeed_min_s=5.0, silent_after_s=60.0
        ),
        bbox=DEFAULT_BBOX,
    )
    sc = Scenario(cfg)
    clear_m = cfg.rules.completion_radius_m + cfg.noise_bound_m + cfg.assume.hysteresis_m
    loops_back = 0
    for route in sc.city.routes:
        end = Point(route.line.x[-1], route.line.y[-1])
        # Route stretches far from the end along it that come near it in the plane.
        far = shapely.ops.substring(route.line_m, 0, route.line.length_m - 4 * clear_m)
        loops_back += far.distance(end) < clear_m
        for z in route.zones:
            assert z.polygon_m.distance(end) > clear_m, (z.zone_id, z.polygon_m.distance(end))
    assert loops_back, "no route of this map passes its own end point: the test would not fail"


PROXIMITY = ProximityRule(
    "convoy", enter_m=40, exit_m=80, min_duration_ms=15_000, tolerance_ms=500, lost_after_ms=30_000
)


@pytest.mark.parametrize(("seed", "ticks_per_batch", "buckets"), [(11, 1, 1), (11, 7, 3), (7, 3, 8)])
def test_proximity_stages_reproduce_the_ground_truth_exactly(
    seed: int, ticks_per_batch: int, buckets: int
) -> None:
    """The processor's proximity stages (cells, then pairs, bucketed as on Spark) over the published
    messages, with every transport fault and silences, find exactly the pairs' alerts the truth
    derived tick by tick: convoys that drift apart, vehicles overtaking or stopping near each
    other, pairs lost to a silence."""
    sc, batches, truth = run(small(seed=seed, proximity=(PROXIMITY,), inject=FAULTY_CONVOYS))
    assert (sc.fleet.follows >= 0).sum() >= 4
    pairs = [a for a in truth if AlertType(a.type).meta.pair]
    kinds = Counter(a.type for a in pairs)
    assert kinds["PROXIMITY_ENTER"] >= 8
    assert kinds["PROXIMITY_EXIT"] >= 4
    assert sc.stats.out_of_order > 0
    assert sc.stats.late > 0
    assert sc.stats.duplicates > 0
    # Each convoy met: its leader and follower entered.
    convoys = {
        (sc.vehicle_ids()[int(f)], sc.vehicle_ids()[int(lead)])
        for f, lead in enumerate(sc.fleet.follows)
        if lead >= 0
    }
    entered = {(a.vehicle_id, a.other_vehicle_id) for a in pairs if a.type == "PROXIMITY_ENTER"}
    assert convoys <= entered
    # A pair lost to a silence exits at its deadline, not at a tick of its last meeting's seq.
    base, period = sc.seq_base(), sc.cfg.period_ms
    lost = [a for a in pairs if a.ts_ms != sc.cfg.start_ms + (a.seq - base) * period]
    assert lost
    assert_stages_find(pairs, sc, batches, ticks_per_batch, buckets)


def test_proximity_rules_per_route_and_group_reproduce_the_ground_truth_exactly() -> None:
    """Three rules at once, each with distances of its own: the fleet's, one route's and one fleet
    group's. Each rule meets only the vehicles in its scope (the route's by its assignments, the
    group's by the vehicle attribute, both from the registered master data), and the stages find
    exactly each rule's alerts the truth derived."""
    base = small(seed=11, inject=FAULTY_CONVOYS)
    route0 = Scenario(base).city.routes[0].route_id
    rules = (
        PROXIMITY,
        ProximityRule("r0", 25, 50, 10_000, 500, 20_000, ProximityScope(route_id=route0)),
        ProximityRule("south", 60, 110, 5_000, 400, 30_000, ProximityScope(group="south")),
    )
    sc, batches, truth = run(dataclasses.replace(base, proximity=rules))
    pairs = [a for a in truth if AlertType(a.type).meta.pair]
    by_rule = Counter(a.subject.split(":", 1)[0] for a in pairs if a.subject)
    assert min(by_rule[r.rule_id] for r in rules) >= 4, by_rule
    ids = sc.vehicle_ids()
    groups = dict(zip(ids, sc.vehicle_groups(), strict=True))
    on_route0 = {ids[i] for i in np.flatnonzero(sc.in_scope(rules[1].scope))}
    for a in pairs:
        rule = (a.subject or "").split(":", 1)[0]
        if rule == "south":
            assert groups[a.vehicle_id] == groups[a.other_vehicle_id or ""] == "south"
        if rule == "r0":
            assert {a.vehicle_id, a.other_vehicle_id} <= on_route0
    # A pair in the group and near under its wider distances, yet never near under the fleet's.
    fleet_pairs = {
        (a.vehicle_id, a.other_vehicle_id) for a in pairs if (a.subject or "").startswith("convoy:")
    }
    assert {
        (a.vehicle_id, a.other_vehicle_id) for a in pairs if (a.subject or "").startswith("south:")
    } - fleet_pairs
    assert_stages_find(pairs, sc, batches, 3, 4)


def assert_stages_find(
    pairs: list[Any], sc: Scenario, batches: list[Any], ticks_per_batch: int, buckets: int
) -> None:
    """The stages (`proximity_alerts`) raise exactly the truth's pair alerts, at the same fixes,
    leaving out the exits the truth cannot decide at the run's end."""
    undecided = set(sc.undecided_alert_ids())
    observed = [
        o for o in proximity_alerts(sc, batches, ticks_per_batch, buckets) if o.alert_id not in undecided
    ]
    res = compare(pairs, observed)
    assert res.missing == []
    assert res.unexpected == []
    assert res.duplicate_ids == 0
    assert sorted((a.alert_id, a.ts_ms, a.lat, a.lon) for a in pairs) == sorted(
        (o.alert_id, o.ts_ms, o.lat, o.lon) for o in observed
    )


FAULTY_CONVOYS = Injections(
    deviation=0.3,
    overspeed=0.3,
    dwell=0.5,
    silent=0.2,
    duplicate=0.03,
    out_of_order=0.05,
    late=0.05,
    convoy=0.3,
)


def test_the_proximity_truth_refuses_rules_it_cannot_keep_exact() -> None:
    """A tolerance of a whole fix period would meet fixes of two ticks (which one a moment takes
    then depends on the batches); a loss slower than a silence could fall after the run's end."""
    with pytest.raises(ConfigError, match="tolerance shorter than the fix period"):
        small(proximity=(dataclasses.replace(PROXIMITY, tolerance_ms=1000),)).validate()
    with pytest.raises(ConfigError, match="lost_after within silent_after_s"):
        small(proximity=(dataclasses.replace(PROXIMITY, lost_after_ms=61_000),)).validate()
    with pytest.raises(ConfigError, match="ids must differ"):
        small(proximity=(PROXIMITY, dataclasses.replace(PROXIMITY, enter_m=20))).validate()
    small(proximity=(PROXIMITY,)).validate()


@pytest.mark.parametrize(("ticks", "decided"), [(61, True), (60, False), (40, False)])
def test_a_pair_lost_to_a_silence_exits_at_its_deadline_or_is_undecided(ticks: int, decided: bool) -> None:
    """Two vehicles 10 m apart enter after the minimum duration; the second goes silent at tick 20.
    The pair is lost 30 s after its last meeting (tick 19), decided once the watermark (the last
    tick less the 10 s lateness) is past that deadline, at tick 60; before, the truth cannot say
    (`undecided_alert_ids`): at the deadline itself, or before it."""
    from simulator.truth_proximity import ProximityTruth

    start, period = 1_795_000_000_000, 1000
    truth = ProximityTruth(PROXIMITY, ["v0", "v1"], start, period, lateness_ms=10_000)
    got = []
    for k in range(ticks):
        alive = np.array([True, k < 20])
        lat = np.array([52.5, 52.5 + 10 / 111_320])
        lon = np.array([13.4 + k * 1e-4, 13.4 + k * 1e-4])
        truth.observe(alive, lat, lon)
        got += truth.tick(k, start + k * period, 1000 + k)
    enter = [a for a in got if a.type == "PROXIMITY_ENTER"]
    assert [(a.vehicle_id, a.other_vehicle_id, a.seq) for a in enter] == [
        ("v0", "v1", 1015),
        ("v1", "v0", 1015),
    ]
    exits = [a for a in got if a.type == "PROXIMITY_EXIT"]
    deadline = start + 19 * period + PROXIMITY.lost_after_ms
    if decided:
        assert [(a.vehicle_id, a.seq, a.ts_ms, a.publish_tick) for a in exits] == [
            ("v0", 1019, deadline, 60),
            ("v1", 1019, deadline, 60),
        ]
        assert truth.undecided_alert_ids() == []
    else:
        assert exits == []
        subject = f"{PROXIMITY.rule_id}:v1:{start + 0 * period}"
        assert sorted(truth.undecided_alert_ids()) == sorted(
            [
                alert_id("v0", "PROXIMITY_EXIT", 1019, subject),
                alert_id("v1", "PROXIMITY_EXIT", 1019, f"{PROXIMITY.rule_id}:v0:{start}"),
            ]
        )
