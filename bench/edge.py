"""The device edge's protocols side by side: FleetFence's MQTT, Teltonika (Codec 8 Extended over
TCP) and OsmAnd (Traccar Client's HTTP), each fix acknowledged only once Kafka has it.

One edge process (`python -m gateway` with its MQTT, Teltonika and HTTP listeners) on an embedded
Kafka broker; this process drives it with asyncio clients that speak each protocol byte for byte
(no client library in the way), one protocol at a time, in alternating rounds:

  saturate  many connections, each as busy as its protocol lets it be: MQTT with a window of QoS 1
            messages in flight, a Teltonika unit one packet of `--records` records at a time (it
            waits for the record count before the next), a phone one request at a time (HTTP/1.1
            without pipelining, as Traccar Client sends). Fixes acknowledged per second, and the
            edge's own CPU per fix (utime + stime from /proc, its share of the 2 cores): the cost
            that decides how many fixes one process takes on one core.
  paced     each of `--rates` fixes/s spread over the connections, each send at its scheduled time; the
            acknowledgement's latency counted from that time (a late send is not forgiven), p50
            and p99.

The figures are the medians over `--rounds`. Logins are off (FLEETFENCE_MQTT_AUTH=false: a tracker's
id names its vehicle), so the cost is the protocol's and Kafka's, not the credential store's.

    .venv/bin/python -m bench.edge --record
"""

from __future__ import annotations

import argparse
import asyncio
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections import deque
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from rich.console import Console
from rich.table import Table

from bench.common import BENCH_LOG, settle_load, write_section
from embedded import infra
from fleetfence.probes import free_port
from fleetfence.settings import Settings
from fleetfence.testing import wait_for
from gateway import mqtt_wire as w
from gateway.protocols import teltonika as t
from gateway.settings import GatewaySettings
from gateway.testing import gateway_env, scrape

HEADER = "## The device edge's protocols side by side"
DOC = BENCH_LOG / "edge.md"
PROTOCOLS = ("mqtt", "teltonika", "osmand")
T0_MS = int(time.time() * 1000) - 3_600_000  # an hour ago: inside the contract's time bounds


@dataclass
class Phase:
    fixes: int = 0
    seconds: float = 0.0
    edge_cpu_s: float = 0.0
    latencies_s: list[float] = field(default_factory=list)

    @property
    def rate(self) -> float:
        return self.fixes / self.seconds if self.seconds else 0.0

    @property
    def cpu_us_per_fix(self) -> float:
        return self.edge_cpu_s / self.fixes * 1e6 if self.fixes else float("nan")

    def pct(self, q: float) -> float:
        xs = sorted(self.latencies_s)
        return xs[min(len(xs) - 1, int(q * len(xs)))] * 1000 if xs else float("nan")


