"""Gateway throughput: MQTT QoS 1 -> Kafka, side by side with a naive bridge and Mosquitto's ceiling.

Each contender drains the same kind of backlog: N telemetry messages queued by Mosquitto in the
contender's own persistent session (published while it was offline), so the publisher's speed does
not limit anyone. Contenders, each in its own process:

  ceiling  `mosquitto_sub -c -q 1 ... -C N > /dev/null`: Mosquitto's own drain rate, no Kafka
  gateway  `python -m gateway`: validation, Kafka with delivery callbacks, PUBACK after Kafka
  naive    paho callback -> `produce` + `flush` per message, then paho's automatic PUBACK

The gateway's and the naive bridge's rates are measured from their first Kafka confirmation to the
last acknowledgement (the one-off idempotent-producer start-up is excluded). The table shows the
ratios; the section in docs/benchmarks.md is rewritten with `--record`.

    .venv/bin/python -m bench.gateway --messages 200000 --record

(Run as a module from the repository root: as a script its own name would shadow the `gateway`
package.)
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import orjson
import paho.mqtt.client as mqtt
from paho.mqtt.enums import CallbackAPIVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from fleetfence import infra
from fleetfence.kafka import ensure_topics, topic_specs
from gateway.settings import GatewaySettings
from gateway.testing import gateway_env, scrape

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "benchmarks.md"
SECTION = "## Gateway (bench/gateway.py)"
VEHICLES = 50
console = Console()


@dataclass
class Result:
    name: str
    messages: int
    seconds: float
    note: str

    @property
    def rate(self) -> float:
        return self.messages / self.seconds if self.seconds > 0 else 0.0


# --------------------------------------------------------------------------- backlog


def _props(expiry_s: int) -> Properties:
    p = Properties(PacketTypes.CONNECT)  # type: ignore[no-untyped-call]
    p.SessionExpiryInterval = expiry_s
    return p


def create_session(host: str, port: int, client_id: str, group: str) -> None:
    """Subscribe once and go offline: Mosquitto now queues every telemetry message for us."""
    c = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=client_id, protocol=mqtt.MQTTv5)
    done = threading.Event()
    c.on_subscribe = lambda *_a: done.set()
    c.connect(host, port, clean_start=True, properties=_props(3600))
    c.loop_start()
    c.subscribe(f"$share/{group}/fleet/+/telemetry", qos=1)
    if not done.wait(10):
        raise RuntimeError("no SUBACK")
    c.disconnect()
    c.loop_stop()


def drop_session(host: str, port: int, client_id: str) -> None:
    c = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=client_id, protocol=mqtt.MQTTv5)
    c.connect(host, port, clean_start=True, properties=_props(0))
    c.loop_start()
    c.disconnect()
    c.loop_stop()


def publish_backlog(host: str, port: int, n: int, vehicles: int, progress: Progress, label: str) -> None:
    """N valid fixes at QoS 1 through `mosquitto_pub -l` (one process per vehicle topic, C speed).

    mosquitto_pub exits only once Mosquitto acknowledged its messages, so all N are queued.
    """
    task = progress.add_task(f"backlog for {label}", total=n)
    ts_ms = int(time.time() * 1000) - 3_600_000
    per = -(-n // vehicles)
    done = 0
    for k in range(vehicles):
        v = f"veh-{k:04d}"
        count = min(per, n - done)
        if count <= 0:
            break
        lines = b"\n".join(
            orjson.dumps(
                {
                    "vehicle_id": v,
                    "seq": s,
                    "ts": ts_ms + s * 1000,
                    "lat": 52.5 + (s % 100) * 1e-4,
                    "lon": 13.4,
                    "speed_kmh": 40.0 + s % 30,
                    "heading_deg": 90.0,
                }
            )
            for s in range(count)
        )
        subprocess.run(
            ["mosquitto_pub", "-h", host, "-p", str(port), "-q", "1", "-t", f"fleet/{v}/telemetry", "-l"],
            input=lines + b"\n",
            check=True,
            timeout=300,
        )
        done += count
        progress.update(task, completed=done)


# --------------------------------------------------------------------------- contenders


def run_ceiling(host: str, port: int, n: int, progress: Progress) -> Result:
    client_id, group = "bench-ceiling", "bceil"
    create_session(host, port, client_id, group)
    publish_backlog(host, port, n, VEHICLES, progress, "mosquitto_sub")
    task = progress.add_task("ceiling: mosquitto_sub draining", total=None)
    t0 = time.perf_counter()
    subprocess.run(
        [
            "mosquitto_sub",
            "-h",
            host,
            "-p",
            str(port),
            "-V",
            "mqttv5",
            "-i",
            client_id,
            "-c",
            "-x",
            "3600",
            "-q",
            "1",
            "-t",
            f"$share/{group}/fleet/+/telemetry",
            "-C",
            str(n),
        ],
        stdout=subprocess.DEVNULL,
        check=True,
        timeout=600,
    )
    dt = time.perf_counter() - t0
    progress.update(task, total=1, completed=1)
    drop_session(host, port, client_id)
    return Result("ceiling: mosquitto_sub > /dev/null", n, dt, "no Kafka, no parsing")


def _drain_metrics(port: int, n: int, progress: Progress, label: str, proc: subprocess.Popen[bytes]) -> float:
    """Seconds from the first acknowledgement to the n-th, from the gateway's /metrics."""
    task = progress.add_task(label, total=n)
    t0 = None
    base = 0.0
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"{label} exited with {proc.returncode}")
        m = scrape(port)
        acked = m.get("fleetfence_gateway_acked_total", 0.0)
        if t0 is None and acked > 0:
            t0, base = time.perf_counter(), acked
        progress.update(task, completed=acked)
        if acked >= n:
            assert t0 is not None
            return (time.perf_counter() - t0) * n / max(n - base, 1)
        time.sleep(0.02)


