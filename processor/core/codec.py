"""The state store's value format: the bucket's vehicle blob and its master data, pickled.

A checkpoint outlives the code that wrote it, and a pickle names each class by its module. So every
place a pickled class has lived stays readable here: the modules of the flat `processor` package
before it split into `core` / `spark` / `ops`, and the classes that left `processor.engine` before
that (tests/processor/test_processor_codec.py loads blobs written by the old layout).
"""

from __future__ import annotations

import io
import pickle
from typing import Any

PROTOCOL = 5

# Old module -> where its classes live now.
_MOVED_MODULES = {
    **{
        f"processor.{m}": f"processor.core.{m}"
        for m in ("domain", "trip", "columns", "geometry", "master", "live", "engine", "parking")
    },
    **{f"processor.{m}": f"processor.spark.{m}" for m in ("rows", "stateful", "rebucket")},
}
# Classes that moved between modules (named by their module at the time).
_MOVED_CLASSES = {
    ("processor.engine", "StateTable"): ("processor.columns", "StateTable"),
    ("processor.engine", "MasterState"): ("processor.master", "MasterState"),
}


def current_name(module: str, name: str) -> tuple[str, str]:
    """Where a class that a pickle names `module.name` lives in this version."""
    module, name = _MOVED_CLASSES.get((module, name), (module, name))
    return _MOVED_MODULES.get(module, module), name


class _StateUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        return super().find_class(*current_name(module, name))


def load_state(blob: bytes) -> Any:
    """Unpickle a state-store value, including one written before its classes moved."""
    return _StateUnpickler(io.BytesIO(blob)).load()


def dump_state(value: Any) -> bytes:
    """Pickle a state-store value."""
    return pickle.dumps(value, protocol=PROTOCOL)
