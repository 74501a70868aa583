"""A driver that cannot reach Kafka right after it took its lease waits for the cluster, logging
each ask, instead of crashing (issue #58 item 5), and a stop ends the wait cleanly. Real clients
whose one broker's host name does not resolve; tests_deploy/test_embedded_cluster.py waits out a
real two-of-three outage with the same reader."""

from __future__ import annotations

import logging
import threading

import pytest

from fleetfence import kafka
from processor.ops.service import open_marker_reader
from processor.settings import ProcessorSettings

UNRESOLVABLE = "nonexistent.invalid:9092"


def test_a_driver_that_cannot_reach_kafka_waits_for_it_until_asked_to_stop(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # One ask waits 0.3 s at most instead of ASK_MAX_S: a broker that never answers makes
    # librdkafka wait out every ask whole.
    monkeypatch.setattr(kafka, "ASK_MAX_S", 0.3)
    caplog.set_level(logging.INFO)
    s = ProcessorSettings(kafka_bootstrap=UNRESOLVABLE)
    stop = threading.Event()
    waits: list[str] = []

    class StopOnFourthWait(logging.Handler):
        """The service's stop (a SIGTERM sets the same event), once the driver has waited a while."""

        def emit(self, record: logging.LogRecord) -> None:
            if record.getMessage().startswith("kafka read waiting "):
                waits.append(record.getMessage())
                if len(waits) == 4:
                    stop.set()

    handler = StopOnFourthWait()
    logging.getLogger("fleetfence.kafka").addHandler(handler)
    try:
        assert open_marker_reader(s, stop) is None
    finally:
        logging.getLogger("fleetfence.kafka").removeHandler(handler)
    assert len(waits) == 4
    assert all(f"what=metadata topic={s.topics.processor_commits} " in w for w in waits), waits
    assert all("cause=unreachable" in w for w in waits), waits
    (said,) = [r.getMessage() for r in caplog.records if r.name == "processor.ops.service"]
    assert said.startswith("processor stopped while waiting for Kafka: stopped waiting for Kafka's answer")
