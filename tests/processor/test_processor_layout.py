"""Bucket -> Spark state key layout: Spark's own hash decides, the spread is even, the checkpoint keeps it."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from fleetfence.errors import ConfigError
from processor.spark.checkpoint_files import (
    SINK_ID_FILE,
    HadoopCheckpointFiles,
    LocalCheckpointFiles,
    sink_id_for,
)
from processor.spark.layout import (
    LAYOUT_FILE,
    LEGACY_BUCKETS,
    balanced_keys,
    checkpoint_layout,
    default_buckets,
    shuffle_partition,
    spark_hash_int,
)
from tests.processor.helpers import Files

VALUES = [*range(-50, 300), 2**31 - 1, -(2**31), 123_456_789, -987_654_321]


@pytest.mark.spark
def test_hash_is_sparks_murmur3_and_partitioning(spark: object) -> None:
    from pyspark.sql import SparkSession

    assert isinstance(spark, SparkSession)
    df = spark.createDataFrame([(v,) for v in VALUES], "k int")
    rows = df.selectExpr("k", "hash(k) AS h", "pmod(hash(k), 2) AS p2", "pmod(hash(k), 7) AS p7").collect()
    assert len(rows) == len(VALUES)
    for r in rows:
        assert spark_hash_int(r["k"]) == r["h"], r
        assert shuffle_partition(r["k"], 2) == r["p2"]
        assert shuffle_partition(r["k"], 7) == r["p7"]


@pytest.mark.spark
def test_a_grouped_shuffle_puts_each_bucket_key_where_the_layout_says(spark: object) -> None:
    """The stateful operator's exchange is hash partitioning on the key: check it on a real shuffle."""
    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F

    assert isinstance(spark, SparkSession)
    keys = balanced_keys(8, 2)
    df = spark.createDataFrame([(k,) for k in keys for _ in range(3)], "bucket int").repartition(2, "bucket")
    placed = {r["bucket"]: r["p"] for r in df.select("bucket", F.spark_partition_id().alias("p")).collect()}
    assert placed == {k: b % 2 for b, k in enumerate(keys)}


@pytest.mark.parametrize(("buckets", "partitions"), [(1, 1), (4, 2), (16, 2), (16, 4), (64, 8), (5, 3)])
def test_balanced_keys_spread_evenly_and_are_distinct(buckets: int, partitions: int) -> None:
    keys = balanced_keys(buckets, partitions)
    assert len(set(keys)) == buckets
    assert min(keys) >= 0
    per = Counter(shuffle_partition(k, partitions) for k in keys)
    assert max(per.values()) - min(per.values()) <= 1
    assert [shuffle_partition(k, partitions) for k in keys] == [b % partitions for b in range(buckets)]


def test_identity_keys_are_what_made_four_buckets_run_one_plus_three() -> None:
    """The imbalance this layout removes: with the bucket numbers as keys, 4 buckets on 2 partitions
    land as 1 + 3 (docs/architecture.md)."""
    assert sorted(Counter(shuffle_partition(b, 2) for b in range(4)).values()) == [1, 3]


def test_checkpoint_records_the_layout_and_refuses_a_changed_bucket_count(
    tmp_path: Path, checkpoint_files: Files
) -> None:
    cp = checkpoint_files(str(tmp_path / "cp"))
    first = checkpoint_layout(cp, 4, 2)
    assert first == balanced_keys(4, 2)
    saved = json.loads((tmp_path / "cp" / LAYOUT_FILE).read_text())
    assert saved == {"buckets": 4, "partitions": 2, "keys": first}
    # A restart with another shuffle partition count keeps the recorded keys (Spark keeps the
    # checkpoint's partition count for stateful operators).
    assert checkpoint_layout(cp, 4, 8) == first
    with pytest.raises(ConfigError, match="4 buckets"):
        checkpoint_layout(cp, 16, 2)


