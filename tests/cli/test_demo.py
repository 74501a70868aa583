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
    # The convoys met (vehicle proximity on, every pair's alert held to the truth too).
    pair_row = re.search(r"PROXIMITY_ENTER[\s│]+(\d+)[\s│]+(\d+)[\s│]+(\d+)", text)
    assert pair_row is not None, text[-3000:]
    assert int(pair_row[1]) >= 2
    assert int(pair_row[1]) == int(pair_row[2]) == int(pair_row[3])
    # Everything the demo started is gone.
    state = tmp_path / "state"
    assert not any((state / "run").glob("*.pid"))
