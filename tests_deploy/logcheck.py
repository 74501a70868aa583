"""Every error line any service of the deployment logged, checked at the end of the suite.

A service can fail in a way no test's assertion sees: Mosquitto logged "Error: Permission denied."
at every autosave of every run, from the first start, and persisted nothing, while every test
passed. So at the end of the session every container's whole log (`docker logs -t`: each line with
its time, every life of a restarted container) is read, each line that carries an error severity in
its service's format is found (`ERROR_LINE`), and each is attributed to the test during which it was
logged (`Window`: from a test's start to the next one's; before the first, "start-up"; the last
runs to the end of the session). An error line is explained when an `ALLOWED` entry matches its
service and text within the tests that entry names, each entry with the reason that error is
expected: the faults inject failures on purpose, and the services log them. An error nobody can
explain is a finding, not an entry; so is one a fault leaves behind in a later test (a broker a
failed test left down). Which unexplained lines fail the suite: `POLICIES` (by default, every one
logged at start-up or in a row without a fault, and anywhere one that says the deployment is
broken).
"""

from __future__ import annotations

import re
import sys
from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

START_UP = "start-up"  # the window before the first test: images built, `up`, every service healthy

# A line that carries an error severity in the format of one of the services (or crashed without
# one). The formats: FleetFence's `ts=... level=ERROR logger=...` (fleetfence.logs); log4j's
# `[time] ERROR message (logger)` (Kafka) and `yy/MM/dd HH:mm:ss ERROR Class:` (Spark); Mosquitto's
# `<epoch>: Error...` (its error-level messages say "Error", it prints no level); Prometheus's and
# toxiproxy's `level=error` or JSON `"level":"error"`; Redis's `#` (warning, its highest level)
# with a failure word; librdkafka's own `%<syslog level>|<time>|` lines (the Kafka clients of every
# Python service: 3 is "err"); the `error: ...` a FleetFence command prints when it exits on an error
# (cli.common.friendly_errors); and what a process prints when it dies of an uncaught exception.
ERROR_LINE = re.compile(
    r"\b(?:ERROR|FATAL|CRITICAL|SEVERE)\b"
    r"|(?i:\blevel=(?:error|fatal|panic|crit)\b)"
    r'|(?i:"level":\s*"(?:error|fatal|panic)")'
    r"|^\d+: .*\bError\b"
    r"|^\d+:[A-Z] \d\d \w{3} \d{4} [\d:.]+ # .*(?i:\b(?:error|fatal|failed|can't|cannot)\b)"
    r"|^%[0-3]\|\d+\.\d+\|"
    r"|^error: "
    r"|^Traceback \(most recent call last\):"
    r"|^Exception in thread "
    r"|^panic: "
    r"|\bPermission denied\b"
    r"|\bSegmentation fault\b"
)


# Lines that say the deployment itself is broken, whatever the timing: a file a service cannot
# write (Mosquitto's persistence, the incident this check exists for), a process dying of an
# uncaught exception (its traceback printed at the start of a line) or a signal, a fatal, panic or
# critical severity. Which unexplained lines fail the suite besides these is `POLICIES`' matter. An
# exception a FleetFence service caught and logged (its JSON line carries the traceback in `msg`)
# is not one of these: during a fault the services log what they recover from.
BROKEN = re.compile(
    r"\bPermission denied\b|^Traceback \(most recent call last\):|^Exception in thread |^panic: "
    r"|\bSegmentation fault\b|\bFATAL\b|(?i:\blevel=(?:fatal|panic)\b)|^\d+: .*\bError\b"
    r'|"level":\s*"CRITICAL"'
)


def broken(line: LogLine) -> bool:
    """Whether an unexplained line says the deployment is broken (`BROKEN`), not just slow."""
    return bool(BROKEN.search(line.text))


# Which unexplained lines fail the suite (FLEETFENCE_DEPLOY_LOGCHECK):
#   `faults` (the default, and CI's): a broken line anywhere, and any line logged at start-up or
#     during a test that injects no fault. During a fault row an unexplained line that does not say
#     the deployment is broken is printed, not failed: which transient errors a fault makes its
#     clients log depends on timing (every full run from 24 to 27 logged one no run before had, each
#     a variant of an entry's error), and the row's own reconciliation (every fix accounted for,
#     alerts equal to the ground truth, no duplicate) is what says whether the fault did harm.
#   `strict`: every unexplained line fails (to extend the allow-list from a run's logs).
#   `lenient`: only a broken line fails (a run on a machine shared with other work).
POLICIES = ("faults", "strict", "lenient")


