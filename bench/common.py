"""What the benchmarks share: writing their section of docs/benchmarks.md."""

from __future__ import annotations

from pathlib import Path

BENCHMARKS_MD = Path(__file__).resolve().parent.parent / "docs" / "benchmarks.md"


def write_section(header: str, lines: list[str], doc: Path = BENCHMARKS_MD) -> None:
    """Replace the `## ...` section that starts with `header` (up to the next `## `) with `lines`,
    or append it: a benchmark keeps one current section instead of a growing log."""
    text = doc.read_text() if doc.exists() else "# Benchmarks\n"
    section = "\n".join(lines).rstrip("\n") + "\n"
    if header in text:
        start = text.index(header)
        nxt = text.find("\n## ", start + len(header))
        text = text[:start] + section + ("\n" + text[nxt + 1 :] if nxt >= 0 else "")
    else:
        text = text.rstrip("\n") + "\n\n" + section
    doc.write_text(text)
