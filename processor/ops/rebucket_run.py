"""`fleetfence rebucket`: the re-bucketing run, on Spark and under the old checkpoint's lease.

The steps and why they are safe are in `processor.spark.rebucket` (the pure split, the checkpoint files
and the state reader); this module drives them: take the lease, drain the old checkpoint, read and
split its state, write the seeded new checkpoint, retire the old one. A run cut short is finished
by running it again with the same target.
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime
from typing import Any

import orjson

from fleetfence.errors import ConfigError
from processor.errors import LeaseLostError, ProcessorError
from processor.ops.lease import CheckpointLease, checkpoint_lease
from processor.settings import ProcessorSettings
from processor.spark.checkpoint_files import HadoopCheckpointFiles
from processor.spark.job import start_query
from processor.spark.layout import LAYOUT_FILE, LEGACY_BUCKETS
from processor.spark.rebucket import (
    RETIRED_FILE,
    SEED_STATE,
    Seed,
    batch_end_offsets,
    last_committed_batch,
    read_bucket_states,
    read_seed,
    refuse_retired,
    split_buckets,
    state_bytes,
    write_seed,
)
from processor.spark.session import build_session, processor_partitions, spark_master_url

logger = logging.getLogger(__name__)


def run_rebucket(s: ProcessorSettings, target: str, buckets: int, spark: Any = None) -> Seed:
    """Move the checkpoint's vehicle state to `buckets` buckets in the new checkpoint `target`
    (the steps and why: processor.spark.rebucket). The processor must be stopped: its lease is taken
    for the whole run, so none can start on the old checkpoint meanwhile. Runs on `spark` when
    given (left running), else on a session of its own."""
    lease = checkpoint_lease(s)
    if lease is not None:
        if not lease.try_acquire():
            raise ConfigError(
                f"a processor holds the checkpoint {s.checkpoint} (lease {lease.key}, {lease.holder()}): "
                "stop it before re-bucketing"
            )
        lease.start_renewing()
    own = None
    try:
        if spark is None:
            spark = own = build_session(
                app_name="fleetfence-rebucket",
                spark_master=spark_master_url(s.processor_spark_master),
                shuffle_partitions=processor_partitions(s.processor_shuffle_partitions),
            )
        return _rebucket(spark, s, target, buckets, lease)
    finally:
        if lease is not None:
            lease.release()
        if own is not None:
            own.stop()


def _rebucket(
    spark: Any, s: ProcessorSettings, target: str, buckets: int, lease: CheckpointLease | None
) -> Seed:
    """The steps of `run_rebucket` under the old checkpoint's lease. Run again with the same target
    after an interruption, it finishes what is left: a complete seed is kept if the old checkpoint
    has not moved on since, an incomplete one is cleared and written again."""
    old, new = HadoopCheckpointFiles(spark, s.checkpoint), HadoopCheckpointFiles(spark, target)
    done = read_seed(new)
    retired = old.read(RETIRED_FILE)
    if done is not None and retired is not None and orjson.loads(retired)["to"] == target:
        logger.info("rebucket: already done from=%s to=%s batch=%d", s.checkpoint, target, done.batch_id)
        return done
    refuse_retired(old)
    if not old.has_entries("offsets"):
        raise ConfigError(f"no processor checkpoint at {s.checkpoint}")
    if new.has_entries("offsets") or (done is not None and done.source != s.checkpoint):
        raise ConfigError(f"the new checkpoint {target} is not empty")
    if done is not None:
        # Cut short between the seed and the retirement: the seed holds if nothing ran since.
        if last_committed_batch(old)[0] != done.batch_id:
            raise ConfigError(
                f"the old checkpoint ran on after {target} was seeded from its batch {done.batch_id}: "
                f"delete {target} and run the command again"
            )
        _retire(old, target, buckets)
        return done
    new.delete(SEED_STATE)  # what a run cut short before its seed file left: nothing ran from it
    new.delete(LAYOUT_FILE)
    layout = old.read(LAYOUT_FILE)
    old_buckets = len(orjson.loads(layout)["keys"]) if layout else s.processor_buckets or LEGACY_BUCKETS
    drain = s.model_copy(update={"processor_buckets": old_buckets})
    logger.info("rebucket: draining checkpoint=%s buckets=%d", s.checkpoint, old_buckets)
    q = start_query(spark, drain, "fleetfence-rebucket-drain", available_now=True)
    while not q.awaitTermination(0.5):
        if lease is not None and lease.lost.is_set():
            q.stop()
            raise LeaseLostError(f"the checkpoint's lease {lease.key} was lost while draining")
    if q.exception() is not None:
        raise ProcessorError(f"draining the checkpoint failed: {q.exception()}")
    batch, watermark_ms = last_committed_batch(old)
    state = read_bucket_states(spark, s.checkpoint, batch)
    vehicles, size = state_bytes(state.values())
    seed = Seed(
        source=s.checkpoint,
        batch_id=batch,
        buckets=buckets,
        watermark_ms=watermark_ms,
        offsets=batch_end_offsets(old, batch),
        vehicles=vehicles,
    )
    partitions = int(spark.conf.get("spark.sql.shuffle.partitions"))
    write_seed(spark, new, seed, split_buckets(list(state.values()), buckets), partitions)
    _retire(old, target, buckets)
    logger.info(
        "rebucket: done from=%s batch=%d buckets=%d->%d vehicles=%d state_bytes=%d to=%s",
        s.checkpoint,
        batch,
        old_buckets,
        buckets,
        vehicles,
        size,
        target,
    )
    return seed


def _retire(old: HadoopCheckpointFiles, target: str, buckets: int) -> None:
    at = datetime.now(UTC).isoformat()
    old.create(RETIRED_FILE, orjson.dumps({"to": target, "at": at, "buckets": buckets}).decode())