def fails(line: LogLine, policy: str) -> bool:
    """Whether an unexplained `line` fails the suite under `policy` (one of POLICIES)."""
    if policy not in POLICIES:
        raise ValueError(f"FLEETFENCE_DEPLOY_LOGCHECK={policy!r}: one of {', '.join(POLICIES)}")
    if policy == "strict" or broken(line):
        return True
    return policy == "faults" and not line.fault


@dataclass(frozen=True)
class Allowed:
    """An error line the suite expects: in one of `services`, matching `pattern` (the line is
    searched), during one of the tests `during` (function names, or START_UP), with `then`
    matching the service's next line when given (a Java exception's class is on the line after
    the message), for `reason`."""

    services: tuple[str, ...]
    pattern: str
    during: tuple[str, ...]
    reason: str
    then: str = ""

    def matches(self, line: LogLine) -> bool:
        return (
            line.service in self.services
            and line.test in self.during
            and re.search(self.pattern, line.text) is not None
            and (not self.then or re.search(self.then, line.next) is not None)
        )


# The whole installation stopped and started (issue #64, case 1): every broker down at once, and
# every client of theirs saying so, as in the rows that kill two of them.
RESTARTED = ("test_stop_and_start_the_whole_installation",)
TWO_DOWN = (
    "test_two_of_three_brokers_down_then_one_back",
    "test_sigkill_mosquitto_while_two_of_three_brokers_are_down",
    "test_sigkill_a_gateway_while_two_of_three_brokers_are_down",
    *RESTARTED,
)
BROKER_KILLS = (
    "test_sigkill_the_telemetry_leader",
    "test_sigkill_the_active_controller",
    *TWO_DOWN,
)
MOSQUITTO_KILLS = (
    "test_sigkill_mosquitto_and_restart",
    "test_sigkill_mosquitto_while_two_of_three_brokers_are_down",
)
KAFKA_NODES = ("kafka-1", "kafka-2", "kafka-3")
SINK_OUTAGE = (
    "Two of three nodes down longer than the sink's commit can wait (run 25: writes taken again 58 s "
    "after a node's restart): the batch's transaction cannot flush, the sink aborts it and the query "
    "ends with the commit's error; the driver exits, the standby takes the lease and the restart "
    "policy brings the driver back. Nothing of the batch was committed and the row lost nothing, but "
    "a driver restart is not yet the wait issue #58 asks for."
)
DRIVERS = ("processor", "processor-standby")
FENCES = (  # the faults after which the running driver no longer holds the checkpoint's lease
    "test_freeze_the_processor_past_its_lease",
    "test_sigkill_redis_and_restart",
    "test_partition_the_processor_from_redis",
)

