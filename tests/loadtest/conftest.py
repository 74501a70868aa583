"""The load test's fixtures: worker processes (tests/loadtest/helpers.py), stopped whatever happened."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.loadtest.helpers import WORKER, Worker


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
