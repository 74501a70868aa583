"""Faults, Jepsen-style, on the compose deployment: each under a steady simulated fleet with its
ground truth (`fleetfence loadtest --attach` in the driver container), each followed by the load
test's reconciliation end to end, counted in Kafka (every fix published was PUBACKed; every
PUBACKed fix is in fleet.telemetry once, or dead-lettered; the processor's markers count every
record written there) and by the alerts compared with the ground truth (precision = recall = 1.0,
no duplicate).

What a user sees is measured from the load test's one-second samples: how long the fleet's
publishing stalled (PUBACKs stopped coming), the worst PUBACK p99 of a second, and the
receipt->alert latency of the run (tests_deploy/measure.py; the session prints the table that
docs/deploy.md records).
"""

from __future__ import annotations

import json
import os
import re
import signal
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from fleetfence.testing import wait_for
from tests_deploy.harness import (
    ONE_SHOT,
    TOPIC_PROBE,
    TOXIPROXY,
    TOXIPROXY_API_PORT,
    DeployError,
    Deployment,
    run,
)
from tests_deploy.measure import MEASURED, record

pytestmark = pytest.mark.deploy

VEHICLES = 100
DURATION_S = 90.0
# Issue #58's rows (the device edge's promise under a broker or edge crash during a write outage)
# run this many times each: `FLEETFENCE_DEPLOY_REPEAT=5 bash scripts/dev.sh deploy-test -k while`.
REPEAT = range(1, int(os.environ.get("FLEETFENCE_DEPLOY_REPEAT", "1")) + 1)


def repeated(name: str, run: int) -> str:
    """A repeated row's name in the table (and its report's directory): which run it was."""
    return f"{name} (run {run} of {len(REPEAT)})" if len(REPEAT) > 1 else name


class LoadTestEndedError(AssertionError):
    """The fault's load test ended before its fault was injected: the test fails at once (no wait
    ignores this, unlike a DeployError of a probe that had no answer yet)."""


def probe(dep: Deployment) -> dict[str, Any]:
    data = dep.py(TOPIC_PROBE)
    assert isinstance(data, dict)
    return data


def records(dep: Deployment) -> int:
    """The telemetry topic's end offsets, summed; DeployError while a partition has no leader
    (waits pass `ignore=(DeployError,)`)."""
    n = probe(dep)["records"]
    if n is None:
        raise DeployError("a telemetry partition has no leader to answer")
    return int(n)


def readable_records(dep: Deployment, timeout_s: float = 120) -> int:
    """`records`, once every partition's leader answers."""
    return (
        wait_for(
            lambda: records(dep) + 1,
            timeout_s,
            "every telemetry partition answering",
            interval_s=1.0,
            ignore=(DeployError,),
        )
        - 1
    )


def docker(*argv: str, timeout_s: float = 120) -> str:
    return run(["docker", *argv], timeout_s=timeout_s).stdout


# Python in the driver container: delete every entity a load test registered (ids "lt<run>s...").
UNREGISTER_LOADTESTS = """
import os
from fleetfence.settings import Settings
from simulator.register import unregister_prefix
print(unregister_prefix(Settings(), "lt", api_url=os.environ["FLEETFENCE_SIMULATOR_API_URL"],
                        api_key=os.environ["FLEETFENCE_SIMULATOR_API_KEY"]))
"""


def under_load(dep: Deployment, name: str, fault: Callable[[], None], tmp_path: Path) -> dict[str, Any]:
    """Run the fleet, inject `fault` once publishing is under way, wait for the run, check it exact."""
    log = tmp_path / f"{name}.log"
    MEASURED.clear()  # what an earlier, failed fault measured is not this row's
    start = readable_records(dep)
    proc = dep.driver_popen(*dep.loadtest_argv(name, vehicles=VEHICLES, duration_s=DURATION_S), log=log)
    try:
        # Under way: the fleet's fixes are reaching Kafka.

        def publishing() -> bool:
            if proc.poll() is not None:
                raise LoadTestEndedError(f"{name}: the load test ended early:\n{log.read_text()[-4000:]}")
            return records(dep) > start + 20 * VEHICLES

        # A partition's leader may not answer a probe for a moment (a broker of the fault before
        # still rejoining): "not yet", as in every other wait here; an ended load test is not.
        wait_for(publishing, 600, f"{name}: the fleet publishing", interval_s=2.0, ignore=(DeployError,))
        fault()
        rc = proc.wait(timeout=1500)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(30)
        if proc.returncode != 0:
            # Killed before its own clean-up ran, or that clean-up failed: remove what it
            # registered, or the next test's check finds these zones in its area and refuses to
            # start (one failure would fail every test after it).
            dep.driver("python", "-c", UNREGISTER_LOADTESTS, timeout_s=300, check=False)
    assert rc == 0, f"{name}: the load test failed:\n{log.read_text()[-8000:]}"
    return record(name, dep.report(name))


def kill(dep: Deployment, service: str, *, stay_down: bool) -> str:
    """SIGKILL a service's process. `stay_down`: through `docker kill`, which Docker counts as a
    manual stop (no restart) until `revive`; otherwise the container's main process is killed from
    the host, a crash as Docker sees one, and the service's restart policy brings it back."""
    cid = dep.container(service)
    if stay_down:
        docker("kill", "-s", "KILL", cid)
    else:
        pid = int(docker("inspect", "-f", "{{.State.Pid}}", cid).strip())
        os.kill(pid, signal.SIGKILL)
    return cid


