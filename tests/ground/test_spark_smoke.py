"""The shared local SparkSession runs a real job with the project's Python workers."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.spark


def test_tiny_batch_job_runs_python_udf(spark: object) -> None:
    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F

    assert isinstance(spark, SparkSession)
    df = spark.range(0, 1000).withColumn("bucket", F.col("id") % 7)

    @F.pandas_udf("double")  # type: ignore[call-overload]
    def twice(s):  # type: ignore[no-untyped-def]
        return s * 2.0

    rows = df.groupBy("bucket").agg(F.sum(twice(F.col("id"))).alias("s")).orderBy("bucket").collect()
    expected = {b: float(sum(2 * i for i in range(1000) if i % 7 == b)) for b in range(7)}
    assert {r["bucket"]: r["s"] for r in rows} == expected
    conf = spark.conf.get("spark.sql.streaming.stateStore.providerClass")
    assert conf is not None
    assert conf.endswith("RocksDBStateStoreProvider")
