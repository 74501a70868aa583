"""fleetfence.files: a folder handed to another process's user, and whether that user can really
create a file in it, tried with real files and a real change of uid and gid (so root only, as the
compose file's `mqtt-bootstrap` runs). The broker's user here is uid/gid 1883, eclipse-mosquitto's:
no entry in this machine's /etc/passwd is needed for a number."""

from __future__ import annotations

import os
import shutil
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from fleetfence.errors import ConfigError
from fleetfence.files import Owner, creatable_by, describe, hand_over_dir, require_creatable

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="changes owners, tries as another uid: root only")

BROKER: Owner = (1883, 1883)
OTHER: Owner = (1884, 1884)


@pytest.fixture
def open_dir() -> Iterator[Path]:
    """A folder any user can pass through (pytest's own are private to root)."""
    d = Path(tempfile.mkdtemp(prefix="fleetfence-files-"))
    d.chmod(0o755)
    yield d
    shutil.rmtree(d, ignore_errors=True)


def mount_point(parent: Path) -> Path:
    """A folder as Docker creates a named volume's mount point in a container without it: root:root
    0755."""
    d = parent / "data"
    d.mkdir()
    d.chmod(0o755)
    os.chown(d, 0, 0)
    return d


def owner_and_mode(path: Path) -> tuple[int, int, int]:
    st = path.stat()
    return st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)


def test_a_root_owned_folder_is_refused_naming_its_owner_and_mode(open_dir: Path) -> None:
    data = mount_point(open_dir)
    failed = creatable_by(data, BROKER)
    assert isinstance(failed, PermissionError), failed
    with pytest.raises(ConfigError) as refused:
        require_creatable(data, BROKER, "the broker", "It keeps its sessions there.")
    text = str(refused.value)
    assert f"the broker (uid 1883, gid 1883) cannot create a file in {data} (owner 0:0, mode 0755)" in text
    assert "Permission denied" in text
    assert text.endswith("It keeps its sessions there.")
    assert list(data.iterdir()) == []
    assert creatable_by(data, None) is None, "root itself can"


def test_a_handed_over_folder_is_its_new_owners_and_the_probe_leaves_nothing(open_dir: Path) -> None:
    data = mount_point(open_dir)
    assert hand_over_dir(data, BROKER) == "owner 0:0, mode 0755"
    assert owner_and_mode(data) == (1883, 1883, 0o755)
    assert creatable_by(data, BROKER) is None
    require_creatable(data, BROKER, "the broker", "")
    assert list(data.iterdir()) == [], "the probe's file was left behind"
    assert hand_over_dir(data, BROKER) is None, "nothing left to change"
    # Only the owner: another user still cannot, and this process is still root.
    assert isinstance(creatable_by(data, OTHER), PermissionError)
    assert (os.geteuid(), os.getegid()) == (0, 0)


def test_the_owner_gets_write_access_and_the_other_bits_stay(open_dir: Path) -> None:
    data = mount_point(open_dir)
    data.chmod(0o550)
    os.chown(data, *BROKER)
    assert isinstance(creatable_by(data, BROKER), PermissionError)
    assert hand_over_dir(data, BROKER) == "owner 1883:1883, mode 0550"
    assert owner_and_mode(data) == (1883, 1883, 0o750)
    assert creatable_by(data, BROKER) is None


def test_the_attempt_has_the_users_group_and_no_other(open_dir: Path) -> None:
    data = mount_point(open_dir)
    os.chown(data, 0, 1883)
    data.chmod(0o775)
    assert creatable_by(data, (1884, 1883)) is None, "group write: its primary group"
    assert isinstance(creatable_by(data, OTHER), PermissionError), "root's groups were not kept"


def test_a_closed_folder_above_is_named(tmp_path: Path) -> None:
    """The folder itself is the broker's, but a folder above it lets nobody else through."""
    data = tmp_path / "data"
    data.mkdir()
    hand_over_dir(data, BROKER)
    closed = next(p for p in reversed(data.parents) if not p.stat().st_mode & stat.S_IXOTH)
    with pytest.raises(ConfigError) as refused:
        require_creatable(data, BROKER, "the broker", "")
    text = str(refused.value)
    assert f"cannot create a file in {data} (owner 1883:1883, mode " in text
    assert f"It cannot pass through {closed} ({describe(closed)})" in text


def test_a_missing_folder_is_an_error_not_a_crash(open_dir: Path) -> None:
    failed = creatable_by(open_dir / "missing", BROKER)
    assert isinstance(failed, FileNotFoundError)
