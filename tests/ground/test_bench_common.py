"""The benchmarks' shared helpers."""

from __future__ import annotations

from pathlib import Path

from bench.common import write_section
from embedded import infra


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


def test_private_fields_never_point_at_shared_or_external_endpoints(tmp_path: Path) -> None:
    f = infra.private_fields(tmp_path)
    assert f["state_dir"] == tmp_path
    assert f["kafka_bootstrap"] is None
    assert f["mqtt_url"] is None
    assert f["redis_url"] is None
    ports = {f["kafka_port"], f["mqtt_port"], f["redis_port"]}
    assert len(ports) == 3
    assert not ports & {9092, 1883, 6379}
