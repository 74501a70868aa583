"""Helpers for processor tests: a small known scenario, Kafka producers and alert readers."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any, Literal, TypeVar

import numpy as np
import orjson
import pandas as pd
import pyarrow as pa

from fleetfence.contracts import AlertRecord, PlainFix, Telemetry
from fleetfence.geo import LocalProjection
from fleetfence.kafka import idempotent_producer
from fleetfence.settings import Settings
from fleetfence.testing import read_all
from fleetfence.testing import wait_for as wait_until_true
from processor.core.columns import StateTable, empty_states
from processor.core.domain import EngineConfig
from processor.core.engine import process_bucket
from processor.core.master import Catalog, MasterState
from processor.settings import ProcessorSettings
from processor.spark.checkpoint_files import CheckpointFiles
from processor.spark.rows import FIX_SCHEMA, InputKind, encode_chunk

T = TypeVar("T")

# A checkpoint's files at a location (the `checkpoint_files` fixture: local, or through Hadoop).
Files = Callable[[str], CheckpointFiles]

T0 = 1_795_000_000_000
LINE = [[13.0, 52.5], [13.1, 52.5]]
ZONE = [[13.03, 52.495], [13.04, 52.495], [13.04, 52.505], [13.03, 52.505], [13.03, 52.495]]


def master_events(trips: bool = False) -> list[dict[str, Any]]:
    """The route, the depot and six assignments; with `trips`, rules short enough for
    `scenario(trips=True)`'s stop, and a planned arrival for v5 that its trip cannot make."""
    route: dict[str, Any] = {
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
    if trips:
        route.update(stop_min_s=10, arrival_risk_s=20)
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
                "data": {
                    "vehicle_id": f"v{v}",
                    "route_id": "r1",
                    "valid_from_ms": 0,
                    "valid_to_ms": None,
                    **({"planned_arrival_ms": T0 + 30_000} if trips and v == 5 else {}),
                },
            }
        )
    return ev


def circle_zone_event() -> dict[str, Any]:
    """A circle zone, 150 m around the line 2 km west of the frame's centre, clear of the
    depot: every vehicle of `scenario` enters it (100 m from the centre) and leaves it (200 m)."""
    lon, lat = LocalProjection(13.05, 52.5).inverse(np.array([-2000.0]), np.array([0.0]))
    data = {
        "zone_id": "yard",
        "name": "Yard",
        "kind": "customer",
        "geometry": {"type": "Point", "coordinates": [float(lon[0]), float(lat[0])], "radius_m": 150.0},
    }
    return {"entity": "zone", "id": "yard", "version": 1, "op": "upsert", "ts_ms": T0, "data": data}


def scenario(n_fixes: int = 60, trips: bool = False) -> list[Telemetry]:
    """Six vehicles drive east along the route at 1 Hz. v1 leaves the corridor (300 m) for fixes
    20-29; v2 speeds at 90 km/h for fixes 10-25; every vehicle crosses the depot zone; v3 stops
    sending after fix 30 (silent); v4's stream has duplicates; v5 is on time and calm.

    With `trips` (and `master_events(trips=True)`), the route-awareness alerts too: v0 drives 60 m
    a fix back for fixes 35-44 (WRONG_DIRECTION, then DIRECTION_RESTORED), v4 stands still for
    fixes 40-59 (UNPLANNED_STOP, STOP_ENDED), v5 is late for its planned arrival (ARRIVAL_AT_RISK),
    and whoever reaches the route's end completes it (ROUTE_COMPLETED)."""
    proj = LocalProjection(13.05, 52.5)
    out = []
    for v in range(6):
        last = 30 if v == 3 else n_fixes
        for s in range(last):
            x = -3000.0 + s * 100.0
            stopped = trips and v == 4 and 40 <= s < 60
            if trips and v == 0 and s >= 35:
                x = 400.0 - 60.0 * (min(s, 44) - 34) + 100.0 * max(s - 44, 0)
            elif trips and v == 4 and s >= 40:
                x = 1000.0 + 100.0 * max(s - 59, 0)
            y = 300.0 if (v == 1 and 20 <= s < 30) else 0.0
            lon, lat = proj.inverse(np.array([x]), np.array([y]))
            speed = 90.0 if (v == 2 and 10 <= s < 26) else 0.0 if stopped else 40.0
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
    p = idempotent_producer(settings.bootstrap_servers)
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


