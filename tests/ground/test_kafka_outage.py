"""An unreachable broker is a state a reader waits out, not a crash (issue #58 item 5): which of
librdkafka's errors `fleetfence.kafka.outage` waits out, and `through_outage`'s deadline, log line
and stop, met with real clients whose one broker has a host name that does not resolve (the
`_RESOLVE` a driver met in compose when a stopped broker's container name left the DNS). No broker
is needed; tests_deploy/test_embedded_cluster.py waits out a real two-of-three outage."""

from __future__ import annotations

import logging
import threading
import time

import pytest
from confluent_kafka import KafkaError, KafkaException, Message, TopicPartition

from fleetfence import kafka
from fleetfence.errors import KafkaUnavailableError
from fleetfence.testing import wait_for

UNRESOLVABLE = "nonexistent.invalid:9092"
QUIET = {"log_level": 0}  # librdkafka's own complaints about the host, on stderr, say nothing new here

WAITED_OUT = (
    KafkaError._RESOLVE,
    KafkaError._TRANSPORT,
    KafkaError._ALL_BROKERS_DOWN,
    KafkaError._TIMED_OUT,
    KafkaError.REQUEST_TIMED_OUT,
    KafkaError._MSG_TIMED_OUT,
    KafkaError._DESTROY_BROKER,
    KafkaError._NODE_UPDATE,
    KafkaError.NOT_LEADER_FOR_PARTITION,
    KafkaError.LEADER_NOT_AVAILABLE,
    KafkaError.UNKNOWN_TOPIC_OR_PART,
    KafkaError._UNKNOWN_PARTITION,
    KafkaError._UNKNOWN_TOPIC,
    KafkaError.FENCED_LEADER_EPOCH,
    KafkaError.UNKNOWN_LEADER_EPOCH,
    KafkaError.OFFSET_NOT_AVAILABLE,
)
RAISED = (
    KafkaError.TOPIC_AUTHORIZATION_FAILED,
    KafkaError._INVALID_ARG,
    KafkaError._FENCED,
    KafkaError.PRODUCER_FENCED,
    KafkaError._DESTROY,  # the client itself closed: nothing left to ask with
)


@pytest.fixture
def short_asks(monkeypatch: pytest.MonkeyPatch) -> None:
    """One ask waits 0.3 s at most instead of ASK_MAX_S: a broker that never answers makes
    librdkafka wait out every ask whole."""
    monkeypatch.setattr(kafka, "ASK_MAX_S", 0.3)


def waiting_lines(caplog: pytest.LogCaptureFixture, what: str) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.getMessage().startswith(f"kafka read waiting {what} ")]


@pytest.mark.parametrize("code", WAITED_OUT, ids=[KafkaError(c).name() for c in WAITED_OUT])
def test_unreachable_brokers_and_moving_leaders_are_waited_out(code: int) -> None:
    err = KafkaError(code)
    assert kafka.outage(KafkaException(err)) is err
    assert kafka.outage(err) is err  # as a delivery report or an error callback gets it


@pytest.mark.parametrize("code", RAISED, ids=[KafkaError(c).name() for c in RAISED])
def test_refusals_and_bad_requests_are_raised_at_once(code: int) -> None:
    assert kafka.outage(KafkaException(KafkaError(code))) is None


def test_a_fatal_error_is_raised_and_a_retriable_one_waited_out_whatever_its_code() -> None:
    assert kafka.outage(KafkaException(KafkaError(KafkaError._TRANSPORT, fatal=True))) is None
    retriable = KafkaError(KafkaError.NOT_ENOUGH_REPLICAS, retriable=True)
    assert kafka.outage(KafkaException(retriable)) is retriable
    assert kafka.outage(ValueError("not Kafka's")) is None
    assert kafka.outage(KafkaException()) is None


