"""The device edge under the fault that lost acknowledged fixes behind Mosquitto (issue #58): Kafka
down, the process holding the vehicles' fixes SIGKILLed meanwhile, both back. Real processes: a
private Apache Kafka broker killed with SIGKILL, the edge as `python -m gateway` killed with SIGKILL,
ten vehicles as paho MQTT 5 clients logged in with their own credentials."""

from __future__ import annotations

import collections
import os
import signal
import time
import uuid
from pathlib import Path

import pytest
import redis

from embedded import infra
from embedded.processes import alive, read_pid
from fleetfence import probes
from fleetfence.kafka import ensure_topics, topic_specs
from fleetfence.mqtt import DynSec
from fleetfence.settings import Settings
from fleetfence.testing import wait_for
from gateway.testing import TopicReader, telemetry_seqs
from tests.gateway.helpers import EdgeProcess, Vehicle, gw_settings, own_kafka
from vehicle_master.credentials import VehicleCredentials

pytestmark = [pytest.mark.services, pytest.mark.slow, pytest.mark.fault]

PER_VEHICLE = 150


def test_edge_sigkilled_during_a_kafka_outage_loses_no_acknowledged_fix(
    settings: Settings, tmp_path: Path
) -> None:
    own = own_kafka(settings, tmp_path)
    gs = gw_settings(own, gateway_edge_port=probes.free_port())
    r = redis.Redis.from_url(settings.redis_dsn)
    control = DynSec.from_settings(settings)
    creds = VehicleCredentials(r, settings.redis_prefix, control)
    run = uuid.uuid4().hex[:6]
    vehicles: list[Vehicle] = []
    edges: list[EdgeProcess] = []
    reader: TopicReader | None = None
    try:
        infra.up(own)  # only the broker: MQTT and Redis are the session's
        ensure_topics(own.bootstrap_servers, topic_specs(own))
        edges.append(EdgeProcess(gs, tmp_path / "edge1.log"))
        edge_port = gs.gateway_edge_port
        assert edge_port is not None
        for i in range(10):
            vid = f"k{run}-{i}"
            vehicles.append(Vehicle(vid, creds.issue(vid)[1], edge_port))
        published = 0

        def publish_some(n: int) -> None:
            nonlocal published
            for _ in range(n):
                seq, i = divmod(published, len(vehicles))
                vehicles[i].publish(seq)
                published += 1
                time.sleep(0.002)  # pacing a fleet's rate, not synchronisation

        def acked() -> int:
            return sum(len(v.acked) for v in vehicles)

        publish_some(400)
        wait_for(lambda: acked() >= 300, 30, "acknowledgements before the outage")
        kafka = read_pid(own, "kafka")
        assert kafka is not None
        os.kill(kafka[0], signal.SIGKILL)
        wait_for(lambda: not alive(*kafka), 10, "Kafka gone")
        acked_at_outage = acked()
        publish_some(500)  # into the outage: the edge takes them and acknowledges none
        wait_for(
            lambda: edges[0].metrics().get("fleetfence_gateway_in_flight", 0) > 0,
            30,
            "fixes held by the edge while Kafka is down",
        )
        forwarded_down = edges[0].metrics()["fleetfence_gateway_forwarded_total"]
        edges[0].kill()
        acked_at_kill = acked()
        # Only what Kafka had confirmed before it died can have been acknowledged.
        assert acked_at_kill - acked_at_outage <= 200, (acked_at_outage, acked_at_kill)
        edges.append(EdgeProcess(gs, tmp_path / "edge2.log"))
        publish_some(PER_VEHICLE * len(vehicles) - published)
        infra.up(own, create_topics=False)  # same port, same data folder
        wait_for(lambda: acked() == published, 90, "every fix acknowledged once Kafka is back")
        reader = TopicReader(own.bootstrap_servers, [own.topics.telemetry])
        want = {(v.vid, s) for v in vehicles for s in range(PER_VEHICLE)}
        prefix = f"k{run}-"
        reader.read_until(lambda rs: want <= set(telemetry_seqs(rs, prefix)), 60, "every fix in Kafka")
        got = telemetry_seqs(reader.records, prefix)
        dups = sum(n - 1 for n in collections.Counter(got).values())
        m = edges[1].metrics()
        print(
            f"edge sigkill in a Kafka outage: published={published} acked_at_outage={acked_at_outage} "
            f"acked_at_kill={acked_at_kill} forwarded_when_killed={forwarded_down} records={len(got)} "
            f"duplicates={dups} redelivered_after_restart={m.get('fleetfence_gateway_redelivered_total')}"
        )
        assert set(got) == want
        assert m["fleetfence_gateway_received_total"] == m["fleetfence_gateway_forwarded_total"]
    finally:
        for v in vehicles:
            v.close()
        for e in edges:
            e.kill()
        if reader is not None:
            reader.close()
        for v in vehicles:
            creds.revoke(v.vid)
        control.close()
        r.close()
        infra.down(own)
