"""Route awareness: direction, stops, arrival and completion, on the reference state
machine (`domain.step`) and through the batch engine, whose fast path must equal folding `step`."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np
import pandas as pd
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from fleetfence.contracts import AlertType
from fleetfence.geo import LocalProjection
from fleetfence.rules import RouteRules
from processor.core.columns import StateTable, empty_states
from processor.core.domain import Alert, EngineConfig, Fix, RawFix, VehicleState, continue_progress, step
from processor.core.engine import process_bucket
from processor.core.geometry import compile_route, route_progress
from processor.core.master import Catalog, MasterState

CFG = EngineConfig(hysteresis_m=15.0, return_min_fixes=2, eta_warmup_s=10.0)
T0 = 1_795_000_000_000
RULES = RouteRules(
    corridor_width_m=100.0,
    speed_limit_kmh=90.0,
    wrong_way_min_m=60.0,
    wrong_way_min_fixes=3,
    wrong_way_min_s=2.0,
    stop_min_s=20.0,
    stop_speed_kmh=3.0,
    stop_radius_m=30.0,
    arrival_risk_s=60.0,
    completion_radius_m=40.0,
)
PROJ = LocalProjection(13.0, 52.0)
WD, DR = AlertType.WRONG_DIRECTION, AlertType.DIRECTION_RESTORED


def types(alerts: list[Alert]) -> list[AlertType]:
    return [a.type for a in alerts]


def on(progress: float | tuple[float, ...], k: int, speed: float = 30.0, **kw: Any) -> Fix:
    """Fix k of a vehicle on route r1 (10 km long) with the given progress; positions are those of
    a straight east-west line (only the stop machine reads them)."""
    p = progress if isinstance(progress, tuple) else (float(progress),)
    lon, lat = PROJ.inverse(np.array([p[0] - 5000.0]), np.array([0.0]))
    base: dict[str, Any] = {"route_length_m": 10_000.0, "end_distance_m": abs(10_000.0 - p[0])}
    base.update(kw)
    return Fix(
        seq=k,
        ts_ms=T0 + k * 1000,
        lat=float(lat[0]),
        lon=float(lon[0]),
        speed_kmh=speed,
        route_id="r1",
        route_version=1,
        progress_m=p,
        **base,
    )


def fold(
    fixes: list[Fix], rules: RouteRules = RULES, s: VehicleState | None = None
) -> tuple[VehicleState, list[Alert]]:
    s = s or VehicleState("v1")
    out: list[Alert] = []
    for f in fixes:
        s, a = step(s, f, rules, CFG)
        out.extend(a)
    return s, out


# --------------------------------------------------------------------------- direction


def test_wrong_direction_after_distance_fixes_and_time_then_restored() -> None:
    prog = [100, 200, 300, 400, 380, 350, 320, 300, 250, 200, 260, 300, 340]
    s, alerts = fold([on(p, k) for k, p in enumerate(prog)])
    assert types(alerts) == [WD, DR]
    wd, dr = alerts
    # 400 -> 320 is the first fix >= 60 m back (seq 6); from the lowest point, 200, 260 is 60 m
    # forward but only one fix on (seq 10): restored at the third, 340 (seq 12).
    assert (wd.seq, dict(wd.details)["moved_m"]) == (6, 80.0)
    assert (dr.seq, dict(dr.details)["moved_m"]) == (12, 140.0)
    assert not s.wrong_way


def test_a_u_turn_shorter_than_the_threshold_raises_nothing() -> None:
    prog = [100, 200, 300, 280, 260, 250, 270, 320, 400]
    assert fold([on(p, k) for k, p in enumerate(prog)])[1] == []


def test_wrong_direction_needs_its_fixes_and_seconds_too() -> None:
    one_jump = [100, 200, 100, 210, 220]  # one fix 100 m back (a GPS outlier), then on
    assert fold([on(p, k) for k, p in enumerate(one_jump)])[1] == []
    rules = RouteRules(**{**RULES.__dict__, "wrong_way_min_fixes": 1, "wrong_way_min_s": 10.0})
    assert fold([on(p, k) for k, p in enumerate([300, 200, 190, 180])], rules)[1] == []


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.floats(min_value=-29.0, max_value=29.0), min_size=2, max_size=120),
    st.floats(min_value=0.0, max_value=5.0),
)
def test_no_direction_alert_under_jitter_below_half_the_threshold(
    jitter: list[float], speed_mps: float
) -> None:
    """A vehicle standing or driving forward, its progress read with up to +-29 m of noise (less
    than half of the 60 m threshold), never raises a direction alert."""
    fixes = [on(1000.0 + k * speed_mps + j, k) for k, j in enumerate(jitter)]
    assert [a for a in fold(fixes)[1] if a.type in (WD, DR)] == []


def test_progress_continues_along_the_pass_it_was_on() -> None:
    assert continue_progress((300.0, 1700.0), 310.0) == 300.0
    # At the tip of a U-turn both legs are as near: the one ahead continues the route.
    assert continue_progress((1980.0, 2020.0), 2000.0) == 2020.0
    assert continue_progress((1940.0, 2020.0), 1995.0) == 2020.0
    assert continue_progress((300.0, 1700.0), 1690.0) == 1700.0
    # No progress to continue from: a fix near two passes is not placed; near one, it is.
    assert continue_progress((300.0, 1700.0), -1.0) is None
    assert continue_progress((300.0,), -1.0) == 300.0


def route_data(xs: list[float], **rules: Any) -> dict[str, Any]:
    """Route r1 through these points of an east-west line (metres), with short thresholds."""
    lon, lat = PROJ.inverse(np.array(xs), np.zeros(len(xs)))
    return {
        "route_id": "r1",
        "geometry": {
            "type": "LineString",
            "coordinates": [[float(x), float(y)] for x, y in zip(lon, lat, strict=True)],
        },
        "corridor_width_m": 100.0,
        "speed_limit_kmh": 90.0,
        "wrong_way_min_m": 60.0,
        "wrong_way_min_fixes": 3,
        "wrong_way_min_s": 2.0,
        "stop_min_s": 20.0,
        "stop_radius_m": 30.0,
        "arrival_risk_s": 60.0,
        "completion_radius_m": 40.0,
        **rules,
    }


def out_and_back_route() -> dict[str, Any]:
    """East 2 km, then back west along the very same street: every point is near two passes."""
    return route_data([0.0, 1000.0, 2000.0, 1000.0, 0.0])


def straight_route(**rules: Any) -> dict[str, Any]:
    """East 3 km."""
    return route_data([0.0, 3000.0], **rules)


def test_route_progress_finds_both_passes_of_a_street_driven_both_ways() -> None:
    cr = compile_route("r1", 1, out_and_back_route(), 15.0)
    lon, lat = PROJ.inverse(np.array([300.0, 1995.0, 5000.0]), np.array([3.0, 0.0, 0.0]))
    mask = np.array([True, True, False])
    progress, passes, end = route_progress([cr], np.zeros(3, dtype=np.int64), lon, lat, mask)
    p300 = passes[0]
    assert len(p300) == 2
    assert abs(p300[0] - 300.0) < 0.5
    assert abs(p300[1] - 3700.0) < 0.5
    assert np.isnan(progress[0])
    assert np.isnan(progress[2])
    # Near the far end the two passes meet at the turn: one pass.
    assert 1 not in passes
    assert abs(progress[1] - 1995.0) < 6.0
    assert abs(end[0] - 300.0) < 0.5
    assert np.isinf(end[2])


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), n=st.integers(1, 300))
@example(seed=1, n=300)  # every route past the own-tree threshold
def test_a_fixs_passes_do_not_depend_on_the_batch_it_came_in(seed: int, n: int) -> None:
    """A route with many fixes in a batch is searched in its own R-tree, the others in the shared
    one of every route (`RouteSetIndex`): each fix gets the same passes either way."""
    rng = np.random.default_rng(seed)
    routes = [
        compile_route("r1", 1, out_and_back_route(), 15.0),
        compile_route("r2", 1, straight_route(), 15.0),
        compile_route("r3", 1, route_data([0.0, 800.0, 400.0, 1200.0]), 15.0),
    ]
    x, y = rng.uniform(-100.0, 3100.0, n), rng.normal(0.0, 20.0, n)
    lon, lat = PROJ.inverse(x, y)
    ridx = rng.integers(0, len(routes), n)
    mask = rng.random(n) < 0.9
    together = route_progress(routes, ridx, lon, lat, mask)
    for i in range(n):
        one = route_progress(routes, ridx[i : i + 1], lon[i : i + 1], lat[i : i + 1], mask[i : i + 1])
        assert np.array_equal(one[0], together[0][i : i + 1], equal_nan=True)
        assert one[1].get(0) == together[1].get(i)
        assert one[2][0] == together[2][i]


# --------------------------------------------------------------------------- engine


def master(
    route: dict[str, Any], assignment: dict[str, Any] | None = None, zones: tuple[dict[str, Any], ...] = ()
) -> MasterState:
    m = MasterState()
    m.apply({"entity": "route", "id": "r1", "version": 1, "op": "upsert", "data": route})
    for z in zones:
        m.apply({"entity": "zone", "id": z["zone_id"], "version": 1, "op": "upsert", "data": z})
    for v in ("a", "b", "c"):
        data = {
            "vehicle_id": v,
            "route_id": "r1",
            "valid_from_ms": 0,
            "valid_to_ms": None,
            **(assignment or {}),
        }
        m.apply({"entity": "assignment", "id": v, "version": 1, "op": "upsert", "data": data})
    return m


def frame(track: list[tuple[str, float, float, float]]) -> pd.DataFrame:
    """(vehicle, x_m, y_m, speed_kmh) per fix; each vehicle's fixes one second apart."""
    seqs: dict[str, int] = {}
    rows = []
    for v, x, y, speed in track:
        k = seqs[v] = seqs.get(v, -1) + 1
        lon, lat = PROJ.inverse(np.array([x]), np.array([y]))
        rows.append([v, k, T0 + k * 1000, float(lat[0]), float(lon[0]), speed, T0 + k * 1000])
    return pd.DataFrame(
        rows, columns=["vehicle_id", "seq", "ts_ms", "lat", "lon", "speed_kmh", "received_ms"]
    )


