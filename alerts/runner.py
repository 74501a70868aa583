"""The receiver framework: one consumer group per receiver, side effect, then mark, then commit.

For each record a runner does, in this order:

1. parse it (an invalid record is dead-lettered with the reason, never dropped silently),
2. apply the receiver's filter,
3. skip it when the de-duplication store already holds its `alert_id`,
4. perform the side effect (the sink),
5. record the `alert_id` in the de-duplication store,
6. commit the offset (periodically, and synchronously on revoke and stop).

A sink that batches (`HoldingSink`, the e-mail receiver) may hold an alert at step 4: steps 4 and 5
then happen later, when the sink `settle`s it, and until then no offset at or past the held alert is
committed (step 6 stops short of it), so a crash or a rebalance makes it be read again.

A crash between 4 and 5 repeats the side effect on restart (at-least-once for that one alert);
a crash between 5 and 6 only re-reads records that step 3 then skips. Sinks whose side effect is
idempotent by construction (the history store's `SET NX`) skip the external store for alerts; it
still records which invalid records were dead-lettered, so a replay does not dead-letter them twice.

The consumer reads `read_committed`, so records of aborted processor transactions never reach a
sink. One alert is handled at a time per receiver, which keeps per-vehicle order (alerts are keyed
by vehicle) at the price of head-of-line blocking while a webhook retries; the retry budget is
bounded by the config (see `WebhookConfig`).
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from confluent_kafka import (
    OFFSET_INVALID,
    Consumer,
    KafkaError,
    KafkaException,
    Message,
    TopicPartition,
)

from alerts.dead_letters import DeadLetters
from alerts.dedup import Dedup
from alerts.errors import FatalConsumerError, StopRequestedError
from alerts.metrics import ReceiverMetrics
from alerts.model import INVALID_ALERT, Alert, AlertFilter, SourceRecord, parse_alert
from alerts.sink import Context, HoldingSink, Outcome, Settled, Sink
from fleetfence.errors import ContractError, KafkaDeliveryError, LifecycleError
from fleetfence.kafka import group_consumer

logger = logging.getLogger(__name__)

LAG_INTERVAL_S = 2.0
MAX_ERROR_BACKOFF_S = 5.0
#: A consumer dead of a fatal error is replaced in place at most this often in the window (`run`).
FENCED_LIMIT = 3
FENCED_WINDOW_S = 300.0
#: A pause before the replacement joins, so a coordinator still moving does not use the budget up.
REPLACE_PAUSE_S = 1.0


@dataclass(frozen=True)
class RunnerOptions:
    bootstrap: str
    topic: str
    group_id: str
    commit: bool = True
    commit_interval_ms: int = 1000
    from_latest: bool = False
    #: Static group membership (`group.instance.id`): a process restarted after a crash takes its
    #: partitions back at once, without a rebalance, instead of waiting for the broker to expire
    #: the dead member (docs/alerts.md).
    instance_id: str | None = None
    batch_size: int = 500
    consumer_overrides: dict[str, Any] | None = None


class ReceiverRunner:
    """Runs one receiver on its own thread and consumer group; `start()`/`stop()` in-process."""

    def __init__(
        self,
        name: str,
        sink: Sink,
        *,
        alert_filter: AlertFilter,
        options: RunnerOptions,
        dedup: Dedup,
        metrics: ReceiverMetrics,
        dead_letters: DeadLetters | None,
    ) -> None:
        self.name = name
        self.sink = sink
        self.holding: HoldingSink | None = sink if isinstance(sink, HoldingSink) else None
        self.filter = alert_filter
        self.options = options
        self.dedup = dedup
        self.metrics = metrics
        self.dead_letters = dead_letters
        self.error: BaseException | None = None
        self._stop = threading.Event()
        self._assigned = threading.Event()
        # The partitions this member owns, kept by the rebalance callbacks (which run inside
        # consume()): a record of a partition revoked during the consume() that returned it is
        # left to its new owner, which starts from the offset committed at the revocation.
        self._owned: set[tuple[str, int]] = set()
        self._thread: threading.Thread | None = None
        # Next offset to commit per partition, for everything handled since the assignment; kept
        # after a commit so the synchronous commit on stop and revoke re-sends all of it (an async
        # commit that failed or was still in flight at close would otherwise be lost silently).
        self._processed: dict[tuple[str, int], int] = {}
        self._sent: dict[tuple[str, int], int] = {}
        self._last_commit = time.monotonic()
        self._last_lag = 0.0
        self.on_alert: Callable[[Alert, Outcome], None] | None = None

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> ReceiverRunner:
        if self._thread is not None:
            raise LifecycleError(f"receiver {self.name} already started")
        self._thread = threading.Thread(target=self._main, name=f"alerts-{self.name}", daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout_s: float = 30.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout_s)
            if self._thread.is_alive():
                logger.error("receiver did not stop in time receiver=%s", self.name)

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    @property
    def partitions(self) -> frozenset[tuple[str, int]]:
        """The (topic, partition) pairs this member of the group owns now."""
        return frozenset(self._owned)

    def wait_assigned(self, timeout_s: float) -> bool:
        """True once the group gave this receiver its partitions (for tests and the demo)."""
        return self._assigned.wait(timeout_s)

    def _main(self) -> None:
        try:
            self.run()
        except BaseException as exc:  # reported by the service, which exits non-zero
            self.error = exc
            logger.exception("receiver crashed receiver=%s", self.name)

    # ------------------------------------------------------------------ loop

    def run(self) -> None:
        """Run until stopped, replacing a consumer that died of a fatal error.

        A static member fenced by the group (librdkafka's fatal error) has a dead consumer. A
        coordinator's move can fence a member with no second process using its id, so the runner
        closes the dead consumer, drops what it owned (re-read from the committed offsets, where
        de-duplication skips what was handled) and joins again with a new one. The process goes
        on, with its counters: a restarted receivers service is one an attached load test can no
        longer account for (loadtest.installation). Fenced more than `FENCED_LIMIT` times in
        `FENCED_WINDOW_S` most likely means a second process runs with the same
        `group.instance.id` (each would fence the other for ever): the receiver ends, and its
        service exits non-zero.
        """
        fenced_at: list[float] = []
        try:
            while True:
                consumer = self._open_consumer()
                try:
                    self._loop(consumer)
                except FatalConsumerError as exc:
                    self._abandon(consumer)
                    now = time.monotonic()
                    fenced_at = [t for t in fenced_at if now - t < FENCED_WINDOW_S] + [now]
                    if len(fenced_at) > FENCED_LIMIT:
                        raise KafkaDeliveryError(
                            f"{exc}; {len(fenced_at)} times in {FENCED_WINDOW_S:.0f} s: does another"
                            f" process use the same group.instance.id ({self.options.instance_id})?"
                        ) from exc
                    self.metrics.consumer_replaced()
                    logger.warning(
                        "consumer replaced after a fatal error receiver=%s instance=%s error=%s",
                        self.name,
                        self.options.instance_id,
                        exc,
                    )
                    if self._stop.wait(REPLACE_PAUSE_S):  # stopping: no new member to join and leave
                        return
                    continue
                except BaseException:
                    self._close(consumer)
                    raise
                self._close(consumer)
                return
        finally:
            self.sink.close()
            logger.info("receiver stopped receiver=%s %s", self.name, self.metrics.snapshot())

    def _open_consumer(self) -> Consumer:
        o = self.options
        overrides: dict[str, Any] = {"client.id": f"fleetfence-alerts-{self.name}"}
        if o.from_latest:
            overrides["auto.offset.reset"] = "latest"
        if o.instance_id is not None:
            overrides["group.instance.id"] = o.instance_id
        overrides.update(o.consumer_overrides or {})
        overrides["on_commit"] = self._on_commit
        consumer = group_consumer(o.bootstrap, o.group_id, **overrides)

        # Cooperative rebalancing (fleetfence.kafka.group_consumer): each callback gets only the
        # partitions that move, and librdkafka assigns or unassigns exactly those (incrementally)
        # after the callback returns, since none of them assigns by itself.
        def on_assign(c: Consumer, parts: list[TopicPartition]) -> None:
            self._owned |= {(tp.topic, tp.partition) for tp in parts}
            logger.info(
                "partitions assigned receiver=%s instance=%s added=%s owned=%s",
                self.name,
                o.instance_id,
                sorted(tp.partition for tp in parts),
                sorted(p for _, p in self._owned),
            )
            self._assigned.set()

        def on_revoke(c: Consumer, parts: list[TopicPartition]) -> None:
            # Everything handled so far is committed before the partitions move, so their next
            # owner starts after it; the partitions this member keeps are committed along.
            try:
                self._commit(c, synchronous=True)
            except KafkaException as exc:  # the next owner re-reads; de-duplication skips repeats
                logger.warning("offset commit on revoke failed receiver=%s error=%s", self.name, exc)
            self._forget(parts)  # with what the sink holds of them: committed before it, re-read
            logger.info(
                "partitions revoked receiver=%s instance=%s removed=%s owned=%s",
                self.name,
                o.instance_id,
                sorted(tp.partition for tp in parts),
                sorted(p for _, p in self._owned),
            )

        def on_lost(c: Consumer, parts: list[TopicPartition]) -> None:
            # The group moved on without this member (e.g. its session expired): the partitions
            # may have another owner already, so a commit would be refused; they are re-read from
            # the last committed offset and de-duplication skips what was handled here.
            self._forget(parts)
            logger.warning(
                "partitions lost receiver=%s instance=%s lost=%s",
                self.name,
                o.instance_id,
                sorted(tp.partition for tp in parts),
            )

        consumer.subscribe([o.topic], on_assign=on_assign, on_revoke=on_revoke, on_lost=on_lost)
        logger.info(
            "receiver started receiver=%s group=%s topic=%s filter=%s",
            self.name,
            o.group_id,
            o.topic,
            self.filter.describe(),
        )
        return consumer

    def _loop(self, consumer: Consumer) -> None:
        o = self.options
        while not self._stop.is_set():
            # What is queued already, at once; when nothing is, wait for the next record and
            # take it as soon as it comes (consume() would hold it until its timeout for want
            # of a full batch).
            msgs = consumer.consume(o.batch_size, 0)
            if not msgs:
                first = consumer.poll(0.2)
                msgs = [first] if first is not None else []
            try:
                for m in msgs:
                    self._one(m)
                self._settle()
            except StopRequestedError:
                break
            self._advance_past_markers(consumer)
            self._maybe_commit(consumer)
            self._maybe_lag(consumer)

    def _close(self, consumer: Consumer) -> None:
        try:
            self._commit(consumer, synchronous=True)
        except Exception as exc:  # the next run re-reads; de-duplication makes that harmless
            logger.error("final offset commit failed receiver=%s error=%s", self.name, exc)
        try:
            consumer.close()
        finally:
            # A static member's close may revoke nothing: what it still holds is released here,
            # unsent and uncommitted, for the next run to read again (counted once: a partition
            # already revoked during the close is no longer owned).
            self._forget([TopicPartition(t, p) for t, p in self._owned])

    def _abandon(self, consumer: Consumer) -> None:
        """Close a dead consumer without committing (a fenced member's commits are refused) and drop
        everything it owned: its successor starts from the committed offsets."""
        try:
            consumer.close()
        except Exception as exc:  # it is dead already; its successor is what matters
            logger.warning("closing a dead consumer failed receiver=%s error=%s", self.name, exc)
        self._forget([TopicPartition(t, p) for t, p in self._owned])
        self._processed.clear()
        self._sent.clear()
        self._assigned.clear()

    def _forget(self, parts: list[TopicPartition]) -> None:
        for tp in parts:
            key = (tp.topic, tp.partition)
            self._owned.discard(key)
            self._processed.pop(key, None)
            self._sent.pop(key, None)
        if self.holding is not None:
            self.metrics.released(self.holding.release((tp.topic, tp.partition) for tp in parts))
            self.metrics.held(self.holding.held_count())

    def _one(self, m: Message) -> None:
        err = m.error()
        if err is not None:
            # A fatal error leaves the consumer unusable: e.g. fenced by a member with the same
            # group.instance.id. The event carries the `_FATAL` code with `fatal()` false, so both
            # are checked; `run` replaces the consumer instead of polling a dead one and delivering
            # nothing more.
            if err.fatal() or err.code() == KafkaError._FATAL:
                raise FatalConsumerError(f"receiver {self.name}: fatal consumer error: {err}")
            if err.code() != KafkaError._PARTITION_EOF:
                logger.warning("consumer error receiver=%s error=%s", self.name, err)
            return
        if (m.topic(), m.partition()) not in self._owned:
            logger.debug("record of a revoked partition left to its new owner receiver=%s", self.name)
            return
        self.metrics.consumed()
        src = SourceRecord(m.topic(), m.partition(), m.offset(), m.key())
        self._with_retries(lambda: self._process(src, m.value()))
        self._processed[(src.topic, src.partition)] = src.offset + 1

    def _with_retries(self, step: Callable[[], None]) -> None:
        """Repeat a step whose infrastructure failed (Redis, MQTT or Kafka down) until it succeeds.

        Skipping the alert would lose it and committing past it would too, so the receiver pauses
        instead; the offset stays uncommitted and a stop leaves the alert for the next run.
        """
        attempt = 0
        while True:
            try:
                step()
                return
            except (StopRequestedError, ContractError):
                raise
            except Exception as exc:
                attempt += 1
                delay_s = min(MAX_ERROR_BACKOFF_S, 0.1 * 2**attempt)
                logger.error(
                    "receiver step failed, retrying receiver=%s attempt=%s delay_s=%.1f error=%s",
                    self.name,
                    attempt,
                    delay_s,
                    exc,
                )
                self.metrics.retried()
                if self._stop.wait(delay_s):
                    raise StopRequestedError("stopping while infrastructure is failing") from exc

    def _process(self, src: SourceRecord, value: bytes | None) -> None:
        try:
            alert = parse_alert(value)
        except ContractError as exc:
            self._dead_letter_invalid(src, value, exc)
            return
        if not self.filter.matches(alert):
            self.metrics.filtered()
            return
        if not self.sink.idempotent and self.dedup.seen(alert.alert_id):
            self.metrics.duplicate()
            self._notify(alert, Outcome.DUPLICATE)
            return
        ctx = Context(src, self.metrics, self.dead_letters, self._stop)
        outcome = self.sink.deliver(alert, ctx)
        if outcome is Outcome.HELD:
            return
        self._record(alert, outcome)

    def _settle(self) -> None:
        """Let a batching sink perform what is due and record the alerts it completed."""
        holding = self.holding
        if holding is None:
            return
        settled: list[Settled] = []

        def step() -> None:
            settled.extend(holding.settle(time.monotonic()))

        self._with_retries(step)
        self.metrics.held(holding.held_count())
        for s in settled:
            self._with_retries(functools.partial(self._record, s.alert, s.outcome))

    def _record(self, alert: Alert, outcome: Outcome) -> None:
        if not self.sink.idempotent and outcome is not Outcome.DUPLICATE:
            self.dedup.mark(alert.alert_id)
        if outcome is Outcome.DELIVERED:
            self.metrics.delivered()
        elif outcome is Outcome.DEAD_LETTERED:
            self.metrics.dead_lettered()
        else:
            self.metrics.duplicate()
        self._notify(alert, outcome)

    def _notify(self, alert: Alert, outcome: Outcome) -> None:
        if self.on_alert is not None:
            self.on_alert(alert, outcome)

    def _dead_letter_invalid(self, src: SourceRecord, value: bytes | None, exc: ContractError) -> None:
        logger.warning(
            "invalid alert receiver=%s partition=%s offset=%s reason=%s detail=%s",
            self.name,
            src.partition,
            src.offset,
            exc.reason,
            exc,
        )
        if self.dead_letters is not None:
            # De-duplicated by position: an invalid record has no trustworthy alert_id.
            marker = f"invalid:{src.topic}:{src.partition}:{src.offset}"
            if self.dedup.seen(marker):
                self.metrics.duplicate()
                return
            self.dead_letters.send(src, value, INVALID_ALERT, str(exc))
            self.dedup.mark(marker)
        self.metrics.dead_lettered()

    # ------------------------------------------------------------------ offsets and lag

    def _advance_past_markers(self, consumer: Consumer) -> None:
        """After a fully handled batch (or an empty poll), commit each assigned partition's position,
        which (read_committed) already skips transaction markers and aborted records. Committing only
        `last + 1` would leave a permanent lag of one marker per partition, and a partition that holds
        only aborted transactions delivers nothing at all, so it would never be committed. The
        position covers only what was handed to us (all handled by now) or skipped by the client;
        before the first fetch it is invalid and left alone."""
        assignment = consumer.assignment()
        if not assignment:
            return
        for tp in consumer.position(assignment):
            key = (tp.topic, tp.partition)
            if tp.offset != OFFSET_INVALID and tp.offset > self._processed.get(key, OFFSET_INVALID):
                self._processed[key] = tp.offset

    def _committable(self) -> dict[tuple[str, int], int]:
        """The offsets handled so far, each stopped at the first alert a batching sink still holds."""
        if self.holding is None:
            return self._processed
        held = self.holding.held_from()
        return {k: min(v, held.get(k, v)) for k, v in self._processed.items()}

    def _maybe_commit(self, consumer: Consumer) -> None:
        if self._committable() == self._sent:
            return
        if (time.monotonic() - self._last_commit) * 1000 >= self.options.commit_interval_ms:
            self._commit(consumer, synchronous=False)

    def _commit(self, consumer: Consumer, *, synchronous: bool) -> None:
        if not self.options.commit or not self._processed:
            return
        committable = self._committable()
        todo = (
            committable if synchronous else {k: v for k, v in committable.items() if self._sent.get(k) != v}
        )
        if not todo:
            return
        offsets = [TopicPartition(t, p, off) for (t, p), off in todo.items()]
        if synchronous:
            result = consumer.commit(offsets=offsets, asynchronous=False) or []
            failed = [tp for tp in result if tp.error is not None]
            if failed:
                logger.error("offset commit failed receiver=%s partitions=%s", self.name, failed)
            logger.debug("offsets committed receiver=%s offsets=%s", self.name, result)
        else:
            consumer.commit(offsets=offsets, asynchronous=True)
        self._sent.update(todo)
        self._last_commit = time.monotonic()

    def _on_commit(self, err: KafkaError | None, parts: list[TopicPartition]) -> None:
        failed = [tp for tp in parts if tp.error is not None]
        if err is not None or failed:
            logger.warning("offset commit failed receiver=%s error=%s partitions=%s", self.name, err, failed)
            for tp in failed:  # resend on the next periodic commit
                self._sent.pop((tp.topic, tp.partition), None)

    def _maybe_lag(self, consumer: Consumer) -> None:
        now = time.monotonic()
        if now - self._last_lag < LAG_INTERVAL_S:
            return
        self._last_lag = now
        try:
            assignment = consumer.assignment()
            if not assignment:
                return
            # The watermarks every fetch response carries, cached by librdkafka: asking the broker
            # (cached=False) queues behind the fetch it holds for fetch.wait.max.ms, which would
            # stall the loop for that long per partition and delay alerts by as much.
            total = 0
            for tp in consumer.position(assignment):
                lo, hi = consumer.get_watermark_offsets(TopicPartition(tp.topic, tp.partition), cached=True)
                if hi < 0:  # not fetched yet
                    continue
                total += max(0, hi - (tp.offset if tp.offset >= 0 else lo))
            self.metrics.lag(total)
        except Exception as exc:  # lag is informational; never stop delivering for it
            logger.debug("lag unavailable receiver=%s error=%s", self.name, exc)
