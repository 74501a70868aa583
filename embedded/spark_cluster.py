"""A Spark standalone cluster (one master, N workers) started from the pyspark installation.

Why here and not in a Docker image: the processor must run unchanged on `spark://` masters, and the
only way to prove that on a machine without a Docker engine is to start Spark's own standalone
daemons from the wheel (`pyspark/bin/spark-class`). The tests, the scale-out benchmark and a
single-host deployment use the same code, so what the benchmark measures is what the tests check.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import time
from pathlib import Path
from types import TracebackType

import pyspark

from fleetfence.errors import StandaloneError
from fleetfence.probes import free_port
from fleetfence.service import stop_process_group

logger = logging.getLogger(__name__)

SPARK_HOME = Path(pyspark.__file__).parent
SPARK_CLASS = SPARK_HOME / "bin" / "spark-class"


def _wait_log(path: Path, needle: str, timeout_s: float, what: str, proc: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if needle in path.read_text(errors="replace"):
            return
        if proc.poll() is not None:
            raise StandaloneError(f"{what} exited with {proc.returncode}; see {path}")
        time.sleep(0.2)
    raise StandaloneError(f"{what} not ready within {timeout_s:.0f} s; see {path}")


class StandaloneCluster:
    """`with StandaloneCluster(dir, workers=2) as c:` → `c.url` is a live `spark://` master.

    Every daemon runs in its own process group on 127.0.0.1 with free ports and logs under
    `workdir`; leaving the block stops workers then the master, whatever happened inside.
    """

    def __init__(
        self,
        workdir: Path,
        workers: int = 1,
        cores_per_worker: int = 1,
        memory_per_worker: str = "2g",
        startup_timeout_s: float = 120,
    ) -> None:
        self.workdir = workdir
        self.n_workers = workers
        self.cores_per_worker = cores_per_worker
        self.memory_per_worker = memory_per_worker
        self.timeout_s = startup_timeout_s
        self.port = free_port()
        self.url = f"spark://127.0.0.1:{self.port}"
        self.master: subprocess.Popen[bytes] | None = None
        self.workers: list[subprocess.Popen[bytes]] = []
        self.env = {
            **os.environ,
            "SPARK_HOME": str(SPARK_HOME),
            "PYSPARK_PYTHON": os.environ.get("PYSPARK_PYTHON", sys.executable),
            "SPARK_LOCAL_IP": "127.0.0.1",
            "SPARK_WORKER_DIR": str(workdir / "work"),
        }

    def _spawn(self, argv: list[str], log: Path) -> subprocess.Popen[bytes]:
        SPARK_CLASS.chmod(0o755)  # wheels do not always keep the executable bit
        return subprocess.Popen(
            [str(SPARK_CLASS), *argv],
            stdout=log.open("ab"),
            stderr=subprocess.STDOUT,
            env=self.env,
            start_new_session=True,
        )

    def worker_log(self, i: int) -> Path:
        return self.workdir / f"worker{i}.log"

    def executors_launched(self) -> list[bool]:
        """Per worker: has it launched an executor for some application?"""
        return [
            "Asked to launch executor" in self.worker_log(i).read_text(errors="replace")
            for i in range(len(self.workers))
        ]

    def start(self) -> StandaloneCluster:
        self.workdir.mkdir(parents=True, exist_ok=True)
        log = self.workdir / "master.log"
        self.master = self._spawn(
            [
                "org.apache.spark.deploy.master.Master",
                "--host",
                "127.0.0.1",
                "--port",
                str(self.port),
                "--webui-port",
                str(free_port()),
            ],
            log,
        )
        _wait_log(log, "I have been elected leader", self.timeout_s, "the Spark master", self.master)
        for i in range(self.n_workers):
            w = self._spawn(
                [
                    "org.apache.spark.deploy.worker.Worker",
                    self.url,
                    "--cores",
                    str(self.cores_per_worker),
                    "--memory",
                    self.memory_per_worker,
                    "--webui-port",
                    str(free_port()),
                    "--host",
                    "127.0.0.1",
                    "--work-dir",
                    str(self.workdir / f"work{i}"),
                ],
                self.worker_log(i),
            )
            self.workers.append(w)
        for i, w in enumerate(self.workers):
            _wait_log(self.worker_log(i), "Successfully registered", self.timeout_s, f"Spark worker {i}", w)
        logger.info(
            "standalone cluster up",
            extra={"url": self.url, "workers": self.n_workers, "cores_per_worker": self.cores_per_worker},
        )
        return self

    def stop(self) -> None:
        for w in self.workers:
            stop_process_group(w)
        if self.master is not None:
            stop_process_group(self.master)

    def __enter__(self) -> StandaloneCluster:
        try:
            return self.start()
        except BaseException:
            self.stop()
            raise

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
