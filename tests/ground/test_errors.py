"""One exception tree: every error class FleetFenceError's packages define lives in the package's
`errors` module and derives from `fleetfence.errors.FleetFenceError` (README "Packages")."""

from __future__ import annotations

import ast
import importlib
import inspect
from pathlib import Path

from fleetfence.errors import FleetFenceError

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = (
    "fleetfence",
    "cli",
    "embedded",
    "loadtest",
    "gateway",
    "processor",
    "vehicle_master",
    "alerts",
    "admin_api",
    "simulator",
    "history",
)


def exception_classes(path: Path) -> list[tuple[int, str]]:
    """(line, name) of every class whose name or bases say it is an exception."""
    tree = ast.parse(path.read_text(), str(path))
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef):
            bases = [ast.unparse(b) for b in node.bases]
            if node.name.endswith(("Error", "Exception")) or any(
                b.endswith(("Error", "Exception")) for b in bases
            ):
                out.append((node.lineno, node.name))
    return out


def test_error_classes_live_in_errors_modules() -> None:
    found = {
        f"{p.relative_to(ROOT)}:{ln} {name}"
        for pkg in PACKAGES
        for p in (ROOT / pkg).rglob("*.py")
        if p.name != "errors.py"
        for ln, name in exception_classes(p)
    }
    assert found == set()


def test_every_error_derives_from_the_one_root() -> None:
    seen = 0
    for pkg in PACKAGES:
        path = ROOT / pkg / "errors.py"
        if not path.exists():
            continue
        module = importlib.import_module(f"{pkg}.errors")
        for name, cls in inspect.getmembers(module, inspect.isclass):
            if cls.__module__ == module.__name__:
                seen += 1
                assert issubclass(cls, FleetFenceError), f"{pkg}.errors.{name}"
    assert seen >= 20


def test_the_scan_catches_an_error_outside_errors_modules(tmp_path: Path) -> None:
    bad = tmp_path / "mod.py"
    bad.write_text("class Oops(ValueError):\n    pass\n\nclass FooError(Exception):\n    pass\n")
    assert exception_classes(bad) == [(1, "Oops"), (4, "FooError")]
