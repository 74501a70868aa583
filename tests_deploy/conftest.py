"""The deployment suite: docker-compose.yml built and run for real (`bash scripts/dev.sh deploy-test`).

Not under `tests/` (the default run's testpaths): it needs Docker and root, and takes minutes. One
deployment serves the whole session: images built (layers cached), `up`, every service healthy;
at the end `down -v`, nothing of the project left, and the Docker daemon stopped if the suite
started it. A service that cannot start fails the suite; nothing is skipped.
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests_deploy import measure
from tests_deploy.harness import Daemon, Deployment, build_local_images


@pytest.fixture(scope="session")
def deployment() -> Iterator[Deployment]:
    t0 = time.monotonic()
    daemon = Daemon()
    daemon.ensure()
    try:
        images = build_local_images()
        images_s = time.monotonic() - t0
        with tempfile.TemporaryDirectory(prefix="fleetfence-deploytest-") as work:
            dep = Deployment(images, Path(work))
            if dep.without:
                print(
                    f"\ndeploy-test: running without {', '.join(dep.without)} (no local image: "
                    "deploy/images/README.md)"
                )
            try:
                dep.up()
                dep.timings["local_images_s"] = images_s
                print(f"\ndeploy-test timings: {dep.timings}")
                yield dep
                if measure.ROWS:
                    print(f"\n{measure.table()}")
            finally:
                dep.down()
                left = dep.leftovers()
                assert not left, f"left behind after down -v: {left}"
    finally:
        daemon.stop()
