"""The CLI tests' fixtures: the working folder and environment docs/quickstart.md runs in."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from fleetfence import probes

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def doc_env(tmp_path: Path) -> Iterator[tuple[Path, dict[str, str]]]:
    """A working folder like a checkout and the environment the document runs in; afterwards
    the embedded servers are stopped (`fleetfence infra down`) whatever happened."""
    work = tmp_path / "checkout"
    work.mkdir()
    (work / ".venv").symlink_to(ROOT / ".venv")
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLEETFENCE_")}
    env.pop("VIRTUAL_ENV", None)
    env.update(
        {
            "FLEETFENCE_KAFKA_PORT": str(probes.free_port()),
            "FLEETFENCE_MQTT_PORT": str(probes.free_port()),
            "FLEETFENCE_REDIS_PORT": str(probes.free_port()),
            "FLEETFENCE_API_PORT": str(probes.free_port()),
            "FLEETFENCE_GATEWAY_METRICS_PORT": str(probes.free_port()),
            "FLEETFENCE_STARTUP_TIMEOUT_S": "60",  # a busy shared machine; the document keeps defaults
            "NO_COLOR": "1",
            "COLUMNS": "200",
        }
    )
    yield work, env
    subprocess.run(
        [str(ROOT / ".venv" / "bin" / "fleetfence"), "infra", "down"],
        cwd=work,
        env=env,
        capture_output=True,
        timeout=120,
        check=False,
    )
