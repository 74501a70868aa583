"""The benchmarks' shared helpers."""

from __future__ import annotations

import re
from pathlib import Path

from bench.common import BENCH_LOG, write_section
from embedded import infra

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "benchmarks.md"


def test_write_section_replaces_its_own_section_and_keeps_the_others(tmp_path: Path) -> None:
    doc = tmp_path / "benchmarks.md"
    doc.write_text("# Benchmarks\n\n## A (bench/a.py)\n\nold a\n\n## B (bench/b.py)\n\nb stays\n")
    write_section("## A (bench/a.py)", ["## A (bench/a.py)", "", "new a", ""], doc)
    assert doc.read_text() == "# Benchmarks\n\n## A (bench/a.py)\n\nnew a\n\n## B (bench/b.py)\n\nb stays\n"
    write_section("## B (bench/b.py)", ["## B (bench/b.py)", "", "new b", ""], doc)
    assert doc.read_text().endswith("## B (bench/b.py)\n\nnew b\n")
    assert "new a" in doc.read_text()
    write_section("## C (bench/c.py)", ["## C (bench/c.py)", "", "c", ""], doc)
    assert doc.read_text().endswith("new b\n\n## C (bench/c.py)\n\nc\n")


def test_write_section_replaces_the_heading_not_a_sentence_that_names_it(tmp_path: Path) -> None:
    """A log's opening text names its recorded section; the record must still land on the heading."""
    doc = tmp_path / "a.md"
    intro = "# A log\n\nRecords replace `## A (bench/a.py)` below.\n\n"
    doc.write_text(intro + "## A (bench/a.py)\n\nold\n")
    write_section("## A (bench/a.py)", ["## A (bench/a.py)", "", "new", ""], doc)
    assert doc.read_text() == intro + "## A (bench/a.py)\n\nnew\n"


def test_write_section_starts_a_missing_log(tmp_path: Path) -> None:
    doc = tmp_path / "bench-log" / "new.md"
    write_section("## N", ["## N", "", "n", ""], doc)
    assert doc.read_text() == "# new log\n\n## N\n\nn\n"


def test_every_bench_records_into_a_log_that_exists() -> None:
    """A bench's `--record` names its log file; a typo would start a new, unlinked log."""
    named = {
        m for f in (ROOT / "bench").glob("*.py") for m in re.findall(r'BENCH_LOG / "([^"]+)"', f.read_text())
    }
    assert len(named) >= 12
    assert sorted(n for n in named if not (BENCH_LOG / n).exists()) == []


def _anchors(md: Path) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"^```.*?^```", "", md.read_text(), flags=re.M | re.S)  # a `# comment` is no heading
    heads = re.findall(r"^#{1,6} (.+)$", text, re.M)
    return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-") for h in heads}


def test_links_of_the_benchmark_docs_resolve() -> None:
    """The page links every log, the logs link the page's sections, and other docs link the page:
    moving a section must not leave a link pointing nowhere."""
    docs = [PAGE, *sorted(BENCH_LOG.glob("*.md"))]
    others = [ROOT / "README.md", ROOT / "CONTRIBUTING.md", *sorted((ROOT / "docs").glob("*.md"))]
    broken = []
    for md in dict.fromkeys(docs + others):
        for target in re.findall(r"\]\(([^)\s]+)\)", md.read_text()):
            if re.match(r"[a-z]+:", target):
                continue
            path, _, anchor = target.partition("#")
            dest = (md.parent / path).resolve() if path else md
            if md not in docs and dest != PAGE:
                continue
            if not dest.exists() or (anchor and dest.suffix == ".md" and anchor not in _anchors(dest)):
                broken.append(f"{md.relative_to(ROOT)}: {target}")
    assert broken == []


def test_private_fields_never_point_at_shared_or_external_endpoints(tmp_path: Path) -> None:
    f = infra.private_fields(tmp_path)
    assert f["state_dir"] == tmp_path
    assert f["kafka_bootstrap"] is None
    assert f["mqtt_url"] is None
    assert f["redis_url"] is None
    ports = {f["kafka_port"], f["mqtt_port"], f["redis_port"]}
    assert len(ports) == 3
    assert not ports & {9092, 1883, 6379}