def run_engine(
    batches: list[pd.DataFrame], m: MasterState, fast_path: bool = True
) -> tuple[list[Alert], StateTable, int, list[dict[str, Any]]]:
    cat = Catalog(CFG)
    states = empty_states()
    held: dict[str, list[RawFix]] = {}
    alerts: list[Alert] = []
    live: list[dict[str, Any]] = []
    fast = wm = 0
    for b in batches:
        r = process_bucket(states, held, m, b, wm, replace(CFG, fast_path=fast_path), cat)
        states, held = r.states, r.held
        fast += r.fast_vehicles
        alerts.extend(r.alerts)
        live.extend(r.live)
        if len(b):
            wm = max(wm, int(b["ts_ms"].max()) - CFG.lateness_ms)
    return alerts, states, fast, live


def drive(v: str, xs: list[float], speed: float = 36.0) -> list[tuple[str, float, float, float]]:
    return [(v, x, 0.0, speed) for x in xs]


def test_a_street_driven_out_and_back_is_never_wrong_way_and_completes_at_the_end() -> None:
    xs = [float(x) for x in range(0, 2001, 20)] + [float(x) for x in range(1980, -1, -20)]
    df = frame(drive("a", xs))
    alerts, states, _, _ = run_engine(
        [df.iloc[i : i + 25] for i in range(0, len(df), 25)], master(out_and_back_route())
    )
    assert types(alerts) == [AlertType.ROUTE_COMPLETED]
    done = alerts[0]
    assert done.seq == len(xs) - 2  # x = 20: the first fix within 40 m of the end (which is the start)
    # Every fix before the turn is near both passes and the vehicle has no progress to continue
    # from: it is placed only where the passes meet, at the turn, and its trip counts from there.
    assert 1900 < dict(done.details)["distance_m"] < 2100
    assert states.state("a").completed


