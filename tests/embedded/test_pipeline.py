"""`embedded.pipeline.Pipeline` when one of its services dies: the error must say which service,
how it ended and why (its log's last lines), not only that something is wrong (issue #64 case 5:
port 8000 taken between the pipeline's check and the API's bind).

The pipeline runs on the session's broker, Mosquitto and Redis, reached as external endpoints,
so it starts and stops none of them; every service of its own is a real process.
"""

from __future__ import annotations

import socket
import time
from pathlib import Path

import pytest

from embedded.pipeline import LOG_TAIL_LINES, Pipeline, PipelineSpec, log_tail
from fleetfence.errors import ServiceExitedError
from fleetfence.mqtt import account_fields
from fleetfence.settings import Settings

pytestmark = [pytest.mark.services, pytest.mark.slow]


def on_session_servers(settings: Settings, state_dir: Path) -> Settings:
    """Settings for a pipeline of its own (state, topics, Redis keys) on the session's servers,
    external to it: it starts and stops none of them."""
    return settings.model_copy(
        update={
            "state_dir": state_dir,
            "kafka_bootstrap": settings.bootstrap_servers,
            "mqtt_url": "mqtt://{}:{}".format(*settings.mqtt_host_port),
            "redis_url": settings.redis_dsn,
            "redis_prefix": f"{settings.topic_prefix}ff:",
            **account_fields(settings),
        }
    )


def test_an_api_that_cannot_bind_its_port_fails_the_start_with_its_reason(
    tmp_path: Path, settings: Settings
) -> None:
    settings = on_session_servers(settings, tmp_path / "state")
    run_dir = tmp_path / "run"
    # The port is taken by another listener when the API binds it, as 8000 was in the issue.
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as taken:
        taken.bind((settings.host, 0))
        taken.listen()
        port = taken.getsockname()[1]
        t0 = time.monotonic()
        with (
            pytest.raises(ServiceExitedError) as caught,
            Pipeline(settings, run_dir, PipelineSpec(api_port=port)),
        ):
            pytest.fail("the pipeline was ready with its API's port taken")
        took = time.monotonic() - t0
    err = caught.value
    message = str(err)
    assert err.service == "api"
    assert err.returncode > 0  # uvicorn's own exit (3: start-up failed), not a signal of ours
    assert message.startswith(f"api exited with code {err.returncode}; "), message
    assert "address already in use" in message
    assert f"({settings.host!r}, {port})" in message  # uvicorn's line, as the API logged it
    log = run_dir / "api.log"
    assert err.log == log
    assert str(log) in message
    # The log's last lines, in order, ending with its last one.
    tail = log_tail(log)
    assert 0 < len(tail) <= LOG_TAIL_LINES
    assert message.endswith("\n".join(f"  {line}" for line in tail))
    # Seen while waiting for the API (its first wait), not after the processor's first batch.
    assert took < 90, took
