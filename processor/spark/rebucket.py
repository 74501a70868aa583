"""Re-bucketing: a checkpoint's vehicle state moved to another bucket count, in a new checkpoint.

The processor keeps each vehicle in one of `FLEETFENCE_PROCESSOR_BUCKETS` state blobs, and a blob
is read and written whole in every micro-batch that touches its bucket, so the vehicles per bucket
decide a batch's state cost. The bucket count is part of a checkpoint's identity
(`processor.spark.layout`: Spark keys the state by bucket), so it changes offline, in five steps, all
through Spark (any Hadoop path, local or on a cluster); `processor.ops.rebucket_run` runs them:

1. take the old checkpoint's lease: a processor running on it holds it, and must be stopped first;
2. drain: run the job on the old checkpoint until it has processed what Kafka holds now
   (`availableNow`), so its last micro-batch is committed in Kafka and in Spark alike, and no batch
   is left half done (whose alerts could be in Kafka while its state is not);
3. read every bucket's state at that batch (Spark's `statestore` reader), its parked vehicles
   included, and split it: every vehicle to `bucket_of(vehicle, new count)`, with its reorder
   buffer; every new bucket gets the routes and zones and the assignments of its own vehicles
   (parked vehicles go into the new bucket's blob, and park again at its next batch);
4. write the new checkpoint's layout, its seed state (Parquet) and its seed: the old checkpoint's
   end offsets for both topics and the watermark of its next batch;
5. mark the old checkpoint retired: a processor started on it refuses (it would emit again what the
   new checkpoint emits).

A processor started on a seeded checkpoint hands the seed state to `transformWithStateInPandas` as
its initial state and starts Kafka at the seed's offsets: its first micro-batch continues exactly
where the old checkpoint's last one ended, and the sink's exactly-once protocol carries on under
the new checkpoint's sink id.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import numpy as np

from fleetfence.contracts import bucket_of
from fleetfence.errors import ConfigError
from processor.core.codec import dump_state, load_state
from processor.core.columns import StateTable, concat_states
from processor.core.domain import RawFix
from processor.core.master import MasterState
from processor.core.parking import unpack_rows
from processor.spark.checkpoint_files import CheckpointFiles, HadoopCheckpointFiles
from processor.spark.layout import LAYOUT_FILE, balanced_keys

logger = logging.getLogger(__name__)

SEED_FILE = "fleetfence-seed.json"
SEED_STATE = "fleetfence-seed-state"
RETIRED_FILE = "fleetfence-retired.json"
SEED_STATE_DDL = "bucket int, vehicles binary, master binary"


@dataclass(frozen=True)
class Seed:
    """Where a re-bucketed checkpoint starts: the old checkpoint's last committed batch."""

    source: str
    batch_id: int
    buckets: int
    watermark_ms: int
    # topic -> partition -> the first offset the new checkpoint reads
    offsets: dict[str, dict[str, int]]
    vehicles: int
    created: str = field(default_factory=lambda: datetime.now(UTC).isoformat())

    def to_json(self) -> str:
        return json.dumps(self.__dict__, sort_keys=True)

    @staticmethod
    def from_json(text: str) -> Seed:
        d = json.loads(text)
        d["offsets"] = {t: {p: int(o) for p, o in parts.items()} for t, parts in d["offsets"].items()}
        return Seed(**d)

    def starting_offsets(self, topic: str) -> str:
        """The Kafka source's `startingOffsets` for one topic (JSON; only read for a new checkpoint)."""
        if topic not in self.offsets:
            raise ConfigError(f"the checkpoint's seed has no offsets for the topic {topic!r}")
        return json.dumps({topic: self.offsets[topic]})


@dataclass
class BucketState:
    """One bucket's state as the stateful operator keeps it."""

    states: StateTable
    held: dict[str, list[RawFix]]
    master: MasterState
    # Its parked vehicles (processor.core.parking), and the bytes of their values in the state store.
    parked: StateTable = field(default_factory=StateTable)
    parked_bytes: int = 0


# ----------------------------------------------------------------------------- pure