def restarted(dep: Deployment, service: str, restarts_before: int) -> bool:
    """The restart policy has brought the killed service back, and it is healthy."""
    st = dep.states()[service]
    return bool(st["restarts"] > restarts_before and st["status"] == "running" and st["health"] == "healthy")


def crash(dep: Deployment, service: str, what: str) -> float:
    """SIGKILL a service's process from the host (a crash, as Docker sees one) and wait until its
    restart policy has it running and healthy again; `MEASURED[what]` = seconds that took. Returns
    the moment of the kill (time.monotonic())."""
    before = dep.states()[service]["restarts"]
    t0 = time.monotonic()
    kill(dep, service, stay_down=False)
    back_healthy(dep, service, before, what, t0, timeout_s=300)
    return t0


def back_healthy(
    dep: Deployment, service: str, restarts_before: int, what: str, t0: float, timeout_s: float = 600
) -> None:
    """Wait until the service's restart policy has it running and healthy again;
    `MEASURED[what]` = seconds since `t0`."""
    wait_for(
        lambda: restarted(dep, service, restarts_before),
        timeout_s,
        f"{service} restarted and healthy",
        interval_s=1.0,
        ignore=(DeployError,),
    )
    MEASURED[what] = time.monotonic() - t0


def revive(dep: Deployment, service: str, cid: str) -> None:
    docker("start", cid)
    wait_for(
        lambda: dep.states()[service]["health"] == "healthy",
        300,
        f"{service} healthy again",
        interval_s=2.0,
        ignore=(DeployError,),
    )


def node_service(node_id: int) -> str:
    return f"kafka-{node_id}"


def fully_replicated(dep: Deployment) -> bool:
    p = probe(dep)
    return all(len(i) == 3 for i in p["isr"].values())


def kill_one_node(dep: Deployment, victim: str, taken_over: Callable[[], bool], what: str) -> None:
    """SIGKILL one Kafka node and keep it down until `taken_over` (the others lead what it led) and
    the fleet's fixes flow on the other two; then restart it and wait until it is back in every
    ISR. `MEASURED[what]`: seconds from the kill to the takeover."""
    t0 = time.monotonic()
    cid = kill(dep, victim, stay_down=True)
    wait_for(taken_over, 120, what, interval_s=1.0, ignore=(DeployError,))
    MEASURED[what] = time.monotonic() - t0
    n = readable_records(dep)
    wait_for(
        lambda: records(dep) > n + 5 * VEHICLES,
        120,
        f"fixes flowing without {victim}",
        interval_s=1.0,
        ignore=(DeployError,),
    )
    revive(dep, victim, cid)
    wait_for(
        lambda: fully_replicated(dep),
        300,
        f"{victim} back in every ISR",
        interval_s=2.0,
        ignore=(DeployError,),
    )


def test_sigkill_the_telemetry_leader(deployment: Deployment, tmp_path: Path) -> None:
    dep = deployment

    def fault() -> None:
        leaders = list(probe(dep)["leaders"].values())
        victim = max(set(leaders), key=leaders.count)  # the broker leading most telemetry partitions
        kill_one_node(
            dep,
            node_service(victim),
            lambda: victim not in probe(dep)["leaders"].values(),
            "new leaders after",
        )

    under_load(dep, "SIGKILL the telemetry partitions' leader, restart it", fault, tmp_path)


# The official image's tool (the stand-in has it too: deploy/images/README.md), run in a broker.
QUORUM_STATUS = (
    "/opt/kafka/bin/kafka-metadata-quorum.sh",
    "--bootstrap-server",
    "localhost:9092",
    "describe",
    "--status",
)


def active_controller(dep: Deployment, via: str) -> int:
    """The node id of the controller quorum's leader, as the broker `via` reports it."""
    out = docker("exec", dep.container(via), *QUORUM_STATUS, timeout_s=120)
    m = re.search(r"^LeaderId:\s*(\d+)", out, re.MULTILINE)
    if m is None:
        raise DeployError(f"no LeaderId in the quorum's status:\n{out}")
    return int(m.group(1))


def test_sigkill_the_active_controller(deployment: Deployment, tmp_path: Path) -> None:
    """Every node is a broker and a voter: the active controller's death costs the quorum an
    election (and its partitions new leaders) while the fleet keeps publishing."""
    dep = deployment

    def fault() -> None:
        leader = active_controller(dep, dep.kafka_nodes[0])
        victim = node_service(leader)
        via = next(n for n in dep.kafka_nodes if n != victim)
        kill_one_node(
            dep, victim, lambda: active_controller(dep, via) != leader, "new active controller after"
        )

    under_load(dep, "SIGKILL the active controller, restart it", fault, tmp_path)


