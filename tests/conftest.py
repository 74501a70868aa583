"""Session-wide fixtures: private, real infrastructure on free ports, and one shared SparkSession.

Nothing is mocked: the broker, Mosquitto and Redis are the same binaries `fleetfence infra up`
starts, under a temporary state folder. A service that cannot start fails the tests that need it
with the start-up error; nothing is skipped.
"""

from __future__ import annotations

import os
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck
from hypothesis import settings as hypothesis_settings

from embedded import infra
from fleetfence.settings import Settings

# The components' helpers (and the fixtures' classes in them) assert too: pytest rewrites their
# asserts like the tests' own, so a failure there shows the values. Registered before any is imported.
pytest.register_assert_rewrite(
    *(f"tests.{c}.helpers" for c in ("admin_api", "alerts", "gateway", "history", "processor"))
)

# CI must not go red for a reason outside the code under test: under CI the examples are derived
# from each test's name (derandomize), so a run draws the same cases every time, and no time-based
# health check can fail it on a loaded machine. Locally the default profile keeps exploring.
hypothesis_settings.register_profile(
    "ci",
    derandomize=True,
    deadline=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
_profile = "ci" if os.environ.get("CI") else "default"
hypothesis_settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", _profile))

# The suite's JVMs (the private broker, the shared SparkSession, each Spark driver a test starts
# and kills) compile with C1 only. Most are drivers that live seconds to a few minutes, dozens of
# them a run, and on two cores C2's compiler threads take the CPU the run is bound by; C2's faster
# code never pays back in so short a life. A compiler tier changes no result; the product's JVMs
# keep the default tiered compilation. Inherited by every child process; a JAVA_TOOL_OPTIONS
# already set is kept as it is.
os.environ.setdefault("JAVA_TOOL_OPTIONS", "-XX:TieredStopAtLevel=1")


@pytest.fixture(scope="session")
def infra_settings(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Settings]:
    """Private broker, Mosquitto and Redis for the whole test session (no topics created)."""
    state = tmp_path_factory.mktemp("fleetfence-state")
    settings = Settings(
        **infra.private_fields(state),
        startup_timeout_s=60,
    )
    try:
        infra.up(settings, create_topics=False)
    except Exception as exc:
        infra.down(settings)
        pytest.fail(f"could not start the private test infrastructure: {exc}", pytrace=False)
    yield settings
    infra.down(settings)


@pytest.fixture
def settings(infra_settings: Settings) -> Settings:
    """Settings pointing at the private services, with a unique topic prefix for this test."""
    prefix = f"t{uuid.uuid4().hex[:10]}."
    return infra_settings.model_copy(update={"topic_prefix": prefix})


@pytest.fixture(scope="session")
def spark(tmp_path_factory: pytest.TempPathFactory) -> Iterator[object]:
    """One local SparkSession shared by every Spark test (start-up costs 5-8 s)."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    from processor.spark.session import build_session

    warehouse = Path(tmp_path_factory.mktemp("spark"))
    session = build_session(app_name="fleetfence-tests", spark_master="local[2]", local_dir=warehouse)
    yield session
    session.stop()
