"""SparkSession construction with the settings every FleetFence Spark job depends on.

transformWithState needs the RocksDB state store provider; reused Python workers skip a process
start and the engine's imports on every task; shuffle partitions default to the cores (the processor
asks for `default_shuffle_partitions`), and RocksDB does not count the store's rows unless the Spark
configuration says so (each count is a read before every write); Python workers must run the
virtualenv's Python (PYSPARK_PYTHON) to import pyarrow. Spark's Kafka connector comes from the
project's jar cache (`fleetfence.jars`) through `spark.jars`: the driver serves the jars to a
cluster's executors, so nothing needs installing on the workers.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

ROCKSDB_PROVIDER = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
# Spark's count of the state store's rows (`numRowsTotal`): off unless configured "true".
ROW_TRACKING = "spark.sql.streaming.stateStore.rocksdb.trackTotalNumberOfRows"


def spark_master_url(configured: str | None) -> str | None:
    """The Spark master URL a service starts on: the configured one; under spark-submit (its scripts
    export SPARK_ENV_LOADED) the one spark-submit was given (None keeps it); else local[*]."""
    if configured:
        return configured
    return None if os.environ.get("SPARK_ENV_LOADED") else "local[*]"


def default_shuffle_partitions(cores: int) -> int:
    """The processor's stateful tasks a batch when none are configured: half the cores, at least one. The
    other half runs the Kafka read's tasks and, on a single node, the broker; on two cores one
    stateful task gave lower event→alert latency than two in every alternation measured, and drained
    a backlog faster (docs/deploy.md, Parallelism)."""
    return max(1, cores // 2)


def processor_partitions(configured: int | None) -> int:
    """The processor's shuffle partitions: the configured count, else `default_shuffle_partitions`
    of this machine's cores."""
    return configured or default_shuffle_partitions(os.cpu_count() or 2)


def build_session(
    app_name: str = "fleetfence",
    spark_master: str | None = None,
    local_dir: Path | None = None,
    shuffle_partitions: int | None = None,
    extra_conf: dict[str, str] | None = None,
) -> Any:
    """Create (or return) the SparkSession; `spark_master=None` keeps what spark-submit configured."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    from fleetfence.jars import spark_jars

    builder = SparkSession.builder.appName(app_name)
    if spark_master is not None:
        builder = builder.master(spark_master)
    cores = os.cpu_count() or 2
    conf = {
        "spark.sql.shuffle.partitions": str(shuffle_partitions or cores),
        "spark.sql.streaming.stateStore.providerClass": ROCKSDB_PROVIDER,
        "spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled": "true",
        "spark.sql.session.timeZone": "UTC",
        "spark.python.worker.reuse": "true",
        "spark.sql.execution.arrow.pyspark.enabled": "true",
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.sql.streaming.noDataMicroBatches.enabled": "true",
        "spark.driver.memory": "2g",
        "spark.sql.adaptive.enabled": "false",
    }
    if local_dir is not None:
        conf["spark.local.dir"] = str(local_dir / "tmp")
        conf["spark.sql.warehouse.dir"] = str(local_dir / "warehouse")
    conf.update(extra_conf or {})
    # Ours first; jars the caller asked for are kept after them.
    conf["spark.jars"] = ",".join(j for j in [spark_jars(), conf.get("spark.jars", "")] if j)
    for k, v in conf.items():
        builder = builder.config(k, v)
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("WARN")
    # Off unless spark-defaults.conf, spark-submit --conf or the caller set it (a builder setting
    # would override the first two).
    if ROW_TRACKING not in conf and session.sparkContext.getConf().get(ROW_TRACKING) is None:
        session.conf.set(ROW_TRACKING, "false")
    return session


def row_tracking(spark: Any) -> bool:
    """Whether RocksDB counts the state store's rows (Spark's `numRowsTotal` is 0 when it does not)."""
    return str(spark.conf.get(ROW_TRACKING, "true")).lower() == "true"