def stall_two_nodes(dep: Deployment) -> tuple[str, str, dict[str, int]]:
    """SIGKILL two of the three Kafka nodes (kept down) and wait until writes have stalled:
    min.insync.replicas=2 cannot be met. Observed, not slept on: the end offsets the surviving
    broker reports stop moving. Returns the two containers and those frozen end offsets."""
    first, second = dep.kafka_nodes[1], dep.kafka_nodes[2]
    t_kill = time.monotonic()
    c1 = kill(dep, first, stay_down=True)
    c2 = kill(dep, second, stay_down=True)
    seen: list[dict[str, int]] = []

    def stalled() -> bool:
        # The partitions whose leader answers (the others have none: no quorum to elect one).
        seen.append({p: n for p, n in probe(dep)["ends"].items() if n is not None})
        return len(seen) >= 5 and seen[-1] == seen[-5]

    wait_for(stalled, 180, "writes stalled with two brokers down", interval_s=2.0, ignore=(DeployError,))
    MEASURED["writes stalled after the kill"] = time.monotonic() - t_kill
    return c1, c2, seen[-1]


def revive_two_nodes(dep: Deployment, c1: str, c2: str, frozen: dict[str, int]) -> None:
    """Start the first node, wait until the stalled partitions take writes again (the backlog the
    vehicles and the gateways held, then the fleet's new fixes), then the second, until every ISR
    is whole."""
    t0 = time.monotonic()
    revive(dep, dep.kafka_nodes[1], c1)

    def resumed() -> bool:
        ends = probe(dep)["ends"]
        return any((ends.get(p) or 0) > n for p, n in frozen.items()) or (
            not frozen and None not in ends.values()
        )

    wait_for(resumed, 300, "writes resumed with two brokers", interval_s=1.0, ignore=(DeployError,))
    MEASURED["writes taken again after the restart"] = time.monotonic() - t0
    revive(dep, dep.kafka_nodes[2], c2)
    wait_for(
        lambda: fully_replicated(dep), 300, "every ISR whole again", interval_s=2.0, ignore=(DeployError,)
    )


def test_two_of_three_brokers_down_then_one_back(deployment: Deployment, tmp_path: Path) -> None:
    dep = deployment

    def fault() -> None:
        revive_two_nodes(dep, *stall_two_nodes(dep))

    under_load(dep, "two of three brokers SIGKILLed, one back after the stall", fault, tmp_path)


def crash_during_the_outage(dep: Deployment, service: str, what: str, name: str, tmp_path: Path) -> None:
    """Issue #58's rows: two of three brokers SIGKILLed until writes stall, `service` SIGKILLed and
    brought back by its restart policy meanwhile, then the brokers; under the fleet, checked exact."""

    def fault() -> None:
        c1, c2, frozen = stall_two_nodes(dep)
        crash(dep, service, what)
        revive_two_nodes(dep, c1, c2, frozen)

    under_load(dep, name, fault, tmp_path)


@pytest.mark.parametrize("run", REPEAT)
def test_sigkill_mosquitto_while_two_of_three_brokers_are_down(
    deployment: Deployment, tmp_path: Path, run: int
) -> None:
    """Issue #58's fault: Mosquitto SIGKILLed while Kafka cannot take writes. Behind Mosquitto it
    lost half the acknowledged fixes (the broker's PUBACK, from memory); the vehicles now send to
    the device edge, whose PUBACK waits for Kafka, and Mosquitto carries only the alerts' fan-out:
    every fix published is acknowledged once Kafka is back, and the alerts are exact."""
    name = repeated("SIGKILL Mosquitto while two of three brokers are down", run)
    crash_during_the_outage(deployment, "mosquitto", "Mosquitto healthy again after", name, tmp_path)


@pytest.mark.parametrize("run", REPEAT)
def test_sigkill_a_gateway_while_two_of_three_brokers_are_down(
    deployment: Deployment, tmp_path: Path, run: int
) -> None:
    """Issue #58's other fault: a device-edge replica SIGKILLed while Kafka cannot take writes,
    holding its vehicles' fixes unacknowledged (some written to Kafka's queue, none confirmed);
    its restart policy brings it back. Its vehicles reconnect, to the other replica while it is
    down, and send again what they got no PUBACK for: nothing acknowledged is lost, and a fix the
    killed replica had written reaches Kafka twice (`sent_again`), dropped by seq. The load test
    counts in Kafka, so the replica's counters starting again from zero do not stop it."""
    name = repeated("SIGKILL a gateway while two of three brokers are down", run)
    crash_during_the_outage(deployment, "gateway-1", "gateway-1 healthy again after", name, tmp_path)
    rec = deployment.report(name)["steps"][0]["reconciliation"]
    assert rec["gateway_restarts"] >= 1, rec  # its restart policy may need more than one try


# How long the installation stays stopped in the restart row (the operator's 20 s in issue #64): a
# parameter of the fault, not a wait for something.
INSTALLATION_DOWN_S = 20.0


def test_stop_and_start_the_whole_installation(deployment: Deployment, tmp_path: Path) -> None:
    """Issue #64, case 1: `docker-compose stop` under a load test, `docker-compose start` 20 s
    later. The load test used to exit 2 when its vehicles were cut off and leave its fleet in the
    vehicle master; it now rides the restart out as trackers do (reconnecting, sending again what
    was not acknowledged), and still verifies exactly, reconciles and cleans up. Every service but
    the load test's own container (the driver) is stopped: Kafka, Redis, Mosquitto, Spark, the
    gateways, the processors, the API and the receivers."""
    dep = deployment
    # The suite's proxy stands for the network between Spark and Kafka: it stays up.
    services = [s for s in dep.services if s not in (*ONE_SHOT, TOXIPROXY)]

    def fault() -> None:
        t0 = time.monotonic()
        dep.compose("stop", *services, timeout_s=600)
        MEASURED["every service stopped after"] = time.monotonic() - t0
        time.sleep(INSTALLATION_DOWN_S)
        t1 = time.monotonic()
        dep.compose("start", *services, timeout_s=600)
        wait_for(dep.healthy, 900, "every service healthy again", interval_s=2.0, ignore=(DeployError,))
        MEASURED["every service healthy again after"] = time.monotonic() - t1

    name = "docker-compose stop, start 20 s later (the whole installation)"
    under_load(dep, name, fault, tmp_path)
    notes = dep.report(name)["steps"][0]["notes"]
    assert any(n.startswith("gateway-") and "restarted" in n for n in notes), notes


