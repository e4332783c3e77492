"""``make run`` installs what serving needs, not the dev toolchain (issue 40: a first
``make run`` installed 107 packages, 616 MB, playwright to cfn-lint, before ``listening``);
``make test`` / ``make venv`` keep installing ``.[dev]``. Read from ``make -n`` (what make would
run) on a .venv path that does not exist; the first run's figure is in README.md."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.skipif(shutil.which("make") is None, reason="no make")


def dry_run(target: str, venv: Path) -> str:
    done = subprocess.run(
        ["make", "-n", "-C", str(ROOT), target, f"VENV={venv}", "PYTHON=python3"],
        capture_output=True,
        text=True,
        check=True,
    )
    return done.stdout


def test_make_run_installs_the_runtime_extra_only(tmp_path: Path) -> None:
    shown = dry_run("run", tmp_path / ".venv")
    assert "-e '.[local,gemini]'" in shown
    assert ".[dev]" not in shown
    assert f"touch {tmp_path / '.venv' / '.installed-run'}" in shown  # its own stamp


def test_make_venv_still_installs_the_dev_extra(tmp_path: Path) -> None:
    shown = dry_run("venv", tmp_path / ".venv")
    assert "-e '.[dev]'" in shown and ".[local,gemini]" not in shown


def test_a_dev_install_serves_as_it_is(tmp_path: Path) -> None:
    venv = tmp_path / ".venv"
    venv.mkdir()
    # a current dev stamp (newer than every dependency file): nothing to install
    (venv / ".installed").touch()
    shown = dry_run("run", venv)
    assert "pip install" not in shown and f"{venv}/bin/opstate serve" in shown