def merge_masters(masters: Iterable[MasterState]) -> MasterState:
    """Every bucket's master data as one: routes and zones are in every bucket, an assignment or a
    vehicle only in its vehicle's; the newest version of each wins, tombstones included."""
    out = MasterState()
    for m in masters:
        for mine, theirs in (
            (out.routes, m.routes),
            (out.zones, m.zones),
            (out.assignments, m.assignments),
            (out.vehicles, m.vehicles),
        ):
            for key, entry in theirs.items():
                current = mine.get(key)
                if current is None or current[0] < entry[0]:
                    mine[key] = entry
    return out


def master_for_bucket(master: MasterState, bucket: int, buckets: int) -> MasterState:
    """What the parse would have sent this bucket: every route and zone, its own vehicles' rest."""
    return MasterState(
        routes=dict(master.routes),
        zones=dict(master.zones),
        assignments={k: v for k, v in master.assignments.items() if bucket_of(k, buckets) == bucket},
        vehicles={k: v for k, v in master.vehicles.items() if bucket_of(k, buckets) == bucket},
    )


def split_buckets(old: list[BucketState], buckets: int) -> list[BucketState]:
    """The old buckets' state under `buckets` buckets, each vehicle where `bucket_of` puts it."""
    if buckets < 1:
        raise ConfigError(f"the bucket count must be at least 1, not {buckets}")
    every = concat_states([b.states for b in old] + [b.parked for b in old])
    held: dict[str, list[RawFix]] = {}
    for b in old:
        held.update(b.held)
    master = merge_masters(b.master for b in old)
    target = np.fromiter((bucket_of(v, buckets) for v in every.ids), np.int64, len(every))
    out = []
    for n in range(buckets):
        rows = np.flatnonzero(target == n)
        out.append(
            BucketState(
                every.take(rows),
                {v: fixes for v, fixes in held.items() if bucket_of(v, buckets) == n},
                master_for_bucket(master, n, buckets),
            )
        )
    return out


def last_committed_batch(files: CheckpointFiles) -> tuple[int, int]:
    """The checkpoint's last committed micro-batch and the watermark its next batch starts from.

    Refuses a checkpoint whose offset log has a batch past it: that batch was started and never
    committed in Spark, and its alerts may be in Kafka already."""
    commits = sorted(int(n) for n in files.entries("commits") if n.isdigit())
    planned = sorted(int(n) for n in files.entries("offsets") if n.isdigit())
    if not commits:
        raise ConfigError(f"the checkpoint {files.location} has no committed micro-batch")
    if planned and planned[-1] != commits[-1]:
        raise ConfigError(
            f"the checkpoint {files.location} has batch {planned[-1]} planned and {commits[-1]} "
            "committed: let the processor finish it first"
        )
    text = files.read(f"commits/{commits[-1]}") or ""
    meta = json.loads(text.splitlines()[1]) if len(text.splitlines()) > 1 else {}
    return commits[-1], int(meta.get("nextBatchWatermarkMs", 0))


def batch_end_offsets(files: CheckpointFiles, batch_id: int) -> dict[str, dict[str, int]]:
    """Every Kafka source's end offsets of a batch, by topic (Spark's offset log: a version line, the
    batch's metadata, then one line per source)."""
    text = files.read(f"offsets/{batch_id}")
    if text is None:
        raise ConfigError(f"the checkpoint {files.location} has no offsets for batch {batch_id}")
    out: dict[str, dict[str, int]] = {}
    for line in text.splitlines()[2:]:
        if not line.startswith("{"):
            continue
        for topic, parts in json.loads(line).items():
            out[topic] = {str(p): int(o) for p, o in parts.items()}
    return out


# ----------------------------------------------------------------------------- checkpoint files


def read_seed(files: CheckpointFiles) -> Seed | None:
    text = files.read(SEED_FILE)
    return Seed.from_json(text) if text else None