def run_gateway(settings: GatewaySettings, n: int, progress: Progress, *, in_order: bool) -> Result:
    tag = "in" if in_order else "ooo"
    gs = settings.model_copy(
        update={
            "gateway_client_id": f"bench-gw-{tag}",
            "gateway_share_group": f"bgw{tag}",
            "gateway_ack_in_order": in_order,
        }
    )
    host, port = gs.mqtt_host_port
    create_session(host, port, gs.gateway_client_id, gs.gateway_share_group)
    publish_backlog(host, port, n, VEHICLES, progress, f"gateway ({tag})")
    mport = infra.free_port()
    env = gateway_env(gs, metrics_port=mport)
    env["FLEETFENCE_GATEWAY_ACK_IN_ORDER"] = str(in_order).lower()
    env["FLEETFENCE_LOG_LEVEL"] = "WARNING"
    proc = subprocess.Popen([sys.executable, "-m", "gateway"], env=env, stdin=subprocess.DEVNULL)
    try:
        dt = _drain_metrics(mport, n, progress, f"gateway ({tag}) draining", proc)
    finally:
        proc.terminate()
        proc.wait(60)
    drop_session(host, port, gs.gateway_client_id)
    order = "PUBACK in receive order" if in_order else "PUBACK in Kafka-confirmation order"
    return Result(f"gateway ({order})", n, dt, "validate + Kafka (acks=all, idempotent) + PUBACK after Kafka")


def naive_worker(host: str, port: int, bootstrap: str, topic: str, n: int) -> None:
    """The bridge a user would write first: callback -> produce -> flush, auto PUBACK."""
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "acks": "all"})
    c = mqtt.Client(CallbackAPIVersion.VERSION2, client_id="bench-naive", protocol=mqtt.MQTTv5)
    seen = [0]
    t0 = [0.0]

    def on_message(client: mqtt.Client, _u: object, msg: mqtt.MQTTMessage) -> None:
        d = json.loads(msg.payload)
        producer.produce(topic, msg.payload, d["vehicle_id"].encode())
        producer.flush()
        seen[0] += 1
        if seen[0] == 1:
            t0[0] = time.perf_counter()
        if seen[0] >= n:
            client.disconnect()

    c.on_message = on_message
    c.connect(host, port, clean_start=False, properties=_props(3600))
    c.subscribe("$share/bnaive/fleet/+/telemetry", qos=1)
    c.loop_forever()
    print(json.dumps({"seconds": (time.perf_counter() - t0[0]) * n / max(n - 1, 1)}))


def run_naive(settings: GatewaySettings, n: int, progress: Progress) -> Result:
    host, port = settings.mqtt_host_port
    create_session(host, port, "bench-naive", "bnaive")
    publish_backlog(host, port, n, VEHICLES, progress, "naive bridge")
    task = progress.add_task("naive bridge draining", total=None)
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "bench.gateway",
            "--naive-worker",
            host,
            str(port),
            settings.bootstrap_servers,
            settings.topics.telemetry,
            str(n),
        ],
        capture_output=True,
        check=True,
        timeout=900,
        cwd=ROOT,
    )
    progress.update(task, total=1, completed=1)
    drop_session(host, port, "bench-naive")
    dt = float(json.loads(out.stdout.decode().strip().splitlines()[-1])["seconds"])
    return Result("naive: paho callback -> produce + flush", n, dt, "same Kafka, one flush per message")