# Every error line a run of the suite logs and why it is expected, set from the logs of full runs
# (docs/bench-log/deploy.md: runs 19 to 23). An entry is as narrow as the error it
# explains: the services that log it, the tests whose fault causes it, the words of the line.
ALLOWED: tuple[Allowed, ...] = (
    Allowed(
        DRIVERS,
        r"^Traceback \(most recent call last\):",
        RESTARTED,
        "A driver stopped by SIGTERM (docker-compose stop): pyspark stops the JVM before its "
        "accumulator server, whose handler then reads the closed socket's end and prints an "
        "EOFError through socketserver (pyspark/accumulators.py); the query was already stopped.",
        then=r"socketserver\.py.*_handle_request_noblock",
    ),
    Allowed(
        ("spark-master", "spark-worker"),
        r"ERROR (Master|Worker): RECEIVED SIGNAL TERM",
        RESTARTED,
        "docker-compose stop's SIGTERM, which Spark's standalone master and worker log at ERROR "
        "before they exit; the restart brings both back, the master from its recovery state.",
    ),
    Allowed(
        KAFKA_NODES,
        r"ERROR \[ControllerApis nodeId=\d\] Unexpected error handling request "
        r"RequestHeader\(apiKey=(?:CONTROLLER_REGISTRATION|BROKER_HEARTBEAT),",
        (START_UP, *BROKER_KILLS),
        "The controller quorum elects its leader at the first start and again when a SIGKILLed node "
        "was the active controller; a node's registration or heartbeat that reaches a node which has "
        "just lost (or not yet taken up) the leadership is refused with NotControllerException, "
        "logged at ERROR, and sent again to the new leader (registration at start-up in runs 19 and "
        "20, a heartbeat in run 21's active-controller kill).",
        then=r"NotControllerException: (?:The active controller appears to be node \d|No controller appears "
        r"to be active)",
    ),
    Allowed(
        KAFKA_NODES,
        r"ERROR \[QuorumController id=\d\] Exceptionally slow controller event \w+(?:[\[(]| took \d+ ms)",
        (START_UP, *BROKER_KILLS),
        "Kafka logs every controller event slower than 2 s (controller.performance.always.log."
        "threshold.ms) at ERROR. On the suite's 2-core machine that happens when the whole deployment "
        "starts at once (three Kafka JVMs, two Spark drivers, the rest: up to 3.9 s in run 20) and when "
        "a SIGKILLed node, restarted, applies the metadata log it missed (4.5 s in run 19); anywhere "
        "else it is a controller starved of CPU, which the suite reports.",
    ),
    Allowed(
        KAFKA_NODES,
        r"ERROR \[QuorumController id=\d\] processExpiredBrokerHeartbeat: controller event queue "
        r"overloaded\. Timed out heartbeat from broker \d\.",
        (START_UP,),
        "The same CPU-starved start: the controller's event queue fell behind and a broker's heartbeat "
        "timed out in it (the broker is fenced, then unfenced at its next heartbeat; every service "
        "was healthy before the first test).",
    ),
    Allowed(
        KAFKA_NODES,
        r"ERROR \[ReplicaManager broker=\d\] Error processing append operation on partition \S+ ",
        TWO_DOWN,
        "With two of three nodes down, every partition's in-sync replicas shrink to the survivor, "
        "below min.insync.replicas=2: it refuses each acks=all write (the gateways' telemetry, the "
        "transaction coordinator's state), logged at ERROR, until a second node is back; that stall "
        "is what the test observes, and the writers retry.",
        then=r"NotEnoughReplicasException: The size of the current ISR : \d+ is insufficient to "
        r"satisfy the min\.isr requirement of 2",
    ),
    Allowed(
        KAFKA_NODES,
        r"ERROR \[ReplicaManager broker=\d\] Error processing append operation on partition "
        r"\S+:fleet\.telemetry-\d+ ",
        (*BROKER_KILLS, *MOSQUITTO_KILLS),
        "The telemetry partitions' leaders move: to another node at the kill, and back to the "
        "restarted one by Kafka's preferred-leader rebalance (checked every 300 s, so also in the test "
        "after the last broker fault). A gateway's idempotent producer has up to 5 batches in flight; "
        "those that reach the new leader after a gap are refused (OutOfOrderSequenceException, logged "
        "at ERROR) and librdkafka sends them again in order: each run reconciles every fix, once.",
        then=r"OutOfOrderSequenceException: Out of order sequence number for producer",
    ),
    Allowed(
        ("gateway-1", "gateway-2", "alerts", "api"),
        r"^%3\|[\d.]+\|FAIL\|[^|]+\| \[thrd:[^\]]+\]: (?:GroupCoordinator: )?(?:kafka-\d:9092\S*: )?"
        r"(?:Connect to ipv4#[\d.]+:9092 failed: Connection (?:refused|reset by peer)"
        r"|Failed to resolve 'kafka-\d:9092': Name or service not known)",
        BROKER_KILLS,
        "The Kafka clients of the services that reach the brokers directly (librdkafka, which logs "
        "at its level 3, err) reconnect to the SIGKILLed node: refused or reset while its process is "
        "dead, its name unknown while its container is stopped (Docker's DNS drops a stopped "
        "container); they use the other nodes meanwhile.",
    ),
    Allowed(
        ("toxiproxy",),
        r'"level":"error","name":"kafka-\d".*"error":"dial tcp(?: [\d.]+:9094: connect: connection '
        r'refused|: lookup kafka-\d on [\d.]+:53: no such host)".*"message":"Unable to open '
        r'connection to upstream"',
        BROKER_KILLS,
        "The suite's proxy between the Spark application and the brokers cannot reach the SIGKILLed "
        "node (refused while its process is dead, no such host while its container is stopped) and "
        "closes the client's connection; the application's clients use the other nodes' proxies.",
    ),
    Allowed(
        DRIVERS,
        r'"logger":"processor\.ops\.lease","msg":"lease lost key=\S+ owner=\S+ holder=\S+"',
        FENCES,
        "The frozen driver, woken after its lease expired, finds the lease held by the standby and "
        "fences itself (stops its query and exits for its restart policy): the freeze test asserts "
        "this line. With Redis SIGKILLed or cut off, the lease can expire too before the active "
        "driver renews it again; the standby takes it and the old driver fences itself the same way "
        "(run 28, the Redis kill).",
    ),
    Allowed(
        DRIVERS,
        r'"logger":"processor\.ops\.lease","msg":"lease not renewed for [\d.]+ s key=\S+ error=',
        ("test_sigkill_redis_and_restart", "test_partition_the_processor_from_redis"),
        "The checkpoint's lease lives in Redis: with Redis SIGKILLed (then loading its append-only "
        "file) or cut off, the running driver cannot renew it and fences itself within half the "
        "lease's time, before another driver could take it (the partition test asserts this line).",
    ),
    Allowed(
        DRIVERS,
        r"ERROR WriteToDataSourceV2Exec: Data source write support MicroBatchWrite\[epoch: \d+, writer: "
        r"org\.apache\.spark\.sql\.execution\.datasources\.v2\.python\.PythonStreamingWrite@\w+\] "
        r"(?:is aborting|aborted)\.",
        FENCES,
        "A driver that fences itself stops its query in the middle of a micro-batch; Spark aborts that "
        "batch's write (the sink's Kafka transaction is aborted, nothing of it is read) and the next "
        "lease holder runs the batch again from its planned offsets.",
    ),
    Allowed(
        DRIVERS,
        r"^%[013]\|[\d.]+\|(?:ADDPARTS|TXNERR|FATAL)\|rdkafka#producer-\d+\| \[thrd:main\]: "
        r"(?:TxnCoordinator/\d: Failed to add partition \"[\w.]+\" \[\d+\] to transaction: Broker: "
        r"Producer attempted an operation with an old epoch"
        r"|Fatal transaction error: Failed to add partitions to transaction: Local: This "
        r"instance has been fenced by a newer instance"
        r"|Fatal error: Local: This instance has been fenced by a newer instance)"
        r"|sink producer unusable \(fenced by another worker of this sink\?\), batch retried with a new one "
        r"sink_id=\w+ batch_id=\d+ error=KafkaError\{FATAL,code=_FENCED,"
        r"|ERROR MicroBatchExecution: Query fleetfence-processor \[id = [\w-]+, runId = [\w-]+\] terminated "
        r"with error",
        FENCES,
        "The fenced driver, woken or cut off, may still be committing a batch when the other takes the "
        "lease: the two drivers' sink producers share the checkpoint's transactional id, so each new "
        "one fences the other's (librdkafka logs the broker's refusal at its levels 3, 1 and 0); each "
        "sink takes a new producer, reads the markers again and commits its batch unless it is "
        "already committed, and the fenced driver's query then ends (run 23: batches 169 and 170, "
        "nothing lost or duplicated in the row).",
    ),
    Allowed(
        DRIVERS,
        r"^Traceback \(most recent call last\):",
        TWO_DOWN,
        SINK_OUTAGE,
        then=r'File "\S*/processor/spark/kafka_sink\.py", line \d+, in _transaction',
    ),
    Allowed(
        DRIVERS,
        r"ERROR WriteToDataSourceV2Exec: Data source write support MicroBatchWrite\[epoch: \d+, writer: "
        r"org\.apache\.spark\.sql\.execution\.datasources\.v2\.python\.PythonStreamingWrite@\w+\] "
        r"(?:is aborting|aborted)\.",
        TWO_DOWN,
        SINK_OUTAGE,
    ),
    Allowed(
        DRIVERS,
        r"ERROR MicroBatchExecution: Query fleetfence-processor \[id = [\w-]+, runId = [\w-]+\] terminated "
        r"with error",
        TWO_DOWN,
        SINK_OUTAGE,
        then=r"Failed when Python streaming data source perform commit",
    ),
    Allowed(
        ("alerts",),
        r"FATAL\|fleetfence-alerts-\w+#consumer-\d+\| \[thrd:main\]: Fatal error: Broker: Static consumer "
        r"fenced by other consumer with same group\.instance\.id",
        BROKER_KILLS,
        "Two of three nodes down: the receivers' static group members miss their heartbeats while the "
        "group coordinator cannot write, and the coordinator fences the old member when it rejoins; "
        "librdkafka calls that fatal for the consumer, and the receiver replaces it in place and reads "
        "on from its committed offsets (run 26: nothing lost, no alert twice).",
    ),
    Allowed(
        KAFKA_NODES,
        r"ERROR \[GroupCoordinator id=\d topic=__consumer_offsets partition=\d+\] The write event "
        r"Timeout\(tp=__consumer_offsets-\d+, key=(?:heartbeat|join)-fleetfence\.",
        BROKER_KILLS,
        "The group coordinator's heartbeat and join timers cannot write to __consumer_offsets while "
        "its in-sync replicas are below min.insync.replicas (two of three nodes down, run 26); the "
        "members rejoin once a second node is back.",
    ),
    Allowed(
        ("alerts",),
        r'"level":"ERROR","logger":"alerts\.runner","msg":"receiver step failed, retrying receiver=\w+ '
        r"attempt=\d+ delay_s=[\d.]+ error=Error (?:while reading from|\d+ connecting to) redis:6379",
        ("test_sigkill_redis_and_restart",),
        "The history and MQTT receivers keep their de-duplication in Redis: with Redis SIGKILLed a step "
        "fails, and the receiver retries the same alerts with its backoff, its consumer offset not "
        "committed until Redis answers (run 26).",
    ),
    Allowed(
        DRIVERS,
        r"ERROR TorrentBroadcast: Store broadcast broadcast_\d+ fail, remove all pieces of the broadcast",
        FENCES,
        "The fencing driver stops its query while Spark plans the next micro-batch: the interrupted "
        "planning cannot store that batch's broadcast, which Spark logs at ERROR and discards.",
    ),
    Allowed(
        DRIVERS,
        r"^error: the checkpoint's lease \S+ is no longer\b",  # rich may wrap the rest
        FENCES,
        "The fenced driver's own last word (`fleetfence processor` exits with it, status 2, and its "
        "restart policy starts it again as the next standby).",
    ),
    Allowed(
        DRIVERS,
        r"ERROR TaskSchedulerImpl: Lost executor \d+ on spark-worker: worker lost",
        ("test_sigkill_the_spark_worker",),
        "The Spark worker SIGKILLed takes each driver's executor with it; each driver's scheduler "
        "reports the loss and gets a new executor when the worker is back.",
    ),
    Allowed(
        DRIVERS,
        r"ERROR TaskSchedulerImpl: Lost executor \d+ on spark-worker: Runner thread for executor "
        r"app-\d+-\d+/\d+ interrupted",
        ("test_restart_the_spark_master",),
        "The restarted master recovers the worker while the worker is reconnecting on its own; in run "
        "20 it registered twice ('Duplicate registration at master'), and the master had it kill both "
        "applications' executors and launched new ones a second later: each driver reports its lost "
        "executor and keeps running (the test checks that no driver restarted).",
    ),
    Allowed(
        ("spark-worker",),
        r"ERROR Worker: Connection to master failed! Waiting for master to reconnect\.\.\.",
        ("test_restart_the_spark_master",),
        "The Spark master SIGKILLed: the worker loses it until the restart policy brings it back and "
        "it recovers the worker from its recovery folder.",
    ),
    Allowed(
        ("alerts",),
        r'"logger":"alerts\.runner","msg":"receiver step failed, retrying receiver=mqtt attempt=\d+ '
        r"delay_s=[\d.]+ error=publish of \w+ failed: Message publish failed: The client is not "
        r'currently connected\."',
        MOSQUITTO_KILLS,
        "The MQTT alert receiver publishes to the SIGKILLed broker: each publish fails until paho has "
        "reconnected, and the receiver retries the same alert with its backoff, its consumer offset "
        "not committed until the broker has it (run 22, CI of 2026-12-07: three attempts, 0.6 s).",
    ),
    Allowed(
        DRIVERS,
        r"ERROR TransportRequestHandler: Error sending result RpcResponse\[.*\] to /[\d.]+:\d+; "
        r"closing connection",
        FENCES,
        "The fencing driver stops its query mid-batch (the sink aborts the batch) and exits: an "
        "executor's RPC answer still on its way finds the channel closed (run 24, the Redis row).",
        then=r"ClosedChannelException",
    ),
    Allowed(
        (*DRIVERS, "spark-worker"),
        r"ERROR TransportResponseHandler: Still have \d+ requests? outstanding when connection from "
        r"\S+ is closed",
        ("test_sigkill_the_spark_worker", "test_restart_the_spark_master"),
        "Spark's RPC client names the requests it had in flight on a connection the other side's "
        "SIGKILL closed: a driver's to its lost executor, the worker's to the killed master. Spark "
        "retries them against the new executor or the restarted master.",
    ),
    Allowed(
        DRIVERS,
        r'"logger":"processor\.ops\.service","msg":"processor stalled, exiting for a restart: no '
        r"micro-batch completed for \d+ s while one was running",
        ("test_sigkill_the_spark_worker",),
        "The batch that lost its executor runs again on a new one, which first starts its JVM, the "
        "Python workers and the state store from the checkpoint; on the suite's 2-core machine beside "
        "the whole deployment that has taken over the stall guard's 120 s (CI of 2026-12-07): the "
        "driver exits, the hot standby takes the lease and the batch runs there. The test waits for "
        "batches from either driver (`batch_progress`).",
    ),
    Allowed(
        DRIVERS,
        r"^%3\|[\d.]+\|FAIL\|[^|]+\| \[thrd:[^\]]+\]: (?:(?:GroupCoordinator|TxnCoordinator): )?"
        r"toxiproxy:\d+\S*: Connect to ipv4#[\d.]+:\d+ failed: Connection refused",
        ("test_cut_the_connections_between_spark_and_kafka",),
        "The active driver's connections to the brokers' proxies are answered with TCP resets "
        "(iptables REJECT --reject-with tcp-reset) while the cut lasts: each new connection is "
        "refused, which librdkafka logs at its level 3.",
    ),
)


