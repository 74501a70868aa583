"""The peers the processor is measured against, doing the same job on the same topic.

- `naive`: the loop a user would write first: one confluent-kafka consumer, orjson, one Shapely
  `contains_xy` call per fix against the prepared corridor, state in a dict, alerts produced
  at-least-once, no checkpointed state.
- `quix`: a quixstreams 3 application with RocksDB state and its exactly-once guarantee.

Both implement the same rule as FleetFence's ROUTE_DEVIATION/ROUTE_RETURN (3 fixes outside the
corridor, 2 fixes back inside the inner band) so their alert counts are comparable.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import orjson
import shapely
from confluent_kafka import TopicPartition

from fleetfence.kafka import plain_consumer, plain_producer
from processor.core.geometry import compile_route

HYSTERESIS_M = 15.0


def corridors(routes: dict[str, dict[str, Any]]) -> dict[str, tuple[Any, Any]]:
    out = {}
    for rid, data in routes.items():
        cr = compile_route(rid, 1, data, HYSTERESIS_M)
        out[rid] = (cr.corridor, cr.inner)
    return out


def step(st: dict[str, Any], corr: tuple[Any, Any], d: dict[str, Any]) -> str | None:
    """Deviation/return with the processor's debounce; returns an alert type or None."""
    if d["seq"] <= st.get("seq", -1):
        return None
    st["seq"] = d["seq"]
    lon, lat = d["lon"], d["lat"]
    if not st.get("off"):
        if shapely.contains_xy(corr[0], lon, lat):
            st["out"] = 0
            return None
        st["out"] = st.get("out", 0) + 1
        if st["out"] >= 3:
            st["off"], st["in"] = True, 0
            return "ROUTE_DEVIATION"
        return None
    if shapely.contains_xy(corr[1], lon, lat):
        st["in"] = st.get("in", 0) + 1
        if st["in"] >= 2:
            st["off"], st["out"], st["in"] = False, 0, 0
            return "ROUTE_RETURN"
    else:
        st["in"] = 0
    return None


def run_naive(
    bootstrap: str,
    topic: str,
    partitions: int,
    total: int,
    alerts_topic: str,
    routes: dict[str, dict[str, Any]],
    assignment: dict[str, str],
    warmup: int = 0,
    cpu: Callable[[], tuple[float, float]] | None = None,
) -> dict[str, Any]:
    corr = corridors(routes)
    cpu = cpu or (lambda: (0.0, 0.0))
    c = plain_consumer(
        bootstrap,
        "naive",
        **{"enable.auto.commit": False, "auto.offset.reset": "earliest", "fetch.max.bytes": 64 * 1024 * 1024},
    )
    c.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
    p = plain_producer(bootstrap, **{"linger.ms": 5})
    states: dict[str, dict[str, Any]] = {}
    n = alerts = 0
    t_first = None
    warm: tuple[float, int] | None = None  # (time, events) when the warm-up share was done
    cpu_warm = (0.0, 0.0)
    while n < total:
        msgs = c.consume(10000, 1.0)
        if t_first is None and msgs:
            t_first = time.perf_counter()
        if warm is None and n >= warmup and msgs:
            warm = (time.perf_counter(), n)
            cpu_warm = cpu()
        for m in msgs:
            if m.error() is not None:
                continue
            d = orjson.loads(m.value())
            vid = d["vehicle_id"]
            st = states.setdefault(vid, {})
            a = step(st, corr[assignment[vid]], d)
            if a is not None:
                alerts += 1
                p.produce(
                    alerts_topic,
                    key=vid.encode(),
                    value=orjson.dumps({"type": a, "vehicle_id": vid, "seq": d["seq"]}),
                )
            n += 1
        p.poll(0)
    p.flush(30)
    t_end = time.perf_counter()
    cpu_end = cpu()
    c.close()
    t_warm, n_warm = warm or (t_first or t_end, 0)
    return {
        "events": n,
        "seconds": t_end - t_warm,
        "sustained_events": n - n_warm,
        "startup_s": 0.0,
        "alerts": alerts,
        "cpu_s": [cpu_end[0] - cpu_warm[0], cpu_end[1] - cpu_warm[1]],
    }


def run_quix(
    bootstrap: str,
    topic: str,
    total: int,
    alerts_topic: str,
    routes: dict[str, dict[str, Any]],
    assignment: dict[str, str],
    state_dir: str,
    warmup: int = 0,
    cpu: Callable[[], tuple[float, float]] | None = None,
) -> dict[str, Any]:
    from quixstreams import Application

    cpu = cpu or (lambda: (0.0, 0.0))
    snapshots: dict[str, tuple[float, float]] = {}
    corr = corridors(routes)
    app = Application(
        broker_address=bootstrap,
        consumer_group="quix-bench",
        auto_offset_reset="earliest",
        processing_guarantee="exactly-once",
        state_dir=state_dir,
        loglevel="WARNING",
    )
    src = app.topic(topic, value_deserializer="json")
    out = app.topic(alerts_topic, value_serializer="json")
    counters = {"n": 0, "alerts": 0, "t_warm": 0.0, "t_last": 0.0}

    def process(value: dict[str, Any], state: Any) -> dict[str, Any] | None:
        if counters["n"] == warmup:
            counters["t_warm"] = time.perf_counter()
            snapshots["warm"] = cpu()
        counters["n"] += 1
        st = state.get("s", default={})
        a = step(st, corr[assignment[value["vehicle_id"]]], value)
        state.set("s", st)
        if counters["n"] >= total:
            counters["t_last"] = time.perf_counter()
            snapshots["end"] = cpu()
            app.stop()
        if a is None:
            return None
        counters["alerts"] += 1
        return {"type": a, "vehicle_id": value["vehicle_id"], "seq": value["seq"]}

    sdf = app.dataframe(src)
    sdf = sdf.apply(process, stateful=True).filter(lambda v: v is not None)
    sdf.to_topic(out)
    app.run()
    return {
        "events": counters["n"],
        "seconds": counters["t_last"] - counters["t_warm"],
        "sustained_events": counters["n"] - warmup,
        "startup_s": 0.0,
        "cpu_s": [snapshots["end"][i] - snapshots["warm"][i] for i in (0, 1)],
        "alerts": counters["alerts"],
    }
