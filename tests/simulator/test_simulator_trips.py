"""The route-awareness episodes of the simulator (issue #26): planned so their truth is exact."""

from __future__ import annotations

import numpy as np
import pytest
import shapely

from fleetfence.contracts import AlertType
from simulator.config import Injections
from simulator.geo import Polyline
from simulator.scenario import WW_DONE
from simulator.trips import (
    END_MARGIN_M,
    WW_MARGIN_M,
    end_nudge,
    plan_schedule,
    shared_stretches,
    wrong_way_profile,
)
from tests.simulator.helpers import run, small

ONLY_TRIPS = Injections(0, 0, 0, 0, duplicate=0, out_of_order=0, late=0, wrong_way=0.25, schedule=0.25)


@pytest.mark.parametrize("threshold_m", [40.0, 60.0, 100.0, 173.0])
def test_wrong_way_profile_keeps_every_fix_clear_of_the_threshold(threshold_m: float) -> None:
    v = wrong_way_profile(threshold_m, 1.5, 1.0)
    d = np.cumsum(v)
    assert np.abs(d - threshold_m).min() >= WW_MARGIN_M
    assert d[-1] > threshold_m
    assert np.abs(np.diff(np.concatenate(([0.0], v)))).max() <= 1.5 + 1e-9  # accelerates like a vehicle


def test_end_nudge_keeps_the_distance_to_the_end_clear_of_the_radius() -> None:
    rng = np.random.default_rng(3)
    x = rng.uniform(-70, 70, 5000)
    y = rng.uniform(-70, 70, 5000)
    nx, ny = rng.uniform(-6, 6, 5000), rng.uniform(-6, 6, 5000)
    zero = np.zeros(5000)
    fx, fy = end_nudge(x, y, nx, ny, zero, zero, 50.0)
    d0, d = np.hypot(x, y), np.hypot(x + fx, y + fy)
    assert np.all(np.abs(d - 50.0) >= END_MARGIN_M - 1e-9)
    assert np.all((d0 >= 50.0) == (d > 50.0))  # always on the planned side
    assert np.hypot(fx, fy).max() <= max(END_MARGIN_M, np.hypot(nx, ny).max()) + 1e-9


def test_shared_stretches_are_where_the_route_passes_twice() -> None:
    # East 1 km, north 200 m, back west 1 km 30 m north of the first leg: a street "used twice".
    xs = np.array([0.0, 1000.0, 1000.0, 0.0])
    ys = np.array([0.0, 0.0, 30.0, 30.0])
    flags = shared_stretches(Polyline.of(xs, ys), 50.0, 5.0)
    s = np.arange(len(flags)) * 2.0
    assert flags[(s > 100) & (s < 800)].all()  # both long legs, all along
    assert not flags[(s > 1010) & (s < 1020)].any()  # the short northward leg is the turn itself


def test_plan_schedule_puts_the_trip_at_risk_then_back_on_time_clear_of_both_thresholds() -> None:
    ts = np.arange(0, 400_000, 1000, dtype=np.float64)
    eta = np.where(ts >= 60_000, 2_000_000 - ts * 3.0, np.nan)  # falling ETAs after a warm-up
    planned = plan_schedule(eta, 600.0, 120.0)
    assert planned is not None
    delay = (eta[~np.isnan(eta)] - planned) / 1000
    assert delay[0] > 600
    assert delay[-1] <= 480
    assert np.abs(delay - 600).min() >= 0.05
    assert np.abs(delay - 480).min() >= 0.05
    assert plan_schedule(np.full(400, 1_000_000.0), 600.0, 120.0) is None  # an ETA that never moves


def test_wrong_way_and_schedule_episodes_have_exact_truth_at_the_planned_fixes() -> None:
    sc, batches, truth = run(small(vehicles=16, inject=ONLY_TRIPS, seed=5))
    assert sc.stats.wrong_ways > 0
    assert sc.stats.schedules > 0
    by_type: dict[str, list[tuple[str, int]]] = {}
    for a in truth:
        by_type.setdefault(a.type, []).append((a.vehicle_id, a.seq))
    vids = sc.vehicle_ids()
    ww = {vids[i] for i in np.flatnonzero(sc.ww & (sc.ww_phase == WW_DONE))}
    assert {v for v, _ in by_type[AlertType.WRONG_DIRECTION.value]} == ww
    assert {v for v, _ in by_type[AlertType.DIRECTION_RESTORED.value]} == ww
    sched = {vids[i] for i in np.flatnonzero(sc.planned_arrival_ms >= 0)}
    assert {v for v, _ in by_type[AlertType.ARRIVAL_AT_RISK.value]} == sched
    assert {v for v, _ in by_type[AlertType.ARRIVAL_BACK_ON_TIME.value]} == sched
    # The wrong-way fixes carry no noise: each lies on its route line, and the alert is raised at
    # the first fix the threshold behind the turn.
    fixes: dict[str, list[tuple[int, float, float]]] = {}
    for b in batches:
        for v, s, lat, lon in zip(
            b.vehicle.tolist(), b.seq.tolist(), b.lat.tolist(), b.lon.tolist(), strict=True
        ):
            fixes.setdefault(vids[v], []).append((s, lon, lat))
    for v, seq in by_type[AlertType.WRONG_DIRECTION.value]:
        i = vids.index(v)
        route = sc.city.routes[int(sc.route_idx[i])]
        track = sorted(set(fixes[v]))
        x, y = sc.city.projection.forward(np.array([t[1] for t in track]), np.array([t[2] for t in track]))
        along = shapely.line_locate_point(route.line_m, shapely.points(x, y))
        k = [t[0] for t in track].index(seq)
        j = int(np.argmax(along[: k + 1]))  # the turn
        back = along[j] - along[j : k + 1]
        assert back[-1] >= sc.cfg.rules.wrong_way_min_m + 0.9
        assert (back[:-1] <= sc.cfg.rules.wrong_way_min_m - 0.9).all()
