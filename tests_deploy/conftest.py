"""The deployment suite: docker-compose.yml built and run for real (`bash scripts/dev.sh deploy-test`).

Not under `tests/` (the default run's testpaths): it needs Docker and root, and takes minutes. One
deployment serves the whole session: images built (layers cached), `up`, every service healthy;
at the end every service's whole log checked for error lines (tests_deploy/logcheck.py: an error
not on its reasoned allow-list fails the suite), `down -v`, nothing of the project left, and the
Docker daemon stopped if the suite started it. A service that cannot start fails the suite; nothing
is skipped.
"""

from __future__ import annotations

import os
import tempfile
import time
from collections.abc import Generator, Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest

from tests_deploy import logcheck, measure
from tests_deploy.harness import Daemon, Deployment, build_local_images

# Where a failed test's deployment logs are kept, and at the end every service's whole log: `down -v`
# removes the containers and their logs, and a fault that fails once in several runs needs them.
LOG_DIR = Path(os.environ.get("FLEETFENCE_DEPLOY_LOG_DIR", "/var/tmp/fleetfence-deploy-logs"))
# Each test's start, for the log check to say during which test an error line was logged.
WINDOWS: list[logcheck.Window] = []


@pytest.fixture(autouse=True)
def _window(request: pytest.FixtureRequest) -> None:
    fault = request.node.module.__name__.endswith(".test_faults")
    WINDOWS.append(logcheck.Window(request.node.originalname, datetime.now(UTC), fault=fault))


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
                check_logs(dep)
            finally:
                dep.down()
                left = dep.leftovers()
                assert not left, f"left behind after down -v: {left}"
    finally:
        daemon.stop()


def check_logs(dep: Deployment) -> None:
    """Every service's whole log, kept under LOG_DIR (`down -v` removes it) and checked: an error
    line the allow-list does not explain fails the suite at the session's teardown as
    FLEETFENCE_DEPLOY_LOGCHECK says (`logcheck.POLICIES`; by default one logged at start-up or
    outside a fault row, or one that says the deployment is broken). The saved file can be checked
    again: `python -m tests_deploy.logcheck <file> [policy]`."""
    policy = os.environ.get("FLEETFENCE_DEPLOY_LOGCHECK", "") or "faults"
    logs = dep.stamped_logs()
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    path = LOG_DIR / f"{stamp}-session.log"
    try:
        LOG_DIR.mkdir(parents=True, exist_ok=True)
        logcheck.save(path, logs, WINDOWS)
        where = f"every service's log: {path}"
    except OSError as exc:
        where = f"the logs were not saved to {path}: {exc}"
    verdict = logcheck.check(logs, WINDOWS)
    print(f"\n{verdict.summary()}\n{where}")
    failing = [line for line in verdict.unexpected if logcheck.fails(line, policy)]
    noted = [line for line in verdict.unexpected if line not in failing]
    if noted:
        print(
            f"{len(noted)} unexplained error lines not failed "
            f"(FLEETFENCE_DEPLOY_LOGCHECK={policy}; findings for the allow-list):\n"
            + "\n".join(str(line)[:400] for line in noted[:60])
        )
    shown = "\n".join(str(line)[:400] for line in failing[:60])
    more = len(failing) - 60
    assert not failing, (
        f"{len(failing)} error lines no entry of tests_deploy/logcheck.py's ALLOWED explains "
        f"({where}):\n{shown}" + (f"\n... and {more} more" if more > 0 else "")
    )
