"""The load test's run: steps of simulated vehicles published in real time over MQTT through the
whole pipeline, sampled once a second, judged against each step's ground truth.

Modes:
- fixed: one step, `vehicles` at `rate_hz` for `duration_s`;
- ramp: steps of `duration_s` each, the fleet growing by `ramp_factor`, until a step cannot be
  sustained (the publisher falls short of the target rate, or the processor's lag grows over the
  step by more than two seconds of input); the highest sustained rate is the answer;
- soak: one long step (e.g. 30 min at half the ramp's answer); RSS growth per process after
  warm-up is the answer.

Each step is its own scenario (its own vehicle prefix, routes and ground truth), registered in the
vehicle master before it starts; the previous step's vehicles simply stop (their silence falls
after their truth's end, so it is out of scope). Accuracy is `simulator.verify` per step.
"""

from __future__ import annotations

import logging
import math
import os
import platform
import threading
import time
import uuid
from dataclasses import asdict, dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import orjson
from rich.console import Console
from rich.live import Live

from fleetfence.errors import ServiceUnavailableError
from fleetfence.rules import ProximityRule, RouteRules
from fleetfence.settings import FLEET_PROXIMITY_RULE_ID, Settings
from loadtest.installation import Installation
from loadtest.model import (
    Accuracy,
    Latency,
    LoadRun,
    ProcSample,
    Reconciliation,
    Sample,
    StepResult,
)
from loadtest.procstat import ProcessSampler
from loadtest.report import live_table, percentiles, rss_growth
from loadtest.taps import GatewayCounters, GroupLag, MarkerTap, MarkerTotals, TelemetryTap, TopicTap
from simulator.commands import start_ms_for
from simulator.config import Injections, ScenarioConfig
from simulator.publish import SimulationOptions, Sink, run_simulation
from simulator.routes import DEFAULT_BBOX
from simulator.settings import SimulatorSettings
from simulator.truth import read_truth
from simulator.verify import MISMATCH_CAP, ObservedAlert, compare, in_scope

logger = logging.getLogger(__name__)

SILENT = "VEHICLE_SILENT"
SAMPLE_EVERY_S = 1.0  # the sampler's cadence, whatever a sample takes (below it)
SETTLE_QUIET_S = 10.0  # no new alert for this long, at least, once every stage has drained
STEP_SHIFT_DEG = 0.25  # longitude between two steps' areas (the default box is 0.2 wide)


@dataclass(frozen=True)
class LoadOptions:
    mode: str = "fixed"  # fixed, ramp or soak
    vehicles: int = 200  # fixed/soak: the fleet; ramp: the first step's
    rate_hz: float = 1.0  # fixes per vehicle and second
    duration_s: float = 90.0  # fixed/soak: the run; ramp: each step
    ramp_factor: float = 1.5
    max_steps: int = 8
    gateway_replicas: int = 2
    seed: int = 11
    warmup_s: float = 60.0  # soak: RSS growth is measured from here
    settle_s: float = 120.0  # after the last fix: until every stage has drained
    max_p99_ms: float | None = None
    min_recall: float | None = None
    max_rss_growth: float | None = None
    report_dir: Path | None = None
    attach: bool = False  # measure the running installation the settings point at; start nothing
    bbox: tuple[float, float, float, float] = DEFAULT_BBOX  # the first step's area; later ones east of it
    proximity_m: float | None = None  # vehicle proximity on (`proximity_rules`), with convoys in the fleet


# The share of a proximity run's vehicles that follow another in a convoy.
CONVOY_SHARE = 0.05


def proximity_rules(opts: LoadOptions) -> tuple[ProximityRule, ...]:
    """The proximity rule a run starts its processor with (`--proximity-m`: the enter distance, the
    exit twice it), with a tolerance of half a fix period, which the truth needs
    (simulator.truth_proximity); none without it."""
    if opts.proximity_m is None:
        return ()
    rule = ProximityRule(
        FLEET_PROXIMITY_RULE_ID,
        enter_m=opts.proximity_m,
        exit_m=2 * opts.proximity_m,
        min_duration_ms=15_000,
        tolerance_ms=round(500 / opts.rate_hz),
        lost_after_ms=30_000,
    )
    return (rule,)


