"""Which Spark state key each vehicle bucket gets, so buckets spread evenly over the stateful tasks.

The stateful operator is keyed by bucket, and Spark routes a key to the shuffle partition
`pmod(murmur3(key, seed 42), partitions)`. With the bucket number itself as the key, 4 buckets on 2
partitions land as 1 + 3: one core runs three buckets while the other idles after one. So each
bucket gets a key chosen for its hash: bucket `b` goes to partition `b % partitions`.

The choice is part of the checkpoint's identity (state lives under these keys, and Spark keeps the
shuffle partition count of a checkpoint for its whole life), so it is written into the checkpoint
(through the FileSystem Spark uses for it, `processor.spark.checkpoint_files`) at the first start and read
from there afterwards. A checkpoint started before this file
existed keeps the bucket numbers as keys. Changing the number of buckets of an existing checkpoint
would move vehicles to buckets whose state does not hold them, so that is refused.
"""

from __future__ import annotations

import json
import logging

from fleetfence.errors import ConfigError
from processor.spark.checkpoint_files import CheckpointFiles

logger = logging.getLogger(__name__)

LAYOUT_FILE = "fleetfence-layout.json"
BUCKETS_PER_PARTITION = 4
# The bucket count of every checkpoint started before layouts were recorded (the default then).
LEGACY_BUCKETS = 16
_M32 = 0xFFFFFFFF


def _rotl32(x: int, r: int) -> int:
    return ((x << r) | (x >> (32 - r))) & _M32


def spark_hash_int(value: int, seed: int = 42) -> int:
    """Spark's `Murmur3_x86_32.hashInt` (what `hash(int_column)` and hash partitioning use), signed."""
    k1 = (value & _M32) * 0xCC9E2D51 & _M32
    k1 = _rotl32(k1, 15) * 0x1B873593 & _M32
    h1 = (seed & _M32) ^ k1
    h1 = (_rotl32(h1, 13) * 5 + 0xE6546B64) & _M32
    h1 ^= 4
    h1 ^= h1 >> 16
    h1 = h1 * 0x85EBCA6B & _M32
    h1 ^= h1 >> 13
    h1 = h1 * 0xC2B2AE35 & _M32
    h1 ^= h1 >> 16
    return h1 - (1 << 32) if h1 >= 1 << 31 else h1


def shuffle_partition(key: int, partitions: int) -> int:
    """The shuffle partition Spark's hash partitioning sends an int key to."""
    return spark_hash_int(key) % partitions  # Python's % is already the non-negative pmod


def balanced_keys(buckets: int, partitions: int) -> list[int]:
    """The smallest distinct non-negative keys with bucket `b`'s key on partition `b % partitions`."""
    if buckets < 1 or partitions < 1:
        raise ConfigError(f"buckets ({buckets}) and partitions ({partitions}) must be at least 1")
    free: dict[int, list[int]] = {p: [] for p in range(partitions)}
    keys: list[int] = []
    candidate = 0
    for b in range(buckets):
        want = b % partitions
        while not free[want]:
            free[shuffle_partition(candidate, partitions)].append(candidate)
            candidate += 1
        keys.append(free[want].pop(0))
    return keys


def default_buckets(partitions: int) -> int:
    """The bucket count of a new checkpoint when none is configured: a few state keys per stateful
    task even out the vehicles' skew over the tasks, and each key is one state round trip and one
    engine call a batch, which on a small box is the batch's work (docs/deploy.md, Parallelism)."""
    return BUCKETS_PER_PARTITION * partitions


def checkpoint_layout(files: CheckpointFiles, buckets: int | None, partitions: int) -> list[int]:
    """The bucket -> state key map of this checkpoint: read it, or choose and record it on first use.
    `buckets` None: the checkpoint's own count; for a new one `default_buckets(partitions)`."""
    text = files.read(LAYOUT_FILE)
    if text is None:
        if files.has_entries("offsets"):
            explicit = buckets is not None
            buckets = buckets or LEGACY_BUCKETS
            keys = list(range(buckets))  # started before layouts were recorded: its state is under these
            logger.warning(
                "checkpoint without a bucket layout: keeping bucket numbers as state keys, %d buckets%s",
                buckets,
                ""
                if explicit
                else " (the default of its time; set FLEETFENCE_PROCESSOR_BUCKETS if it had others)",
            )
        else:
            buckets = buckets or default_buckets(partitions)
            keys = balanced_keys(buckets, partitions)
        layout = json.dumps({"buckets": buckets, "partitions": partitions, "keys": keys})
        if files.create(LAYOUT_FILE, layout):
            return keys
        text = files.read(LAYOUT_FILE) or layout  # another driver recorded one first: use that
    keys = [int(k) for k in json.loads(text)["keys"]]
    if buckets is not None and len(keys) != buckets:
        raise ConfigError(
            f"checkpoint {files.location} holds state for {len(keys)} buckets, but "
            f"FLEETFENCE_PROCESSOR_BUCKETS={buckets}: changing the bucket count of a checkpoint would "
            "lose vehicle state; keep the setting or start from a new checkpoint"
        )
    return keys