def test_sigkill_mosquitto_and_restart(deployment: Deployment, tmp_path: Path) -> None:
    dep = deployment

    def fault() -> None:
        # Its restart policy brings it back, as in production; the vehicles and the gateways
        # reconnect on their own.
        crash(dep, "mosquitto", "Mosquitto healthy again after")

    under_load(dep, "SIGKILL Mosquitto, restarted by its policy", fault, tmp_path)


def pause(cid: str, attempts: int = 5) -> None:
    """`docker pause`, again if the cgroup freezer gave up: on a loaded machine it may not freeze
    every task in time ("unable to freeze"), and the container is then left running."""
    for attempt in range(1, attempts + 1):
        out = run(["docker", "pause", cid], timeout_s=120, check=False)
        if out.returncode == 0:
            return
        if "unable to freeze" not in out.stderr or attempt == attempts:
            raise DeployError(f"docker pause failed: {out.stderr.strip()}")


# Python in the api container: the owners of the processor's checkpoint leases in Redis
# (processor.ops.lease: "<host>:<pid>:<token>"; a driver's host name is its service's).
LEASE_PROBE = """
import json, os, redis
r = redis.Redis.from_url(os.environ["FLEETFENCE_REDIS_URL"], socket_timeout=5)
keys = list(r.scan_iter(match="*processor:lease:*"))
print(json.dumps([v.decode() for v in (r.get(k) for k in keys) if v]))
"""


def lease_holders(dep: Deployment) -> list[str]:
    """The owners of the processor's checkpoint leases present in Redis."""
    data = dep.py(LEASE_PROBE, timeout_s=60)
    assert isinstance(data, list)
    return [str(v) for v in data]


def active_processor(dep: Deployment) -> str | None:
    """The processor service whose driver holds the checkpoint's lease (runs the query), or None."""
    holders = lease_holders(dep)
    assert len(holders) <= 1, f"more than one lease: {holders}"
    return holders[0].split(":", 1)[0] if holders else None


def standby_waiting(dep: Deployment, service: str) -> bool:
    """The driver has Spark up and warmed and polls the lease (processor.ops.lease's log line),
    since its container last started: a fault on the active one now has somebody to take over.
    Its healthcheck passes earlier, as soon as its metrics endpoint answers."""
    return "waiting to take over" in dep.logs_since_start(service)


def took_the_lease(dep: Deployment, standby: str, t0: float) -> None:
    """Wait until the standby holds the checkpoint's lease; MEASURED: seconds since the fault."""
    wait_for(
        lambda: active_processor(dep) == standby,
        120,
        f"{standby} took the lease",
        interval_s=0.5,
        ignore=(DeployError,),
    )
    MEASURED["the standby took the lease after"] = time.monotonic() - t0


def the_active_processor(dep: Deployment) -> tuple[str, str]:
    """(the driver running the query, the standby ready to take over): services of the compose
    file. Waits for both, so that a fault starts from a deployment that can fail over."""
    active = wait_for(
        lambda: active_processor(dep),
        120,
        "a processor holding the lease",
        interval_s=1.0,
        ignore=(DeployError,),
    )
    assert active in dep.processors, (active, dep.processors)
    others = [p for p in dep.processors if p != active]
    assert len(others) == 1, f"no standby beside {active}: {dep.processors}"
    wait_for(
        lambda: standby_waiting(dep, others[0]),
        600,
        f"{others[0]} warmed up and waiting for the lease",
        interval_s=2.0,
        ignore=(DeployError,),
    )
    return active, others[0]


def test_freeze_the_processor_past_its_lease(deployment: Deployment, tmp_path: Path) -> None:
    """The active driver frozen (not dead: a GC pause, a stalled VM) longer than its checkpoint
    lease: the warm standby takes the lease and runs the query from the checkpoint while the
    frozen one is still frozen. Woken, the old driver finds its lease gone, stops its query and
    exits (fenced: it commits nothing more, and the sink's shared transactional id would abort its
    open transaction anyway); its restart policy starts it again as the next standby. Nothing is
    lost or emitted twice (docs/exactly-once.md)."""
    dep = deployment

    def fault() -> None:
        active, standby = the_active_processor(dep)
        restarts = dep.states()[active]["restarts"]
        cid = dep.container(active)
        n = batches_of(dep, standby)
        t0 = time.monotonic()
        pause(cid)
        try:
            took_the_lease(dep, standby, t0)
            wait_for(
                lambda: batches_of(dep, standby) > n,
                300,
                f"{standby} committing batches while {active} is frozen",
                interval_s=1.0,
                ignore=(DeployError,),
            )
            MEASURED["the standby's first batch after"] = time.monotonic() - t0
        finally:
            docker("unpause", cid)
        MEASURED["frozen for"] = time.monotonic() - t0
        back_healthy(dep, active, restarts, "the frozen driver fenced, restarted and healthy again after", t0)
        # Woken, its lease thread finds the lease another's ("lease lost") or, on a loaded machine,
        # its first renewal times out after the margin had passed ("lease not renewed"): fenced.
        logs = dep.logs(active, tail=800)
        assert "lease lost" in logs or "lease not renewed" in logs, (
            f"the woken driver did not report its lost lease:\n{logs[-3000:]}"
        )
        # (On a machine so loaded that the new holder missed its own renewals, it would have fenced
        # itself too, and this would say so.)
        assert active_processor(dep) == standby, "the lease changed hands again after the takeover"

    under_load(dep, "processor frozen past its lease (docker pause), then woken", fault, tmp_path)


