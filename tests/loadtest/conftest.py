"""The load test's fixtures: worker processes (tests/loadtest/helpers.py), stopped whatever happened;
running installations to attach to."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from embedded.pipeline import Pipeline, PipelineSpec
from fleetfence.settings import Settings
from tests.loadtest.helpers import WORKER, Worker, attached_settings


@pytest.fixture
def worker(tmp_path: Path) -> Iterator[Callable[[], Worker]]:
    """Start workers on demand; each is killed (its children lose their input and exit) at the end."""
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    started: list[Worker] = []

    def start() -> Worker:
        started.append(Worker(script))
        return started[-1]

    yield start
    for w in started:
        w.stop()


@pytest.fixture
def install(settings: Settings, tmp_path: Path) -> Iterator[Callable[[int], tuple[Settings, Pipeline]]]:
    """`install(gateways)`: a running installation on the session's servers (external to it: the
    pipeline starts no server and stops none), with its own topics, Redis prefix and state, and
    `gateways` device-edge replicas; stopped at the end."""
    started: list[Pipeline] = []
    s = attached_settings(settings, tmp_path / "installation")

    def start(gateways: int) -> tuple[Settings, Pipeline]:
        pipeline = Pipeline(s, tmp_path / "installation-logs", PipelineSpec(gateway_replicas=gateways))
        started.append(pipeline)
        pipeline.__enter__()
        return s, pipeline

    yield start
    for p in started:
        p.stop()
