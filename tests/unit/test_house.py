"""The house stays walkable: no module of the package passes 500 lines, and ``make mutate``'s
module list names modules and tests that exist (a move that forgot it would leave the mutation
run failing on a missing file instead of testing the domain)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

from tests.unit.test_layers import PACKAGE, module_files

ROOT = PACKAGE.parents[2]
MAX_LINES = 500


def _mutate_targets() -> dict[str, list[str]]:
    spec = importlib.util.spec_from_file_location("opstate_mutate_tool", ROOT / "tools/mutate.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault(spec.name, module)  # its dataclasses look their module up
    spec.loader.exec_module(module)
    targets: dict[str, list[str]] = module.TARGETS
    return targets


def long_modules(files: dict[str, Path], limit: int = MAX_LINES) -> list[str]:
    counts = {
        name: len(path.read_text(encoding="utf-8").splitlines()) for name, path in files.items()
    }
    return [f"{name}: {n} lines" for name, n in sorted(counts.items()) if n > limit]


def test_no_module_passes_500_lines() -> None:
    assert long_modules(module_files()) == [], (
        "split these along their seams (docs/architecture.md)"
    )


def test_the_line_check_can_fail(tmp_path: Path) -> None:
    big = tmp_path / "big.py"
    big.write_text("x = 1\n" * (MAX_LINES + 1))
    small = tmp_path / "small.py"
    small.write_text("x = 1\n" * MAX_LINES)
    assert long_modules({"big": big, "small": small}) == ["big: 501 lines"]


@pytest.mark.parametrize("module", sorted(_mutate_targets()))
def test_every_mutation_target_and_its_tests_exist(module: str) -> None:
    assert (PACKAGE / (module.replace(".", "/") + ".py")).is_file(), f"tools/mutate.py: {module}"
    for test in _mutate_targets()[module]:
        # A file, or one test of it (``file::test_name``: retry.jobs's two plan tests).
        path, _, name = test.partition("::")
        assert (ROOT / path).is_file(), f"tools/mutate.py names a missing test file: {path}"
        if name:
            defined = f"def {name}(" in (ROOT / path).read_text()
            assert defined, f"tools/mutate.py names a missing test: {test}"
