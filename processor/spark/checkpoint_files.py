"""The small files FleetFence keeps in a Spark checkpoint beside Spark's own: the sink id and the
bucket layout.

They are part of the checkpoint's identity (a new sink id on a restarted driver would let it commit
its last micro-batch to Kafka a second time), so they must live exactly where Spark keeps the
checkpoint. Spark resolves the checkpoint location with Hadoop's FileSystem: `hdfs://`, `s3a://`,
`abfss://`, `file:`, and a path without a scheme on the cluster's `fs.defaultFS`.
`HadoopCheckpointFiles` therefore goes through the same FileSystem, with the session's Hadoop
configuration, from the driver (the only place these files are read or written).
`LocalCheckpointFiles` is the same contract on a local folder, for code and tests without a
SparkSession.

Both only ever create a file if it is absent, atomically (write a temporary file, then link or
rename it into place, which fails if the name exists): two drivers started on one new checkpoint by
mistake still agree on one sink id, and a crash mid-write never leaves half a file.
"""

from __future__ import annotations

import logging
import os
import uuid
from pathlib import Path
from typing import Any, Protocol

from fleetfence.errors import ConfigError

logger = logging.getLogger(__name__)


class CheckpointFiles(Protocol):
    """Small text files in a checkpoint folder."""

    location: str

    def read(self, name: str) -> str | None:
        """The file's text, or None if it does not exist."""
        ...

    def create(self, name: str, text: str) -> bool:
        """Write the file if it does not exist (atomically); False if it existed already."""
        ...

    def has_entries(self, folder: str) -> bool:
        """Whether the sub-folder exists and holds anything (e.g. Spark's `offsets` log)."""
        ...

    def entries(self, folder: str) -> list[str]:
        """The names in the sub-folder (none if it does not exist)."""
        ...


class LocalCheckpointFiles:
    """A checkpoint on the local file system (a plain path or a `file:` URI)."""

    def __init__(self, location: str) -> None:
        self.location = location
        self.root = Path(location.removeprefix("file://").removeprefix("file:"))

    def read(self, name: str) -> str | None:
        f = self.root / name
        return f.read_text() if f.exists() else None

    def create(self, name: str, text: str) -> bool:
        self.root.mkdir(parents=True, exist_ok=True)
        tmp = self.root / f".{name}.{uuid.uuid4().hex}.tmp"
        tmp.write_text(text)
        try:
            os.link(tmp, self.root / name)  # fails if the name exists: create-if-absent, atomic
            return True
        except FileExistsError:
            return False
        finally:
            tmp.unlink()

    def has_entries(self, folder: str) -> bool:
        d = self.root / folder
        return d.is_dir() and any(d.iterdir())

    def entries(self, folder: str) -> list[str]:
        d = self.root / folder
        return sorted(p.name for p in d.iterdir()) if d.is_dir() else []


class HadoopCheckpointFiles:
    """A checkpoint on whatever Hadoop FileSystem Spark resolves its location to."""

    def __init__(self, spark: Any, location: str) -> None:
        self.location = location
        self._jvm = spark._jvm
        path = self._jvm.org.apache.hadoop.fs.Path(location)
        try:
            self._fs = path.getFileSystem(spark._jsc.hadoopConfiguration())
        except Exception as exc:  # py4j wraps the JVM's exception: say what was asked for
            raise ConfigError(f"checkpoint location {location!r} cannot be opened by Spark: {exc}") from exc
        self._root = self._fs.makeQualified(path)

    def _path(self, name: str) -> Any:
        return self._jvm.org.apache.hadoop.fs.Path(self._root, name)

    def read(self, name: str) -> str | None:
        p = self._path(name)
        if not self._fs.exists(p):
            return None
        stream = self._fs.open(p)
        try:
            return str(self._jvm.org.apache.commons.io.IOUtils.toString(stream, "UTF-8"))
        finally:
            stream.close()

    def create(self, name: str, text: str) -> bool:
        final = self._path(name)
        if self._fs.exists(final):
            return False
        self._fs.mkdirs(self._root)
        tmp = self._path(f".{name}.{uuid.uuid4().hex}.tmp")
        out = self._fs.create(tmp, True)
        try:
            out.write(bytearray(text.encode()))
        finally:
            out.close()
        error: Exception | None = None
        try:
            # Hadoop's rename does not replace an existing file: it returns False (HDFS, local) or
            # raises, so a racing writer cannot overwrite the first one's file.
            renamed = bool(self._fs.rename(tmp, final))
        except Exception as exc:
            renamed, error = False, exc
        if not renamed:
            self._fs.delete(tmp, False)
            if not self._fs.exists(final):
                raise ConfigError(
                    f"could not write {name} into the checkpoint {self.location}: {error or 'rename refused'}"
                ) from error
        return renamed

    def has_entries(self, folder: str) -> bool:
        d = self._path(folder)
        return bool(self._fs.exists(d)) and len(self._fs.listStatus(d)) > 0

    def remove(self) -> None:
        """Delete the whole location, if it exists (a scratch checkpoint's, never the job's): as
        `delete`, for the root, which a name relative to it cannot denote."""
        self._fs.delete(self._root, True)

    def delete(self, name: str) -> None:
        """Remove a file or a folder (recursively), if it exists."""
        self._fs.delete(self._path(name), True)

    def entries(self, folder: str) -> list[str]:
        d = self._path(folder)
        if not self._fs.exists(d):
            return []
        return sorted(str(st.getPath().getName()) for st in self._fs.listStatus(d))


SINK_ID_FILE = "fleetfence-sink-id"


def sink_id_for(files: CheckpointFiles) -> str:
    """A stable id per checkpoint: a reset checkpoint gets a new id, so its batches are not skipped
    against the markers of the old one. Kept in the checkpoint itself, through the same FileSystem
    as Spark's logs: a driver restarted elsewhere must find the same id, or it could commit its last
    micro-batch to Kafka a second time (docs/exactly-once.md)."""
    files.create(SINK_ID_FILE, uuid.uuid4().hex[:16])
    text = files.read(SINK_ID_FILE)
    if not text or not text.strip():
        raise ConfigError(f"the checkpoint {files.location} has an empty {SINK_ID_FILE}")
    return text.strip()
