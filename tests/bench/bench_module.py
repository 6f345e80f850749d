"""A script of bench/ loaded as a module, for the smoke tests that call its functions (bench/ is not
a package: its scripts put the repository on sys.path themselves and import each other by name)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

BENCH = Path(__file__).resolve().parents[2] / "bench"


def load(name: str, script: str) -> ModuleType:
    """`bench/<script>` as the module `name` (registered in sys.modules: dataclasses and pickling
    in spawned writer processes look it up there)."""
    spec = importlib.util.spec_from_file_location(name, BENCH / script)
    assert spec and spec.loader, script
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module
