"""``tools/mutate.py``'s gate (issue 49): the mutants on a line marked ``# mutant: equivalent —
why`` are skipped and counted, every other survivor fails the run, and a marker on a line
without a mutant (a stale claim) fails it too."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _tool() -> ModuleType:
    spec = importlib.util.spec_from_file_location("opstate_mutate_tool", ROOT / "tools/mutate.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault(spec.name, module)  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


mutate = _tool()

# Each function holds one mutant (Lt -> LtE, Gt -> GtE), and the test below kills neither.
TINY = """\
def small(n: int, limit: int) -> bool:
    return n < limit  # mutant: equivalent — the test never asks at the limit


def big(n: int, limit: int) -> bool:
    return n > limit
"""
TINY_TEST = """\
from opstate.tiny import big, small


def test_tiny() -> None:
    assert small(3, 10)
    assert big(30, 10)
"""


def _tiny_root(tmp_path: Path, source: str = TINY) -> Path:
    package = tmp_path / "layers" / "opstate" / "opstate"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "tiny.py").write_text(source)
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_tiny.py").write_text(TINY_TEST)
    return tmp_path


def test_the_marker_is_read_with_its_reason() -> None:
    source = (
        "a = 1  # mutant: equivalent — only the memory\n"
        "b = 2  # mutant: equivalent - a hyphen will do\n"
        "c = 3  # mutant: equivalent\n"  # no reason: not a marker
        "d = 4  # mutant slots=False: equivalent (the old prose)\n"
        "e = 5  #mutant: equivalent —  spaces around\n"
    )
    assert mutate.equivalent_lines(source) == {
        1: "only the memory",
        2: "a hyphen will do",
        5: "spaces around",
    }


def test_marked_lines_are_skipped_exactly(tmp_path: Path) -> None:
    root = _tiny_root(tmp_path)
    chosen = mutate.select("tiny", root)
    assert [(m.line, m.description) for m in chosen.skipped] == [(2, "Lt -> LtE")]
    assert [(m.line, m.description) for m in chosen.run] == [(6, "Gt -> GtE")]
    assert chosen.stale == []


def test_a_marker_without_a_mutant_is_stale(tmp_path: Path) -> None:
    source = TINY.replace("def big(", "# mutant: equivalent — of nothing\ndef big(")
    chosen = mutate.select("tiny", _tiny_root(tmp_path, source))
    assert chosen.stale == ["tiny.py:5"]


def test_the_gate_fails_on_an_unmarked_survivor_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    root = _tiny_root(tmp_path)
    monkeypatch.setattr(mutate, "ROOT", root)
    monkeypatch.setattr(mutate, "TARGETS", {"tiny": ["tests/test_tiny.py"]})

    assert mutate.main(["--module", "tiny", "--jobs", "1"]) == 1
    out = capsys.readouterr().out
    assert "1 mutants in tiny (1 skipped: marked equivalent)" in out
    assert "SURVIVED tiny.py:6: #1 Gt -> GtE" in out
    assert "tiny.py:2" not in out  # the marked mutant was never run
    assert "1 mutants run, 1 survived, 1 skipped (marked equivalent)" in out

    marked = TINY.replace("return n > limit", "return n > limit  # mutant: equivalent — same")
    (root / "layers/opstate/opstate/tiny.py").write_text(marked)
    assert mutate.main(["--module", "tiny", "--jobs", "1"]) == 0
    assert "0 mutants run, 0 survived, 2 skipped (marked equivalent)" in capsys.readouterr().out


def test_the_gate_is_the_retry_rooms_and_the_job_queues_pure_modules() -> None:
    assert {"domain.retry", "domain.refusals", "retry.rules", "retry.final"} <= set(mutate.GATED)
    assert {"domain.parts", "retry.jobs"} <= set(mutate.GATED)
    assert set(mutate.GATED) <= set(mutate.TARGETS)
