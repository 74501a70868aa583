"""The house's layers, enforced: imports run one way (README "Packages", docs/architecture.md).

    cli                      the composition on top: commands, the demo; nothing imports it
    loadtest                 the load test (on top, beside the CLI that runs it): drives the whole
                             pipeline; never imports the CLI
    embedded                 launchers of the embedded infrastructure and a local Spark cluster
    gateway, processor, vehicle_master, alerts, admin_api, simulator, history   the components
    fleetfence               the ground: contracts, rules, geo, settings, errors, Kafka helpers,
                             health probes, jars, the service loop, testing helpers; imports no
                             component

Every import counts, the ones inside functions too (that is where a lazy import hides an upward
dependency). Tests and benchmarks share helpers through `fleetfence.testing` and
`tests/<package>/helpers.py`, never by importing a test module.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
GROUND = "fleetfence"
COMPONENTS = ("gateway", "processor", "vehicle_master", "alerts", "admin_api", "simulator", "history")
LAUNCHERS = "embedded"
TOP = "cli"
LOADTEST = "loadtest"
FIRST_PARTY = (GROUND, LAUNCHERS, TOP, LOADTEST, "tests", "bench", *COMPONENTS)


def imports(path: Path, root: Path = ROOT) -> list[tuple[int, str]]:
    """(line, module) of every first-party import in a file, relative ones resolved."""
    tree = ast.parse(path.read_text(), str(path))
    package = ".".join(path.relative_to(root).with_suffix("").parts[:-1])
    out: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                mod = ".".join([*base, node.module] if node.module else base)
            else:
                mod = node.module or ""
            out.append((node.lineno, mod))
    return [(ln, m) for ln, m in out if m.split(".")[0] in FIRST_PARTY]


def violations(files: list[Path], allowed: tuple[str, ...], root: Path = ROOT) -> list[str]:
    return [
        f"{f.relative_to(root)}:{ln} imports {mod}"
        for f in files
        for ln, mod in imports(f, root)
        if mod.split(".")[0] not in allowed
    ]


def py_files(*dirs: str) -> list[Path]:
    return sorted(p for d in dirs for p in (ROOT / d).rglob("*.py"))


def test_the_ground_imports_no_component_and_not_the_cli() -> None:
    assert py_files(GROUND), "no ground package found"
    assert violations(py_files(GROUND), (GROUND,)) == []


def test_components_never_import_the_cli_or_the_launchers() -> None:
    assert violations(py_files(*COMPONENTS), (GROUND, *COMPONENTS)) == []


def test_the_launchers_never_import_the_cli() -> None:
    assert py_files(LAUNCHERS), "no launcher package found"
    assert violations(py_files(LAUNCHERS), (GROUND, *COMPONENTS, LAUNCHERS)) == []


def test_the_load_test_never_imports_the_cli() -> None:
    assert py_files(LOADTEST), "no load test package found"
    assert violations(py_files(LOADTEST), (GROUND, *COMPONENTS, LAUNCHERS, LOADTEST)) == []


def test_tests_and_benchmarks_import_no_test_module() -> None:
    bad = [
        f"{f.relative_to(ROOT)}:{ln} imports {mod}"
        for f in py_files("tests", "bench")
        for ln, mod in imports(f)
        if (mod.startswith("tests.") and mod.rsplit(".", 1)[-1].startswith("test_"))
        or ("bench" in f.relative_to(ROOT).parts[:1] and mod.startswith("tests"))
    ]
    assert bad == []


def test_the_checker_sees_an_upward_import(tmp_path: Path) -> None:
    """The contract is only as good as its import reader: a lazy, a relative and a plain import
    of a component from inside the ground are all caught."""
    fake = tmp_path / GROUND / "_layer_probe.py"
    fake.parent.mkdir()
    fake.write_text(
        "import processor.job\n"
        "def f() -> None:\n    from gateway import service\n"
        "from .settings import Settings\n"
    )
    assert violations([fake], (GROUND,), root=tmp_path) == [
        f"{GROUND}/_layer_probe.py:1 imports processor.job",
        f"{GROUND}/_layer_probe.py:3 imports gateway",
    ]