@dataclass(frozen=True)
class Window:
    """One test's stretch of the session: from its start to the next test's start."""

    test: str
    start: datetime
    fault: bool = False  # the test injects a fault (tests_deploy/test_faults.py)


@dataclass(frozen=True)
class LogLine:
    service: str
    at: datetime | None
    test: str
    text: str
    next: str = ""  # the service's next line
    fault: bool = False  # logged during a test that injects a fault

    def __str__(self) -> str:
        at = self.at.isoformat(timespec="milliseconds") if self.at else "?"
        return f"{self.service} [{self.test}] {at} {self.text}"


@dataclass
class Verdict:
    unexpected: list[LogLine] = field(default_factory=list)
    allowed: Counter[str] = field(default_factory=Counter)  # entry's reason -> lines it allowed
    errors: int = 0
    lines: int = 0

    def summary(self) -> str:
        out = [
            f"deploy-test logs: {self.lines} lines, {self.errors} error lines, "
            f"{len(self.unexpected)} unexpected"
        ]
        out += [f"  allowed {n:>5}  {reason[:110]}" for reason, n in self.allowed.most_common()]
        return "\n".join(out)


STAMP_RE = re.compile(r"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(?:\.(\d+))?Z (.*)$")


def parse_stamped(line: str) -> tuple[datetime | None, str]:
    """A `docker logs -t` line: (its time, the service's own text)."""
    m = STAMP_RE.match(line)
    if m is None:
        return None, line
    frac = (m.group(2) or "0")[:6].ljust(6, "0")  # Docker's nanoseconds, to Python's microseconds
    at = datetime.fromisoformat(f"{m.group(1)}.{frac}").replace(tzinfo=UTC)
    return at, m.group(3)


