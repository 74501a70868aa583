"""CPU and memory of the processes a load test started, each counted with all its descendants.

A service under test is rarely one process: the Spark processor is a Python driver, a JVM and the
JVM's Python workers; the admin API is uvicorn and its workers. What it costs is the sum over its
process tree, so `ProcessSampler` finds each watched root's descendants by scanning the parent pid
of every process in /proc at each sample. Linux only, read straight from /proc (no psutil): the
load test runs where the pipeline runs, and one scan a second over a few hundred small files is
cheap.

The rules, so a reader of the numbers knows what they mean:

- **CPU** is percent of one core (200 = two busy cores) over the wall time since the previous
  sample (since the root was added, for the first): the growth of utime + stime from
  /proc/<pid>/stat, in clock ticks (`SC_CLK_TCK`). A descendant seen for the first time counts all
  its ticks (it started after the previous scan). A descendant that exits and is reaped by a member
  of the tree is not lost: the kernel adds its times to its reaper's cutime/cstime, and that growth
  is counted less what the sampler had already counted for the dead one, so nothing counts twice.
  The last moments of a descendant reaped by a process outside the tree (an orphan re-parented to
  init) are lost: the numbers err low, never high.
- **RSS** is resident memory in MiB (resident pages of /proc/<pid>/statm times the page size),
  summed over the tree. Pages shared between a parent and its forked children count once per
  process, as `ps` counts them: an upper bound on physical memory, and its growth is what a soak
  test watches.
- **Trees do not overlap**: a descendant that is itself a watched root (the load test's own
  children are the services under test) counts under its own name only, never under an ancestor.
- **A root that is gone** (exited, a zombie not yet reaped, or its pid reused by another process)
  gives **no entry** in `sample()`, and never comes back: absence says "not running", where zeros
  would pass for an idle process. A descendant that vanishes simply drops out.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from loadtest.errors import LoadtestError
from loadtest.model import ProcSample

logger = logging.getLogger(__name__)

PROC = Path("/proc")
CLK_TCK = os.sysconf("SC_CLK_TCK")
PAGE_SIZE_B = os.sysconf("SC_PAGE_SIZE")
MIB_B = 1024 * 1024


@dataclass(frozen=True)
class ProcStat:
    """The fields of /proc/<pid>/stat the sampler needs. `start_ticks` (since boot) tells a pid
    from a later process that reuses it; `cpu_ticks` is utime + stime, `reaped_ticks` is cutime +
    cstime (the waited-for children's totals, their own reaped children included)."""

    pid: int
    ppid: int
    state: str
    start_ticks: int
    cpu_ticks: int
    reaped_ticks: int

    @property
    def total_ticks(self) -> int:
        return self.cpu_ticks + self.reaped_ticks


def read_stat(pid: int) -> ProcStat | None:
    """/proc/<pid>/stat parsed, or None when the process is gone (it can vanish between the
    directory listing and the read). The command name sits in parentheses and may itself hold
    spaces and parentheses, so the fields are split after the last ')'."""
    try:
        text = (PROC / str(pid) / "stat").read_text()
    except OSError:  # FileNotFoundError, or ProcessLookupError (ESRCH) once it is gone
        return None
    fields = text[text.rindex(")") + 2 :].split()
    # fields[0] is field 3 of proc(5): state, ppid, ..., utime (14), stime (15), cutime, cstime,
    # ..., starttime (22)
    return ProcStat(
        pid=pid,
        ppid=int(fields[1]),
        state=fields[0],
        start_ticks=int(fields[19]),
        cpu_ticks=int(fields[11]) + int(fields[12]),
        reaped_ticks=int(fields[13]) + int(fields[14]),
    )


def read_rss_mib(pid: int) -> float:
    """Resident memory of one process in MiB; 0 when it is gone or a zombie (no memory left)."""
    try:
        resident_pages = int((PROC / str(pid) / "statm").read_text().split()[1])
    except (OSError, IndexError, ValueError):
        return 0.0
    return resident_pages * PAGE_SIZE_B / MIB_B


def uptime_ticks() -> int:
    """Clock ticks since boot, the clock of a process's start time in /proc/<pid>/stat."""
    return int(float((PROC / "uptime").read_text().split()[0]) * CLK_TCK)


def scan() -> dict[int, ProcStat]:
    """Every process on the machine, by pid: one consistent-enough picture of the process table
    (a process forked while the directory is read may be missed; the next scan finds it)."""
    out: dict[int, ProcStat] = {}
    with os.scandir(PROC) as entries:
        for entry in entries:
            if entry.name.isdigit() and (st := read_stat(int(entry.name))) is not None:
                out[st.pid] = st
    return out


@dataclass(frozen=True)
class _Root:
    name: str
    pid: int
    start_ticks: int
    tree: bool


class ProcessSampler:
    """CPU and RSS per named process tree, one `sample()` per call (the driver calls it once a
    second). Not thread-safe: one sampling loop owns it."""

    def __init__(self, pids: Mapping[str, int] | None = None) -> None:
        if not (PROC / "self" / "stat").exists():
            raise LoadtestError("process sampling reads /proc: it needs Linux")
        self._roots: dict[str, _Root] = {}
        # What the previous sample saw of each tree's members, by pid: their stat then.
        self._seen: dict[str, dict[int, ProcStat]] = {}
        self._at: dict[str, float] = {}  # monotonic time of that previous look, per root
        self._since: dict[str, int] = {}  # uptime ticks just before that look's scan, per root
        self.last_interval_s: float | None = None  # wall time the last sample's CPU figures cover
        for name, pid in (pids or {}).items():
            self.add(name, pid)

    def add(self, name: str, pid: int, *, tree: bool = True) -> None:
        """Watch `pid` as `name`, with its descendants unless `tree` is False. Its CPU counts from
        now: the first sample's figure covers the time since this call. A pid that is already gone
        is logged and never reported."""
        if name in self._roots:
            raise LoadtestError(f"a process named {name!r} is already watched")
        since = uptime_ticks()
        table = scan()
        st = table.get(pid)
        if st is None or st.state == "Z":
            logger.warning("not watching %s: process %d is not running", name, pid)
            return
        self._roots[name] = _Root(name, pid, st.start_ticks, tree)
        self._seen[name] = self._members(self._roots[name], table)
        self._at[name], self._since[name] = time.monotonic(), since

    def add_self(self, name: str = "loadtest", *, tree: bool = False) -> None:
        """Watch the load test's own process (the MQTT publisher, in-process parts). By default
        without its descendants: the processes it starts are the services under test, watched
        under their own names, and an unwatched one (a broker started for the run) is not the
        load test's own cost."""
        self.add(name, os.getpid(), tree=tree)

    @property
    def names(self) -> list[str]:
        """The roots still watched (a root that went away is dropped at the sample that finds it gone)."""
        return list(self._roots)

    def pids(self, name: str) -> list[int]:
        """The pids the previous sample counted under `name` (root first): what a test or a
        puzzled reader checks."""
        seen = self._seen.get(name, {})
        root = self._roots[name].pid if name in self._roots else None
        return sorted(seen, key=lambda p: (p != root, p))

    def sample(self) -> dict[str, ProcSample]:
        """One figure per live root: CPU since the previous sample, RSS now."""
        since = uptime_ticks()
        table = scan()
        now = time.monotonic()
        out: dict[str, ProcSample] = {}
        intervals: list[float] = []
        for name, root in list(self._roots.items()):
            st = table.get(root.pid)
            if st is None or st.start_ticks != root.start_ticks or st.state == "Z":
                logger.info("%s (pid %d) has exited: no longer sampled", name, root.pid)
                del self._roots[name], self._seen[name], self._at[name], self._since[name]
                continue
            members = self._members(root, table)
            cpu_ticks = self._cpu_ticks(self._seen[name], members, self._since[name])
            interval_s = now - self._at[name]
            intervals.append(interval_s)
            cpu_pct = 100.0 * cpu_ticks / CLK_TCK / interval_s if interval_s > 0 else 0.0
            rss_mib = sum(read_rss_mib(pid) for pid, m in members.items() if m.state != "Z")
            out[name] = ProcSample(cpu_pct=round(cpu_pct, 1), rss_mib=round(rss_mib, 1))
            self._seen[name], self._at[name], self._since[name] = members, now, since
        self.last_interval_s = max(intervals) if intervals else None
        return out

    def _members(self, root: _Root, table: Mapping[int, ProcStat]) -> dict[int, ProcStat]:
        """The root and (for a tree) its descendants, stopping at other watched roots."""
        members = {root.pid: table[root.pid]}
        if not root.tree:
            return members
        children: dict[int, list[int]] = {}
        for st in table.values():
            children.setdefault(st.ppid, []).append(st.pid)
        others = {r.pid for r in self._roots.values() if r.name != root.name}
        todo = [root.pid]
        while todo:
            for child in children.get(todo.pop(), []):
                if child not in others and child not in members:
                    members[child] = table[child]
                    todo.append(child)
        return members

    @staticmethod
    def _cpu_ticks(before: Mapping[int, ProcStat], after: Mapping[int, ProcStat], since: int) -> int:
        """Ticks the tree used between two looks (see the module's docstring for the rules).

        A member's utime + stime + cutime + cstime grows by its own work and by the totals of the
        children it reaped. A member that vanished had its total, as last seen, counted already;
        its reaper is its nearest ancestor still alive, whose cutime/cstime grew by the dead one's
        final total, so that growth is counted less the part already counted, never below zero.
        A member new since the previous look that started after it (`since`, in ticks since boot)
        counts whole; one that is older (it joined the tree another way: a watched root in
        between went away) has no baseline, and counts from the next look on."""
        counted_dead: dict[int, int] = {}  # live reaper pid -> ticks of its dead descendants already counted
        for pid, old in before.items():
            new = after.get(pid)
            if new is not None and new.start_ticks == old.start_ticks:
                continue
            ancestor, visited = old.ppid, {pid}
            while (
                ancestor in before
                and ancestor not in visited
                and not _same(before[ancestor], after.get(ancestor))
            ):
                visited.add(ancestor)
                ancestor = before[ancestor].ppid
            if _same(before.get(ancestor), after.get(ancestor)):
                counted_dead[ancestor] = counted_dead.get(ancestor, 0) + old.total_ticks
        ticks = 0
        for pid, new in after.items():
            prev = before.get(pid)
            if prev is None or prev.start_ticks != new.start_ticks:
                if new.start_ticks >= since:
                    ticks += new.total_ticks  # started since the previous look: all of it is new
                continue
            ticks += max(0, new.cpu_ticks - prev.cpu_ticks)
            reaped = max(0, new.reaped_ticks - prev.reaped_ticks)
            ticks += max(0, reaped - counted_dead.get(pid, 0))
        return ticks


def _same(old: ProcStat | None, new: ProcStat | None) -> bool:
    return old is not None and new is not None and old.start_ticks == new.start_ticks