def test_engine_raises_each_route_alert_once_and_its_live_row_shows_the_trip() -> None:
    dep = T0
    fwd = [float(x) for x in range(0, 1001, 10)]  # 100 s at 36 km/h
    back = [1000.0 - 10.0 * k for k in range(1, 13)]  # 120 m the wrong way
    again = [880.0 + 10.0 * k for k in range(1, 40)]
    stop = [1270.0] * 40  # 40 s standing
    rest = [1270.0 + 20.0 * k for k in range(1, 90)]  # on to the end at 72 km/h
    track = drive("a", fwd + back + again) + [("a", x, 0.0, 0.0) for x in stop] + drive("a", rest, 72.0)
    df = frame(track)
    m = master(straight_route(), {"planned_departure_ms": dep, "planned_arrival_ms": dep + 200_000})
    alerts, _, _fast, live = run_engine([df.iloc[i : i + 30] for i in range(0, len(df), 30)], m)
    got = types(alerts)
    for t in (
        WD,
        DR,
        AlertType.UNPLANNED_STOP,
        AlertType.STOP_ENDED,
        AlertType.ARRIVAL_AT_RISK,
        AlertType.ROUTE_COMPLETED,
    ):
        assert got.count(t) == 1, (t, got)
    assert (
        got.index(WD) < got.index(DR) < got.index(AlertType.UNPLANNED_STOP) < got.index(AlertType.STOP_ENDED)
    )
    assert dict(alerts[got.index(AlertType.STOP_ENDED)].details)["duration_s"] >= 20.0
    risk = alerts[got.index(AlertType.ARRIVAL_AT_RISK)]
    assert dict(risk.details)["delay_s"] > 60.0
    last = live[-1]
    assert last["completed"] is True
    assert last["progress_m"] > 2900