def test_an_unset_bucket_count_is_the_checkpoints_own_or_four_per_partition(
    tmp_path: Path, checkpoint_files: Files
) -> None:
    """FLEETFENCE_PROCESSOR_BUCKETS unset: a new checkpoint gets four buckets per shuffle partition,
    an existing one keeps what it holds (an upgrade from the old default of 16 starts as before), and
    one from before layouts were recorded has the 16 buckets of that time."""
    assert checkpoint_layout(checkpoint_files(str(tmp_path / "one")), None, 1) == balanced_keys(4, 1)
    assert checkpoint_layout(checkpoint_files(str(tmp_path / "three")), None, 3) == balanced_keys(12, 3)
    sixteen = checkpoint_files(str(tmp_path / "sixteen"))
    keys = checkpoint_layout(sixteen, 16, 2)
    assert checkpoint_layout(sixteen, None, 1) == keys
    assert len(keys) == 16
    legacy = tmp_path / "legacy"
    (legacy / "offsets").mkdir(parents=True)
    (legacy / "offsets" / "0").write_text("v1")
    assert checkpoint_layout(checkpoint_files(str(legacy)), None, 1) == list(range(LEGACY_BUCKETS))
    assert default_buckets(1) == 4


def test_checkpoint_from_before_layouts_keeps_bucket_numbers(tmp_path: Path, checkpoint_files: Files) -> None:
    cp = tmp_path / "old"
    (cp / "offsets").mkdir(parents=True)
    (cp / "offsets" / "0").write_text("v1")
    assert checkpoint_layout(checkpoint_files(str(cp)), 4, 2) == [0, 1, 2, 3]
    assert checkpoint_layout(checkpoint_files(f"file:{cp}"), 4, 2) == [0, 1, 2, 3]
    assert checkpoint_layout(checkpoint_files(f"file://{cp}"), 4, 2) == [0, 1, 2, 3]


def test_files_are_created_once_and_both_implementations_see_the_same_folder(
    tmp_path: Path, checkpoint_files: Files
) -> None:
    cp = checkpoint_files(f"file://{tmp_path / 'new' / 'cp'}")  # the folder does not exist yet
    assert cp.read("id") is None
    assert not cp.has_entries("offsets")
    assert cp.create("id", "first")
    assert not cp.create("id", "second"), "create must not replace an existing file"
    assert cp.read("id") == "first"
    left = sorted(p.name for p in (tmp_path / "new" / "cp").iterdir())
    assert left in (["id"], [".id.crc", "id"]), left  # Hadoop's local FS keeps a checksum beside it
    (tmp_path / "new" / "cp" / "offsets").mkdir()
    assert not cp.has_entries("offsets"), "an empty offsets folder is a new checkpoint"
    (tmp_path / "new" / "cp" / "offsets" / "0").write_text("v1")
    assert cp.has_entries("offsets")
    assert LocalCheckpointFiles(str(tmp_path / "new" / "cp")).read("id") == "first"


def test_sink_id_is_kept_in_the_checkpoint(tmp_path: Path, checkpoint_files: Files) -> None:
    cp = checkpoint_files(str(tmp_path / "cp"))
    sid = sink_id_for(cp)
    assert len(sid) == 16
    assert sink_id_for(checkpoint_files(str(tmp_path / "cp"))) == sid, "a restarted driver gets the same id"
    assert (tmp_path / "cp" / SINK_ID_FILE).read_text() == sid
    assert sink_id_for(checkpoint_files(str(tmp_path / "other"))) != sid, "a new checkpoint gets a new id"


@pytest.mark.spark
def test_a_location_spark_cannot_open_is_a_clear_error(spark: object) -> None:
    with pytest.raises(ConfigError, match="nosuchfs://x/cp"):
        HadoopCheckpointFiles(spark, "nosuchfs://x/cp")


@pytest.mark.spark
def test_a_scratch_checkpoint_is_removed_whole_and_removing_a_missing_one_is_no_error(
    spark: object, tmp_path: Path
) -> None:
    scratch = HadoopCheckpointFiles(spark, f"file://{tmp_path / 'cp.warm-up-host'}")
    assert scratch.create("metadata", "{}")
    (tmp_path / "cp.warm-up-host" / "state" / "0").mkdir(parents=True)
    (tmp_path / "cp.warm-up-host" / "state" / "0" / "1.changelog").write_text("x")
    scratch.remove()
    assert not (tmp_path / "cp.warm-up-host").exists()
    scratch.remove()
    assert list(tmp_path.iterdir()) == []
