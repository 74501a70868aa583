"""Helpers that tests, benchmarks and the demo share (the bytewax `testing` module's idea).

Waiting is always "poll a condition until a deadline", never a sleep that hopes: `wait_for` is the
one implementation, so every wait in the suite fails the same way, naming what it waited for and
the last value it saw.
"""

from __future__ import annotations

import hashlib
import hmac
import time
import uuid
from collections.abc import Callable
from typing import Any, Literal, TypeVar

from confluent_kafka import KafkaError, TopicPartition

from fleetfence.errors import WaitTimeoutError
from fleetfence.kafka import group_consumer, watermarks
from fleetfence.mqtt import Account, DynSec, acl, service_account
from fleetfence.settings import Settings

T = TypeVar("T")


def wait_for(
    check: Callable[[], T | Literal[False] | None],
    timeout_s: float,
    what: str,
    *,
    interval_s: float = 0.05,
    ignore: tuple[type[BaseException], ...] = (),
) -> T:
    """Call `check` until it returns something truthy and return that (typed without the None or
    False a check returns for "not yet"); at the deadline raise
    WaitTimeoutError naming `what` and the last value. Exceptions of the `ignore` types count as
    "not yet" (a server still starting), any other propagates at once."""
    deadline = time.monotonic() + timeout_s
    last: object = None
    while True:
        try:
            value = check()
        except ignore as exc:
            last = exc
        else:
            if value:
                return value
            last = value
        if time.monotonic() > deadline:
            raise WaitTimeoutError(f"timed out after {timeout_s}s waiting for {what} (last: {last!r})")
        time.sleep(interval_s)


def read_all(settings: Settings, topic: str, partitions: int, timeout_s: float = 10.0) -> list[Any]:
    """Every committed record of a topic (confluent-kafka messages), read_committed, up to the end
    it had when called: what a test or a benchmark compares against what it expected."""
    c = group_consumer(
        settings.bootstrap_servers, f"read-{uuid.uuid4().hex}", **{"enable.partition.eof": True}
    )
    tps = [TopicPartition(topic, p, 0) for p in range(partitions)]
    ends = {p: watermarks(c, topic, p, timeout_s)[1] for p in range(partitions)}
    c.assign(tps)
    out: list[Any] = []
    done = {p for p, e in ends.items() if e == 0}
    deadline = time.monotonic() + timeout_s
    while len(done) < partitions and time.monotonic() < deadline:
        for m in c.consume(1000, 0.2):
            if m.error() is not None:
                if m.error().code() == KafkaError._PARTITION_EOF and m.offset() >= ends[m.partition()]:
                    done.add(m.partition())
                continue
            out.append(m)
            if m.offset() >= ends[m.partition()] - 1:
                done.add(m.partition())
        for p in range(partitions):
            if p not in done and c.position([TopicPartition(topic, p)])[0].offset >= ends[p]:
                done.add(p)
    c.close()
    return out


TEST_ACCOUNT = "fleetfence-test"
_test_accounts: dict[tuple[str, int], Account] = {}


def mqtt_test_account(settings: Settings) -> Account | None:
    """An MQTT account for tests, benchmarks and tools that publish as any vehicle and read any
    topic (a fuzzer, a subscriber checking the fan-out): created in the broker through the
    admin account, never used by a service. Its secret derives from the admin secret, so every
    process on the machine computes the same one. None when MQTT authentication is off."""
    admin = service_account(settings, "admin")
    if admin is None:
        return None
    where = settings.mqtt_host_port
    found = _test_accounts.get(where)
    if found is not None:
        return found
    secret = hmac.new(admin.password.encode(), TEST_ACCOUNT.encode(), hashlib.sha256).hexdigest()
    account = Account(TEST_ACCOUNT, secret)
    control = DynSec(*where, admin)
    try:
        control.ensure_account(
            account,
            [
                # `#` never matches a topic starting with `$` ($CONTROL, $SYS): not the plugin's control.
                acl("publishClientSend", "#"),
                acl("subscribePattern", "#"),
                acl("publishClientReceive", "#"),
            ],
        )
    finally:
        control.close()
    _test_accounts[where] = account
    return account