def test_planned_stop_zone_raises_no_stop_alert() -> None:
    lon, lat = PROJ.inverse(
        np.array([400.0, 600.0, 600.0, 400.0, 400.0]), np.array([-80.0, -80.0, 80.0, 80.0, -80.0])
    )
    depot: dict[str, Any] = {
        "zone_id": "depot",
        "kind": "customer",
        "geometry": {
            "type": "Polygon",
            "coordinates": [[[float(x), float(y)] for x, y in zip(lon, lat, strict=True)]],
        },
    }
    track = drive("a", [float(x) for x in range(0, 500, 10)]) + [("a", 500.0, 0.0, 0.0)] * 40
    alerts, _, _, _ = run_engine([frame(track)], master(straight_route(), zones=(depot,)))
    assert [t for t in types(alerts) if t in (AlertType.UNPLANNED_STOP, AlertType.STOP_ENDED)] == []
    other = {**depot, "kind": "other"}
    alerts, _, _, _ = run_engine([frame(track)], master(straight_route(), zones=(other,)))
    assert AlertType.UNPLANNED_STOP in types(alerts)


# --------------------------------------------------------------------------- fast path == fold

move = st.tuples(
    st.sampled_from(["a", "b", "c", "d"]),  # d is unassigned
    st.sampled_from([12.0, 12.0, 12.0, -25.0, 0.0, 35.0]),  # metres moved along the route
    st.sampled_from([0.0, 0.0, 4.0, -30.0, 90.0]),  # lateral offset (90: outside the corridor)
    st.sampled_from([40.0, 40.0, 1.0, 0.0, 120.0]),  # speed
)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(move, min_size=1, max_size=150),
    st.integers(min_value=1, max_value=5),
    st.sampled_from(["none", "arrival", "duration", "out_and_back"]),
)
@example(
    [("a", 12.0, 0.0, 40.0)] * 60 + [("a", -25.0, 0.0, 40.0)] * 6 + [("a", 0.0, 0.0, 0.0)] * 30, 3, "arrival"
)
def test_fast_path_equals_the_reference_fold_with_route_awareness(
    moves: list[tuple[str, float, float, float]], n_batches: int, plan: str
) -> None:
    pos: dict[str, float] = {}
    track = []
    for v, dx, y, speed in moves:
        pos[v] = min(max(pos.get(v, 2000.0 if v == "b" else 100.0) + dx, 0.0), 3000.0)
        track.append((v, pos[v], y, speed))
    df = frame(track)
    batches = [df.iloc[i::n_batches] for i in range(n_batches)]
    # No plan, a planned arrival on the assignment, or a planned duration on the route (the trip's
    # planned arrival then hangs on when its trip started, which the fast path also replays).
    sched = {"planned_arrival_ms": T0 + 30_000} if plan == "arrival" else {}
    # ... or a street the route drives both ways, where fixes near two passes take the slow path.
    route = straight_route(planned_duration_s=25.0) if plan == "duration" else straight_route()
    if plan == "out_and_back":
        route = out_and_back_route()
    m = master(route, sched)
    fast_alerts, fast_states, fast, _ = run_engine(batches, m)
    slow_alerts, slow_states, none, _ = run_engine(batches, m, fast_path=False)
    assert none == 0
    FAST_SEEN.append(fast)
    assert sorted(a.alert_id for a in fast_alerts) == sorted(a.alert_id for a in slow_alerts)
    for v in slow_states.ids:
        assert fast_states.state(v) == slow_states.state(v), v


