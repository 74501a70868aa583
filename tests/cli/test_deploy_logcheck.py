"""The deployment suite's log check (tests_deploy/logcheck.py) without Docker: which lines are error
lines in each service's format, during which test a line was logged, and that every allow-list
entry is scoped and says why."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from tests_deploy import logcheck
from tests_deploy.logcheck import ALLOWED, ERROR_LINE, START_UP, Allowed, Window

T0 = datetime(2026, 12, 1, 12, 0, 0, tzinfo=UTC)


def stamped(at: datetime, text: str) -> str:
    return f"{at.strftime('%Y-%m-%dT%H:%M:%S')}.{at.microsecond:06d}123Z {text}"


ERRORS = [
    "1764590400: Error: Permission denied.",  # Mosquitto's failed autosave (issue #58)
    "1764590400: Error saving Dynamic security plugin config: File is not writable - check permissions.",
    "1764590400: OpenSSL Error[0]: error:0A000418:SSL routines::tlsv1 alert unknown ca",
    "ts=2026-12-01T12:00:00.000+00:00 level=ERROR logger=gateway msg=forward failed",
    "ts=2026-12-01T12:00:00.000+00:00 level=CRITICAL logger=x msg=y",
    '{"ts": "x", "level": "ERROR", "logger": "x", "msg": "y"}',
    "[2026-12-01T12:00:00.000Z] ERROR [ReplicaFetcher replicaId=1] Error for partition (kafka.server)",
    "26/12/01 12:00:00 ERROR TaskSchedulerImpl: Lost executor 0 on 172.18.0.9",
    'time=2026-12-01T12:00:00Z level=ERROR source=x msg="scrape failed"',
    "ts=2026-12-01T12:00:00Z caller=x level=error msg=y",
    '{"level":"error","msg":"x"}',
    "1:M 01 Dec 2026 12:00:00.000 # Fatal error loading the DB: Permission denied. Exiting.",
    "%3|1796612416.818|FAIL|rdkafka#producer-1| [thrd:kafka-1:9092/1]: kafka-1:9092/1: Connect failed",
    "Traceback (most recent call last):",
    'Exception in thread "main" java.lang.IllegalStateException: x',
    "panic: runtime error: index out of range",
]
NOT_ERRORS = [
    "1764590400: Socket error on client veh-1, disconnecting.",  # a client gone: notice level
    "1764590400: Saving in-memory database to /mosquitto/data//mosquitto.db.",
    "ts=2026-12-01T12:00:00.000+00:00 level=WARNING logger=x msg=retrying after error",
    "ts=2026-12-01T12:00:00.000+00:00 level=INFO logger=x msg=errors=0",
    "[2026-12-01T12:00:00.000Z] WARN [Producer] Got error produce response (org.apache.kafka)",
    "[2026-12-01T12:00:00.000Z] INFO \terrors.deadletterqueue.topic.name = (kafka.server.KafkaConfig)",
    "26/12/01 12:00:00 WARN TaskSetManager: Lost task 0.0 in stage 1.0",
    "1:M 01 Dec 2026 12:00:00.000 # WARNING Memory overcommit must be enabled!",
    "1:M 01 Dec 2026 12:00:00.000 * Ready to accept connections tcp",
    "%4|1796612416.818|OFFSET|rdkafka#consumer-1| [thrd:main]: offset reset",
    "%6|1796612416.818|FAIL|rdkafka#producer-1| [thrd:kafka-1:9092/1]: Disconnected (after 1ms)",
]


def test_error_lines_in_every_services_format() -> None:
    for line in ERRORS:
        assert ERROR_LINE.search(line), line
    for line in NOT_ERRORS:
        assert not ERROR_LINE.search(line), line


def test_lines_belong_to_the_test_running_when_they_were_logged() -> None:
    windows = [Window("test_b", T0 + timedelta(minutes=5)), Window("test_a", T0)]
    logs = {
        "redis": "\n".join(
            [
                stamped(T0 - timedelta(seconds=1), "1:M 01 Dec 2026 11:59:59.000 # Fatal error: denied"),
                stamped(T0 + timedelta(seconds=1), "1:M 01 Dec 2026 12:00:01.000 # Fatal error: denied"),
                stamped(T0 + timedelta(minutes=6), "1:M 01 Dec 2026 12:06:00.000 # Fatal error: denied"),
                stamped(T0 + timedelta(minutes=6), "1:M 01 Dec 2026 12:06:00.000 * Saving the dataset"),
            ]
        )
    }
    verdict = logcheck.check(logs, windows, allowed=())
    assert [line.test for line in verdict.unexpected] == [START_UP, "test_a", "test_b"]
    assert verdict.lines == 4
    assert verdict.errors == 3
    assert verdict.unexpected[0].at == T0 - timedelta(seconds=1)  # nanoseconds cut to microseconds
    assert verdict.unexpected[0].text == "1:M 01 Dec 2026 11:59:59.000 # Fatal error: denied"

    only_b = Allowed(("redis",), r"Fatal error", ("test_b",), "a fault of test_b")
    verdict = logcheck.check(logs, windows, allowed=(only_b,))
    assert [line.test for line in verdict.unexpected] == [START_UP, "test_a"]
    assert verdict.allowed == {"a fault of test_b": 1}
    other_service = Allowed(("mosquitto",), r"Fatal error", ("test_a", "test_b"), "another's")
    assert len(logcheck.check(logs, windows, allowed=(other_service,)).unexpected) == 3
    with_next = Allowed(("redis",), r"Fatal error", ("test_b",), "then", then=r"Saving")
    assert logcheck.check(logs, windows, allowed=(with_next,)).allowed == {"then": 1}
    not_next = Allowed(("redis",), r"Fatal error", ("test_b",), "then", then=r"Loading")
    assert not logcheck.check(logs, windows, allowed=(not_next,)).allowed


def test_a_line_with_its_own_time_belongs_to_when_it_was_logged() -> None:
    """Mosquitto's stdout is buffered: Docker receives its lines up to minutes late, so its own
    epoch says when a line was logged."""
    windows = [Window("test_a", T0), Window("test_b", T0 + timedelta(minutes=1))]
    own = int((T0 + timedelta(seconds=30)).timestamp())
    logs = {"mosquitto": stamped(T0 + timedelta(minutes=2), f"{own}: Error: Permission denied.")}
    (line,) = logcheck.check(logs, windows, allowed=()).unexpected
    assert line.test == "test_a"
    assert line.at == T0 + timedelta(seconds=30)


def test_the_broken_persistence_fails_the_suite_in_any_test() -> None:
    """Issue #58's line, and the plugin's failed save, are on no entry: logged during any test
    (or at start-up), they fail the suite."""
    tests = sorted({t for entry in ALLOWED for t in entry.during} | {START_UP})
    windows = [Window(t, T0 + timedelta(minutes=i)) for i, t in enumerate(tests)]
    lines = []
    for i in range(len(tests)):
        at = T0 + timedelta(minutes=i, seconds=30)
        lines.append(stamped(at, f"{int(at.timestamp())}: Error: Permission denied."))
        lines.append(stamped(at, f"{int(at.timestamp())}: Error saving Dynamic security plugin config: x"))
    verdict = logcheck.check({"mosquitto": "\n".join(lines)}, windows)
    assert len(verdict.unexpected) == 2 * len(tests)


def test_an_unexplained_transient_line_fails_only_outside_a_fault_row() -> None:
    """The default policy: during a fault row a client's unexplained reconnect error is noted, not
    failed (the row's reconciliation judges the fault); at start-up, in a row without a fault, or
    saying the deployment is broken, it fails. `strict` fails all, `lenient` only the broken."""
    windows = [Window("test_up", T0), Window("test_kill", T0 + timedelta(minutes=1), fault=True)]
    transient = "%3|1796653232.333|FAIL|rdkafka#consumer-2| [thrd:main]: kafka-9:9092: Unknown error"
    logs = {
        "alerts": "\n".join(
            [
                stamped(T0 - timedelta(seconds=1), transient),
                stamped(T0 + timedelta(seconds=1), transient),
                stamped(T0 + timedelta(minutes=1, seconds=1), transient),
                stamped(T0 + timedelta(minutes=1, seconds=2), "Traceback (most recent call last):"),
            ]
        )
    }
    unexpected = logcheck.check(logs, windows, allowed=()).unexpected
    assert [(line.test, line.fault) for line in unexpected] == [
        (START_UP, False),
        ("test_up", False),
        ("test_kill", True),
        ("test_kill", True),
    ]
    assert [logcheck.fails(line, "faults") for line in unexpected] == [True, True, False, True]
    assert [logcheck.fails(line, "strict") for line in unexpected] == [True, True, True, True]
    assert [logcheck.fails(line, "lenient") for line in unexpected] == [False, False, False, True]
    with pytest.raises(ValueError, match="FLEETFENCE_DEPLOY_LOGCHECK='loose'"):
        logcheck.fails(unexpected[0], "loose")


def test_saved_windows_keep_which_tests_inject_faults(tmp_path: Path) -> None:
    windows = [Window("test_up", T0), Window("test_kill", T0 + timedelta(minutes=1), fault=True)]
    path = tmp_path / "session.log"
    logcheck.save(path, {"alerts": stamped(T0, "hello")}, windows)
    logs, loaded = logcheck.load(path)
    assert loaded == windows
    assert logs == {"alerts": stamped(T0, "hello")}


def test_every_allowed_entry_is_reasoned_and_narrow() -> None:
    tests = set(re.findall(r"^def (test_\w+)", _suite_source(), re.MULTILINE)) | {START_UP}
    assert ALLOWED
    for entry in ALLOWED:
        assert entry.services, entry
        assert entry.during, f"name the tests whose fault logs it: {entry}"
        assert len(entry.reason) > 80, f"say why: {entry}"
        assert len(entry.pattern) > 30, f"too broad: {entry}"
        re.compile(entry.pattern)
        re.compile(entry.then)
        assert set(entry.during) <= tests, f"no such test: {set(entry.during) - tests}"


def _suite_source() -> str:
    from pathlib import Path

    root = Path(__file__).resolve().parents[2] / "tests_deploy"
    return "\n".join(p.read_text() for p in sorted(root.glob("test_*.py")))


def test_the_broken_persistence_fails_even_a_lenient_check() -> None:
    """FLEETFENCE_DEPLOY_LOGCHECK=lenient fails only on lines that say the deployment is broken:
    issue #58's line is one of them, a slow controller event is not."""
    at = T0
    persist = logcheck.LogLine("mosquitto", at, START_UP, f"{int(at.timestamp())}: Error: Permission denied.")
    assert logcheck.broken(persist)
    slow = "[2026-12-01T12:00:00.000Z] ERROR [QuorumController id=1] Exceptionally slow controller event"
    assert not logcheck.broken(logcheck.LogLine("kafka-1", at, START_UP, slow))
