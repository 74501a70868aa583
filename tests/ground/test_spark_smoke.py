"""The shared local SparkSession runs a real job with the project's Python workers."""

from __future__ import annotations

import os
import subprocess
import sys
from typing import TYPE_CHECKING

import pandas as pd
import pytest

pytestmark = pytest.mark.spark

# Spark reads the UDF's kind from its type hints at run time, where a Series takes no parameter.
if TYPE_CHECKING:
    FloatSeries = pd.Series[float]
else:
    FloatSeries = pd.Series


def test_tiny_batch_job_runs_python_udf(spark: object) -> None:
    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F
    from pyspark.sql.pandas.functions import pandas_udf

    assert isinstance(spark, SparkSession)
    df = spark.range(0, 1000).withColumn("bucket", F.col("id") % 7)

    def double(s: FloatSeries) -> FloatSeries:
        return s * 2.0

    # The stubs lack the documented form that takes the UDF's kind from its type hints.
    twice = pandas_udf(double, "double")  # type: ignore[call-overload]

    rows = df.groupBy("bucket").agg(F.sum(twice(F.col("id"))).alias("s")).orderBy("bucket").collect()
    expected = {b: float(sum(2 * i for i in range(1000) if i % 7 == b)) for b in range(7)}
    assert {r["bucket"]: r["s"] for r in rows} == expected
    conf = spark.conf.get("spark.sql.streaming.stateStore.providerClass")
    assert conf is not None
    assert conf.endswith("RocksDBStateStoreProvider")


def test_the_session_leaves_rocksdb_row_counting_off_unless_configured(spark: object) -> None:
    """RocksDB's row count costs a read before every write, so the session turns it off; a value
    from the Spark configuration (here spark-submit's --conf, as spark-defaults.conf would give it)
    is kept, which a builder setting would have overridden."""
    from processor.spark.session import ROW_TRACKING, row_tracking

    assert not row_tracking(spark)
    script = (
        "from processor.spark.session import build_session, row_tracking\n"
        "s = build_session(app_name='row-tracking', spark_master='local[1]')\n"
        "print('ROWS', row_tracking(s))\n"
        "s.stop()\n"
    )
    env = {**os.environ, "PYSPARK_SUBMIT_ARGS": f"--conf {ROW_TRACKING}=true pyspark-shell"}
    out = subprocess.run(
        [sys.executable, "-c", script], check=False, capture_output=True, text=True, env=env, timeout=180
    )
    assert "ROWS True" in out.stdout, out.stderr[-2000:]