FAST_SEEN: list[int] = []


def test_the_route_awareness_property_exercised_the_fast_path() -> None:
    assert sum(FAST_SEEN) > 0


# --------------------------------------------------------------------------- no flapping, replays


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(st.floats(min_value=0.0, max_value=7.9), st.floats(min_value=-20.0, max_value=20.0)),
        min_size=1,
        max_size=200,
    )
)
def test_a_stop_raises_at_most_one_alert_under_speed_and_position_jitter(
    jitter: list[tuple[float, float]],
) -> None:
    """Standing still with the speed reading jittering up to 7.9 km/h (under the stop speed plus
    the hysteresis) and the position by +-20 m (inside the radius plus the hysteresis band): one
    UNPLANNED_STOP at most, and no STOP_ENDED while it stands."""
    _, alerts = fold([on(1000.0 + dx, k, speed=0.0 if k == 0 else v) for k, (v, dx) in enumerate(jitter)])
    stops = [a.type for a in alerts if a.type in (AlertType.UNPLANNED_STOP, AlertType.STOP_ENDED)]
    assert stops in ([], [AlertType.UNPLANNED_STOP])


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.floats(min_value=-59.0, max_value=59.0), min_size=1, max_size=80), st.floats(-100.0, 100.0)
)
def test_arrival_alerts_do_not_flap_while_the_delay_jitters_within_the_hysteresis(
    jitter_s: list[float], offset_s: float
) -> None:
    """A trip whose ETA jitters by less than half the hysteresis (120 s) either side of a level:
    one ARRIVAL_AT_RISK at most and never ARRIVAL_BACK_ON_TIME, whatever the level."""
    fixes = []
    for k, j in enumerate([0.0, *jitter_s]):
        t = 10.0 * k
        # Progress that gives exactly this ETA at the trip's average speed: t + (L - p) t / p = E.
        eta_s = 1000.0 + j
        p = 10_000.0 * t / eta_s
        fixes.append(
            Fix(
                seq=k,
                ts_ms=T0 + int(t * 1000),
                lat=52.0,
                lon=13.0,
                speed_kmh=36.0,
                route_id="r1",
                route_version=1,
                progress_m=(p,),
                route_length_m=10_000.0,
                end_distance_m=10_000.0 - p,
                planned_arrival_ms=T0 + int((1000.0 - offset_s) * 1000),
            )
        )
    rules = RouteRules(**{**RULES.__dict__, "arrival_risk_s": 60.0, "wrong_way_min_m": float("inf")})
    risk = [a.type for a in fold(fixes, rules)[1]]
    assert risk.count(AlertType.ARRIVAL_AT_RISK) <= 1
    assert AlertType.ARRIVAL_BACK_ON_TIME not in risk


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(move, min_size=1, max_size=120), st.integers(min_value=1, max_value=4), st.data())
def test_replaying_any_batches_again_raises_nothing_new(
    moves: list[tuple[str, float, float, float]], n_batches: int, data: st.DataObject
) -> None:
    """A restart re-reads what it had applied: every replayed fix is a duplicate, no alert repeats."""
    pos: dict[str, float] = {}
    track = []
    for v, dx, y, speed in moves:
        pos[v] = min(max(pos.get(v, 100.0) + dx, 0.0), 3000.0)
        track.append((v, pos[v], y, speed))
    df = frame(track)
    batches = [df.iloc[i::n_batches] for i in range(n_batches)]
    m = master(straight_route(), {"planned_arrival_ms": T0 + 30_000})
    cat = Catalog(CFG)
    states = empty_states()
    held: dict[str, list[RawFix]] = {}
    for i, b in enumerate(batches):
        r = process_bucket(states, held, m, b, 0, CFG, cat)
        states, held = r.states, r.held
        again = data.draw(st.sampled_from(batches[: i + 1]))
        before = [states.state(v) for v in states.ids]
        r2 = process_bucket(states, held, m, again, 0, CFG, cat)
        states, held = r2.states, r2.held
        assert r2.alerts == []
        assert r2.accepted == 0
        assert [states.state(v) for v in states.ids] == before


