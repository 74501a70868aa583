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

Inside a package, modules import one way too: no circle (a module that imports another that imports
it back, however many steps apart). A circle is how a lazy or `TYPE_CHECKING` import usually hides
a piece that belongs in a third module both can import.
"""

from __future__ import annotations

import ast
import sys
from collections import deque
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
GROUND = "fleetfence"
COMPONENTS = ("gateway", "processor", "vehicle_master", "alerts", "admin_api", "simulator", "history")
LAUNCHERS = "embedded"
TOP = "cli"
LOADTEST = "loadtest"
FIRST_PARTY = (GROUND, LAUNCHERS, TOP, LOADTEST, "tests", "bench", *COMPONENTS)


def import_statements(path: Path, root: Path = ROOT) -> Iterator[tuple[int, str, list[str]]]:
    """(line, module, names) of every import statement in a file, anywhere in it (functions and
    `if TYPE_CHECKING:` blocks included), relative ones resolved; `names` are what a `from` import
    takes from the module, empty for a plain `import`."""
    tree = ast.parse(path.read_text(), str(path))
    package = ".".join(path.relative_to(root).with_suffix("").parts[:-1])
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                yield node.lineno, a.name, []
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                mod = ".".join([*base, node.module] if node.module else base)
            else:
                mod = node.module or ""
            yield node.lineno, mod, [a.name for a in node.names]


def imports(path: Path, root: Path = ROOT) -> list[tuple[int, str]]:
    """(line, module) of every first-party import in a file, relative ones resolved."""
    return [(ln, m) for ln, m, _ in import_statements(path, root) if m.split(".")[0] in FIRST_PARTY]


def violations(files: list[Path], allowed: tuple[str, ...], root: Path = ROOT) -> list[str]:
    return [
        f"{f.relative_to(root)}:{ln} imports {mod}"
        for f in files
        for ln, mod in imports(f, root)
        if mod.split(".")[0] not in allowed
    ]


def py_files(*dirs: str) -> list[Path]:
    return sorted(p for d in dirs for p in (ROOT / d).rglob("*.py"))


def module_name(path: Path, root: Path = ROOT) -> str:
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph(files: list[Path], root: Path = ROOT) -> dict[str, dict[str, int]]:
    """{module: {module it imports: line}} among `files` only. `from a import b` is an edge to
    the module `a.b` when there is one (a submodule), else to `a`; `import a.b.c` to the longest
    of `a.b.c`, `a.b`, `a` that is among the files."""
    known = {module_name(f, root) for f in files}
    graph: dict[str, dict[str, int]] = {}
    for f in files:
        me = module_name(f, root)
        edges = graph.setdefault(me, {})
        for ln, mod, names in import_statements(f, root):
            if names:
                targets = [f"{mod}.{n}" if f"{mod}.{n}" in known else mod for n in names]
            else:
                parts = mod.split(".")
                prefixes = (".".join(parts[:i]) for i in range(len(parts), 0, -1))
                targets = [next((t for t in prefixes if t in known), mod)]
            for t in targets:
                if t in known and t != me:
                    edges[t] = min(ln, edges.get(t, ln))
    return graph


def circles(files: list[Path], root: Path = ROOT) -> list[str]:
    """The import circles among `files`: for each module on one, the shortest way round from it,
    each set of modules once ("a:3 imports b, b:7 imports a")."""
    graph = import_graph(files, root)
    found: list[str] = []
    seen: set[frozenset[str]] = set()
    for start in sorted(graph):
        # Breadth first from `start` until an edge leads back to it: the shortest circle through it.
        came_from: dict[str, str] = {}
        queue = deque([start])
        while queue:
            here = queue.popleft()
            if start in graph[here]:
                path = [here]
                while path[-1] != start:
                    path.append(came_from[path[-1]])
                path.reverse()
                members = frozenset(path)
                if members not in seen:
                    seen.add(members)
                    steps = zip(path, [*path[1:], start], strict=True)
                    found.append(", ".join(f"{a}:{graph[a][b]} imports {b}" for a, b in steps))
                break
            for nxt in sorted(graph[here]):
                if nxt not in came_from and nxt != start:
                    came_from[nxt] = here
                    queue.append(nxt)
    return found


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
        "import processor.spark.job\n"
        "def f() -> None:\n    from gateway import service\n"
        "from .settings import Settings\n"
    )
    assert violations([fake], (GROUND,), root=tmp_path) == [
        f"{GROUND}/_layer_probe.py:1 imports processor.spark.job",
        f"{GROUND}/_layer_probe.py:3 imports gateway",
    ]


def test_no_import_circle_inside_a_package() -> None:
    found = [c for package in (*FIRST_PARTY, "tests_deploy") for c in circles(py_files(package))]
    assert not found, "import circles:\n" + "\n".join(found)


def test_the_circle_check_sees_lazy_and_type_checking_imports(tmp_path: Path) -> None:
    """A circle closed by a `from package import module`, a relative import inside a function and
    an import under `TYPE_CHECKING` is found, once, and a module that only imports into it is not
    on it."""
    pkg = tmp_path / "alerts"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from alerts import b\n")
    (pkg / "b.py").write_text("def f() -> None:\n    from .c import X\n")
    (pkg / "c.py").write_text("from typing import TYPE_CHECKING\n\nif TYPE_CHECKING:\n    import alerts.a\n")
    (pkg / "d.py").write_text("import alerts.a\nfrom alerts.c import X\n")
    assert circles(sorted(pkg.rglob("*.py")), root=tmp_path) == [
        "alerts.a:1 imports alerts.b, alerts.b:2 imports alerts.c, alerts.c:4 imports alerts.a"
    ]


# The processor's own floors: a Spark-free core, the Spark adapters on it, operations on top.
PROCESSOR_FLOORS = {
    "core": ("processor.core", "processor.errors"),
    "spark": ("processor.core", "processor.spark", "processor.errors", "processor.settings"),
}
# What the core may import from outside the standard library and the processor: computation, never
# I/O or Spark; from the ground only the contracts, rules, geometry helpers and errors.
CORE_THIRD_PARTY = ("numpy", "pandas", "pyarrow", "shapely", "h3", "h3ronpy", "orjson")
CORE_GROUND = ("fleetfence.contracts", "fleetfence.rules", "fleetfence.geo", "fleetfence.errors")


def processor_floor_violations(root: Path = ROOT) -> list[str]:
    found = []
    for floor, allowed in PROCESSOR_FLOORS.items():
        for f in sorted((root / "processor" / floor).rglob("*.py")):
            for ln, mod, _ in import_statements(f, root):
                top = mod.split(".")[0]
                inside = top == "processor" and not any(mod == a or mod.startswith(a + ".") for a in allowed)
                if top == GROUND:
                    outside = floor == "core" and mod not in CORE_GROUND
                else:
                    known = ("processor", *CORE_THIRD_PARTY, *sys.stdlib_module_names)
                    outside = floor == "core" and top not in known
                if inside or outside:
                    found.append(f"{f.relative_to(root)}:{ln} imports {mod}")
    return sorted(found)


def test_the_processor_core_imports_no_spark_and_the_adapters_no_operations() -> None:
    """processor.core is the engine and its data (no Spark, no Kafka, no Redis: it runs and is
    tested in a plain Python process); processor.spark adapts it to Spark and the sinks;
    processor.ops runs the job. Imports run core <- spark <- ops."""
    assert processor_floor_violations() == []


def test_the_floor_check_sees_spark_in_the_core(tmp_path: Path) -> None:
    for floor in ("core", "spark", "ops"):
        (tmp_path / "processor" / floor).mkdir(parents=True)
    (tmp_path / "processor" / "core" / "a.py").write_text(
        "import math\nimport numpy\ndef f() -> None:\n    from pyspark.sql import DataFrame\n"
        "from processor.spark.rows import OutputRow\nfrom fleetfence.kafka import ensure_topics\n"
        "from fleetfence.geo import haversine_m\nimport vehicle_master.store\n"
    )
    (tmp_path / "processor" / "spark" / "b.py").write_text(
        "from processor.core import domain\nfrom processor.ops.service import run\n"
    )
    assert processor_floor_violations(tmp_path) == [
        "processor/core/a.py:4 imports pyspark.sql",
        "processor/core/a.py:5 imports processor.spark.rows",
        "processor/core/a.py:6 imports fleetfence.kafka",
        "processor/core/a.py:8 imports vehicle_master.store",
        "processor/spark/b.py:2 imports processor.ops.service",
    ]
