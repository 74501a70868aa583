"""The processor tests' fixtures (the shared SparkSession is the session-wide `spark`)."""

from __future__ import annotations

import pytest

from processor.spark.checkpoint_files import HadoopCheckpointFiles, LocalCheckpointFiles
from tests.processor.helpers import Files


@pytest.fixture(params=["local", "hadoop"])
def checkpoint_files(request: pytest.FixtureRequest) -> Files:
    """Both implementations of the checkpoint files: on a local folder, and through the Hadoop
    FileSystem of the shared SparkSession (what the job uses, for any checkpoint URI)."""
    if request.param == "local":
        return LocalCheckpointFiles
    request.applymarker(pytest.mark.spark)
    spark = request.getfixturevalue("spark")
    return lambda location: HadoopCheckpointFiles(spark, location)