def test_a_new_assignment_to_the_same_route_starts_a_new_trip() -> None:
    """Tomorrow's run of today's route: completed yesterday, it is a new trip once reassigned;
    a new plan on the same assignment keeps the trip."""
    end = [float(x) for x in range(2600, 3001, 20)]
    m = master(straight_route())
    alerts, states, _, _ = run_engine([frame(drive("a", end))], m)
    assert types(alerts) == [AlertType.ROUTE_COMPLETED]
    # Same assignment, a new plan: still completed, nothing new.
    again = frame(drive("a", end + end))
    m.apply(
        {
            "entity": "assignment",
            "id": "a",
            "version": 2,
            "op": "upsert",
            "data": {
                "vehicle_id": "a",
                "route_id": "r1",
                "valid_from_ms": 0,
                "planned_arrival_ms": T0 + 10**7,
            },
        }
    )
    r = process_bucket(states, {}, m, again.iloc[len(end) :], 0, CFG, Catalog(CFG))
    assert r.alerts == []
    assert r.states.state("a").completed
    # Reassigned: the next drive to the end completes a new trip.
    m.apply(
        {
            "entity": "assignment",
            "id": "a",
            "version": 3,
            "op": "upsert",
            "data": {"vehicle_id": "a", "route_id": "r1", "valid_from_ms": T0},
        }
    )
    third = frame(drive("a", end + end + end)).iloc[2 * len(end) :]
    r = process_bucket(r.states, r.held, m, third, 0, CFG, Catalog(CFG))
    assert types(r.alerts) == [AlertType.ROUTE_COMPLETED]
    assert r.states.state("a").trip_from_ms == T0


# --------------------------------------------------------------------------- first placement

