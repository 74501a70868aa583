"""The alert receivers' fixtures: a local HTTP webhook target."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.alerts.helpers import WebhookTarget


@pytest.fixture
def target() -> Iterator[WebhookTarget]:
    t = WebhookTarget().start()
    yield t
    t.stop()