# --------------------------------------------------------------------------- report


def report(results: list[Result], cmd: str, record: bool) -> None:
    ceiling = next(r for r in results if r.name.startswith("ceiling"))
    naive = next(r for r in results if r.name.startswith("naive"))
    table = Table(title=f"MQTT QoS 1 -> Kafka drain rate ({os.cpu_count()} cores, everything on this box)")
    for col in ("contender", "messages", "seconds", "msg/s", "x ceiling", "x naive", "what it does"):
        table.add_column(col, justify="right" if col not in ("contender", "what it does") else "left")
    rows = []
    for r in results:
        row = [
            r.name,
            f"{r.messages:,}",
            f"{r.seconds:.2f}",
            f"{r.rate:,.0f}",
            f"{r.rate / ceiling.rate:.2f}",
            f"{r.rate / naive.rate:.1f}",
            r.note,
        ]
        rows.append(row)
        table.add_row(*row)
    console.print(table)
    best = max((r for r in results if r.name.startswith("gateway")), key=lambda r: r.rate)
    verdict = (
        f"target >= 50,000 msg/s: {'met' if best.rate >= 50_000 else 'NOT met'} ({best.rate:,.0f}); "
        f"target >= 0.7 x ceiling: {'met' if best.rate >= 0.7 * ceiling.rate else 'NOT met'} "
        f"({best.rate / ceiling.rate:.2f})"
    )
    console.print(verdict)
    console.print(f"reproduce: {cmd}")
    if not record:
        return
    lines = [
        SECTION,
        "",
        f"`{cmd}` ({os.cpu_count()} cores shared by Mosquitto, the noida-db broker and the "
        "contender; the backlog is published before each drain"
        "). Each contender drains a backlog queued in its own persistent MQTT session; rates "
        "for the gateway and the naive bridge run from their first Kafka confirmation to the last PUBACK.",
        "",
        "| contender | messages | seconds | msg/s | × ceiling | × naive | what it does |",
        "|---|---|---|---|---|---|---|",
        *[f"| {' | '.join(r)} |" for r in rows],
        "",
        verdict + f". Load average at the end of the run: {os.getloadavg()[0]:.1f} (a shared box: "
        "compare ratios from one run, not absolute rates across runs).",
        "",
    ]
    text = DOC.read_text() if DOC.exists() else "# Benchmarks\n"
    pattern = re.compile(rf"^{re.escape(SECTION)}\n.*?(?=^## |\Z)", re.S | re.M)
    new = "\n".join(lines)
    text = pattern.sub(new, text) if pattern.search(text) else text.rstrip("\n") + "\n\n" + new
    DOC.write_text(text)
    console.print(f"recorded in {DOC.relative_to(ROOT)}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--messages", type=int, default=200_000)
    ap.add_argument("--naive-messages", type=int, default=3_000, help="the naive bridge is slow")
    ap.add_argument("--record", action="store_true", help="write the results to docs/benchmarks.md")
    ap.add_argument("--naive-worker", nargs=5, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.naive_worker:
        host, port, bootstrap, topic, n = a.naive_worker
        naive_worker(host, int(port), bootstrap, topic, int(n))
        return
    cmd = f".venv/bin/python -m bench.gateway --messages {a.messages} --naive-messages {a.naive_messages}"
    with tempfile.TemporaryDirectory(prefix="ff-bench-gw-") as state:
        s = GatewaySettings(
            state_dir=Path(state),
            kafka_port=infra.free_port(),
            mqtt_port=infra.free_port(),
            redis_port=infra.free_port(),
            kafka_bootstrap=None,
            mqtt_url=None,
            redis_url=None,
            topic_prefix="bench.",
            gateway_metrics_port=0,
            startup_timeout_s=60,
        )
        try:
            with console.status("starting broker, Mosquitto and Redis…"):
                infra.up(s, create_topics=False)
                ensure_topics(s.bootstrap_servers, topic_specs(s))
            results: list[Result] = []
            with Progress(
                TextColumn("{task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                TimeElapsedColumn(),
                console=console,
            ) as progress:
                results.append(run_ceiling(*s.mqtt_host_port, a.messages, progress))
                results.append(run_gateway(s, a.messages, progress, in_order=True))
                results.append(run_gateway(s, a.messages, progress, in_order=False))
                results.append(run_naive(s, a.naive_messages, progress))
        finally:
            infra.down(s)
    report(results, cmd + (" --record" if a.record else ""), a.record)


if __name__ == "__main__":
    main()
