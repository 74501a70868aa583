"""The vehicle master's fixtures: its settings on a Redis prefix of the test's own, and the store."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

from fleetfence.settings import Settings
from vehicle_master.settings import MasterSettings
from vehicle_master.store import VehicleMaster


@pytest.fixture
def msettings(settings: Settings) -> MasterSettings:
    return MasterSettings.from_base(
        settings, redis_prefix=f"{settings.redis_prefix}{uuid.uuid4().hex[:8]}:", relay_block_ms=100
    )


@pytest.fixture
def vm(msettings: MasterSettings) -> Iterator[VehicleMaster]:
    store = VehicleMaster.from_settings(msettings)
    yield store
    store.close()
