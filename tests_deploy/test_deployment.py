"""The compose deployment end to end: a fleet registered through the admin API and driven over
MQTT TLS with per-vehicle credentials; the alerts equal the ground truth, every count reconciles,
and `fleetfence status` sees every service."""

from __future__ import annotations

import json
import ssl
import urllib.request

import pytest

from tests_deploy.harness import TOPIC_PROBE, Deployment
from tests_deploy.measure import record

pytestmark = pytest.mark.deploy


def test_published_ports_answer(deployment: Deployment) -> None:
    """The admin API on 8000 and the vehicles' TLS listener on 8883, from the host."""
    with urllib.request.urlopen(f"http://127.0.0.1:{deployment.api_port}/readyz", timeout=10) as resp:
        assert resp.status == 200
    ctx = ssl.create_default_context(cadata=deployment.driver("cat", "/certs/ca.crt", timeout_s=120).stdout)
    import socket

    with (
        socket.create_connection(("127.0.0.1", deployment.mqtt_tls_port), timeout=10) as raw,
        ctx.wrap_socket(raw, server_hostname="localhost") as tls,
    ):
        assert tls.version() in ("TLSv1.2", "TLSv1.3")


def test_topics_are_replicated(deployment: Deployment) -> None:
    probe = deployment.py(TOPIC_PROBE)
    assert all(len(r) == 3 for r in probe["replicas"].values()), probe
    assert all(len(i) == 3 for i in probe["isr"].values()), probe
    cfg = deployment.py(
        "import json, os\n"
        "from confluent_kafka.admin import AdminClient, ConfigResource\n"
        "a = AdminClient({'bootstrap.servers': os.environ['FLEETFENCE_KAFKA_BOOTSTRAP']})\n"
        "r = ConfigResource('topic', 'fleet.telemetry')\n"
        "c = a.describe_configs([r])[r].result(timeout=20)\n"
        "print(json.dumps({k: v.value for k, v in c.items()}))"
    )
    assert cfg["min.insync.replicas"] == "2", cfg


def test_fleet_over_tls_alerts_equal_the_ground_truth(deployment: Deployment) -> None:
    proc = deployment.driver(
        *deployment.loadtest_argv("steady", vehicles=100, duration_s=90), timeout_s=900, check=False
    )
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-3000:]
    record("none (steady)", deployment.report("steady"))


def test_fleetfence_status_sees_every_service(deployment: Deployment) -> None:
    out = deployment.driver("fleetfence", "status", "--json", timeout_s=180, check=False)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-2000:]
    status = json.loads(out.stdout[out.stdout.index("{") :])
    assert status["ok"], status
    assert all(s["healthy"] for s in status["infrastructure"]), status["infrastructure"]
    kinds = sorted(s["kind"] for s in status["services"])
    assert kinds.count("gateway") == len(deployment.gateways), kinds
    assert {"api", "processor", "alerts"} <= set(kinds), kinds
    # The active driver and the warm standby, each announced under its host name.
    assert kinds.count("processor") == len(deployment.processors) == 2, kinds
