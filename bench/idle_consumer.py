"""What a consumer waiting at the end of its topic costs, on the embedded broker.

    .venv/bin/python -m bench.idle_consumer [--seconds 5] [--record]

noida-db 0.2.3 answers an empty fetch at once instead of holding it for `fetch.wait.max.ms`, and
librdkafka sends the next fetch as soon as the answer is in: an idle consumer and the broker play
ping-pong. Every long-lived consumer that waits for data (above all the alert receivers) pays it.
This measures broker and client CPU, side by side in one run, for a plain confluent-kafka consumer
and for the alert receiver loop without and with its idle back-off (`FLEETFENCE_ALERTS_IDLE_BACKOFF_MS`),
then checks that the receiver with the back-off still delivers an alert produced while it idles.
"""

from __future__ import annotations

import argparse
import io
import resource
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import orjson
from confluent_kafka import Consumer, Producer, TopicPartition
from prometheus_client import CollectorRegistry
from rich.console import Console
from rich.table import Table

from alerts.metrics import ReceiverMetrics
from alerts.model import AlertFilter
from alerts.runner import MemoryDedup, ReceiverRunner, RunnerOptions
from alerts.tail import TailSink
from bench.common import write_section
from bench.cpu import broker_pid, pid_cpu_s
from fleetfence import infra
from fleetfence.contracts import alert_id, ms_to_iso
from fleetfence.kafka import ensure_topics, producer_config, topic_specs
from fleetfence.settings import Settings

console = Console()


def _self_cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def measure(broker: int, seconds: float) -> tuple[float, float]:
    """Broker and client (this process) CPU in cores over `seconds` of idling."""
    b0, c0 = pid_cpu_s(broker), _self_cpu_s()
    time.sleep(seconds)  # the idle period being measured, not synchronisation
    return (pid_cpu_s(broker) - b0) / seconds, (_self_cpu_s() - c0) / seconds


def alert_json(seq: int) -> tuple[str, bytes]:
    """An alert as the processor writes it (docs/contracts.md), and its id."""
    ts_ms = 1_795_000_000_000 + seq * 1000
    aid = alert_id("v-idle", "ROUTE_DEVIATION", seq, "")
    body = {
        "alert_id": aid,
        "type": "ROUTE_DEVIATION",
        "vehicle_id": "v-idle",
        "route_id": "r1",
        "route_version": 1,
        "seq": seq,
        "ts_ms": ts_ms,
        "ts": ms_to_iso(ts_ms),
        "lat": 52.5,
        "lon": 13.4,
        "details": {"distance_m": 150.0},
    }
    return aid, orjson.dumps(body)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=5.0, help="idle time measured per contender")
    ap.add_argument("--backoff-ms", type=int, default=100)
    ap.add_argument("--record", action="store_true", help="write the section of docs/benchmarks.md")
    args = ap.parse_args()

    s = Settings(
        **infra.private_fields(Path(tempfile.mkdtemp(prefix="ff-bench-idle-"))),
    )
    infra.up(s, create_topics=False)
    rows: list[tuple[str, float, float]] = []
    try:
        ensure_topics(s.bootstrap_servers, topic_specs(s))
        broker = broker_pid(s.kafka_port)
        if broker is None:
            raise SystemExit("cannot find the broker process")
        rows.append(("nothing connected", *measure(broker, args.seconds)))

        c = Consumer({"bootstrap.servers": s.bootstrap_servers, "group.id": "bench-idle-plain"})
        c.assign([TopicPartition(s.topics.alerts, p, 0) for p in range(s.alerts_partitions)])
        c.consume(1, 1.0)
        rows.append(("plain consumer at the end (fetch.wait.max.ms 500)", *measure(broker, args.seconds)))
        c.close()

        delivered = ""
        for backoff in (0, args.backoff_ms):
            out = io.StringIO()
            runner = ReceiverRunner(
                "bench",
                TailSink(True, None, out),
                alert_filter=AlertFilter(),
                options=RunnerOptions(
                    bootstrap=s.bootstrap_servers,
                    topic=s.topics.alerts,
                    group_id=f"bench-idle-{backoff}",
                    commit=False,
                    idle_backoff_ms=backoff,
                ),
                dedup=MemoryDedup(),
                metrics=ReceiverMetrics(f"bench{backoff}", CollectorRegistry()),
                dead_letters=None,
            ).start()
            if not runner.wait_assigned(30):
                raise SystemExit("receiver got no partitions")
            rows.append((f"alert receiver, idle back-off {backoff} ms", *measure(broker, args.seconds)))
            if backoff:
                aid, value = alert_json(1)
                p = Producer(producer_config(s.bootstrap_servers))
                p.produce(s.topics.alerts, key=b"v-idle", value=value)
                p.flush(10)
                deadline = time.monotonic() + 10
                while aid not in out.getvalue() and time.monotonic() < deadline:
                    time.sleep(0.01)
                delivered = "yes" if aid in out.getvalue() else "NO"
            runner.stop()
    finally:
        infra.down(s)

    table = Table(title=f"one consumer idling at the end of {s.topics.alerts} ({args.seconds:g} s each)")
    for col in ("contender", "broker cores", "client cores"):
        table.add_column(col)
    for name, b, c in rows:
        table.add_row(name, f"{b:.2f}", f"{c:.2f}")
    console.print(table)
    console.print(f"alert produced while the receiver with back-off idled was delivered: {delivered}")
    if delivered != "yes":
        raise SystemExit("the receiver with back-off missed an alert")
    if args.record:
        record(args, rows, delivered)


def record(args: argparse.Namespace, rows: list[tuple[str, float, float]], delivered: str) -> None:
    head = "## Idle consumers on the embedded broker (bench/idle_consumer.py)"
    body: list[str] = [
        head,
        "",
        f"`.venv/bin/python -m bench.idle_consumer --seconds {args.seconds:g} --record` "
        f"({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}): CPU of the noida-db broker and of the "
        "client process while one consumer waits at the end of `fleet.alerts` with nothing to read.",
        "",
        "| contender | broker cores | client cores |",
        "|---|---|---|",
        *[f"| {n} | {b:.2f} | {c:.2f} |" for n, b, c in rows],
        "",
        "noida-db 0.2.3 answers an empty fetch at once instead of holding it for `fetch.wait.max.ms`, so "
        "librdkafka fetches again at once; `fetch.wait.max.ms` and `fetch.min.bytes` change nothing "
        "(measured). The receivers therefore pause fetching for `FLEETFENCE_ALERTS_IDLE_BACKOFF_MS` after an "
        f"empty poll; an alert produced while one idled was delivered: {delivered}. Apache Kafka holds "
        "empty fetches, so there the back-off only delays the first alert after a quiet spell by at most "
        "that long.",
        "",
    ]
    write_section(head, body)


if __name__ == "__main__":
    main()
