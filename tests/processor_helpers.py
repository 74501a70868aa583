"""Helpers for processor tests: a small known scenario, Kafka producers and alert readers."""

from __future__ import annotations

import time
import uuid
from functools import partial
from typing import Any

import numpy as np
import orjson
from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition

from fleetfence.contracts import Telemetry
from fleetfence.kafka import consumer_config, producer_config
from fleetfence.settings import Settings
from fleetfence.testing import wait_for as wait_until_true
from processor.geometry import LocalProjection

T0 = 1_795_000_000_000
LINE = [[13.0, 52.5], [13.1, 52.5]]
ZONE = [[13.03, 52.495], [13.04, 52.495], [13.04, 52.505], [13.03, 52.505], [13.03, 52.495]]


def master_events() -> list[dict[str, Any]]:
    route = {
        "route_id": "r1",
        "name": "test",
        "geometry": {"type": "LineString", "coordinates": LINE},
        "corridor_width_m": 100,
        "speed_limit_kmh": 60,
        "deviation_min_fixes": 3,
        "deviation_min_s": 0,
        "overspeed_min_s": 5,
        "silent_after_s": 60,
    }
    ev = [
        {"entity": "route", "id": "r1", "version": 1, "op": "upsert", "ts_ms": T0, "data": route},
        {
            "entity": "zone",
            "id": "depot",
            "version": 1,
            "op": "upsert",
            "ts_ms": T0,
            "data": {
                "zone_id": "depot",
                "name": "Depot",
                "kind": "depot",
                "geometry": {"type": "Polygon", "coordinates": [ZONE]},
            },
        },
    ]
    for v in range(6):
        ev.append(
            {
                "entity": "assignment",
                "id": f"v{v}",
                "version": 1,
                "op": "upsert",
                "ts_ms": T0,
                "data": {"vehicle_id": f"v{v}", "route_id": "r1", "valid_from_ms": 0, "valid_to_ms": None},
            }
        )
    return ev


def scenario(n_fixes: int = 60) -> list[Telemetry]:
    """Six vehicles drive east along the route at 1 Hz. v1 leaves the corridor (300 m) for fixes
    20-29; v2 speeds at 90 km/h for fixes 10-25; every vehicle crosses the depot zone; v3 stops
    sending after fix 30 (silent); v4's stream has duplicates; v5 is on time and calm."""
    proj = LocalProjection(13.05, 52.5)
    out = []
    for v in range(6):
        last = 30 if v == 3 else n_fixes
        for s in range(last):
            x = -3000.0 + s * 100.0
            y = 300.0 if (v == 1 and 20 <= s < 30) else 0.0
            lon, lat = proj.inverse(np.array([x]), np.array([y]))
            speed = 90.0 if (v == 2 and 10 <= s < 26) else 40.0
            out.append(
                Telemetry(
                    f"v{v}",
                    s,
                    T0 + s * 1000,
                    float(lat[0]),
                    float(lon[0]),
                    speed,
                    None,
                    None,
                    T0 + s * 1000 + 50,
                )
            )
            if v == 4 and s % 7 == 0:
                out.append(out[-1])
    # Interleave by time like a real fleet.
    out.sort(key=lambda t: (t.ts_ms, t.vehicle_id))
    return out


def produce(settings: Settings, topic: str, records: list[tuple[bytes, bytes]]) -> None:
    p = Producer(producer_config(settings.bootstrap_servers))
    for k, v in records:
        p.produce(topic, key=k, value=v)
        p.poll(0)
    assert p.flush(30) == 0


def produce_master(settings: Settings, events: list[dict[str, Any]]) -> None:
    produce(
        settings,
        settings.topics.master,
        [(f"{e['entity']}:{e['id']}".encode(), orjson.dumps(e)) for e in events],
    )


def produce_telemetry(settings: Settings, fixes: list[Telemetry]) -> None:
    produce(settings, settings.topics.telemetry, [(f.vehicle_id.encode(), f.to_json()) for f in fixes])


def read_all(settings: Settings, topic: str, partitions: int, timeout_s: float = 10.0) -> list[Any]:
    """Every committed record of a topic, read_committed, up to its current end."""
    c = Consumer(
        consumer_config(
            settings.bootstrap_servers, f"read-{uuid.uuid4().hex}", **{"enable.partition.eof": True}
        )
    )
    tps = [TopicPartition(topic, p, 0) for p in range(partitions)]
    ends = {
        p: c.get_watermark_offsets(TopicPartition(topic, p), timeout=10, cached=False)[1]
        for p in range(partitions)
    }
    c.assign(tps)
    out: list[Any] = []
    done = {p for p, e in ends.items() if e == 0}
    deadline = time.monotonic() + timeout_s
    while len(done) < partitions and time.monotonic() < deadline:
        for m in c.consume(1000, 0.2):
            if m.error() is not None:
                if m.error().code() == KafkaError._PARTITION_EOF and m.offset() >= ends[m.partition()]:
                    done.add(m.partition())
                continue
            out.append(m)
            if m.offset() >= ends[m.partition()] - 1:
                done.add(m.partition())
        for p in range(partitions):
            if p not in done and c.position([TopicPartition(topic, p)])[0].offset >= ends[p]:
                done.add(p)
    c.close()
    return out


# Each check of these tests reads topics to their end: poll every 0.25 s, not the default 0.05 s.
wait_for = partial(wait_until_true, interval_s=0.25)
