"""Process bookkeeping of the embedded servers: spawn one in its own session with a pid file, tell
our process from a recycled pid, stop exactly what we started and wait until its ports are free.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

from fleetfence.errors import InfraError, MissingBinaryError
from fleetfence.probes import port_free
from fleetfence.settings import Settings

logger = logging.getLogger(__name__)


def system_binary(name: str, package: str) -> Path:
    found = shutil.which(name) or next(
        (str(p) for p in (Path("/usr/sbin") / name, Path("/usr/bin") / name) if p.is_file()), None
    )
    if not found:
        raise MissingBinaryError(f"{name} is not installed: run `sudo apt-get install -y {package}`")
    return Path(found)


def pid_file(settings: Settings, name: str) -> Path:
    return settings.run_dir / f"{name}.pid"


def read_pid(settings: Settings, name: str) -> tuple[int, str, str] | None:
    """(pid, binary, marker) from a pid file; the marker is the last argument of the command line
    (the config file), which tells our JVM from any other `java` on a recycled pid."""
    pf = pid_file(settings, name)
    if not pf.exists():
        return None
    try:
        lines = pf.read_text().splitlines()
        return int(lines[0]), lines[1].strip(), (lines[2].strip() if len(lines) > 2 else "")
    except (ValueError, IndexError):
        return None


def alive(pid: int, exe: str, marker: str = "") -> bool:
    """True when `pid` runs and is the process we started (not a recycled pid)."""
    try:
        running = os.readlink(f"/proc/{pid}/exe")
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes() if marker else b""
    except OSError:  # gone, a zombie, or not ours to inspect
        return False
    if Path(running.removesuffix(" (deleted)")).name != Path(exe).name:
        return False
    return not marker or marker.encode() in cmdline.split(b"\0")


def spawn(
    settings: Settings, name: str, argv: list[str], log: Path, marker: str = ""
) -> subprocess.Popen[bytes]:
    """Start a service in its own session; `marker` (an argument of its command line) tells it
    apart from other processes of the same binary (every JVM is `java`). Redis rewrites its process
    title, so it goes without."""
    settings.run_dir.mkdir(parents=True, exist_ok=True)
    logf = log.open("ab")
    proc = subprocess.Popen(
        argv, stdout=logf, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True
    )
    logf.close()
    # The resolved path: /usr/bin/redis-server is a symlink to redis-check-rdb, which is what
    # /proc/<pid>/exe shows.
    pid_file(settings, name).write_text(f"{proc.pid}\n{Path(argv[0]).resolve()}\n{marker}\n")
    logger.info("service spawned service=%s pid=%s", name, proc.pid)
    return proc


def check_port(settings: Settings, name: str, port: int) -> None:
    if not port_free(settings.host, port):
        raise InfraError(
            f"{name} port {settings.host}:{port} is taken by another process; set "
            f"FLEETFENCE_{name.upper()}_PORT to a free port or point FleetFence at that server with "
            "its external-endpoint variable"
        )


def stop_one(settings: Settings, name: str, timeout_s: float = 30.0) -> bool:
    rec = read_pid(settings, name)
    pf = pid_file(settings, name)
    if rec is None:
        return False
    pid, exe, marker = rec
    stopped = False
    if alive(pid, exe, marker):
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout_s
        while alive(pid, exe, marker) and time.monotonic() < deadline:
            reap(pid)
            time.sleep(0.05)
        if alive(pid, exe, marker):
            logger.warning("service ignored SIGTERM, killing service=%s pid=%s", name, pid)
            os.kill(pid, signal.SIGKILL)
            while alive(pid, exe, marker):
                reap(pid)
                time.sleep(0.05)
        # A restart right after must find the port free (bounded: a recycled pid is not waited on).
        exit_deadline = time.monotonic() + 5
        while not exited(pid) and time.monotonic() < exit_deadline:
            time.sleep(0.01)
        reap(pid)
        stopped = True
    pf.unlink(missing_ok=True)
    return stopped


def exited(pid: int) -> bool:
    """True once every thread of `pid` has finished exiting (gone, or only a zombie left): only then
    are its sockets closed and its ports free again. Its /proc exe link, which `alive` reads,
    disappears earlier, and a JVM's main thread turns zombie while its other threads still exit."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        threads = len(os.listdir(f"/proc/{pid}/task"))
    except (OSError, IndexError):
        return True
    return state in ("Z", "X") and threads <= 1


def reap(pid: int) -> None:
    """Collect the exit status when the process is our child, so it does not linger as a zombie."""
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)
