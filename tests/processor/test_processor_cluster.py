"""The processor unchanged on a Spark standalone cluster: a master and two workers started from the
pyspark installation, the job submitted by `spark://` URL, the alerts checked exactly."""

from __future__ import annotations

from pathlib import Path

import pytest

from embedded.spark_cluster import StandaloneCluster
from fleetfence.kafka import ensure_topics, topic_specs
from fleetfence.service import stop_process_group
from fleetfence.settings import Settings
from tests.processor.helpers import (
    committed_alerts,
    expected_alerts,
    master_events,
    processor_settings,
    produce_master,
    produce_telemetry,
    scenario,
    spawn_processor,
    wait_for,
)

pytestmark = [pytest.mark.spark, pytest.mark.services, pytest.mark.slow]


def test_processor_on_standalone_master_and_two_workers(settings: Settings, tmp_path: Path) -> None:
    with StandaloneCluster(tmp_path / "cluster", workers=2, cores_per_worker=1, memory_per_worker="1g") as c:
        ensure_topics(settings.bootstrap_servers, topic_specs(settings))
        ps = processor_settings(settings, tmp_path, processor_spark_master=c.url)
        fixes = scenario()
        expected = expected_alerts(fixes, ps.engine_config())
        produce_master(settings, master_events())
        produce_telemetry(settings, fixes)
        proc = spawn_processor(ps, tmp_path / "processor.log", spark_master=c.url)
        try:
            got = wait_for(
                lambda: (a := committed_alerts(settings)) and len(a) >= len(expected) and a,
                300,
                "the alerts from the cluster",
            )
            assert sorted(a["alert_id"] for a in got) == sorted(expected)
            # It really ran on the cluster: each worker launched an executor for the application.
            assert c.executors_launched() == [True, True]
        finally:
            stop_process_group(proc)
