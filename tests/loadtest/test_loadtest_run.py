"""`fleetfence loadtest` end to end on the embedded infrastructure: a short fixed-rate run through
MQTT, two gateway replicas, Kafka, the Spark processor and the alert receivers. Its report must
reconcile every count and its accuracy against the ground truth must be exact; it must leave
nothing running."""

from __future__ import annotations

import os
import struct
import subprocess
import sys
from pathlib import Path

import orjson
import pytest

from fleetfence import probes

pytestmark = [pytest.mark.spark, pytest.mark.services, pytest.mark.slow]


def png_size(path: Path) -> tuple[int, int]:
    head = path.read_bytes()[:24]
    assert head[:8] == b"\x89PNG\r\n\x1a\n", path
    w, h = struct.unpack(">II", head[16:24])
    return int(w), int(h)


def test_a_short_fixed_rate_load_test_reconciles_and_is_exact(tmp_path: Path) -> None:
    state = tmp_path / "state"
    report = tmp_path / "report"
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLEETFENCE_")}
    env.update(
        {
            "FLEETFENCE_STATE_DIR": str(state),
            "FLEETFENCE_KAFKA_PORT": str(probes.free_port()),
            "FLEETFENCE_MQTT_PORT": str(probes.free_port()),
            "FLEETFENCE_REDIS_PORT": str(probes.free_port()),
            "COLUMNS": "200",
        }
    )
    argv = [sys.executable, "-m", "cli", "loadtest", "--vehicles", "40", "--duration-s", "25"]
    argv += ["--gateways", "2", "--report-dir", str(report), "--min-recall", "1.0", "--settle-s", "90"]
    argv += ["--proximity-m", "40"]  # vehicle proximity on: its convoys' pairs are held to the truth too
    out = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=900, check=False)
    text = out.stdout + out.stderr
    assert out.returncode == 0, text[-6000:]

    run = orjson.loads((report / "report.json").read_bytes())
    (step,) = run["steps"]
    # Every count reconciles end to end: published = acknowledged = in fleet.telemetry once each
    # (no dead letters: the simulator sends valid fixes; nothing sent again: no fault) = received by
    # the gateways = forwarded = read by the processor.
    r = step["reconciliation"]
    assert r["reconciled"], r
    assert r["published"] == r["acked"] == r["gateway_received"] > 0
    assert r["in_kafka"] == r["published"] - r["sent_twice"]  # the scenario's duplicates: fixes again
    assert r["sent_again"] == r["sent_twice"] > 0
    assert r["dead_lettered"] == r["gateway_dead_lettered"] == r["gateway_restarts"] == 0
    assert r["gateway_forwarded"] == r["gateway_received"] == r["telemetry_records"]
    assert r["processor_read"] == r["telemetry_records"]
    assert r["processor_invalid"] == 0
    # 40 vehicles at 1 Hz for 25 s, with the simulator's injected duplicates on top.
    assert r["published"] >= 40 * 24
    # Exactly the ground truth's alerts, once each.
    acc = step["accuracy"]
    assert acc["expected"] >= 5
    assert acc["expected"] == acc["observed"] == acc["matched"]
    assert acc["precision"] == acc["recall"] == 1.0
    assert acc["duplicates"] == 0
    assert acc["per_type"]["PROXIMITY_ENTER"]["matched"] >= 2  # a convoy, an alert per vehicle
    lat = step["latency_event"]
    assert lat["count"] >= 1
    assert 0 < lat["p50_ms"] <= lat["p99_ms"] < 60_000
    # Sampled every second, every process measured.
    samples = run["samples"]
    assert len(samples) >= 30
    names = set(samples[-1]["procs"])
    assert {"api", "processor", "gateway-1", "gateway-2", "receivers"} <= names
    assert max(s["procs"]["processor"]["rss_mib"] for s in samples) > 100  # a JVM and Python workers
    assert run["verdicts"] == []
    # The report a person reads.
    summary = (report / "summary.md").read_text()
    assert "1.0" in summary
    for chart in ("rate.png", "lag.png", "latency.png", "cpu.png", "memory.png"):
        w, h = png_size(report / chart)
        assert w >= 300
        assert h >= 200
    # Nothing left running.
    run_dir = state / "loadtest" / "state" / "run"
    assert run_dir.is_dir()
    assert not any(run_dir.glob("*.pid")), list(run_dir.glob("*"))
