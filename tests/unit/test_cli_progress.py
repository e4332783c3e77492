"""tqdm is the CLI's alone (issue 49): only ``opstate.cli.progress`` imports it, no Lambda
layer or function requirements name it, the wheel's dependencies do; and the pure parts of the
bars and the text views (``wait_counts``, ``cli.views``)."""

from __future__ import annotations

import ast
import io
import re
import tomllib
from pathlib import Path

from opstate.cli.progress import (
    MAX_COUNT_NAME,
    MAX_COUNTS,
    ByteSteps,
    LineBar,
    WaitBar,
    wait_counts,
)
from opstate.cli.views import MAX_DEPTH, view_lines

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "layers" / "opstate" / "opstate"


def _imports_tqdm(path: Path) -> bool:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import) and any(a.name.split(".")[0] == "tqdm" for a in node.names):
            return True
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "tqdm":
            return True
    return False


def test_only_the_cli_progress_module_imports_tqdm() -> None:
    sources = [*PACKAGE.rglob("*.py"), *(ROOT / "functions").rglob("*.py")]
    importers = sorted(str(p.relative_to(ROOT)) for p in sources if _imports_tqdm(p))
    assert importers == ["layers/opstate/opstate/cli/progress.py"]


def test_tqdm_is_the_wheels_dependency_and_no_functions() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    assert any(re.match(r"tqdm\b", d) for d in project["dependencies"])
    for requirements in [
        ROOT / "layers" / "opstate" / "requirements.txt",
        *(ROOT / "functions").glob("*/requirements.txt"),
    ]:
        assert "tqdm" not in requirements.read_text(encoding="utf-8").lower(), requirements


def test_bars_that_are_off_write_nothing_and_never_load_tqdm() -> None:
    stream = io.StringIO()
    steps = ByteSteps(False, size=10, stream=stream)
    assert list(steps.read("reading", [b"abc", b"de"])) == [b"abc", b"de"]
    steps("uploading", 5, 5)
    steps.close()
    wait = WaitBar("batches/a", False, stream)
    wait.show("RUNNING", {"batch_stats": {"requestCount": 3}}, None)
    wait.close()
    lines = LineBar(2, False, stream)
    lines.advance()
    lines.clear()
    assert stream.getvalue() == ""


def test_wait_counts_reads_whatever_counts_the_details_show() -> None:
    details = {
        "batch_stats": {"requestCount": 5, "successfulRequestCount": 2, "note": "x"},
        "parts": {"done": 3, "held": 1, "running": 2, "ok": True},
        "rows": 7,
        "deep": {"a": {"b": 1}},
        "flag": False,
    }
    assert wait_counts(details) == {
        "requestCount": 5,
        "successfulRequestCount": 2,
        "done": 3,
        "held": 1,
        "running": 2,
        "rows": 7,
    }


def test_wait_counts_from_outside_cannot_drive_the_terminal_or_grow_the_line() -> None:
    hostile = {"batch_stats": {"\x1b[2Jwiped": 1, "\u202eevil": 2, "x" * 500: 3}}
    hostile |= {f"k{i}": i for i in range(10_000)}
    counts = wait_counts(hostile)
    assert len(counts) == MAX_COUNTS
    assert "\\x1b[2Jwiped" in counts and "\\u202eevil" in counts
    assert all(len(name) <= MAX_COUNT_NAME for name in counts)
    assert not any(ch < " " or ch == "\u202e" for name in counts for ch in name)


def test_text_views_nest_as_blocks_and_stay_bounded() -> None:
    deep: dict[str, object] = {"leaf": 1}
    for _ in range(10):  # hostile details: deeper than any block is drawn
        deep = {"d": deep}
    lines = view_lines({"name": "batches/a", "details": deep, "empty": {}, "tags": ["a", "b"]})
    assert lines[0] == "name     batches/a"
    assert lines[1] == "details"
    assert max(len(line) - len(line.lstrip()) for line in lines) == 2 * MAX_DEPTH
    assert any('{"d": ' in line for line in lines)  # the rest on one line, compact
    assert "empty    -" in lines and "tags     a, b" in lines