def docker_time(text: str) -> datetime:
    """A time as Docker writes it (`State.StartedAt`: RFC 3339, nanoseconds, UTC)."""
    at, _ = parse_stamped(f"{text} -")
    if at is None:
        raise ValueError(f"not a Docker time: {text!r}")
    return at


def window_of(at: datetime | None, windows: list[Window]) -> Window:
    """The test window `at` falls in; START_UP's before the first."""
    current = Window(START_UP, datetime.min.replace(tzinfo=UTC))
    if at is None:
        return current
    for w in windows:
        if w.start <= at:
            current = w
        else:
            break
    return current


def test_of(at: datetime | None, windows: list[Window]) -> str:
    """The test during whose window `at` falls; START_UP before the first."""
    return window_of(at, windows).test


OWN_TIME_RE = re.compile(r"^(\d{10}): ")  # Mosquitto's: seconds since the epoch


def logged_at(docker_at: datetime | None, body: str) -> datetime | None:
    """When the line was logged: its own time where it has one Docker may have received late
    (Mosquitto writes its log through a buffered stdout: Docker's times of its lines trail theirs
    by up to minutes), else Docker's."""
    m = OWN_TIME_RE.match(body)
    if m is not None:
        return datetime.fromtimestamp(int(m.group(1)), UTC)
    return docker_at


