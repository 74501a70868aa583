"""The compose deployment end to end: a fleet registered through the admin API and driven over
MQTT TLS with per-vehicle credentials; the alerts equal the ground truth, every count reconciles,
`fleetfence status` sees every service, and Mosquitto persists its state in its volume."""

from __future__ import annotations

import json
import re
import socket
import ssl
import time
import urllib.request
from datetime import UTC, datetime

import pytest

from fleetfence.testing import wait_for
from gateway.protocols.teltonika import encode_imei
from tests_deploy.harness import ROOT, TOPIC_PROBE, Deployment
from tests_deploy.logcheck import docker_time
from tests_deploy.measure import record

pytestmark = pytest.mark.deploy


def test_published_ports_answer(deployment: Deployment) -> None:
    """The admin API on 8000, the device edge's TLS listeners (one per gateway replica) and the
    broker's (the alerts' subscribers), from the host, each presenting the bootstrapped certificate;
    and each replica's listeners for phones (HTTPS) and Teltonika units (TCP), each answering as
    its protocol says."""
    with urllib.request.urlopen(f"http://127.0.0.1:{deployment.api_port}/readyz", timeout=10) as resp:
        assert resp.status == 200
    ctx = ssl.create_default_context(cadata=deployment.driver("cat", "/certs/ca.crt", timeout_s=120).stdout)
    for port in (*deployment.edge_tls_ports, deployment.mqtt_tls_port):
        with (
            socket.create_connection(("127.0.0.1", port), timeout=10) as raw,
            ctx.wrap_socket(raw, server_hostname="localhost") as tls,
        ):
            assert tls.version() in ("TLSv1.2", "TLSv1.3")
            # A TLS close (close_notify), not just the socket's: Mosquitto logs a connection that
            # ends without one as an error ("OpenSSL Error[0]: ... unexpected eof while reading").
            tls.unwrap()
    # The edge's listeners for trackers: a phone's request naming no device gets the edge's own
    # 400 over TLS; a Teltonika unit whose IMEI is bound to nothing is refused (0x00) and closed.
    for port in deployment.phone_ports:
        with (
            socket.create_connection(("127.0.0.1", port), timeout=10) as raw,
            ctx.wrap_socket(raw, server_hostname="localhost") as tls,
        ):
            # `Connection: close`: the edge ends the TLS session itself once it has answered.
            tls.sendall(b"GET /?lat=60.1&lon=24.9 HTTP/1.1\r\nHost: edge\r\nConnection: close\r\n\r\n")
            answer = b""
            while chunk := tls.recv(4096):
                answer += chunk
        assert answer.startswith(b"HTTP/1.1 400 "), answer
        assert answer.endswith(b"the device id (id, deviceid or device_id) is required\n"), answer
    for port in deployment.teltonika_ports:
        with socket.create_connection(("127.0.0.1", port), timeout=10) as unit:
            unit.sendall(encode_imei("356307042441013"))
            assert unit.recv(1) == b"\x00"
            assert unit.recv(1) == b"", "refused units are disconnected"


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


def mosquitto_option(name: str) -> str:
    """An option of deploy/mosquitto.conf, the config the broker runs."""
    for line in (ROOT / "deploy" / "mosquitto.conf").read_text().splitlines():
        key, _, value = line.strip().partition(" ")
        if key == name:
            return value.strip()
    raise AssertionError(f"deploy/mosquitto.conf has no {name}")


def test_mosquitto_persists_its_state_in_its_volume(deployment: Deployment) -> None:
    """Once the broker has run longer than its autosave interval, its persistence file is in the
    `mosquitto-data` volume, the broker's (uid 1883, as `mqtt-bootstrap --owner` hands it over), and
    rewritten at each autosave. It never was before issue #58: the volume's folder stayed root's
    and the broker logged "Error: Permission denied." at every autosave."""
    dep = deployment
    autosave = int(mosquitto_option("autosave_interval"))
    location = mosquitto_option("persistence_location").rstrip("/")
    folder = dep.volume_path("mosquitto", location)
    assert folder.parent.name.endswith("_mosquitto-data"), folder  # <project>_mosquitto-data/_data
    started = docker_time(str(dep.states()["mosquitto"]["started_at"]))
    ran = (datetime.now(UTC) - started).total_seconds()
    time.sleep(max(0.0, 2 * autosave - ran))  # usually long past: the broker started before `init`
    db = folder / "mosquitto.db"
    assert db.exists(), (
        f"no {db.name} in the volume after {max(ran, 2 * autosave):.0f} s of the broker: "
        f"{sorted(p.name for p in folder.iterdir())}\n{dep.logs('mosquitto', tail=20)}"
    )
    st = folder.stat()
    assert (st.st_uid, st.st_gid) == (1883, 1883), f"{folder}: owner {st.st_uid}:{st.st_gid}"
    assert (db.stat().st_uid, db.stat().st_gid) == (1883, 1883)
    first = db.stat().st_mtime_ns
    wait_for(lambda: db.stat().st_mtime_ns > first, 3 * autosave + 5, f"{db.name} rewritten by an autosave")
    # Mosquitto's own line for a failed save ("Error: <the system's reason>."), none since it started.
    assert not re.search(r"^\d+: Error: ", dep.logs_since_start("mosquitto"), re.MULTILINE), dep.logs(
        "mosquitto", tail=20
    )
