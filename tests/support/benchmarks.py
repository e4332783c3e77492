"""A module of ``benchmarks/`` loaded by its file, for the tests of its pure parts (the
benchmarks are scripts, not a package)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


def load_benchmark(stem: str) -> ModuleType:
    """``benchmarks/<stem>.py`` as the module ``bench_<stem>`` (registered in ``sys.modules``:
    dataclasses resolve their module by name)."""
    spec = importlib.util.spec_from_file_location(f"bench_{stem}", BENCHMARKS / f"{stem}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module