def cpu_s(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


# --------------------------------------------------------------------------- one client per protocol


class Client:
    """A device's connection: `send` one acknowledgement's worth of fixes, `acked` waits for it."""

    fixes_per_ack = 1

    def __init__(self, n: int) -> None:
        self.n = n
        self.i = 0
        self.reader: asyncio.StreamReader
        self.writer: asyncio.StreamWriter

    async def open(self, port: int) -> None:
        self.reader, self.writer = await asyncio.open_connection("127.0.0.1", port)

    def send(self) -> None:
        raise NotImplementedError

    async def acked(self) -> None:
        raise NotImplementedError

    def close(self) -> None:
        self.writer.close()


class MqttClient(Client):
    """MQTT 3.1.1, QoS 1 to `fleet/<vehicle>/telemetry`; PUBACKs read in order."""

    async def open(self, port: int) -> None:
        await super().open(port)
        cid = f"bench-m{self.n}".encode()
        body = b"\x00\x04MQTT\x04\x02\x00\x3c" + len(cid).to_bytes(2, "big") + cid
        self.writer.write(w.frame(w.CONNECT << 4, body))
        head = await self.reader.readexactly(4)
        assert head[0] == 0x20, f"not a CONNACK: {head!r}"
        assert head[3] == 0, f"CONNACK refused: {head!r}"
        self.topic = f"fleet/bm{self.n}/telemetry".encode()

    def send(self) -> None:
        self.i += 1
        ts = T0_MS + self.i
        payload = b'{"vehicle_id":"bm%d","seq":%d,"ts":%d,"lat":60.17,"lon":24.94,"speed_kmh":42.0}' % (
            self.n,
            self.i,
            ts,
        )
        pid = (self.i % 65535) + 1
        body = len(self.topic).to_bytes(2, "big") + self.topic + pid.to_bytes(2, "big") + payload
        self.writer.write(w.frame((w.PUBLISH << 4) | 0x02, body))

    async def acked(self) -> None:
        ack = await self.reader.readexactly(4)
        assert ack[0] == 0x40, f"not a PUBACK: {ack!r}"


class TeltonikaClient(Client):
    """A unit: IMEI handshake, then Codec 8 Extended packets of `records` records each."""

    def __init__(self, n: int, records: int) -> None:
        super().__init__(n)
        self.records = records
        self.fixes_per_ack = records

    async def open(self, port: int) -> None:
        await super().open(port)
        self.writer.write(t.encode_imei(f"35{self.n:013d}"))
        assert await self.reader.readexactly(1) == b"\x01"

    def send(self) -> None:
        recs = []
        for _ in range(self.records):
            self.i += 1
            recs.append(
                t.AvlRecord(
                    timestamp_ms=T0_MS + self.i,
                    priority=0,
                    lon=24.94,
                    lat=60.17,
                    altitude_m=10,
                    angle_deg=90,
                    satellites=9,
                    speed_kmh=42,
                    event_io_id=0,
                    io={239: 1},
                )
            )
        self.writer.write(t.encode_avl_packet(recs, codec=t.CODEC_8E))

    async def acked(self) -> None:
        assert await self.reader.readexactly(4) == t.encode_ack(self.records)


class OsmAndClient(Client):
    """Traccar Client's GET, keep-alive, one request at a time."""

    def send(self) -> None:
        self.i += 1
        ts = T0_MS // 1000 + self.i  # epoch seconds, as Traccar Client sends
        self.writer.write(
            b"GET /?id=bo%d&lat=60.17&lon=24.94&timestamp=%d&speed=22.7&bearing=90&accuracy=5"
            b" HTTP/1.1\r\nHost: edge\r\n\r\n" % (self.n, ts)
        )

    async def acked(self) -> None:
        head = await self.reader.readuntil(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200 "), head
        length = int(head.lower().split(b"content-length: ", 1)[1].split(b"\r\n", 1)[0])
        if length:
            await self.reader.readexactly(length)


# --------------------------------------------------------------------------- phases


async def saturate(clients: list[Client], window: int, seconds: float, pid: int) -> Phase:
    """Every client as busy as its protocol allows for `seconds`; fixes acknowledged per second."""
    ph = Phase()
    stop = time.monotonic() + seconds

    async def run(c: Client) -> None:
        outstanding = 0
        while time.monotonic() < stop or outstanding:
            while outstanding < window and time.monotonic() < stop:
                c.send()
                outstanding += 1
            await c.writer.drain()
            await c.acked()
            outstanding -= 1
            ph.fixes += c.fixes_per_ack

    cpu0, t0 = cpu_s(pid), time.monotonic()
    await asyncio.gather(*(run(c) for c in clients))
    ph.seconds, ph.edge_cpu_s = time.monotonic() - t0, cpu_s(pid) - cpu0
    return ph


async def paced(clients: list[Client], rate: float, seconds: float, window: int, pid: int) -> Phase:
    """`rate` fixes/s over the clients; latency from each send's scheduled time to its ack. A
    client with `window` sends in flight waits for an ack before the next send (a Teltonika unit
    and a phone always do: `window` 1), and the wait counts in the latency of the late send."""
    ph = Phase()
    period = len(clients) * clients[0].fixes_per_ack / rate  # seconds between one client's sends
    start = time.monotonic() + 0.1

    async def run(k: int, c: Client) -> None:
        first = start + period * k / len(clients)  # the clients' phases spread over a period
        dues = [first + period * j for j in range(max(0, math.ceil((start + seconds - first) / period)))]
        sent: deque[float] = deque()
        room = asyncio.Semaphore(window)

        async def sender() -> None:
            for due in dues:
                await room.acquire()
                delay = due - time.monotonic()
                if delay > 0:
                    await asyncio.sleep(delay)
                c.send()
                sent.append(due)
                await c.writer.drain()

        async def reader() -> None:
            for _ in dues:
                await c.acked()
                ph.latencies_s.append(time.monotonic() - sent.popleft())
                ph.fixes += c.fixes_per_ack
                room.release()

        await asyncio.gather(sender(), reader())

    cpu0 = cpu_s(pid)
    await asyncio.gather(*(run(k, c) for k, c in enumerate(clients)))
    ph.seconds, ph.edge_cpu_s = seconds, cpu_s(pid) - cpu0
    return ph


def make_clients(protocol: str, n: int, records: int, base: int) -> list[Client]:
    if protocol == "mqtt":
        return [MqttClient(base + i) for i in range(n)]
    if protocol == "teltonika":
        return [TeltonikaClient(base + i, records) for i in range(n)]
    return [OsmAndClient(base + i) for i in range(n)]


async def one_round(
    protocol: str, ports: dict[str, int], a: argparse.Namespace, pid: int, base: int
) -> tuple[Phase, list[Phase]]:
    conns = a.mqtt_connections if protocol == "mqtt" else a.connections
    window = a.mqtt_window if protocol == "mqtt" else 1
    clients = make_clients(protocol, conns, a.records, base)
    await asyncio.gather(*(c.open(ports[protocol]) for c in clients))
    try:
        sat = await saturate(clients, window, a.seconds, pid)
        paces = [await paced(clients, rate, a.seconds, window, pid) for rate in a.rates]
    finally:
        for c in clients:
            c.close()
    return sat, paces


# --------------------------------------------------------------------------- the run


def start_edge(s: Settings, tmp: Path) -> tuple[subprocess.Popen[bytes], dict[str, int], int]:
    ports = {"mqtt": free_port(), "teltonika": free_port(), "osmand": free_port()}
    metrics = free_port()
    gs = GatewaySettings(**s.model_dump(exclude={"topics"}))
    env = gateway_env(gs, metrics_port=metrics)
    env.update(
        {
            "FLEETFENCE_MQTT_AUTH": "false",
            "FLEETFENCE_GATEWAY_EDGE_PORT": str(ports["mqtt"]),
            "FLEETFENCE_GATEWAY_TELTONIKA_PORT": str(ports["teltonika"]),
            "FLEETFENCE_GATEWAY_HTTP_PORT": str(ports["osmand"]),
            "FLEETFENCE_GATEWAY_CLIENT_ID": "bench-edge",
            "FLEETFENCE_LOG_LEVEL": "WARNING",
        }
    )
    log = (tmp / "edge.log").open("wb")
    proc = subprocess.Popen([sys.executable, "-m", "gateway"], env=env, stdout=log, stderr=subprocess.STDOUT)
    wait_for(lambda: scrape(metrics).get("fleetfence_gateway_mqtt_connected") == 1.0, 60, "the edge up")
    return proc, ports, metrics


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=15.0, help="of each phase")
    ap.add_argument("--connections", type=int, default=200, help="Teltonika units, phones")
    ap.add_argument("--mqtt-connections", type=int, default=20)
    ap.add_argument("--mqtt-window", type=int, default=100, help="QoS 1 messages in flight each")
    ap.add_argument("--records", type=int, default=10, help="records per Teltonika packet")
    ap.add_argument(
        "--rates",
        type=lambda x: [float(r) for r in x.split(",")],
        default=[2000.0, 10000.0],
        help="fixes/s of the paced phases, comma-separated",
    )
    ap.add_argument("--settle-load", type=float, default=1.0, help="wait for the load average below")
    ap.add_argument(
        "--record", action="store_true", help=f"rewrite {DOC.relative_to(BENCH_LOG.parent.parent)}"
    )
    a = ap.parse_args()
    console = Console()
    load = settle_load(a.settle_load)
    results: dict[str, list[tuple[Phase, list[Phase]]]] = {p: [] for p in PROTOCOLS}
    with tempfile.TemporaryDirectory(prefix="ff-bench-edge-") as d:
        tmp = Path(d)
        s = Settings(**infra.private_fields(tmp), mqtt_auth=False, startup_timeout_s=90)
        infra.up(s, only=("kafka", "redis"))
        proc = None
        try:
            proc, ports, _ = start_edge(s, tmp)
            base = 0
            for r in range(a.rounds):
                for protocol in PROTOCOLS if r % 2 == 0 else reversed(PROTOCOLS):
                    base += 10_000  # each round's devices are new ones: no sequence seen before
                    sat, paces = asyncio.run(one_round(protocol, ports, a, proc.pid, base))
                    results[protocol].append((sat, paces))
                    at = "; ".join(
                        f"at {q.rate:,.0f}/s p50 {q.pct(0.5):.1f} ms p99 {q.pct(0.99):.1f} ms" for q in paces
                    )
                    console.print(
                        f"round {r + 1} {protocol}: {sat.rate:,.0f} fixes/s, {sat.cpu_us_per_fix:.1f} µs "
                        f"edge CPU/fix; {at}"
                    )
        except BaseException:
            log = tmp / "edge.log"
            if log.exists():
                console.print(f"the edge's log, last lines:\n{log.read_text()[-4000:]}")
            raise
        finally:
            if proc is not None:
                proc.terminate()
                proc.wait(60)
            infra.down(s)
    report(results, a, load, console)


def report(
    results: dict[str, list[tuple[Phase, list[Phase]]]], a: argparse.Namespace, load: float, console: Console
) -> None:
    med = statistics.median
    rows = []
    mqtt_cpu = med(s.cpu_us_per_fix for s, _ in results["mqtt"])
    for p in PROTOCOLS:
        sats = [s for s, _ in results[p]]
        cpu = med(s.cpu_us_per_fix for s in sats)
        row = [
            p,
            f"{med(s.rate for s in sats):,.0f}",
            f"{cpu:.1f}",
            f"{1e6 / cpu:,.0f}",
            f"{cpu / mqtt_cpu:.2f}x",
        ]
        for i in range(len(a.rates)):
            paces = [q[i] for _, q in results[p]]
            row += [f"{med(q.pct(0.5) for q in paces):.1f}", f"{med(q.pct(0.99) for q in paces):.1f}"]
        rows.append(row)
    cols = [
        "protocol",
        "fixes/s acknowledged (saturated)",
        "edge CPU µs/fix",
        "fixes/s per edge core",
        "CPU vs MQTT",
    ]
    for rate in a.rates:
        cols += [f"ack p50 ms at {rate:,.0f}/s", f"ack p99 ms at {rate:,.0f}/s"]
    table = Table(title="the device edge, one process")
    for c in cols:
        table.add_column(c, justify="right")
    for row in rows:
        table.add_row(*row)
    console.print(table)
    if not a.record:
        return
    cmd = (
        f".venv/bin/python -m bench.edge --rounds {a.rounds} --seconds {a.seconds:g} --connections "
        f"{a.connections} --records {a.records} --rates {','.join(f'{r:g}' for r in a.rates)} --record"
    )
    when = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    lines = [
        HEADER,
        "",
        f"`{cmd}` ({when}; this 2-core machine, load average {load} at the start, nothing else",
        "running; one edge process and the clients in this process share the 2 cores). Medians of",
        f"{a.rounds} alternating rounds. Saturated: {a.connections} Teltonika units ({a.records} records",
        f"a packet, one packet at a time) or phones (one request at a time), {a.mqtt_connections} MQTT",
        f"connections with {a.mqtt_window} QoS 1 messages in flight each. Paced: each rate over the",
        "same connections, latency from each send's scheduled time. Every acknowledgement means Kafka",
        "(one embedded broker, acks=all) has the fixes it covers. The clients are Python too: at a rate",
        "where they and the edge together want more than the 2 cores, the latency is the machine's.",
        "",
        "| " + " | ".join(cols) + " |",
        "|---|" + "---:|" * (len(cols) - 1),
        *("| " + " | ".join(r) + " |" for r in rows),
    ]
    write_section(HEADER, lines, DOC)
    console.print(f"recorded in {DOC}")


if __name__ == "__main__":
    main()
