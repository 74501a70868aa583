"""`fleetfence loadtest --attach` on an installation that is already running: the whole pipeline as
separate processes (admin API, Spark processor, a gateway, `alerts run`) on the session's Kafka,
Mosquitto and Redis, started here as an operator's installation would be. The load test finds the
services in the registry, counts only its own traffic (the gateway has counted fixes before it
starts), judges its accuracy, starts and stops nothing, and leaves the vehicle master as it found
it; it refuses an area that holds one of the installation's zones."""

from __future__ import annotations

import subprocess
import uuid
from collections.abc import Callable
from pathlib import Path
from urllib.parse import urlparse

import orjson
import pytest
import redis

from admin_api.security import Role, create_api_key
from embedded.pipeline import Pipeline, settings_env
from fleetfence.contracts import MasterEntity
from fleetfence.metrics import scrape
from fleetfence.mqtt import Account, DynSec
from fleetfence.settings import Settings
from fleetfence.testing import wait_for
from gateway.testing import Publisher, fix
from tests.loadtest.helpers import ELSEWHERE, FLEETFENCE
from vehicle_master.credentials import VehicleCredentials
from vehicle_master.models import VehicleData, ZoneData
from vehicle_master.store import VehicleMaster

pytestmark = [pytest.mark.spark, pytest.mark.services, pytest.mark.slow]

# A zone of the installation's own, in the load test's default area (central Berlin).
BERLIN_ZONE = [[13.40, 52.50], [13.41, 52.50], [13.41, 52.51], [13.40, 52.51], [13.40, 52.50]]
LEFTOVER = "lt0badc0s"  # an earlier run's prefix (loadtest.run.RUN_PREFIX_RE)


@pytest.fixture
def installation(install: Callable[[int], tuple[Settings, Pipeline]]) -> tuple[Settings, Pipeline]:
    return install(1)


def loadtest(
    s: Settings, report: Path, *extra: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    env = settings_env(s, COLUMNS="200", **(env or {}))
    argv = [*FLEETFENCE, "loadtest", "--attach", "--vehicles", "30", "--duration-s", "20"]
    argv += ["--report-dir", str(report), "--min-recall", "1.0", "--settle-s", "90", *extra]
    return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=600, check=False)


def cleanup(s: Settings, run: str) -> subprocess.CompletedProcess[str]:
    argv = [*FLEETFENCE, "loadtest", "--attach", "--cleanup", run]
    return subprocess.run(argv, env=settings_env(s), capture_output=True, text=True, timeout=120, check=False)


def ids(vm: VehicleMaster, entity: MasterEntity) -> list[str]:
    return [r.id for r in vm.list(entity, limit=10_000)]