def check(logs: dict[str, str], windows: list[Window], allowed: tuple[Allowed, ...] = ALLOWED) -> Verdict:
    """Every service's stamped log (`docker logs -t`) against the allow-list."""
    verdict = Verdict()
    windows = sorted(windows, key=lambda w: w.start)
    for service, text in sorted(logs.items()):
        lines = [parse_stamped(raw) for raw in text.splitlines()]
        for i, (docker_at, body) in enumerate(lines):
            verdict.lines += 1
            if not ERROR_LINE.search(body):
                continue
            verdict.errors += 1
            at = logged_at(docker_at, body)
            following = lines[i + 1][1] if i + 1 < len(lines) else ""
            window = window_of(at, windows)
            line = LogLine(service, at, window.test, body, following, fault=window.fault)
            entry = next((a for a in allowed if a.matches(line)), None)
            if entry is None:
                verdict.unexpected.append(line)
            else:
                verdict.allowed[entry.reason] += 1
    return verdict


def save(path: Path, logs: dict[str, str], windows: list[Window]) -> None:
    """The session's logs and test windows in one file, which `load` reads back."""
    with path.open("w") as out:
        for w in windows:
            out.write(f"=== window {w.start.isoformat()} {w.test}{' fault' if w.fault else ''}\n")
        for service, text in sorted(logs.items()):
            out.write(f"=== service {service}\n{text}")
            if text and not text.endswith("\n"):
                out.write("\n")


