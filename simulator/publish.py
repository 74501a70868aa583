"""Publishing a scenario: MQTT QoS 1 through the gateway, or canonical records straight to Kafka.

`run_simulation` is the public entry point (the CLI and `fleetfence demo` call it): build the
scenario, optionally register it, publish tick by tick (paced in real time, or as fast as the
transport acknowledges), stream the ground truth to a file and return a report.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Protocol

import orjson
import paho.mqtt.client as mqtt
from confluent_kafka import KafkaError, Message
from paho.mqtt.enums import CallbackAPIVersion
from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.table import Table

from fleetfence.contracts import telemetry_topic
from fleetfence.errors import InfraError, KafkaDeliveryError
from fleetfence.kafka import idempotent_producer
from fleetfence.mqtt import Account, login
from simulator.config import ScenarioConfig
from simulator.fleet_sink import FleetMqttSink, PubackCounter, telemetry_payload, tick_rows
from simulator.register import (
    RegistrationReport,
    issue_credentials_api,
    issue_credentials_direct,
    moved_schedules,
    register_api,
    register_direct,
    scenario_entities,
)
from simulator.scenario import Scenario, ScenarioStats, TickBatch
from simulator.settings import SimulatorSettings
from simulator.truth import RunHeader, TruthAlert, TruthWriter
from vehicle_master.models import EntityData

logger = logging.getLogger(__name__)


class Sink(Protocol):
    sent: int
    errors: int

    @property
    def acked(self) -> int: ...

    def send(self, batch: TickBatch, vids: list[str]) -> None: ...

    def flush(self, timeout_s: float) -> int: ...

    def close(self) -> None: ...


class MqttSink(PubackCounter):
    """QoS 1 publisher to `fleet/{vehicle_id}/telemetry`; counts PUBACKs, bounds what is unacked."""

    def __init__(
        self, host: str, port: int, *, inflight: int, accuracy_m: float, account: Account | None = None
    ) -> None:
        self.client = mqtt.Client(
            CallbackAPIVersion.VERSION2,
            client_id=f"fleetfence-sim-{uuid.uuid4().hex[:8]}",
            protocol=mqtt.MQTTv5,
        )
        login(self.client, account)
        self.client.max_inflight_messages_set(inflight)
        self.client.max_queued_messages_set(0)
        self.client.on_publish = self._on_publish
        self.client.on_connect = self._on_connect
        super().__init__(inflight)
        self.accuracy_m = accuracy_m
        self._connected = threading.Event()
        try:
            self.client.connect(host, port, keepalive=30)
        except OSError as exc:
            raise InfraError(f"MQTT broker {host}:{port} unreachable: {exc}") from exc
        self.client.loop_start()
        if not self._connected.wait(10):
            self.close()
            raise InfraError(f"MQTT broker {host}:{port} did not accept the connection")

    def _on_connect(self, *_a: Any) -> None:
        self._connected.set()

    def _on_publish(self, _client: Any, _userdata: Any, mid: int, *_a: Any) -> None:
        if self.clock.tracking:
            self.clock.acked(mid)
        self._count_ack()

    def send(self, batch: TickBatch, vids: list[str]) -> None:
        acc = self.accuracy_m
        for vid, seq, ts, lat, lon, sp, hd in tick_rows(batch, vids):
            payload = telemetry_payload(vid, seq, ts, lat, lon, sp, hd, acc)
            t = time.monotonic()
            info = self.client.publish(telemetry_topic(vid), payload, qos=1)
            if self.clock.tracking and info.mid:  # paho queues (and later acks) even without a connection
                self.clock.published(info.mid, t)
            if info.rc != mqtt.MQTT_ERR_SUCCESS:
                self.errors += 1
                continue
            self.sent += 1
            if self._too_many_pending():
                self._wait_for_room()

    def close(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()


class KafkaSink:
    """Canonical `fleet.telemetry` records keyed by vehicle id, idempotent batched producer."""

    def __init__(self, bootstrap: str, topic: str, *, accuracy_m: float) -> None:
        self.topic = topic
        self.accuracy_m = accuracy_m
        self.producer = idempotent_producer(bootstrap, **{"linger.ms": 20, "on_delivery": self._on_delivery})
        self.sent = 0
        self.errors = 0
        self._acked = 0
        self.last_error: str | None = None

    def _on_delivery(self, err: KafkaError | None, _msg: Message) -> None:
        if err is None:
            self._acked += 1
        else:
            self.errors += 1
            self.last_error = str(err)

    @property
    def acked(self) -> int:
        return self._acked

    def send(self, batch: TickBatch, vids: list[str]) -> None:
        acc = self.accuracy_m
        now_ms = int(time.time() * 1000)
        produce, poll, topic = self.producer.produce, self.producer.poll, self.topic
        for vid, seq, ts, lat, lon, sp, hd in tick_rows(batch, vids):
            value = orjson.dumps(
                {
                    "vehicle_id": vid,
                    "seq": seq,
                    "ts_ms": ts,
                    "lat": lat,
                    "lon": lon,
                    "speed_kmh": sp,
                    "heading_deg": hd,
                    "accuracy_m": acc,
                    "received_ms": now_ms,
                }
            )
            while True:
                try:
                    produce(topic, value, vid.encode())
                    break
                except BufferError:  # local queue full: let deliveries drain
                    poll(0.05)
            self.sent += 1
        poll(0)

    def flush(self, timeout_s: float) -> int:
        return int(self.producer.flush(timeout_s))

    def close(self) -> None:
        self.producer.flush(10)


@dataclass
class SimulationOptions:
    direct: bool = False
    realtime: bool = False
    truth_path: Path = Path("sim-truth.jsonl")
    register: bool = True
    api_url: str | None = None
    api_key: str | None = None
    run_relay: bool = True
    show_progress: bool = True
    flush_timeout_s: float = 60.0
    # Real time with event times "now": the first fix's time is taken when publishing starts
    # (after registration), so event time and wall clock agree.
    start_now: bool = False
    # Called with the sink once it is connected, before the first fix: a load test samples its
    # counters (sent, acked) and PUBACK latencies while the run goes on.
    sink_observer: Callable[[Sink], None] | None = None


@dataclass
class SimulationReport:
    mode: str
    vehicles: int
    ticks: int
    messages: int
    acked: int
    errors: int
    seconds: float
    rate_msg_s: float
    truth_path: str
    truth: dict[str, int]
    scenario: ScenarioStats
    registration: RegistrationReport | None = None
    header: RunHeader | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def run_simulation(
    settings: SimulatorSettings,
    cfg: ScenarioConfig,
    opts: SimulationOptions,
    console: Console | None = None,
) -> SimulationReport:
    """Build, register, publish; write the ground truth; return the closing figures."""
    console = console or Console(stderr=True)
    sc = Scenario(cfg)
    vids = sc.vehicle_ids()
    progress = Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[info]}"),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
        console=console,
        disable=not opts.show_progress,
        transient=False,
    )
    registration: RegistrationReport | None = None
    accuracy = round(max(2 * cfg.noise_sigma_m, 0.5), 1)
    with progress:

        def register(entities: list[EntityData], what: str) -> RegistrationReport:
            task = progress.add_task(what, total=len(entities), info="")

            def advance(n: int) -> None:
                progress.advance(task, n)

            if opts.api_url:
                if not opts.api_key:
                    raise InfraError(
                        "--api-url needs an admin API key (--api-key or FLEETFENCE_SIMULATOR_API_KEY)"
                    )
                report = register_api(settings, entities, opts.api_url, opts.api_key, progress=advance)
            else:
                report = register_direct(settings, entities, run_relay=opts.run_relay, progress=advance)
            logger.info(
                "scenario registered what=%s entities=%s changed=%s", what, report.entities, report.changed
            )
            return report

        if opts.register:
            registration = register(scenario_entities(sc), "register")

        sink: Sink
        if opts.direct:
            sink = KafkaSink(settings.bootstrap_servers, settings.topics.telemetry, accuracy_m=accuracy)
        elif settings.mqtt_auth:
            # As a fleet connects: each vehicle on its own connection with its own credentials,
            # issued through the admin API when one is given (or the vehicle master's service).
            task = progress.add_task("credentials", total=len(vids), info="")

            def issued(n: int) -> None:
                progress.advance(task, n)

            if opts.api_url and opts.api_key:
                secrets = issue_credentials_api(vids, opts.api_url, opts.api_key, progress=issued)
            else:
                secrets = issue_credentials_direct(settings, vids, progress=issued)
            brokers = settings.vehicle_brokers()
            sink = FleetMqttSink(
                [(host, port) for host, port, _ca in brokers],
                secrets,
                tls_ca=brokers[0][2],
                inflight=settings.simulator_mqtt_inflight,
                accuracy_m=accuracy,
            )
        else:
            sink = MqttSink(
                *settings.vehicle_brokers()[0][:2],
                inflight=settings.simulator_mqtt_inflight,
                accuracy_m=accuracy,
            )
        try:
            if opts.realtime and opts.start_now:
                # Once the sink is ready (each vehicle's credentials issued, its connection up): the
                # first tick leaves at once, not late by however long the set-up took.
                now_ms = int(time.time() * 1000)
                cfg = replace(cfg, start_ms=now_ms - now_ms % cfg.period_ms + cfg.period_ms)
                moved = Scenario(cfg)  # same seed: the same city and plan, only the clock moves
                if registration is not None:
                    # Before the first fix: the processor must judge the trips against these arrivals.
                    rescheduled = moved_schedules(sc, moved)
                    if rescheduled:
                        again = register(list(rescheduled), "reschedule")
                        registration = replace(
                            registration,
                            changed=registration.changed + again.changed,
                            seconds=registration.seconds + again.seconds,
                        )
                sc = moved

            if opts.sink_observer is not None:
                opts.sink_observer(sink)
            writer = TruthWriter(opts.truth_path)
            task = progress.add_task("publish", total=cfg.n_ticks, info="")
            pending: list[TruthAlert] = []
            wall_of_tick: dict[int, int] = {}
            t0 = time.monotonic()
            wall0 = cfg.start_ms / 1000.0 if opts.realtime else 0.0
            last_ts = cfg.start_ms
            for batch in sc.ticks():
                if opts.realtime and batch.tick < cfg.n_ticks:
                    # Pacing (not synchronisation): each tick leaves at its own wall-clock time.
                    delay = wall0 + batch.tick * cfg.period_ms / 1000.0 - time.time()
                    if delay > 0:
                        time.sleep(delay)
                wall_of_tick[batch.tick] = int(time.time() * 1000)
                sink.send(batch, vids)
                if batch.tick < cfg.n_ticks:
                    last_ts = batch.ts_ms
                pending.extend(batch.truth)
                done = [a for a in pending if a.publish_tick <= batch.tick]
                if done:
                    pending = [a for a in pending if a.publish_tick > batch.tick]
                    for a in done:
                        a.publish_ms = wall_of_tick.get(a.publish_tick) if opts.realtime else None
                    writer.write(done)
                wall_of_tick.pop(batch.tick - 2, None)
                elapsed = time.monotonic() - t0
                progress.update(
                    task,
                    completed=min(batch.tick + 1, cfg.n_ticks),
                    info=f"{sink.sent:,} msgs {sink.sent / max(elapsed, 1e-9):,.0f}/s truth {writer.count}",
                )
            writer.write(pending)
            remaining = sink.flush(opts.flush_timeout_s)
        finally:
            sink.close()
        seconds = time.monotonic() - t0
    header = RunHeader(
        cfg.vehicle_prefix,
        cfg.vehicles,
        cfg.start_ms,
        last_ts,
        cfg.period_ms,
        cfg.seed,
        opts.realtime,
        {
            **asdict(cfg.rules),
            **asdict(cfg.assume),
            "proximity": [asdict(r) for r in cfg.proximity],
            "undecided_alert_ids": sc.undecided_alert_ids(),
        },
    )
    writer.close(header)
    if remaining:
        raise KafkaDeliveryError(f"{remaining} messages were not acknowledged within {opts.flush_timeout_s}s")
    return SimulationReport(
        "kafka-direct" if opts.direct else "mqtt",
        cfg.vehicles,
        cfg.n_ticks,
        sink.sent,
        sink.acked,
        sink.errors,
        seconds,
        sink.sent / max(seconds, 1e-9),
        str(opts.truth_path),
        dict(sc.stats.truth),
        sc.stats,
        registration,
        header,
    )


def report_table(rep: SimulationReport) -> Table:
    t = Table(title=f"simulation ({rep.mode})")
    t.add_column("figure")
    t.add_column("value", justify="right")
    s = rep.scenario
    rows: list[tuple[str, str]] = [
        ("vehicles", f"{rep.vehicles:,}"),
        ("ticks", f"{rep.ticks:,}"),
        ("messages sent", f"{rep.messages:,}"),
        ("acknowledged", f"{rep.acked:,}"),
        ("errors", f"{rep.errors:,}"),
        ("seconds", f"{rep.seconds:.2f}"),
        ("achieved rate (msg/s)", f"{rep.rate_msg_s:,.0f}"),
        ("duplicates / out-of-order / late injected", f"{s.duplicates} / {s.out_of_order} / {s.late}"),
        (
            "deviations / overspeeds / dwells / silences",
            f"{s.deviations} / {s.overspeeds} / {s.dwells} / {s.silences}",
        ),
        ("injections skipped (no room)", f"{s.skipped}"),
    ]
    if rep.registration is not None:
        r = rep.registration
        rows.append((f"registered via {r.via}", f"{r.entities:,} ({r.changed:,} changed, {r.seconds:.1f}s)"))
    for typ, count in sorted(rep.truth.items()):
        rows.append((f"expected {typ}", f"{count:,}"))
    rows.append(("ground truth", rep.truth_path))
    for a, b in rows:
        t.add_row(a, b)
    return t
