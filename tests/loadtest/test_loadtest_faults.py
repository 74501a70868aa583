"""`fleetfence loadtest --attach` rides out a fault of the installation it measures (issue #64, case
1): a gateway replica SIGKILLed mid-run and started again by its "restart policy" used to stop the
run ("its counters started again from zero, so the counts cannot reconcile"), with nothing
verified. The vehicles on it now reconnect with their credentials, to the other replica when it
refuses, and send again what they got no PUBACK for; the run is counted in Kafka, so it still
verifies exactly and reconciles, and its report says which service restarted."""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from pathlib import Path

import orjson
import pytest

from embedded.pipeline import Pipeline, settings_env
from fleetfence.metrics import scrape
from fleetfence.settings import Settings
from fleetfence.testing import wait_for
from tests.loadtest.helpers import ELSEWHERE, FLEETFENCE

pytestmark = [pytest.mark.spark, pytest.mark.services, pytest.mark.slow, pytest.mark.fault]

VEHICLES = 40
DURATION_S = 40


def test_a_gateway_sigkilled_mid_run_loses_nothing_and_the_run_still_verifies(
    install: Callable[[int], tuple[Settings, Pipeline]], tmp_path: Path
) -> None:
    s, pipeline = install(2)
    report = tmp_path / "report"
    argv = [*FLEETFENCE, "loadtest", "--attach", "--vehicles", str(VEHICLES), "--duration-s", str(DURATION_S)]
    argv += ["--report-dir", str(report), "--min-recall", "1.0", "--settle-s", "120", "--bbox", ELSEWHERE]
    log = tmp_path / "loadtest.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            argv, env=settings_env(s, COLUMNS="200"), stdout=out, stderr=subprocess.STDOUT
        )
    try:
        gw1 = pipeline.metrics_urls("gateway-1")["gateway-1"]

        def under_way() -> bool:
            assert proc.poll() is None, log.read_text()[-6000:]
            # Half the fleet on this replica, for a few seconds: fixes of its vehicles in flight.
            return scrape(gw1).total("fleetfence_gateway_received_total") >= 5 * VEHICLES // 2

        wait_for(under_way, 300, "the fleet publishing through gateway-1", interval_s=0.5, ignore=(OSError,))
        pipeline.crash_and_restart("gateway-1")
        rc = proc.wait(timeout=600)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(30)
    text = log.read_text()
    assert rc == 0, text[-8000:]

    run = orjson.loads((report / "report.json").read_bytes())
    (step,) = run["steps"]
    r = step["reconciliation"]
    assert r["reconciled"], r
    # Every fix published was acknowledged, and every acknowledged fix is in Kafka, once as a fix
    # (what the killed replica had written but not acknowledged came again: `sent_again`, which
    # the processor drops by seq); the processor read every record written.
    assert r["published"] == r["acked"] >= VEHICLES * (DURATION_S - 1)
    assert r["in_kafka"] == r["published"] - r["sent_twice"]
    assert r["processor_read"] == r["telemetry_records"] == r["in_kafka"] + r["sent_again"]
    assert r["gateway_restarts"] == 1
    # The kill was felt: gateway-1's vehicles lost their connections and came back.
    assert "vehicle disconnected" in text
    assert any("gateway-" in n and "restarted" in n for n in step["notes"]), step["notes"]
    # Exactly the ground truth's alerts, once each.
    acc = step["accuracy"]
    assert acc["expected"] >= 3
    assert acc["expected"] == acc["observed"] == acc["matched"]
    assert acc["duplicates"] == 0
    assert run["verdicts"] == []