def load(path: Path) -> tuple[dict[str, str], list[Window]]:
    """A session's logs as `save` (the suite, at its end) wrote them."""
    windows: list[Window] = []
    logs: dict[str, list[str]] = {}
    current: list[str] | None = None
    for line in path.read_text().splitlines():
        if line.startswith("=== window "):
            at, _, rest = line.removeprefix("=== window ").partition(" ")
            test, _, fault = rest.partition(" ")
            windows.append(Window(test, datetime.fromisoformat(at), fault=fault == "fault"))
        elif line.startswith("=== service "):
            current = logs.setdefault(line.removeprefix("=== service "), [])
        elif current is not None:
            current.append(line)
    return {k: "\n".join(v) for k, v in logs.items()}, windows


if __name__ == "__main__":
    # A saved session's logs against the allow-list as it is now:
    #   python -m tests_deploy.logcheck /var/tmp/fleetfence-deploy-logs/<stamp>-session.log [policy]
    # (logs saved before the windows said which tests inject faults count as `strict`)
    policy = sys.argv[2] if len(sys.argv) > 2 else "faults"
    verdict = check(*load(Path(sys.argv[1])))
    print(verdict.summary())
    failing = [line for line in verdict.unexpected if fails(line, policy)]
    for unexpected in verdict.unexpected:
        print(("FAILS " if unexpected in failing else "noted ") + str(unexpected)[:400])
    sys.exit(1 if failing else 0)
