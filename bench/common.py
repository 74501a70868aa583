"""What the benchmarks share: recording a run into the bench's log under docs/bench-log/.

docs/benchmarks.md is the page a user reads: the current figure, the box and the command for each
component, written by hand from the logs. A `--record` writes the bench's log and never that page,
so a figure on it is always one a person has checked against its log.
"""

from __future__ import annotations

import os
import re
import time
from pathlib import Path

BENCH_LOG = Path(__file__).resolve().parent.parent / "docs" / "bench-log"


def log_text(doc: Path) -> str:
    """The log's text, or a bare title for a log that does not exist yet (its folder is made)."""
    if doc.exists():
        return doc.read_text()
    doc.parent.mkdir(parents=True, exist_ok=True)
    return f"# {doc.stem} log\n"


def find_heading(text: str, heading: str, start: int = 0, end: int | None = None) -> int:
    """Where the line starting with `heading` begins, or -1. Only a heading line counts: the logs'
    prose names their own sections, and a record must not land inside a sentence."""
    m = re.compile(rf"^{re.escape(heading)}", re.M).search(text, start, len(text) if end is None else end)
    return m.start() if m else -1


def write_section(header: str, lines: list[str], doc: Path) -> None:
    """Replace the `## ...` section of `doc` whose heading line starts with `header` (up to the
    next `## `) with `lines`, or append it: a bench keeps one current recorded section in its log,
    and the hand-written readings in `## ` sections of their own stay."""
    text = log_text(doc)
    section = "\n".join(lines).rstrip("\n") + "\n"
    start = find_heading(text, header)
    if start >= 0:
        nxt = text.find("\n## ", start + len(header))
        text = text[:start] + section + ("\n" + text[nxt + 1 :] if nxt >= 0 else "")
    else:
        text = text.rstrip("\n") + "\n\n" + section
    doc.write_text(text)


def settle_load(below: float, timeout_s: float = 600.0) -> float:
    """Wait until the 1-min load average is under `below` (0: don't wait) and return it: a run
    that decides something starts on a quiet machine, and its record says how quiet. Past the
    timeout it returns the load as it is (the record shows the run started loaded)."""
    deadline = time.monotonic() + timeout_s
    load = os.getloadavg()[0]
    while below > 0 and load >= below and time.monotonic() < deadline:
        time.sleep(5)  # the kernel's 1-min average moves every 5 s
        load = os.getloadavg()[0]
    return round(load, 2)