# A route whose last leg runs south-east to its end at (0, 0) and crosses, 30 m before it, a
# diagonal street the route drove early on. Metres, in the route's frame; the fixes as published,
# 1 s apart, the transport delivering seq 7 before seq 6.
CROSSING_EARLY = [(15.6, 48.5), (-17.0, 27.9), (-49.6, 7.4), (-82.2, -13.2), (-85.0, -15.9)]
CROSSING_LATE = [(-300.0, 400.0), (-71.6, 95.7), (-47.7, 63.8), (-23.9, 31.9), (0.0, 0.0)]
CROSSING_FIXES = [
    (0, -33.8, 45.2),
    (1, -27.9, 37.3),
    (2, -23.9, 32.9),
    (3, -18.9, 24.2),
    (4, -10.9, 15.2),
    (5, -0.8, 4.0),
    (7, 0.9, 13.6),  # the vehicle has turned at the end; seq 7 overtakes seq 6 in transport
    (6, 6.3, -2.5),
    (8, -14.9, 18.1),
    (9, -15.6, 23.5),
]


def route_xy(points: list[tuple[float, float]], **rules: Any) -> dict[str, Any]:
    """Route r1 through these points (metres around PROJ's origin), with the load test's rules."""
    lon, lat = PROJ.inverse(np.array([p[0] for p in points]), np.array([p[1] for p in points]))
    base = route_data([0.0, 1.0], corridor_width_m=60.0, completion_radius_m=50.0, **rules)
    base["geometry"]["coordinates"] = [[float(x), float(y)] for x, y in zip(lon, lat, strict=True)]
    return base


def crossing_end_route() -> dict[str, Any]:
    """From 500 m north-east down the early diagonal, a 6 km detour, then the last leg to the end."""
    detour = [(-85.0, -1500.0), (-1500.0, -1500.0), (-1500.0, 600.0)]
    return route_xy([(400.0, 300.0), *CROSSING_EARLY, *detour, *CROSSING_LATE])


def placed_fixes(data: dict[str, Any], fixes: list[tuple[int, float, float]]) -> list[Fix]:
    """Each fix with its passes and end distance as the engine's geometry computes them, by seq."""
    cr = compile_route("r1", 1, data, CFG.hysteresis_m)
    ordered = sorted(fixes)
    lon, lat = PROJ.inverse(np.array([f[1] for f in ordered]), np.array([f[2] for f in ordered]))
    n = len(ordered)
    progress, passes, end = route_progress([cr], np.zeros(n, dtype=np.int64), lon, lat, np.ones(n, bool))
    out = []
    for i, (k, _x, _y) in enumerate(ordered):
        p = passes.get(i) or (() if np.isnan(progress[i]) else (float(progress[i]),))
        out.append(
            Fix(
                seq=k,
                ts_ms=T0 + k * 1000,
                lat=float(lat[i]),
                lon=float(lon[i]),
                speed_kmh=35.0,
                route_id="r1",
                route_version=1,
                progress_m=p,
                end_distance_m=float(end[i]),
                route_length_m=cr.length_m,
            )
        )
    return out


def xy_frame(v: str, fixes: list[tuple[int, float, float]]) -> pd.DataFrame:
    rows = []
    for k, x, y in fixes:
        lon, lat = PROJ.inverse(np.array([x]), np.array([y]))
        rows.append([v, k, T0 + k * 1000, float(lat[0]), float(lon[0]), 35.0, T0 + k * 1000])
    return pd.DataFrame(
        rows, columns=["vehicle_id", "seq", "ts_ms", "lat", "lon", "speed_kmh", "received_ms"]
    )


def completions(alerts: list[Alert]) -> list[tuple[int, float, float]]:
    return [
        (a.seq, dict(a.details)["distance_m"], dict(a.details)["duration_s"])
        for a in alerts
        if a.type is AlertType.ROUTE_COMPLETED
    ]