def processor_settings(settings: Settings, tmp: Path, **kw: Any) -> ProcessorSettings:
    return ProcessorSettings(
        **{
            **settings.model_dump(exclude={"topics"}),
            "processor_checkpoint": str(tmp / "cp"),
            "processor_buckets": 4,
            "processor_trigger_ms": 100,
            "redis_prefix": f"{settings.topic_prefix}ff:",
            **kw,
        }
    )


def expected_alerts(
    fixes: list[Telemetry], cfg: EngineConfig, master: list[dict[str, Any]] | None = None
) -> dict[str, AlertRecord]:
    """The reference: the pure engine over all fixes in one batch (no watermark, so no silence),
    against `master` (default `master_events()`)."""
    ref = replace(cfg, fast_path=False)
    r = process_bucket(empty_states(), {}, master_state(master), fixes_frame(fixes), 0, ref, Catalog(cfg))
    return {a.alert_id: a.to_dict() for a in r.alerts}


def master_state(master: list[dict[str, Any]] | None = None) -> MasterState:
    """`master` (default `master_events()`) folded as the processor folds it."""
    return MasterState.of(master if master is not None else master_events())


def fixes_frame(fixes: list[Telemetry]) -> pd.DataFrame:
    """Fixes as the engine's input frame: the fields the processor reads (`PlainFix`)."""
    cols = list(PlainFix.__struct_fields__)
    return pd.DataFrame([[getattr(f, c) for c in cols] for f in fixes], columns=cols)


def telemetry_rows(fixes: list[Telemetry]) -> pd.DataFrame:
    """Fixes as the stateful operator's input: one telemetry row carrying them as an Arrow chunk
    (processor.spark.rows), each with a made-up place on the topic."""
    frame = fixes_frame(fixes).assign(kafka_partition=0, kafka_offset=range(len(fixes)))
    table = pa.Table.from_pandas(frame, schema=FIX_SCHEMA, preserve_index=False)
    return pd.DataFrame({"kind": [InputKind.FIXES], "payload": [encode_chunk(table)]})


def committed_alerts(s: Settings) -> list[dict[str, Any]]:
    return [orjson.loads(m.value()) for m in read_all(s, s.topics.alerts, s.alerts_partitions)]


def markers(s: Settings) -> list[dict[str, Any]]:
    return [orjson.loads(m.value()) for m in read_all(s, s.topics.processor_commits, 1)]


def processor_env(ps: ProcessorSettings, spark_master: str = "local[2]") -> dict[str, str]:
    """The environment that gives a child process (`python -m processor`, `fleetfence ...`) these
    settings."""
    return {
        **os.environ,
        **{
            f"FLEETFENCE_{k.upper()}": str(v)
            for k, v in ps.model_dump(exclude={"topics"}).items()
            if v is not None
        },
        "FLEETFENCE_PROCESSOR_SPARK_MASTER": spark_master,
    }


def spawn_processor(
    ps: ProcessorSettings, log: Path, spark_master: str = "local[2]"
) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "processor"],
        env=processor_env(ps, spark_master),
        stdout=log.open("ab"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )


def wait_for(
    check: Callable[[], T | Literal[False] | None], timeout_s: float, what: str, *, interval_s: float = 0.25
) -> T:
    """fleetfence.testing.wait_for, polling every 0.25 s (each check of these tests reads topics to
    their end), typed as what it returns: the check's first truthy value, so never None or False
    (`lambda: (a := read()) and len(a) >= n and a` gives the list)."""
    return wait_until_true(check, timeout_s, what, interval_s=interval_s)


def same_states(a: StateTable, b: StateTable) -> bool:
    return dict(zip(a.ids, a.states(), strict=True)) == dict(zip(b.ids, b.states(), strict=True))
