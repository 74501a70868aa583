"""The README's main command end to end: MQTT -> gateway -> Kafka -> Spark -> alerts, verified.

`fleetfence demo` starts its own embedded broker, Mosquitto and Redis (on free ports here), the
admin API and the processor as subprocesses, the gateway and the receivers in-process, drives a
small real-time scenario over MQTT and exits with verify's code: 0 only when precision = recall =
1.0 and there are no duplicates.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from fleetfence import probes
from simulator.truth import read_truth

pytestmark = [pytest.mark.spark, pytest.mark.services, pytest.mark.slow]


def test_demo_pipeline_is_exact(tmp_path: Path) -> None:
    env = {
        **os.environ,
        "FLEETFENCE_STATE_DIR": str(tmp_path / "state"),
        "FLEETFENCE_KAFKA_PORT": str(probes.free_port()),
        "FLEETFENCE_MQTT_PORT": str(probes.free_port()),
        "FLEETFENCE_REDIS_PORT": str(probes.free_port()),
        "FLEETFENCE_GATEWAY_METRICS_PORT": "0",
        "COLUMNS": "200",
    }
    env.pop("FLEETFENCE_KAFKA_BOOTSTRAP", None)
    env.pop("FLEETFENCE_MQTT_URL", None)
    env.pop("FLEETFENCE_REDIS_URL", None)
    out = subprocess.run(
        [sys.executable, "-m", "cli", "demo", "--vehicles", "12", "--duration-s", "30"],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    text = out.stdout + out.stderr
    assert out.returncode == 0, text[-6000:]
    assert "PASS" in text
    all_row = re.search(r"ALL[\s│]+(\d+)[\s│]+(\d+)[\s│]+(\d+)[\s│]+([\d.]+)[\s│]+([\d.]+)[\s│]+(\d+)", text)
    assert all_row is not None, text[-3000:]
    expected, observed, matched, precision, recall, dups = all_row.groups()
    assert int(expected) >= 3
    assert int(expected) == int(observed) == int(matched)
    assert float(precision) == 1.0
    assert float(recall) == 1.0
    assert int(dups) == 0
    # The convoys met: vehicle proximity is on, and its alerts are among those verified exact.
    (truth_file,) = (tmp_path / "state" / "demo").glob("truth-*.jsonl")
    _header, truth = read_truth(truth_file)
    assert sum(a.type == "PROXIMITY_ENTER" for a in truth) >= 4  # two pairs, an alert per vehicle
    # Everything the demo started is gone.
    state = tmp_path / "state"
    assert not any((state / "run").glob("*.pid"))
