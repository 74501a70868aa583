"""The processor unchanged on a Spark standalone cluster (master + worker from the pyspark install)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pyspark
import pytest

from fleetfence import infra
from fleetfence.kafka import ensure_topics, topic_specs
from fleetfence.settings import Settings
from tests.processor_helpers import master_events, produce_master, produce_telemetry, scenario, wait_for
from tests.test_processor_stream import _spawn, committed_alerts, expected_alerts, processor_settings

pytestmark = [pytest.mark.spark, pytest.mark.services, pytest.mark.slow]

SPARK_CLASS = Path(pyspark.__file__).parent / "bin" / "spark-class"


def _start(argv: list[str], log: Path, env: dict[str, str]) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [str(SPARK_CLASS), *argv],
        stdout=log.open("ab"),
        stderr=subprocess.STDOUT,
        env=env,
        start_new_session=True,
    )


def _stop(p: subprocess.Popen[bytes]) -> None:
    if p.poll() is None:
        os.killpg(p.pid, signal.SIGTERM)
        try:
            p.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait(10)


def test_processor_on_standalone_master_and_worker(settings: Settings, tmp_path: Path) -> None:
    SPARK_CLASS.chmod(0o755)
    env = {
        **os.environ,
        "SPARK_HOME": str(SPARK_CLASS.parent.parent),
        "PYSPARK_PYTHON": sys.executable,
        "SPARK_LOCAL_IP": "127.0.0.1",
        "SPARK_WORKER_DIR": str(tmp_path / "work"),
    }
    port, ui, wui = infra.free_port(), infra.free_port(), infra.free_port()
    url = f"spark://127.0.0.1:{port}"
    master = _start(
        [
            "org.apache.spark.deploy.master.Master",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--webui-port",
            str(ui),
        ],
        tmp_path / "master.log",
        env,
    )
    worker = None
    proc = None
    try:
        wait_for(
            lambda: "I have been elected leader" in (tmp_path / "master.log").read_text(errors="replace"),
            90,
            "the Spark master",
        )
        worker = _start(
            [
                "org.apache.spark.deploy.worker.Worker",
                url,
                "--cores",
                "2",
                "--memory",
                "2g",
                "--webui-port",
                str(wui),
                "--host",
                "127.0.0.1",
            ],
            tmp_path / "worker.log",
            env,
        )
        wait_for(
            lambda: "Successfully registered" in (tmp_path / "worker.log").read_text(errors="replace"),
            90,
            "the worker to register",
        )
        ensure_topics(settings.bootstrap_servers, topic_specs(settings))
        ps = processor_settings(settings, tmp_path, processor_spark_master=url)
        fixes = scenario()
        expected = expected_alerts(fixes, ps.engine_config())
        produce_master(settings, master_events())
        produce_telemetry(settings, fixes)
        proc = _spawn(ps, tmp_path / "processor.log", spark_master=url)
        got = wait_for(
            lambda: (a := committed_alerts(settings)) and len(a) >= len(expected) and a,
            300,
            "the alerts from the cluster",
        )
        assert sorted(a["alert_id"] for a in got) == sorted(expected)
        # It really ran on the cluster: the worker launched an executor for the application.
        assert "Asked to launch executor" in (tmp_path / "worker.log").read_text(errors="replace")
    finally:
        if proc is not None:
            _stop(proc)
        if worker is not None:
            _stop(worker)
        _stop(master)
