"""The deployment suite: docker-compose.yml built and run for real (`bash scripts/dev.sh deploy-test`).

Not under `tests/` (the default run's testpaths): it needs Docker and root, and takes minutes. One
deployment serves the whole session: images built (layers cached), `up`, every service healthy;
at the end `down -v`, nothing of the project left, and the Docker daemon stopped if the suite
started it. A service that cannot start fails the suite; nothing is skipped.
"""

from __future__ import annotations

import os
import tempfile
import time
from collections.abc import Generator, Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest

from tests_deploy import measure
from tests_deploy.harness import Daemon, Deployment, build_local_images

# Where a failed test's deployment logs are kept: `down -v` at the session's end removes the
# containers and their logs, and a fault that fails once in several runs needs them to be diagnosed.
LOG_DIR = Path(os.environ.get("FLEETFENCE_DEPLOY_LOG_DIR", "/var/tmp/fleetfence-deploy-logs"))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    """On a failed call of a test on the deployment: every service's log saved under LOG_DIR."""
    report = yield
    dep = getattr(item, "funcargs", {}).get("deployment")
    if report.when != "call" or not report.failed or not isinstance(dep, Deployment):
        return report
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    path = LOG_DIR / f"{stamp}-{item.name}.log"
    try:
        LOG_DIR.mkdir(parents=True, exist_ok=True)
        path.write_text(dep.logs(tail=20000))
        report.sections.append(("deployment logs", f"every service's log: {path}"))
    except OSError as exc:
        report.sections.append(("deployment logs", f"not saved to {path}: {exc}"))
    return report


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
