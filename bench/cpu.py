"""CPU time of processes from /proc, for benchmarks that say where a shared box's cores went.

On this 2-core machine the contender, its JVM and Python workers, the broker and Redis all share the
cores, so a rate alone does not say what to cut: CPU seconds per event of each side do.
"""

from __future__ import annotations

import os
from pathlib import Path

_HZ = os.sysconf("SC_CLK_TCK")


def _stat(pid: int) -> list[str] | None:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None


def pid_cpu_s(pid: int) -> float:
    """User + system CPU seconds of one process (0 if it is gone)."""
    f = _stat(pid)
    return (int(f[11]) + int(f[12])) / _HZ if f else 0.0


def tree_cpu_s(root: int) -> float:
    """CPU seconds of `root` and all its live descendants, plus the children they have reaped
    (Spark's JVM and the Python workers it forks are descendants of the benchmark's process)."""
    parent: dict[int, int] = {}
    stats: dict[int, list[str]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            f = _stat(int(entry))
            if f is not None:
                stats[int(entry)] = f
                parent[int(entry)] = int(f[1])
    total = 0.0
    for pid, f in stats.items():
        p = pid
        while p not in (root, 0, 1) and p in parent:
            p = parent[p]
        if p == root:
            total += sum(int(x) for x in f[11:15]) / _HZ
    return total


def broker_pid(port: int) -> int | None:
    """The pid of the process listening on `port` on this machine (the embedded broker)."""
    inode = None
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for ln in lines:
            cols = ln.split()
            if cols[3] == "0A" and int(cols[1].rsplit(":", 1)[1], 16) == port:
                inode = cols[9]
                break
        if inode:
            break
    if inode is None:
        return None
    target = f"socket:[{inode}]"
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            for fd in os.listdir(f"/proc/{entry}/fd"):
                if os.readlink(f"/proc/{entry}/fd/{fd}") == target:
                    return int(entry)
        except OSError:
            continue
    return None