def test_what_real_clients_say_of_a_broker_whose_name_does_not_resolve_is_an_outage() -> None:
    """librdkafka's own errors, caused for real: the error callback's `_RESOLVE`, the exceptions
    of a watermark and a metadata read, a queued record's `_MSG_TIMED_OUT`; and a configuration
    it refuses, which no wait mends."""
    reported: list[KafkaError] = []
    c = kafka.plain_consumer(UNRESOLVABLE, "outage-probe", error_cb=reported.append, **QUIET)
    try:

        def resolve_failed() -> list[KafkaError]:
            c.poll(0.05)  # serves the error callback
            return [e for e in reported if e.code() == KafkaError._RESOLVE]

        (resolve, *_) = wait_for(resolve_failed, 15, "librdkafka to report _RESOLVE")
        assert kafka.outage(resolve) is resolve
        with pytest.raises(KafkaException) as wm:
            c.get_watermark_offsets(TopicPartition("t", 0), timeout=0.3, cached=False)
        with pytest.raises(KafkaException) as md:
            c.list_topics("t", timeout=0.3)
    finally:
        c.close()
    for raised in (wm.value, md.value):
        assert kafka.outage(raised) is raised.args[0], raised

    delivered: list[KafkaError | None] = []

    def on_delivery(err: KafkaError | None, _msg: Message) -> None:
        delivered.append(err)

    p = kafka.plain_producer(UNRESOLVABLE, **{"message.timeout.ms": 100, **QUIET})
    p.produce("t", b"x", on_delivery=on_delivery)
    assert p.flush(10) == 0
    (timed_out,) = delivered
    assert timed_out is not None
    assert timed_out.code() == KafkaError._MSG_TIMED_OUT
    assert kafka.outage(timed_out) is timed_out

    with pytest.raises(KafkaException) as bad:
        kafka.plain_consumer(UNRESOLVABLE, "outage-probe", **{"no.such.property": 1})
    assert bad.value.args[0].code() == KafkaError._INVALID_ARG
    assert kafka.outage(bad.value) is None


def test_a_refused_read_is_raised_at_once_not_waited_for() -> None:
    asked = 0

    def ask(_wait_s: float) -> object:
        nonlocal asked
        asked += 1
        return kafka.plain_consumer(UNRESOLVABLE, "outage-probe", **{"no.such.property": 1})

    with pytest.raises(KafkaException):
        kafka.through_outage(ask, "what=probe", timeout_s=None)
    assert asked == 1


@pytest.mark.usefixtures("short_asks")
def test_a_read_kafka_does_not_answer_waits_logs_and_gives_up_at_its_deadline(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="fleetfence.kafka")
    c = kafka.plain_consumer(UNRESOLVABLE, "outage-probe", **QUIET)
    try:
        t0 = time.monotonic()
        with pytest.raises(KafkaUnavailableError) as gave_up:
            kafka.watermarks(c, "t", 0, timeout_s=1.0)
        took = time.monotonic() - t0
    finally:
        c.close()
    assert 0.9 <= took < 5.0, took
    e = gave_up.value
    assert not e.stopped
    assert kafka.outage(e.error) is e.error
    assert isinstance(e.__cause__, KafkaException)
    assert "what=watermarks topic=t partition=0 within 1.0 s" in str(e)
    lines = waiting_lines(caplog, "what=watermarks topic=t partition=0")
    assert len(lines) >= 2, [r.getMessage() for r in caplog.records]
    assert all(r.levelno == logging.WARNING for r in lines)
    first = lines[0].getMessage()
    named = first.split(" error=")[1].split()[0]
    assert named in {KafkaError(c).name() for c in WAITED_OUT}, first
    assert "attempt=1 " in first
    assert "cause=unreachable" in first


@pytest.mark.usefixtures("short_asks")
def test_an_unbounded_read_waits_until_its_caller_stops_it(caplog: pytest.LogCaptureFixture) -> None:
    """No deadline: the read asks again and again (each ask logged) until `stop` is set, here by
    the third waiting line itself, and then ends at once with a KafkaUnavailableError that says so."""
    caplog.set_level(logging.INFO, logger="fleetfence.kafka")
    stop = threading.Event()
    waits = 0

    class StopOnThirdWait(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            nonlocal waits
            if record.getMessage().startswith("kafka read waiting what=metadata topic=t "):
                waits += 1
                if waits == 3:
                    stop.set()

    handler = StopOnThirdWait()
    logging.getLogger("fleetfence.kafka").addHandler(handler)
    admin = kafka.admin_client(UNRESOLVABLE)
    try:
        with pytest.raises(KafkaUnavailableError) as stopped:
            kafka.partitions_of(admin, "t", timeout_s=None, stop=stop)
    finally:
        logging.getLogger("fleetfence.kafka").removeHandler(handler)
    assert stopped.value.stopped
    assert "stopped waiting for Kafka's answer to what=metadata topic=t" in str(stopped.value)
    assert waits == 3
    attempts = [
        r.getMessage().split(" attempt=")[1].split()[0]
        for r in waiting_lines(caplog, "what=metadata topic=t")
    ]
    assert attempts == ["1", "2", "3"]