@dataclass
class _Counters:
    """Cumulative figures at one moment (the sampler's previous reading, for rates)."""

    t: float
    acked: int
    written: int  # records written to fleet.telemetry
    read: int


def step_bbox(opts: LoadOptions, step: int) -> tuple[float, float, float, float]:
    """Each step in its own part of the map: zones are fleet-wide, and a step's vehicles crossing
    the previous step's zones would raise alerts its ground truth does not know."""
    b = opts.bbox
    return (b[0] + step * STEP_SHIFT_DEG, b[1], b[2] + step * STEP_SHIFT_DEG, b[3])


class LoadTest:
    """One run on a running installation (the embedded pipeline started for it, or one it attached
    to); `run()` returns the record (`LoadRun`)."""

    def __init__(
        self,
        settings: Settings,
        installation: Installation,
        opts: LoadOptions,
        console: Console,
        run_dir: Path,
        groups: list[str],
    ) -> None:
        self.s = settings
        self.sim = SimulatorSettings.from_base(settings)
        if installation.device_urls and self.sim.simulator_mqtt_url is None:  # the device edges
            self.sim = self.sim.model_copy(update={"simulator_mqtt_url": ",".join(installation.device_urls)})
        # Embedded, the rules the run starts its processor with; attached, the installation's
        # (FLEETFENCE_PROCESSOR_PROXIMITY_*, read as the processor reads them).
        self.proximity = proximity_rules(opts) or self.sim.proximity_rules()
        self.installation = installation
        self.opts = opts
        self.console = console
        self.run_dir = run_dir
        self.run_id = uuid.uuid4().hex[:6]
        t = settings.topics
        group = f"fleetfence-loadtest-{self.run_id}"
        opened: list[Any] = []
        try:
            self.alert_tap = TopicTap(settings.bootstrap_servers, t.alerts, group)
            opened.append(self.alert_tap)
            self.marker_tap = MarkerTap(settings.bootstrap_servers, t.processor_commits)
            opened.append(self.marker_tap)
            self.group_lag = GroupLag(settings.bootstrap_servers, self.alert_tap, groups)
            opened.append(self.group_lag)
            # The run is counted in Kafka: what the gateways wrote, whichever replica and process.
            self.telemetry = TelemetryTap(
                settings.bootstrap_servers, t.telemetry, t.telemetry_dlq, f"{group}-fixes", self.prefix
            )
            opened.append(self.telemetry)
            try:
                # The gateways' own counts, informative (an attached installation's have counted
                # what came before: the run's are the differences).
                self.gateways = GatewayCounters(lambda: installation.metrics_urls("gateway"))
            except ServiceUnavailableError:
                installation.check_alive()  # a replica that died: its own error says why
                raise
        except BaseException:
            for c in reversed(opened):
                c.close()
            raise
        self.procs = ProcessSampler(installation.pids())
        self.procs.add_self("loadtest")  # the publisher and the sampler run here
        self.alerts: list[tuple[dict[str, Any], int]] = []  # (alert, record ts) of this run
        self.samples: list[Sample] = []
        self.sink: Sink | None = None
        self.sent_before = 0  # fixes sent by earlier steps' sinks
        self.acked_before = 0
        self.sent_twice = 0  # messages the scenarios sent twice on purpose (Injections.duplicate)
        self.t0 = time.monotonic()
        self._prev: _Counters | None = None

    # ------------------------------------------------------------------ sampling

    def _acked(self) -> int:
        sink = self.sink
        return self.acked_before + (sink.acked if sink is not None else 0)

    def sample(self, step: int, target_rate: float) -> Sample:
        self.installation.check_alive()
        now = time.monotonic()
        for value, ts in self.alert_tap.poll():
            self.alerts.append((orjson.loads(value), ts))
        totals = self.marker_tap.poll()
        kafka = self.telemetry.poll()
        # What the topic holds now (the leaders' word), not what the tap has fetched of it yet: a
        # tap behind the topic must not make the processor look drained.
        written = max(self.telemetry.written() or 0, kafka.records)
        self.gateways.read()
        acked = self._acked()
        puback: list[float] = []
        take = getattr(self.sink, "take_puback_ms", None)
        if take is not None:
            puback = take()
        prev = self._prev or _Counters(self.t0, 0, 0, 0)
        dt = max(now - prev.t, 1e-6)
        lat = percentiles(puback)
        smp = Sample(
            t_s=round(now - self.t0, 2),
            step=step,
            target_rate=target_rate,
            publish_rate=(acked - prev.acked) / dt,
            puback_p50_ms=lat.p50_ms,
            puback_p99_ms=lat.p99_ms,
            gateway_forwarded_rate=(written - prev.written) / dt,
            gateway_dead_lettered=kafka.dead_lettered,
            processor_rate=(totals.read - prev.read) / dt,
            processor_lag=max(written - totals.read, 0),
            receivers_lag=self.group_lag.lag(),
            alerts=len(self.alerts),
            procs={k: ProcSample(v.cpu_pct, v.rss_mib) for k, v in self.procs.sample().items()},
        )
        self._prev = _Counters(now, acked, written, totals.read)
        self.samples.append(smp)
        return smp

    def _view(self, smp: Sample, step: int) -> Any:
        """The live view: the sample, with event->alert latency over the alerts so far."""
        recent = self.alerts[-5000:]
        return live_table(
            smp,
            step,
            latency_event=self._latency(recent, None),
            latency_receipt=self._latency(recent, "trigger_received_ms"),
        )

    # ------------------------------------------------------------------ steps

    def _scenario(self, step: int, vehicles: int) -> ScenarioConfig:
        rules = RouteRules(
            corridor_width_m=60.0, speed_limit_kmh=50.0, overspeed_min_s=5.0, silent_after_s=60.0
        )
        duration = self.opts.duration_s
        period_ms = round(1000 / self.opts.rate_hz)
        return ScenarioConfig(
            vehicles=vehicles,
            duration_s=duration,
            rate_hz=self.opts.rate_hz,
            seed=self.opts.seed + step,
            route_length_m=6000.0,
            rules=rules,
            # The behaviours and transport faults of a fleet, at rates a load test can verify exactly.
            inject=Injections(
                deviation=0.1,
                overspeed=0.1,
                dwell=0.1,
                silent=0.05,
                late=0.0,
                convoy=CONVOY_SHARE if self.proximity else 0.0,
            ),
            proximity=self.proximity,
            start_ms=start_ms_for(None, True, duration, period_ms),
            vehicle_prefix=f"{self.prefix}{step}-",
            bbox=step_bbox(self.opts, step),
        )

    @property
    def prefix(self) -> str:
        """Every id this run registers (vehicles, routes, zones) starts with this."""
        return f"lt{self.run_id}s"

    def run_step(self, step: int, vehicles: int, live: Live) -> tuple[Path, float, float, int, int]:
        """Publish one step in real time while sampling; (truth file, target rate, achieved rate,
        processor lag at its start, at its end)."""
        cfg = self._scenario(step, vehicles)
        target = vehicles * self.opts.rate_hz
        truth = self.run_dir / f"truth-step{step}.jsonl"
        done = threading.Event()
        failure: list[BaseException] = []

        def observe(sink: Sink) -> None:
            track = getattr(sink, "track_puback", None)
            if track is not None:
                track()  # only measured while someone drains it (take_puback_ms)
            self.sink = sink

        def publish() -> None:
            try:
                opts = SimulationOptions(
                    realtime=True,
                    truth_path=truth,
                    register=True,
                    # Through the admin API when one is configured (FLEETFENCE_SIMULATOR_API_URL
                    # and _API_KEY), as an operator would; else straight into the vehicle master.
                    api_url=self.sim.simulator_api_url,
                    api_key=self.sim.simulator_api_key,
                    start_now=True,
                    show_progress=False,
                    sink_observer=observe,
                    # The vehicles hold what is not acknowledged for as long as the run waits for
                    # the pipeline to drain: an installation restarted under the run takes minutes.
                    flush_timeout_s=max(60.0, self.opts.settle_s),
                )
                done_rep = run_simulation(
                    self.sim, replace(cfg, assume=self.sim.processor_rules()), opts, self.console
                )
                # The scenario's own duplicate messages (a fix sent twice on purpose): one fix each.
                self.sent_twice += done_rep.scenario.duplicates
            except BaseException as exc:  # handed to the sampling thread, which raises it
                failure.append(exc)
            finally:
                done.set()

        lag_start = self.samples[-1].processor_lag if self.samples else 0
        sent0 = self._acked()
        thread = threading.Thread(target=publish, name=f"loadtest-step{step}", daemon=True)
        thread.start()
        t_start = None
        next_at = time.monotonic() + SAMPLE_EVERY_S
        while not done.wait(max(0.0, next_at - time.monotonic())):
            # Once a second from the last tick (a slow sample, a fault's timeouts: from now).
            next_at = max(next_at, time.monotonic()) + SAMPLE_EVERY_S
            # While the step's vehicles are being registered nothing is published: target 0, so
            # the step's rate and lag trend are judged over its publishing only.
            smp = self.sample(step, target if self.sink is not None else 0.0)
            if self.sink is not None and t_start is None:
                t_start = time.monotonic()
            live.update(self._view(smp, step))
        thread.join()
        if failure:
            # A service that died explains a failed publisher (a gateway's device edge refusing
            # it, say) better than the publisher's own error: its name, its end, its log.
            try:
                self.installation.check_alive()
            except ServiceUnavailableError as exc:
                raise exc from failure[0]
            raise failure[0]
        elapsed = time.monotonic() - (t_start or self.t0)
        smp = self.sample(step, target)  # the step's last PUBACKs, while its sink is still known
        live.update(self._view(smp, step))
        achieved = (self._acked() - sent0) / max(elapsed, 1e-6)
        sink = self.sink
        if sink is not None:
            self.acked_before += sink.acked
            self.sent_before += sink.sent
        self.sink = None
        return truth, target, achieved, lag_start, smp.processor_lag

    def settle(self, live: Live) -> None:
        """After the last fix: until the processor has read everything written to fleet.telemetry,
        the receivers have caught up and alerts stop coming (silence needs the watermark to move),
        or `settle_s` is over."""
        deadline = time.monotonic() + self.opts.settle_s
        quiet_since = time.monotonic()
        n = len(self.alerts)
        smp = None
        while time.monotonic() < deadline:
            next_at = time.monotonic() + SAMPLE_EVERY_S
            smp = self.sample(len(self.steps_done) - 1, 0.0)
            live.update(self._view(smp, smp.step))
            if len(self.alerts) != n:
                n, quiet_since = len(self.alerts), time.monotonic()
            drained = smp.processor_lag == 0 and smp.receivers_lag == 0
            # Quiet for longer than the batches' pace: the batch after the last one read still
            # emits what the watermark's move releases (run 21 of the deployment suite settled 3 s
            # before a 90 s batch did, after an executor was lost).
            quiet_s = max(SETTLE_QUIET_S, 1.5 * self.marker_tap.totals.batch_pace_s)
            if drained and time.monotonic() - quiet_since > quiet_s:
                return
            time.sleep(max(0.0, next_at - time.monotonic()))
        logger.warning(
            "loadtest settle timed out settle_s=%s processor_lag=%s receivers_lag=%s "
            "quiet_s=%.0f (since the last alert, or the settle's start)",
            self.opts.settle_s,
            smp.processor_lag if smp else None,
            smp.receivers_lag if smp else None,
            time.monotonic() - quiet_since,
        )

    # ------------------------------------------------------------------ judging

    def _latency(self, alerts: list[tuple[dict[str, Any], int]], field_name: str | None) -> Latency:
        vals = [
            float(ts - (a["ts_ms"] if field_name is None else a.get(field_name) or 0))
            for a, ts in alerts
            if a["type"] != SILENT and (field_name is None or a.get(field_name))
        ]
        return percentiles(vals)

    def judge_step(self, truth: Path) -> tuple[Accuracy, Latency, Latency]:
        header, expected = read_truth(truth)
        prefix = header.vehicle_prefix
        mine = [(a, ts) for a, ts in self.alerts if str(a.get("vehicle_id", "")).startswith(prefix)]
        observed = in_scope(
            header,
            [ObservedAlert.from_dict(a, ts) for a, ts in mine],
        )
        res = compare(expected, observed, seq_tolerance=0)
        o = res.overall
        acc = Accuracy(
            expected=o.expected,
            observed=o.observed,
            matched=o.matched,
            duplicates=o.duplicates,
            precision=o.precision,
            recall=o.recall,
            per_type={t: sc.to_dict() for t, sc in sorted(res.by_type.items())},
            mismatch_count=len(found := res.mismatches),
            mismatches=[m.to_dict() for m in found[:MISMATCH_CAP]],
        )
        scoped = {a.alert_id for a in observed}
        mine = [(a, ts) for a, ts in mine if a["alert_id"] in scoped]
        return acc, self._latency(mine, None), self._latency(mine, "trigger_received_ms")

    def reconcile(self) -> Reconciliation:
        """The run's counts end to end, from Kafka: a gateway or processor restarted during the run
        changes none of them. The gateways' own counts are checked only when no replica restarted
        or went unread (a restart loses what it counted since the last reading)."""
        totals: MarkerTotals = self.marker_tap.poll()
        kafka = self.telemetry.drain()
        gw = self.gateways.read()
        in_kafka = kafka.fixes + kafka.dead_lettered
        published, acked = self.sent_before, self.acked_before
        checks = {
            "every fix published was acknowledged": published == acked,
            # Each fix once: the scenario's deliberate duplicates are the same fixes again.
            "every acknowledged fix is in Kafka, in fleet.telemetry or dead-lettered": in_kafka
            == acked - self.sent_twice,
            "the processor read every record written to fleet.telemetry": totals.read == kafka.records,
            "processor received = accepted + duplicates + late + held": totals.received
            == totals.accepted + totals.duplicates + totals.late + totals.held,
        }
        if gw.restarts == 0 and not gw.unanswered:
            checks["gateway in = forwarded + dead-lettered"] = gw.received == gw.forwarded + gw.dead_lettered
        failed = [k for k, ok in checks.items() if not ok]
        return Reconciliation(
            published=published,
            acked=acked,
            sent_twice=self.sent_twice,
            in_kafka=kafka.fixes,
            sent_again=kafka.sent_again,
            dead_lettered=kafka.dead_lettered,
            telemetry_records=kafka.records,
            gateway_received=gw.received,
            gateway_forwarded=gw.forwarded,
            gateway_dead_lettered=gw.dead_lettered,
            gateway_redelivered=gw.redelivered,
            gateway_restarts=gw.restarts,
            processor_read=totals.read,
            processor_accepted=totals.accepted,
            processor_duplicates=totals.duplicates,
            processor_invalid=totals.invalid,
            processor_late=totals.late,
            reconciled=not failed,
            detail="; ".join(f"not: {k}" for k in failed),
        )

    # ------------------------------------------------------------------ the run

    steps_done: list[tuple[int, int, Path, float, float, int, int, float]]

    def run(self) -> LoadRun:
        o = self.opts
        started = datetime.now(UTC)
        self.steps_done = []
        n_steps = o.max_steps if o.mode == "ramp" else 1
        with Live(console=self.console, refresh_per_second=2, transient=False) as live:
            for step in range(n_steps):
                vehicles = max(1, round(o.vehicles * (o.ramp_factor**step)))
                t_step = time.monotonic()
                truth, target, achieved, lag0, lag1 = self.run_step(step, vehicles, live)
                self.steps_done.append(
                    (step, vehicles, truth, target, achieved, lag0, lag1, time.monotonic() - t_step)
                )
                if o.mode == "ramp" and not self._sustained(step, target, achieved):
                    break
            self.settle(live)
        recon = self.reconcile()
        steps: list[StepResult] = []
        for step, vehicles, truth, target, achieved, lag0, lag1, secs in self.steps_done:
            acc, lat_event, lat_receipt = self.judge_step(truth)
            notes = []
            if achieved < 0.95 * target:
                notes.append(f"the publisher reached {achieved:,.0f} of {target:,.0f} fixes/s")
            growth = self.lag_growth(step)
            if growth > 2 * target:
                notes.append(f"the processor's lag grew by {growth:,.0f} records over the step (its trend)")
            steps.append(
                StepResult(
                    step=step,
                    target_rate=target,
                    vehicles=vehicles,
                    duration_s=round(secs, 1),
                    achieved_rate=round(achieved, 1),
                    sustained=self._sustained(step, target, achieved),
                    lag_start=lag0,
                    lag_end=lag1,
                    latency_event=lat_event,
                    latency_receipt=lat_receipt,
                    accuracy=acc,
                    reconciliation=recon,
                    notes=notes,
                )
            )
        run = LoadRun(
            mode=o.mode,
            started_at=started.isoformat(),
            finished_at=datetime.now(UTC).isoformat(),
            machine={
                "cores": os.cpu_count(),
                "memory_gib": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1),
                "python": platform.python_version(),
                "processes": sorted(self.installation.pids()),
                **self.installation.describe(),
            },
            options={k: (str(v) if isinstance(v, Path) else v) for k, v in asdict(o).items()},
            steps=steps,
            samples=self.samples,
        )
        # What happened to the installation under the run (a fault under test): said in the report.
        seen = list(getattr(self.installation, "events", []))
        if recon.gateway_restarts and not any(e.startswith("gateway-") for e in seen):
            seen.append(f"{recon.gateway_restarts} gateway restart(s) during the run")
        if steps:
            steps[-1].notes.extend(seen)
        sustained = [st.target_rate for st in steps if st.sustained]
        run.highest_sustained_rate = max(sustained) if sustained else None
        run.rss_growth = rss_growth(self.samples, o.warmup_s)
        run.verdicts = self.verdicts(run)
        return run

    def lag_growth(self, step: int) -> float:
        """How much the processor's lag grew over a step, by its least-squares trend: the lag of a
        pipeline that keeps up swings between zero and a batch or two of input (a micro-batch
        reads what arrived during the previous one), so two single readings would judge the
        swing, not the trend; one that cannot keep up grows by (input - capacity) a second."""
        pts = [(x.t_s, x.processor_lag) for x in self.samples if x.step == step and x.target_rate > 0]
        if len(pts) < 5:
            return 0.0
        t = np.array([p[0] for p in pts])
        lag = np.array([p[1] for p in pts], dtype=np.float64)
        slope = float(np.polyfit(t, lag, 1)[0])
        return slope * float(t[-1] - t[0])

    def _sustained(self, step: int, target: float, achieved: float) -> bool:
        """The publisher reached the target and the processor's lag did not grow over the step
        by more than two seconds of input."""
        return achieved >= 0.95 * target and self.lag_growth(step) <= 2 * target

    def verdicts(self, run: LoadRun) -> list[str]:
        """The thresholds given on the command line that this run missed (empty: passed)."""
        o = self.opts
        judged = [st for st in run.steps if st.sustained] or run.steps
        out = []
        if not run.steps[-1].reconciliation.reconciled:
            out.append(f"counts do not reconcile: {run.steps[-1].reconciliation.detail}")
        if o.max_p99_ms is not None:
            worst = max((st.latency_event.p99_ms or 0.0) for st in judged)
            if worst > o.max_p99_ms:
                out.append(f"event->alert p99 {worst:,.0f} ms > {o.max_p99_ms:,.0f} ms")
        if o.min_recall is not None:
            low = min((st.accuracy.recall if st.accuracy.recall is not None else 1.0) for st in judged)
            if low < o.min_recall:
                out.append(f"recall {low:.4f} < {o.min_recall}")
        if o.max_rss_growth is not None:
            for name, g in sorted(run.rss_growth.items()):
                if not math.isnan(g) and g > o.max_rss_growth:
                    out.append(f"RSS of {name} grew {g:.1%} > {o.max_rss_growth:.0%} after warm-up")
        return out

    def close(self) -> None:
        for c in (self.alert_tap, self.marker_tap, self.group_lag, self.telemetry):
            c.close()