def test_attached_load_test_counts_its_own_traffic_and_leaves_the_installation_running(
    installation: tuple[Settings, Pipeline], tmp_path: Path
) -> None:
    s, pipeline = installation
    pids = pipeline.pids()
    vm = VehicleMaster.from_settings(s)
    try:
        vm.upsert(
            ZoneData.model_validate(
                {
                    "zone_id": "depot-berlin",
                    "name": "Depot",
                    "kind": "depot",
                    "geometry": {"type": "Polygon", "coordinates": [BERLIN_ZONE]},
                }
            )
        )
        vm.upsert(VehicleData(vehicle_id="truck-1", label="Truck 1"))
        # What a killed earlier load test left behind (issue #64, case 1): its zone in the area and a
        # vehicle, named after its run prefix.
        vm.upsert(
            ZoneData.model_validate(
                {
                    "zone_id": f"{LEFTOVER}0-z1",
                    "name": "left by a killed run",
                    "kind": "depot",
                    "geometry": {"type": "Polygon", "coordinates": [BERLIN_ZONE]},
                }
            )
        )
        vm.upsert(VehicleData(vehicle_id=f"{LEFTOVER}0-v1", label="left by a killed run"))
        # The installation has already carried traffic: its gateway's counters are not zero. A
        # vehicle with credentials of its own, on the installation's device edge.
        r = redis.Redis.from_url(s.redis_dsn)
        control = DynSec.from_settings(s)
        try:
            _rec, secret = VehicleCredentials(r, s.redis_prefix, control).issue("truck-1")
        finally:
            control.close()
            r.close()
        edge = urlparse(pipeline.device_urls[0])
        assert edge.hostname is not None
        assert edge.port is not None
        pub = Publisher(edge.hostname, edge.port, account=Account("truck-1", secret))
        try:
            for seq in range(20):
                pub.publish("fleet/truck-1/telemetry", orjson.dumps(fix("truck-1", seq)))
            pub.publish("fleet/truck-1/telemetry", b"not json")
            pub.wait_all()
        finally:
            pub.close()
        # ... and the processor has read it (a load test wants a quiet installation: a backlog
        # the processor is still reading would count as the run's own).
        gw_url = pipeline.metrics_urls("gateway")["gateway-1"]
        proc_url = pipeline.metrics_urls("processor")["processor"]

        def processor_read() -> float:
            by = scrape(proc_url).by_label("fleetfence_processor_records_total", "outcome")
            return by.get("received", 0.0) + by.get("invalid", 0.0)

        received = "fleetfence_gateway_received_total"
        wait_for(lambda: scrape(gw_url).total(received) == 21, 30, "earlier traffic")
        wait_for(lambda: processor_read() == 20, 60, "the processor to read the earlier traffic")

        # The default area holds the installation's depot: refused before anything is registered.
        refused = loadtest(s, tmp_path / "refused")
        assert refused.returncode != 0
        said = refused.stdout + refused.stderr
        assert "depot-berlin" in said, said[-6000:]
        # The earlier run's zone is named with the command that removes its leftovers.
        assert f"--cleanup {LEFTOVER}" in " ".join(said.split()), said[-6000:]
        assert ids(vm, MasterEntity.VEHICLE) == [f"{LEFTOVER}0-v1", "truck-1"]
        cleaned = cleanup(s, LEFTOVER)
        assert cleaned.returncode == 0, cleaned.stdout + cleaned.stderr
        assert "removed 2 entities" in cleaned.stdout, cleaned.stdout
        assert ids(vm, MasterEntity.VEHICLE) == ["truck-1"]
        assert ids(vm, MasterEntity.ZONE) == ["depot-berlin"]
        not_a_run = cleanup(s, "truck")  # not a load test's prefix: refused, nothing deleted
        assert not_a_run.returncode != 0
        assert ids(vm, MasterEntity.VEHICLE) == ["truck-1"]

        # Registered through the installation's admin API with an admin key, as an operator would.
        r = redis.Redis.from_url(s.redis_dsn)
        try:
            key = create_api_key(r, s.redis_prefix, "loadtest", Role.ADMIN)
        finally:
            r.close()
        api = {"FLEETFENCE_SIMULATOR_API_URL": pipeline.api_url, "FLEETFENCE_SIMULATOR_API_KEY": key}
        out = loadtest(s, tmp_path / "report", "--bbox", ELSEWHERE, env=api)
        text = out.stdout + out.stderr
        assert out.returncode == 0, text[-6000:]
    finally:
        vm.close()

    run = orjson.loads((tmp_path / "report" / "report.json").read_bytes())
    assert run["machine"]["attached"] is True
    (step,) = run["steps"]
    # Only the run's own traffic is counted: the 21 earlier messages (one dead-lettered) are not.
    r = step["reconciliation"]
    assert r["reconciled"], r
    assert r["published"] == r["acked"] == r["gateway_received"] >= 30 * 19
    assert r["in_kafka"] == r["published"] - r["sent_twice"]
    assert r["gateway_forwarded"] == r["gateway_received"] == r["telemetry_records"]
    assert r["sent_again"] == r["sent_twice"]
    assert r["dead_lettered"] == r["gateway_dead_lettered"] == 0
    assert r["processor_read"] == r["telemetry_records"]
    acc = step["accuracy"]
    assert acc["expected"] >= 3
    assert acc["expected"] == acc["observed"] == acc["matched"]
    assert acc["precision"] == acc["recall"] == 1.0
    assert acc["duplicates"] == 0
    assert run["verdicts"] == []
    # The installation's processes, found through the registry, were measured on this machine.
    names = set(run["samples"][-1]["procs"])
    assert any(n.startswith("gateway-") for n in names), names
    assert any(n.startswith("processor-") for n in names), names

    # The scenario went in through the admin API's bulk import.
    imports = scrape(f"{pipeline.api_url}/metrics").by_label("fleetfence_api_requests_total", "route")
    assert imports.get("/api/v1/import", 0) >= 1, imports
    # Nothing was started or stopped: the installation runs on, with the same processes.
    pipeline.check_alive()
    assert pipeline.pids() == pids
    # The vehicle master is as the load test found it: its own entities removed, ours kept.
    vm = VehicleMaster.from_settings(s)
    try:
        assert ids(vm, MasterEntity.VEHICLE) == ["truck-1"]
        assert ids(vm, MasterEntity.ZONE) == ["depot-berlin"]
        assert ids(vm, MasterEntity.ROUTE) == []
        assert ids(vm, MasterEntity.ASSIGNMENT) == []
    finally:
        vm.close()
    # Each simulated vehicle logged in with credentials issued through the API, and deleting the
    # vehicles revoked them: no account of the run is left in the broker.
    control = DynSec.from_settings(s)
    try:
        (listing,) = control.command({"command": "listClients", "verbose": False})
    finally:
        control.close()
    clients = listing["data"]["clients"]
    assert "fleetfence-gateway" in clients
    assert [c for c in clients if c.startswith("lt")] == []
    r = redis.Redis.from_url(s.redis_dsn)
    try:
        statuses = {k: r.hget(k, "status") for k in r.scan_iter(f"{s.redis_prefix}mqtt:credentials:lt*")}
    finally:
        r.close()
    assert len(statuses) >= 30
    assert set(statuses.values()) == {b"revoked"}


def test_attach_without_a_running_installation_says_what_is_missing(
    settings: Settings, tmp_path: Path
) -> None:
    empty = f"empty{uuid.uuid4().hex[:6]}:"  # a registry nobody announced in
    s = settings.model_copy(update={"state_dir": tmp_path, "redis_prefix": empty})
    out = loadtest(s, tmp_path / "report")
    assert out.returncode != 0
    assert "no gateway is registered" in out.stdout + out.stderr, out.stdout[-2000:] + out.stderr[-2000:]
