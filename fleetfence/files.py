"""Files written for another process (the broker runs as its own user and reads its secrets
after dropping root): created with an exact mode and owner whatever the umask, and never in
place of a file that exists, because an existing secret is the one its clients already trust.

A folder another process writes in is handed to it (`hand_over_dir`) and then tried for real
(`require_creatable`: a file created and removed as that process's uid and gid), because the
permission bits alone do not say whether it can: an ACL, a read-only mount or a folder above that it
cannot pass through says otherwise, and a broker that cannot write its files only logs it, again
and again, while it runs on.

`Report` is how a bootstrap that writes them tells its operator what it did, one step at a
time, so a step that fails later still leaves the earlier ones reported (the CLI prints them).
"""

from __future__ import annotations

import errno
import os
import secrets
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


def describe(path: Path) -> str:
    """`owner UID:GID, mode 0755` of a path, as an operator compares it with `ls -ln`."""
    st = path.stat()
    return f"owner {st.st_uid}:{st.st_gid}, mode {stat.S_IMODE(st.st_mode):04o}"


def hand_over_dir(folder: Path, owner: Owner) -> str | None:
    """Give an existing folder to `owner`, who may then read, write and enter it (u+rwx; the other
    bits are kept). Returns what it was before (`describe`) when that changed anything, else None.

    `make_dirs` leaves an existing folder as it is, and a folder another process must write in
    often exists before anybody chose its owner: a Docker volume's mount point is created
    root:root 0755 by the first container that mounts it."""
    before = describe(folder)
    st = folder.stat()
    mode = stat.S_IMODE(st.st_mode)
    if (st.st_uid, st.st_gid) == owner and mode & 0o700 == 0o700:
        return None
    chown(folder, owner)
    try:
        folder.chmod(mode | 0o700)
    except OSError as exc:
        raise ConfigError(f"cannot change the mode of {folder}: {exc}") from exc
    return before


def _create_and_remove(folder: Path) -> int:
    """0 when a new file can be created in `folder` (it is removed again), else the errno."""
    probe = folder / f".fleetfence-probe-{os.getpid()}-{secrets.token_hex(4)}"
    try:
        fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except OSError as exc:
        return exc.errno or errno.EIO
    os.close(fd)
    try:
        probe.unlink()
    except OSError as exc:
        return exc.errno or errno.EIO
    return 0


def creatable_by(folder: Path, owner: Owner | None) -> OSError | None:
    """Whether `owner` (None: this process) can create a file in `folder`, tried for real: None if
    it can, else the error it got. Another user's attempt runs in a forked child that drops to that
    uid and gid (no supplementary groups) before it tries, so this process keeps its identity;
    only root can do that."""
    if owner is None or owner == (os.geteuid(), os.getegid()):
        code = _create_and_remove(folder)
        return OSError(code, os.strerror(code), str(folder)) if code else None
    if os.geteuid() != 0:
        raise ConfigError(f"only root can try {folder} as uid {owner[0]} (run as root, or without --owner)")
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: nothing but system calls, then _exit (no cleanup of the parent's state)
        code = 255
        try:
            os.close(read_end)
            os.setgroups([])
            os.setgid(owner[1])
            os.setuid(owner[0])
            os.write(write_end, str(_create_and_remove(folder)).encode())
            code = 0
        finally:
            os._exit(code)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as f:
        answer = f.read()
    _, status = os.waitpid(pid, 0)
    if os.waitstatus_to_exitcode(status) != 0 or not answer.isdigit():
        raise ConfigError(f"could not try {folder} as uid {owner[0]} gid {owner[1]} (status {status})")
    code = int(answer)
    return OSError(code, os.strerror(code), str(folder)) if code else None


def _closed_above(folder: Path, owner: Owner) -> Path | None:
    """The first folder above `folder` that `owner` cannot pass through (no x bit for it), going
    by the mode bits: the likely reason when `folder` itself looks writable."""
    uid, gid = owner
    for parent in reversed(folder.parents):
        st = parent.stat()
        bit = stat.S_IXUSR if st.st_uid == uid else stat.S_IXGRP if st.st_gid == gid else stat.S_IXOTH
        if not st.st_mode & bit:
            return parent
    return None


def require_creatable(folder: Path, owner: Owner | None, who: str, why: str) -> None:
    """Fail loudly unless `owner` (None: this process) can create a file in `folder`: a
    ConfigError naming the folder, its owner and mode, the user, the error and `why` it matters."""
    failed = creatable_by(folder, owner)
    if failed is None:
        return
    user = f"uid {owner[0]}, gid {owner[1]}" if owner else f"uid {os.geteuid()}, gid {os.getegid()}"
    text = f"{who} ({user}) cannot create a file in {folder} ({describe(folder)}): {failed.strerror}. {why}"
    if owner is not None and writable_by(folder, owner):
        above = _closed_above(folder, owner)
        if above is not None:
            text += f" It cannot pass through {above} ({describe(above)})."
    raise ConfigError(text)
