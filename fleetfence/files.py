"""Files written for another process (the broker runs as its own user and reads its secrets
after dropping root): created with an exact mode and owner whatever the umask, and never in
place of a file that exists, because an existing secret is the one its clients already trust.

`Report` is how a bootstrap that writes them tells its operator what it did, one step at a
time, so a step that fails later still leaves the earlier ones reported (the CLI prints them).
"""

from __future__ import annotations

import os
import stat
import tempfile
from pathlib import Path
from typing import Protocol

from fleetfence.errors import ConfigError

Owner = tuple[int, int]  # uid, gid


class Report(Protocol):
    """Where a bootstrap's steps go: `step` for a file written or kept (the verb first), `note`
    and `warning` for what the operator should look at."""

    def step(self, verb: str, text: str) -> None: ...

    def note(self, text: str) -> None: ...

    def warning(self, text: str) -> None: ...


def chown(path: Path, owner: Owner | None) -> None:
    if owner is None:
        return
    try:
        os.chown(path, *owner)
    except OSError as exc:  # not root, a read-only mount
        raise ConfigError(
            f"cannot hand {path} to uid {owner[0]} (run as root, or without --owner): {exc}"
        ) from exc


def make_dirs(path: Path, mode: int, owner: Owner | None = None) -> None:
    """Create the missing folders up to `path` with this mode (whatever the umask) and owner;
    existing folders are left as they are."""
    missing = [p for p in (path, *path.parents) if not p.exists()]
    for p in reversed(missing):
        try:
            p.mkdir()
            p.chmod(mode)
        except OSError as exc:
            raise ConfigError(f"cannot create {p}: {exc}") from exc
        chown(p, owner)


def write_new(path: Path, data: bytes, mode: int, owner: Owner | None = None) -> None:
    """Write a file that must not exist: a temporary file in the same folder, complete and with its
    mode and owner, then hard-linked to its name, which fails rather than replace a file."""
    try:
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    except OSError as exc:
        raise ConfigError(f"cannot write in {path.parent}: {exc}") from exc
    try:
        with os.fdopen(fd, "wb") as f:
            os.fchmod(f.fileno(), mode)
            if owner is not None:
                os.fchown(f.fileno(), *owner)
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.link(tmp, path)
    except FileExistsError as exc:
        raise ConfigError(f"{path} appeared meanwhile: left as it is") from exc
    except OSError as exc:  # no permission, a read-only mount, a full disk
        raise ConfigError(f"cannot write {path}: {exc}") from exc
    finally:
        Path(tmp).unlink(missing_ok=True)


def writable_by(folder: Path, owner: Owner) -> bool:
    st = folder.stat()
    uid, gid = owner
    return bool(
        (st.st_uid == uid and st.st_mode & stat.S_IWUSR)
        or (st.st_gid == gid and st.st_mode & stat.S_IWGRP)
        or st.st_mode & stat.S_IWOTH
    )