def refuse_retired(files: CheckpointFiles) -> None:
    """A retired checkpoint must not run again: its successor already continues its stream."""
    text = files.read(RETIRED_FILE)
    if text:
        d = json.loads(text)
        raise ConfigError(
            f"the checkpoint {files.location} was re-bucketed into {d['to']} at {d['at']}: point "
            f"FLEETFENCE_PROCESSOR_CHECKPOINT there (and FLEETFENCE_PROCESSOR_BUCKETS={d['buckets']})"
        )


def refuse_incomplete(files: CheckpointFiles, seed: Seed | None) -> None:
    """A seed state without its seed file is a re-bucketing cut short: started as a new checkpoint
    it would read Kafka from the beginning and alert everything again."""
    if seed is None and files.has_entries(SEED_STATE):
        raise ConfigError(
            f"the checkpoint {files.location} is an unfinished re-bucketing: run `fleetfence rebucket` "
            "with the same --to again"
        )


# ----------------------------------------------------------------------------- Spark


def read_bucket_states(spark: Any, location: str, batch_id: int) -> dict[int, BucketState]:
    """Every bucket's state of a checkpoint at a committed batch, by state key (`processor.spark.layout`),
    through Spark's state reader."""

    def read(var: str) -> Any:
        return (
            spark.read.format("statestore")
            .option("path", location)
            .option("batchId", batch_id)
            .option("stateVarName", var)
            .load()
        )

    def blobs(var: str) -> dict[int, bytes]:
        return {int(r["key"]["bucket"]): bytes(r["value"]["blob"]) for r in read(var).collect()}

    vehicles, masters = blobs("vehicles"), blobs("master")
    parked: dict[int, tuple[list[str], list[bytes]]] = {}
    for r in read("parked").toLocalIterator():
        ids, values = parked.setdefault(int(r["key"]["bucket"]), ([], []))
        ids.append(str(r["user_map_key"]["vehicle_id"]))
        values.append(bytes(r["user_map_value"]["row"]))
    out = {}
    for key in sorted(set(vehicles) | set(parked)):
        states, held = load_state(vehicles[key]) if key in vehicles else (StateTable(), {})
        master = load_state(masters[key]) if key in masters else MasterState()
        ids, values = parked.get(key, ([], []))
        out[key] = BucketState(states, held, master, unpack_rows(ids, values), sum(map(len, values)))
    return out


def write_seed(
    spark: Any, target: HadoopCheckpointFiles, seed: Seed, state: list[BucketState], partitions: int
) -> None:
    """The new checkpoint: its seed state (Parquet), its bucket layout and last its seed file, so a
    checkpoint with a seed file is a complete one, and one with only a seed state is refused by the
    processor (`refuse_incomplete`) and cleared by the next run of the command."""
    keys = balanced_keys(seed.buckets, partitions)
    rows = [
        (
            keys[n],
            dump_state((b.states, b.held)),
            dump_state(b.master),
        )
        for n, b in enumerate(state)
    ]
    path = f"{target.location.rstrip('/')}/{SEED_STATE}"
    spark.createDataFrame(rows, SEED_STATE_DDL).coalesce(1).write.mode("error").parquet(path)
    layout = json.dumps({"buckets": seed.buckets, "partitions": partitions, "keys": keys})
    if not target.create(LAYOUT_FILE, layout):
        raise ConfigError(f"the checkpoint {target.location} already has a bucket layout")
    if not target.create(SEED_FILE, seed.to_json()):
        raise ConfigError(f"the checkpoint {target.location} already has a seed")


def seed_state(spark: Any, location: str) -> Any:
    """The seed state as `transformWithStateInPandas`'s initial state (grouped by the state key)."""
    return spark.read.schema(SEED_STATE_DDL).parquet(f"{location.rstrip('/')}/{SEED_STATE}").groupBy("bucket")


def state_bytes(state: Iterable[BucketState]) -> tuple[int, int]:
    """(vehicles, bytes of their pickled state blobs and parked values): what the state store holds
    per vehicle."""
    vehicles = size = 0
    for b in state:
        vehicles += len(b.states) + len(b.parked)
        size += len(dump_state((b.states, b.held))) + b.parked_bytes
    return vehicles, size
