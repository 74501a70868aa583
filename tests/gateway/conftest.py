"""The gateway's fixtures: its settings on the test's topics, a running gateway, an MQTT
publisher, and a fleet for the fault tests."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
import redis

from fleetfence.kafka import ensure_topics, topic_specs
from fleetfence.mqtt import DynSec, service_account
from fleetfence.settings import Settings
from gateway.edge import EdgeGateway
from gateway.service import Gateway
from gateway.settings import GatewaySettings
from gateway.testing import Publisher, fleet_publisher, forget_session
from tests.gateway.helpers import gw_settings
from vehicle_master.credentials import VehicleCredentials
from vehicle_master.trackers import VehicleTrackers


@pytest.fixture
def gs(settings: Settings) -> Iterator[GatewaySettings]:
    ensure_topics(settings.bootstrap_servers, topic_specs(settings))
    s = gw_settings(settings)
    yield s
    forget_session(*s.mqtt_host_port, s.gateway_client_id, service_account(s, "gateway"))


@pytest.fixture
def creds(gs: GatewaySettings) -> Iterator[VehicleCredentials]:
    """Vehicle credentials issued as the admin API issues them (status and secret hash in Redis, the
    vehicle's account in Mosquitto), on whatever `gs` the test module runs with."""
    r = redis.Redis.from_url(gs.redis_dsn)
    control = DynSec.from_settings(gs)
    yield VehicleCredentials(r, gs.redis_prefix, control)
    control.close()
    r.close()


@pytest.fixture
def edge(gs: GatewaySettings) -> Iterator[EdgeGateway]:
    """A device edge on the module's `gs` (which sets its ports)."""
    e = EdgeGateway(gs)
    e.start()
    yield e
    e.stop(drain_timeout_s=5)


@pytest.fixture
def gateway(gs: GatewaySettings) -> Iterator[Gateway]:
    gw = Gateway(gs)
    gw.start()
    yield gw
    gw.stop(drain_timeout_s=5)


@pytest.fixture
def publisher(gs: GatewaySettings) -> Iterator[Publisher]:
    p = fleet_publisher(gs)
    yield p
    p.close()


@pytest.fixture
def fleet(settings: Settings) -> Iterator[tuple[GatewaySettings, Publisher, str]]:
    """The gateway's settings (not started: the tests run it), a publisher with room for a
    fleet's in-flight messages, and a vehicle-id prefix of the test's own."""
    ensure_topics(settings.bootstrap_servers, topic_specs(settings))
    gs = gw_settings(settings)
    pub = fleet_publisher(gs, inflight=1000)
    yield gs, pub, f"f{uuid.uuid4().hex[:6]}-"
    pub.close()
    forget_session(*gs.mqtt_host_port, gs.gateway_client_id, service_account(gs, "gateway"))


@pytest.fixture
def trackers(gs: GatewaySettings) -> Iterator[VehicleTrackers]:
    """Tracker bindings as the admin API writes them, on the module's `gs`."""
    r = redis.Redis.from_url(gs.redis_dsn)
    yield VehicleTrackers(r, gs.redis_prefix)
    r.close()
