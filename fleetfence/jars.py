"""The JVM jars FleetFence runs with: the embedded Apache Kafka broker and Spark's Kafka connector.

Each bundle is a checked-in Maven pom (`fleetfence/jvm/<bundle>/pom.xml`) whose runtime
dependencies Maven copies, once, into a cache folder named after the pom's content hash; later
runs (and CI on the same machine) find the folder complete and never call Maven again, and a pom
edit gets a fresh folder instead of a mix of old and new jars. Maven itself keeps `~/.m2`, so a
second fetch of the same artifacts is offline. Nothing here is committed: the jars come from Maven
Central at set-up (`fleetfence infra jars`, which `scripts/dev.sh` runs).
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import shutil
import subprocess
import tempfile
from importlib.resources import files
from pathlib import Path

from fleetfence.errors import InfraError, MissingBinaryError

logger = logging.getLogger(__name__)

BUNDLES = ("kafka", "spark")
COMPLETE = ".complete"


def pom_path(bundle: str) -> Path:
    """The checked-in pom of a bundle (package data, so an installed wheel carries it too)."""
    if bundle not in BUNDLES:
        raise InfraError(f"unknown jar bundle {bundle!r}; known: {', '.join(BUNDLES)}")
    return Path(str(files("fleetfence").joinpath("jvm", bundle, "pom.xml")))


def pom_property(bundle: str, name: str) -> str:
    """A `<properties>` value of a bundle's pom, e.g. the Kafka or Spark version it pins."""
    m = re.search(rf"<{re.escape(name)}>([^<]+)</{re.escape(name)}>", pom_path(bundle).read_text())
    if m is None:
        raise InfraError(f"{pom_path(bundle)} has no <{name}> property")
    return m.group(1).strip()


def cache_root() -> Path:
    """`FLEETFENCE_JAR_CACHE` or the user's cache folder: shared by every clone on the machine."""
    env = os.environ.get("FLEETFENCE_JAR_CACHE")
    if env:
        return Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "fleetfence" / "jars"


def bundle_dir(bundle: str) -> Path:
    digest = hashlib.sha256(pom_path(bundle).read_bytes()).hexdigest()[:12]
    return cache_root() / f"{bundle}-{digest}"


def ensure_jars(bundle: str, timeout_s: float = 900.0) -> list[Path]:
    """The bundle's jars, fetched with Maven on first use; raises with Maven's own words on failure."""
    target = bundle_dir(bundle)
    if not (target / COMPLETE).is_file():
        _fetch(bundle, target, timeout_s)
    jars = sorted((target / "libs").glob("*.jar"))
    if not jars:
        raise InfraError(f"the jar cache {target} is marked complete but holds no jars: delete it")
    return jars


def _fetch(bundle: str, target: Path, timeout_s: float) -> None:
    mvn = shutil.which("mvn")
    if mvn is None:
        raise MissingBinaryError(
            f"Maven is needed once to fetch the {bundle} jars: run `sudo apt-get install -y maven`"
        )
    target.parent.mkdir(parents=True, exist_ok=True)
    logger.info("fetching jars bundle=%s into=%s", bundle, target)
    # Into a temporary sibling, then renamed: a killed fetch leaves no half-filled bundle behind.
    tmp = Path(tempfile.mkdtemp(prefix=f".{bundle}-", dir=target.parent))
    try:
        proc = subprocess.run(
            [
                mvn,
                "-q",
                "-B",
                "-f",
                str(pom_path(bundle)),
                "dependency:copy-dependencies",
                f"-DoutputDirectory={tmp / 'libs'}",
            ],
            capture_output=True,
            text=True,
            timeout=timeout_s,
            check=False,
        )
        if proc.returncode != 0:
            raise InfraError(
                f"Maven could not fetch the {bundle} jars (exit {proc.returncode}):\n"
                f"{(proc.stdout + proc.stderr)[-3000:]}"
            )
        (tmp / COMPLETE).write_text(pom_property(bundle, f"{bundle}.version") + "\n")
        tmp.chmod(0o755)  # mkdtemp makes it 0700: a cache shared by users (an image) must be readable
        try:
            tmp.rename(target)
        except OSError:
            if not (target / COMPLETE).is_file():  # not a concurrent fetch that won the race
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def spark_jars() -> str:
    """`spark.jars` for every SparkSession: the Kafka connector and its dependencies."""
    return ",".join(str(p) for p in ensure_jars("spark"))
