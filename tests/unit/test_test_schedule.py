"""How `make test` runs (issue 49): the checks and builds side by side, then pytest on every
core with pytest-xdist, a module's tests on one worker and the slowest modules first
(tests/conftest.py); builds of the source tree one at a time. Read from ``make -n`` and from
the hook itself, on stand-in items."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests import conftest
from tests.support.source_build import lock_path, source_tree_lock

ROOT = Path(__file__).resolve().parents[2]


def dry_run(*args: str) -> str:
    # Without the variables of a make this suite may run under (`make pytest PYTEST_WORKERS=3`
    # hands PYTEST_WORKERS to every make below it through MAKEFLAGS).
    env = {k: v for k, v in os.environ.items() if k not in {"MAKEFLAGS", "MFLAGS", "MAKELEVEL"}}
    result = subprocess.run(
        ["make", "-n", "-C", str(ROOT), "--no-print-directory", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    assert result.returncode == 0, result.stderr
    return result.stdout.replace("\\\n", " ")


needs_make = pytest.mark.skipif(shutil.which("make") is None, reason="no make")


@needs_make
def test_pytest_runs_on_every_core_unless_told_one_process() -> None:
    line = next(x for x in dry_run("-B", "pytest").splitlines() if " -m pytest" in x)
    # --no-loadscope-reorder: the order tests/conftest.py gives (slowest first), not xdist's
    # (the modules with the most tests first).
    # One worker more than the cores: the tests wait on subprocesses and Docker often enough.
    workers = (os.cpu_count() or 1) + 1
    assert f"-n {workers} --dist loadfile --no-loadscope-reorder" in " ".join(line.split())
    line = next(
        x for x in dry_run("-B", "pytest", "PYTEST_WORKERS=0").splitlines() if " -m pytest" in x
    )
    assert " -n " not in line and "--dist" not in line and "reorder" not in line


@needs_make
def test_the_benchmark_check_leaves_make_test_for_ci() -> None:
    """The AWS cost benchmark's quick day (marker bench) is not in make test's pytest;
    `make bench-check` runs it alone and .ci/run runs that after make test (issue 48 allows
    "make test (or .ci/run)"; issue 49 wants make test under 8 minutes)."""
    line = next(x for x in dry_run("-B", "pytest").splitlines() if " -m pytest" in x)
    assert '-m "not bench"' in line
    check = next(x for x in dry_run("-B", "bench-check").splitlines() if " -m pytest" in x)
    assert "-m bench " in check and "test_bench_aws_cost_quick.py" in check
    marked = (ROOT / "tests" / "integration" / "test_bench_aws_cost_quick.py").read_text("utf-8")
    assert "pytest.mark.bench" in marked
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    body = ci.split("\nelse\n", 1)[1]
    assert body.index("make test") < body.index("make bench-check")


@needs_make
def test_make_test_runs_the_checks_side_by_side_before_pytest() -> None:
    lines = dry_run("test").splitlines()
    setup = next(i for i, x in enumerate(lines) if "test-setup" in x)
    assert " -j4 " in f" {lines[setup]} "
    tests = next(i for i, x in enumerate(lines) if " -m pytest" in x)
    assert setup < tests
    prerequisites = (ROOT / "Makefile").read_text(encoding="utf-8").split("\ntest-setup:", 1)[1]
    needed = prerequisites.split("\n\n", 1)[0].replace("\\\n", " ").split()
    assert set(needed) == {
        *("lint", "typecheck", "template-lint", "checkov-venv", "builds", "rie-venv"),
        "lambda-base-image-if-docker",
        "collect",  # pytest's collection once: the workers read its bytecode
    }
    # Checkov runs once, in pytest (tests/e2e/test_template_scan.py), not also before it.
    assert not [x for x in lines[:tests] if "checkov -f template.yaml" in x]
    scan = (ROOT / "tests" / "e2e" / "test_template_scan.py").read_text(encoding="utf-8")
    assert '"template.yaml"' in scan and '"cloudformation"' in scan
    assert 'report["summary"]["failed"] == 0' in scan
    # The two sam builds run side by side, each beside its own build.toml (sam keeps it in the
    # build folder's parent): the arm64 build's folder is not a sibling of .aws-sam/build.
    builds = prerequisites.split("\nbuilds:", 1)[1].split("\n", 1)[0].split()
    assert builds == ["build", "build-arm64"]
    arm64 = next(x for x in dry_run("-B", "build-arm64").splitlines() if " build " in x)
    build_dir = Path(arm64.split("--build-dir ", 1)[1].split()[0])
    cache_dir = Path(arm64.split("--cache-dir ", 1)[1].split()[0])
    assert build_dir.parent != Path(".aws-sam") and build_dir.parent == cache_dir.parent


@dataclass
class StandIn:
    """What the hook reads of a collected test: its node id."""

    nodeid: str


def test_the_slowest_modules_come_first_and_each_module_keeps_its_order() -> None:
    names = [
        "tests/browser/test_p.py::test_1",
        "tests/e2e/test_e.py::test_1",
        "tests/integration/test_i.py::test_1",
        "tests/integration/test_wheel_install.py::test_1",
        "tests/integration/test_i.py::test_2",
        "tests/reliability/test_r.py::test_1",
        "tests/samlocal/test_local_config.py::test_1",
        "tests/samlocal/test_sam_local.py::test_2",
        "tests/samlocal/test_sam_local.py::test_1",
        "tests/unit/test_u.py::test_1",
    ]
    items = [StandIn(n) for n in names]
    conftest.pytest_collection_modifyitems(None, items)  # type: ignore[arg-type]
    assert [item.nodeid for item in items] == [
        "tests/samlocal/test_sam_local.py::test_2",
        "tests/samlocal/test_sam_local.py::test_1",
        "tests/integration/test_wheel_install.py::test_1",
        "tests/browser/test_p.py::test_1",
        "tests/e2e/test_e.py::test_1",
        "tests/reliability/test_r.py::test_1",
        "tests/integration/test_i.py::test_1",
        "tests/integration/test_i.py::test_2",
        "tests/samlocal/test_local_config.py::test_1",
        "tests/unit/test_u.py::test_1",
    ]


def test_a_build_of_the_source_tree_waits_for_the_one_running() -> None:
    """Two builds of the tree at once break each other (setuptools writes into it): the lock
    tests/support/source_build.py takes is held across processes."""
    probe = (
        "import fcntl, sys\n"
        "with open(sys.argv[1], 'a') as h:\n"
        "    try:\n"
        "        fcntl.flock(h, fcntl.LOCK_EX | fcntl.LOCK_NB)\n"
        "    except BlockingIOError:\n"
        "        sys.exit(3)\n"
    )
    with source_tree_lock():
        tried = subprocess.run([sys.executable, "-c", probe, str(lock_path())], timeout=60)
    assert tried.returncode == 3


@needs_make
def test_every_virtualenv_brings_its_pip_up_to_date_before_installing() -> None:
    """The bundled pip of a new venv (23.2 on the machines' Python 3.11) spent 26 of the tools'
    28 CPU s reading PyPI's pages; pip 26 installs the same in 10 (issue 49)."""
    for stamp in (".tools-venv/.installed", ".checkov-venv/.installed", ".rie-venv/.installed"):
        lines = [x for x in dry_run("-B", stamp).splitlines() if " -m pip install " in x]
        assert len(lines) == 2, lines
        assert "--upgrade pip" in lines[0] and " -r requirements-" in lines[1]


@needs_make
def test_typecheck_seeds_and_keeps_mypys_cache() -> None:
    lines = dry_run("-B", "typecheck", "MYPY_SHARED_CACHE=/cache/mypy").splitlines()
    lines = lines[lines.index('scripts/mypy-cache.sh seed "/cache/mypy"') :]
    assert lines[-1] == 'scripts/mypy-cache.sh keep "/cache/mypy"'
    assert [x.split()[0] for x in lines[1:-1]] == [".venv/bin/mypy"] * 4