class ApiWriter:
    """Zone writes through the admin API on the published port, one after another, in an area far
    from the fleet's (no alert of the run is affected): which were answered 2xx, which not."""

    def __init__(self, api_key: str, port: int) -> None:
        self.key = api_key
        self.port = port
        self.ok: list[str] = []
        self.failed = 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, name="api-writer", daemon=True)

    def request(self, method: str, path: str, body: dict[str, Any] | None = None) -> int:
        req = urllib.request.Request(
            f"http://127.0.0.1:{self.port}{path}",
            method=method,
            data=json.dumps(body).encode() if body is not None else None,
            headers={"X-API-Key": self.key, "Content-Type": "application/json"},
        )
        try:
            with urllib.request.urlopen(req, timeout=10) as resp:
                return int(resp.status)
        except urllib.error.HTTPError as exc:
            return int(exc.code)
        except (urllib.error.URLError, OSError):
            return 0

    def _run(self) -> None:
        i = 0
        while not self.stop.is_set():
            zid = f"zdeploytest-{i}"
            lon = 150.0 + (i % 100) * 0.01
            lat = -30.0 - (i // 100) * 0.01
            ring = [
                [lon, lat],
                [lon + 0.005, lat],
                [lon + 0.005, lat + 0.005],
                [lon, lat + 0.005],
                [lon, lat],
            ]
            status = self.request(
                "POST",
                "/api/v1/zones",
                {
                    "type": "Feature",
                    "id": zid,
                    "geometry": {"type": "Polygon", "coordinates": [ring]},
                    "properties": {"name": zid, "kind": "depot"},
                },
            )
            if 200 <= status < 300:
                self.ok.append(zid)
            else:
                self.failed += 1
            i += 1


def test_sigkill_redis_and_restart(deployment: Deployment, tmp_path: Path) -> None:
    """Every admin API write answered 2xx survives a SIGKILL of Redis (appendonly yes: Redis writes
    each command to its append-only file before it answers, so a killed process loses none; the
    `everysec` fsync only bounds what a machine crash can lose), and the run stays exact."""
    dep = deployment
    writer = ApiWriter(dep.api_key, dep.api_port)

    def fault() -> None:
        writer.thread.start()
        wait_for(lambda: len(writer.ok) >= 20, 120, "API writes answered before the kill", interval_s=0.5)
        t0 = crash(dep, "redis", "Redis healthy again after")
        before = len(writer.ok)
        wait_for(lambda: len(writer.ok) > before + 20, 300, "API writes answered again", interval_s=0.5)
        MEASURED["API writes answered again after"] = time.monotonic() - t0
        writer.stop.set()
        writer.thread.join(30)

    try:
        row = under_load(dep, "SIGKILL Redis, restarted by its policy", fault, tmp_path)
        missing = [z for z in writer.ok if writer.request("GET", f"/api/v1/zones/{z}") != 200]
        assert not missing, f"{len(missing)} of {len(writer.ok)} zones answered 2xx are gone: {missing[:10]}"
        row["lost"] = f"nothing ({len(writer.ok)} API writes answered 2xx, all kept; {writer.failed} refused)"
    finally:
        writer.stop.set()
        for z in writer.ok:
            writer.request("DELETE", f"/api/v1/zones/{z}")


# --------------------------------------------------------------------------- network partitions


def container_pid(dep: Deployment, service: str) -> int:
    return int(docker("inspect", "-f", "{{.State.Pid}}", dep.container(service)).strip())


def compose_ips(dep: Deployment, service: str) -> list[str]:
    """The service's addresses on the compose network(s)."""
    nets = json.loads(docker("inspect", "-f", "{{json .NetworkSettings.Networks}}", dep.container(service)))
    return [n["IPAddress"] for n in nets.values() if n.get("IPAddress")]


class Partition:
    """Every packet between one container and some addresses dropped, both ways, by iptables rules
    in the container's network namespace (entered from the host with nsenter): a network partition
    as the container sees one: no reset, no error, the peers just stop answering. `heal` removes the
    rules; a container that restarts meanwhile gets a new namespace without them, as a replaced
    host would."""

    def __init__(self, pid: int, peers: list[str]) -> None:
        assert peers, "nothing to partition from"
        self.pid = pid
        self.rules = [("OUTPUT", "-d", ip) for ip in peers] + [("INPUT", "-s", ip) for ip in peers]

    def _iptables(self, op: str, chain: str, flag: str, ip: str, check: bool) -> bool:
        argv = ["nsenter", "-t", str(self.pid), "-n", "iptables", "-w", op, chain, flag, ip, "-j", "DROP"]
        return run(argv, timeout_s=30, check=check).returncode == 0

    def cut(self) -> None:
        for chain, flag, ip in self.rules:
            self._iptables("-I", chain, flag, ip, check=True)

    def heal(self) -> None:
        for chain, flag, ip in self.rules:
            self._iptables("-D", chain, flag, ip, check=False)  # gone with a restarted container


METRIC_PROBE = """
import json, re, urllib.request
out = {{}}
for host, port, name in {targets!r}:
    try:
        text = urllib.request.urlopen(f"http://{{host}}:{{port}}/metrics", timeout=5).read().decode()
    except OSError:
        if not {unreachable_ok!r}:
            raise
        out[host] = None
        continue
    m = re.search(r"^" + name + r" (\\S+)$", text, re.M)
    out[host] = None if m is None else float(m.group(1))
print(json.dumps(out))
"""


def metric(
    dep: Deployment, targets: list[tuple[str, int, str]], *, unreachable_ok: bool = False
) -> dict[str, float | None]:
    """One Prometheus sample per (service, metrics port, metric name), read inside the network;
    `unreachable_ok`: None for a target that does not answer (a frozen or restarting driver)."""
    data = dep.py(METRIC_PROBE.format(targets=targets, unreachable_ok=unreachable_ok))
    assert isinstance(data, dict)
    return data


def standing_still(read: Callable[[], float | None], samples: int) -> Callable[[], bool]:
    """A condition: the last `samples` reads of a counter are equal (observed, not slept on)."""
    seen: list[float | None] = []

    def still() -> bool:
        seen.append(read())
        return len(seen) >= samples and len(set(seen[-samples:])) == 1

    return still


def test_partition_one_gateway_from_kafka(deployment: Deployment, tmp_path: Path) -> None:
    """gateway-1 (a device edge) cut off from all three brokers while it keeps its vehicles'
    connections. What it receives it cannot store, so it acknowledges none of it: its vehicles'
    fixes wait, in order, in its in-flight window and in the vehicles; nothing is acknowledged that
    Kafka does not have. gateway-2 carries its own vehicles meanwhile, so when the network heals
    gateway-1's fixes reach Kafka late but in each vehicle's order, and the alerts are exact."""
    dep = deployment
    victim = dep.gateways[0]

    def forwarded() -> float | None:
        return metric(dep, [(victim, 9464, "fleetfence_gateway_forwarded_total")])[victim]

    def fault() -> None:
        cut = Partition(
            container_pid(dep, victim), [ip for k in dep.kafka_nodes for ip in compose_ips(dep, k)]
        )
        t0 = time.monotonic()
        cut.cut()
        try:
            wait_for(standing_still(forwarded, 6), 180, f"{victim} storing nothing", interval_s=2.0)
            MEASURED[f"{victim} stored nothing, seen after"] = time.monotonic() - t0
        finally:
            cut.heal()
        t1 = time.monotonic()
        MEASURED["partitioned for"] = t1 - t0
        before = forwarded() or 0.0
        wait_for(lambda: (forwarded() or 0.0) > before, 300, f"{victim} storing again", interval_s=1.0)
        MEASURED[f"{victim} stored again after the heal"] = time.monotonic() - t1
        st = dep.states()[victim]
        assert st["health"] == "healthy", f"{victim} after the partition: {st}"

    under_load(dep, "gateway-1 partitioned from Kafka (iptables DROP both ways), healed", fault, tmp_path)


def test_partition_the_processor_from_redis(deployment: Deployment, tmp_path: Path) -> None:
    """The active driver cut off from Redis, which holds its checkpoint lease (and its live view).
    It cannot renew the lease, so within half the lease's time it fences itself: stops its query
    and exits before another driver could take the lease. The standby, which reaches Redis, takes
    the lease once it expired and runs the query from the checkpoint; the fenced driver's restart
    policy starts it in a new network namespace (the partition gone, as on a replaced host) as the
    next standby. None of the alerts is lost or emitted twice."""
    dep = deployment

    def fault() -> None:
        active, standby = the_active_processor(dep)
        restarts = dep.states()[active]["restarts"]
        cut = Partition(container_pid(dep, active), compose_ips(dep, "redis"))
        t0 = time.monotonic()
        cut.cut()
        try:
            wait_for(
                lambda: dep.states()[active]["restarts"] > restarts,
                120,
                f"{active} fenced itself (exited) without its lease",
                interval_s=1.0,
                ignore=(DeployError,),
            )
            MEASURED["the cut driver fenced itself, exited and restarted after"] = time.monotonic() - t0
        finally:
            cut.heal()
        took_the_lease(dep, standby, t0)
        back_healthy(dep, active, restarts, "the cut driver healthy again (the next standby) after", t0)
        logs = dep.logs(active, tail=800)
        assert "lease not renewed" in logs, f"{active} did not say why it stopped:\n{logs[-3000:]}"

    under_load(dep, "processor partitioned from Redis (its lease), the standby takes over", fault, tmp_path)


# --------------------------------------------------------------------------- Spark


SPARK_MASTER_PROBE = """
import json, urllib.request
m = json.load(urllib.request.urlopen("http://spark-master:8080/json/", timeout=5))
print(json.dumps({"status": m.get("status"), "workers": [w["state"] for w in m.get("workers", [])],
                  "apps": [[a["id"], a["state"]] for a in m.get("activeapps", [])]}))
"""


def spark_master(dep: Deployment) -> dict[str, Any]:
    data = dep.py(SPARK_MASTER_PROBE)
    assert isinstance(data, dict)
    return data


def batches_of(dep: Deployment, service: str) -> float:
    """The micro-batches one processor's driver has completed since it started."""
    n = metric(dep, [(service, 9465, "fleetfence_processor_batches_total")])[service]
    if n is None:
        raise DeployError(f"{service}'s metrics have no batch count yet")
    return n


def batches(dep: Deployment) -> float:
    """The micro-batches the processors' drivers have completed, together: it grows while either
    runs the query, so a fault's "batches completing again" holds whichever driver runs it (a
    driver that restarts counts again from zero, which can only make the wait longer)."""
    ns = metric(
        dep, [(p, 9465, "fleetfence_processor_batches_total") for p in dep.processors], unreachable_ok=True
    )
    seen = [n for n in ns.values() if n is not None]
    if not seen:
        raise DeployError("no processor's metrics answer with a batch count")
    return sum(seen)


def batch_progress(dep: Deployment) -> Callable[[], float]:
    """A counter of the micro-batches the processors' drivers complete from now on, together. Each
    driver is held to its own count at this moment; a driver whose count falls below it restarted
    (its stall guard, a takeover) and all it has completed since counts. A sum of the drivers'
    counts would not do: a restarted driver's count starting from zero again would hide the other's
    batches for as many batches as it had done."""

    def counts() -> dict[str, float]:
        ns = metric(
            dep,
            [(p, 9465, "fleetfence_processor_batches_total") for p in dep.processors],
            unreachable_ok=True,
        )
        return {p: n for p, n in ns.items() if n is not None}

    base = counts()
    if not base:
        raise DeployError("no processor's metrics answer with a batch count")

    def since() -> float:
        done = 0.0
        for p, n in counts().items():
            before = base.get(p, 0.0)
            done += n - before if n >= before else n
        return done

    return since


def driver_restarts(dep: Deployment) -> int:
    """Restarts of the processors' containers, together: a fault that should leave the drivers
    alone must not restart either (a standby restarted by it would not be ready for the next)."""
    states = dep.states()
    return sum(int(states[p]["restarts"]) for p in dep.processors)


def test_sigkill_the_spark_worker(deployment: Deployment, tmp_path: Path) -> None:
    """The only Spark worker (and with it the executor running the processor's tasks) SIGKILLed
    while the fleet publishes, so mid-batch: the driver loses its executor and the batch's tasks;
    the worker's restart policy brings it back, the master gives the application a new executor,
    the batch runs again from its planned offsets. Exactly-once holds through the sink's
    transaction (docs/exactly-once.md)."""
    dep = deployment

    def fault() -> None:
        t0 = crash(dep, "spark-worker", "worker healthy again after")
        done = batch_progress(dep)
        wait_for(
            lambda: done() > 1, 300, "micro-batches completing again", interval_s=1.0, ignore=(DeployError,)
        )
        MEASURED["batches completing again after"] = time.monotonic() - t0

    under_load(dep, "SIGKILL the Spark worker (its executor) mid-batch", fault, tmp_path)


def test_restart_the_spark_master(deployment: Deployment, tmp_path: Path) -> None:
    """The standalone master SIGKILLed and restarted by its policy. Running applications do not
    need it (a driver talks to its executors directly); the restarted master recovers its worker
    and both drivers' applications from its recovery directory (spark.deploy.recoveryMode
    FILESYSTEM in docker-compose.yml), so the executors are kept and the applications are its own
    again."""
    dep = deployment

    def fault() -> None:
        before = spark_master(dep)
        assert before["status"] == "ALIVE", before
        # One application per driver, the active one's and the standby's (a driver restarted by an
        # earlier fault registers its application some seconds after its healthcheck passes).
        before = wait_for(
            lambda: (
                (m := spark_master(dep))["apps"]
                and len(m["apps"]) == len(dep.processors)
                and all(state == "RUNNING" for _, state in m["apps"])
                and m
            ),
            300,
            "an application per driver, running",
            interval_s=2.0,
            ignore=(DeployError,),
        )
        apps = sorted([a[0], "RUNNING"] for a in before["apps"])
        restarts = driver_restarts(dep)
        t0 = crash(dep, "spark-master", "master healthy again after")

        def recovered() -> bool:
            m = spark_master(dep)
            return bool(
                m["status"] == "ALIVE" and m["workers"].count("ALIVE") == 1 and sorted(m["apps"]) == apps
            )

        wait_for(
            recovered,
            300,
            "the master recovered its worker and the application",
            interval_s=2.0,
            ignore=(DeployError,),
        )
        MEASURED["master recovered the application after"] = time.monotonic() - t0
        done = batch_progress(dep)
        wait_for(lambda: done() > 1, 300, "micro-batches completing", interval_s=1.0, ignore=(DeployError,))
        assert driver_restarts(dep) == restarts, "a driver did not survive"

    under_load(dep, "SIGKILL the Spark master, restarted by its policy", fault, tmp_path)


class Reset(Partition):
    """Every TCP packet one container sends to some addresses answered with a reset (iptables
    REJECT --reject-with tcp-reset in its namespace): its open connections to them break at their
    next packet and new ones are refused, a cut the peer's client sees at once (unlike a partition's
    silence)."""

    def __init__(self, pid: int, peers: list[str]) -> None:
        super().__init__(pid, peers)
        self.rules = [("OUTPUT", "-d", ip) for ip in peers]

    def _iptables(self, op: str, chain: str, flag: str, ip: str, check: bool) -> bool:
        argv = ["nsenter", "-t", str(self.pid), "-n", "iptables", "-w", op, chain, flag, ip]
        argv += ["-p", "tcp", "-j", "REJECT", "--reject-with", "tcp-reset"]
        return run(argv, timeout_s=30, check=check).returncode == 0


class Toxiproxy:
    """The suite's toxiproxy (tests_deploy/harness.py) through its HTTP API, reached from the host
    on its compose address: toxics on every broker's proxy, and their removal."""

    def __init__(self, dep: Deployment) -> None:
        self.url = f"http://{compose_ips(dep, TOXIPROXY)[0]}:{TOXIPROXY_API_PORT}"
        self.proxies = list(dep.kafka_nodes)

    def _call(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(
            self.url + path, data=data, method=method, headers={"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(req, timeout=10) as resp:
            raw = resp.read()
        return json.loads(raw) if raw else None

    def add(self, name: str, kind: str, attributes: dict[str, int]) -> None:
        """The toxic on both directions of every broker's proxy."""
        for proxy in self.proxies:
            for stream in ("upstream", "downstream"):
                body = {"name": f"{name}-{stream}", "type": kind, "stream": stream, "attributes": attributes}
                self._call("POST", f"/proxies/{proxy}/toxics", body)

    def clear(self) -> None:
        for proxy in self.proxies:
            for toxic in self._call("GET", f"/proxies/{proxy}/toxics"):
                self._call("DELETE", f"/proxies/{proxy}/toxics/{toxic['name']}")

    def toxics(self) -> int:
        return sum(len(self._call("GET", f"/proxies/{p}/toxics")) for p in self.proxies)


def test_latency_between_spark_and_kafka(deployment: Deployment, tmp_path: Path) -> None:
    """300 ms (jitter 100 ms) added each way to every connection of the Spark application (driver
    and executor) to the brokers, through toxiproxy, for five micro-batches under load; then taken
    away. Every Kafka round trip of a batch (offsets, fetches, the sink's transaction, the markers)
    pays it: batches run slower, alerts come later, nothing is lost or emitted twice."""
    dep = deployment

    def fault() -> None:
        proxy = Toxiproxy(dep)
        restarts = driver_restarts(dep)
        done = batch_progress(dep)
        t0 = time.monotonic()
        try:
            proxy.add("latency", "latency", {"latency": 300, "jitter": 100})
            assert proxy.toxics() == 2 * len(dep.kafka_nodes)
            wait_for(
                lambda: done() >= 5,
                600,
                "five micro-batches completing with the latency",
                interval_s=1.0,
                ignore=(DeployError,),
            )
            MEASURED["five batches with the latency took"] = time.monotonic() - t0
        finally:
            proxy.clear()
        assert proxy.toxics() == 0
        assert driver_restarts(dep) == restarts, "a driver failed under latency"

    under_load(dep, "300 ms latency each way between Spark and Kafka (toxiproxy)", fault, tmp_path)


def test_cut_the_connections_between_spark_and_kafka(deployment: Deployment, tmp_path: Path) -> None:
    """The Spark application's connections to the brokers reset, in the driver (the sink's
    transactions, the markers, offset planning) and in the executor (the Kafka source's reads),
    until no micro-batch has completed for several samples; then the link is back. Kafka's clients
    reconnect and the batch that was cut runs again from its planned offsets, or the driver fails
    and its restart policy starts it on the checkpoint. Nothing lost, nothing emitted twice."""
    dep = deployment

    def fault() -> None:
        # The brokers, and the proxy the application reaches them through in the suite.
        kafka_ips = [ip for k in [*dep.kafka_nodes, TOXIPROXY] for ip in compose_ips(dep, k)]
        active, _standby = the_active_processor(dep)
        restarts = driver_restarts(dep)
        cuts = [Reset(container_pid(dep, svc), kafka_ips) for svc in (active, "spark-worker")]
        t0 = time.monotonic()
        for c in cuts:
            c.cut()
        try:
            still = standing_still(lambda: batches(dep), 5)
            wait_for(
                lambda: driver_restarts(dep) > restarts or still(),
                180,
                "no batch completing while cut (or the driver failed)",
                interval_s=2.0,
                ignore=(DeployError,),
            )
            MEASURED["connections reset for"] = time.monotonic() - t0
        finally:
            for c in cuts:
                c.heal()
        t1 = time.monotonic()
        wait_for(
            lambda: all(dep.states()[p]["health"] == "healthy" for p in dep.processors),
            600,
            "the processors healthy",
            interval_s=2.0,
            ignore=(DeployError,),
        )
        done = batch_progress(dep)
        wait_for(
            lambda: done() > 1,
            600,
            "batches completing again",
            interval_s=1.0,
            ignore=(DeployError,),
        )
        MEASURED["batches completing again after the link was back"] = time.monotonic() - t1
        print(f"\nprocessor restarts during the fault: {driver_restarts(dep) - restarts}")

    under_load(dep, "Spark's connections to Kafka reset (driver and executor), then back", fault, tmp_path)