def test_a_vehicle_first_seen_where_its_route_crosses_its_own_end_completes_where_it_is_placed() -> None:
    """The load test's mismatch, in the engine. The first six fixes are near the last leg and the
    early diagonal: a vehicle with no past cannot be placed there, and one of the two passes lies
    before half the route, so nothing says it completed. Seq 6 is near the last leg alone: the
    vehicle is placed there, at its route's end, and completes there (its trip starts there too).
    The fold, the fast path and the slow path agree, whichever batch the overtaken fix arrives in;
    the simulator refuses such starts (`test_a_start_the_processor_cannot_judge_is_moved_back`)."""
    data = crossing_end_route()
    fixes = placed_fixes(data, CROSSING_FIXES)
    assert all(len(f.progress_m) == 2 for f in fixes[:6])
    assert len(fixes[6].progress_m) == 1
    assert min(fixes[0].progress_m) < fixes[0].route_length_m / 2 < max(fixes[0].progress_m)
    _s, folded = fold(fixes, RouteRules.from_master(data))
    assert completions(folded) == [(6, 0.0, 0.0)]
    m = master(data)
    arrived = xy_frame("a", CROSSING_FIXES)
    for cut in (1, 6, 7, 8):
        batches = [arrived.iloc[:cut], arrived.iloc[cut:]]
        for fast_path in (True, False):
            alerts, _, _, _ = run_engine(batches, m, fast_path=fast_path)
            assert completions(alerts) == [(6, 0.0, 0.0)], (cut, fast_path)
            assert [a.type for a in alerts] == [AlertType.ROUTE_COMPLETED]


def test_a_vehicle_first_seen_where_its_route_retraces_a_street_completes_at_the_radius() -> None:
    """The route's last 300 m drive back along the street it came on. A vehicle first seen there is
    near both passes and cannot be placed, but both lie past half the route: it completes at its
    first fix within the radius, not once it has driven past the end."""
    data = route_data([0.0, 3000.0, 2700.0])
    xs = [2790.0, 2775.0, 2760.0, 2745.0, 2730.0, 2715.0, 2700.0, 2685.0, 2670.0]
    track = [(k, x, 0.0) for k, x in enumerate(xs)]
    fixes = placed_fixes(data, track)
    assert all(len(f.progress_m) == 2 for f in fixes[:5])
    _s, folded = fold(fixes, RouteRules.from_master(data))
    assert completions(folded) == [(4, 0.0, 0.0)]  # 30 m from the end; the radius is 40 m
    m = master(data)
    arrived = xy_frame("a", track)
    for fast_path in (True, False):
        alerts, states, _, _ = run_engine([arrived.iloc[:3], arrived.iloc[3:]], m, fast_path=fast_path)
        assert completions(alerts) == [(4, 0.0, 0.0)]
        assert [a.type for a in alerts] == [AlertType.ROUTE_COMPLETED]
        assert states.state("a").completed


# A narrow hairpin whose legs run 9 m apart and whose tip lies beyond the half width
# of a fix beside the legs; the segments at the tip are out of that fix's reach.
HAIRPIN = [
    (-1368.1, -162.6),
    (-1389.9, -195.8),
    (-1411.7, -228.9),
    (-1415.2, -232.1),
    (-1419.8, -233.0),
    (-1424.3, -231.6),
    (-1403.0, -199.2),
    (-1381.8, -166.8),
    (-1360.5, -134.4),
]


def test_a_narrow_hairpins_legs_stay_two_passes_when_its_tip_is_out_of_reach() -> None:
    """A fix 0.1 m from the out leg and 9 m from the back leg is near both: the chain of near
    points along the segments before the tip must not join the legs into one pass (then only the
    nearer leg was kept, and a vehicle on the back leg jumped back 80 m: a false wrong way)."""
    cr = compile_route("r1", 1, route_xy([(-1300.0, -60.0), *HAIRPIN, (-1300.0, -40.0)]), 15.0)
    lon, lat = PROJ.inverse(np.array([-1395.7]), np.array([-204.4]))
    progress, passes, _end = route_progress([cr], np.zeros(1, dtype=np.int64), lon, lat, np.ones(1, bool))
    assert np.isnan(progress[0])
    legs = passes[0]
    assert len(legs) == 2
    assert 70.0 < legs[1] - legs[0] < 100.0
    # Continuity then keeps a vehicle coming from the tip on the back leg.
    assert continue_progress(legs, legs[1] - 17.0) == legs[1]
