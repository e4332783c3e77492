"""Builds of the project from its source tree, one at a time across processes (pytest-xdist's
workers): setuptools writes ``layers/opstate/gemini_opstate.egg-info`` and ``build/`` inside the
tree, and two builds at once fail on each other's half-written files ("No such file or
directory: 'gemini_opstate-0.6.0/layers/opstate/opstate/store/...'" from ``build_sdist``).

``built_once`` builds the sdist and the wheel once per pytest run (issue 49): the tests that
install the wheel (tests/integration/test_wheel_install.py, test_cli_oldest_python.py) run on
different xdist workers, and each used to build the same tree again."""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# make package's (the Makefile): the build backend is the dev virtualenv's (pyproject's dev extra
# holds [build-system]'s requires), not one pip installs into a fresh environment per build.
BUILD_FLAGS = ("--no-isolation",)


def lock_path() -> Path:
    """This checkout's build lock: a file in the temporary directory, named by the tree's path."""
    tag = hashlib.sha256(str(ROOT).encode()).hexdigest()[:16]
    return Path(tempfile.gettempdir()) / f"opstate-source-build-{tag}.lock"


@contextmanager
def source_tree_lock() -> Iterator[None]:
    """Hold this checkout's build lock (blocks while another process holds it)."""
    # O_NOFOLLOW: a link planted at that name in the shared temporary directory is refused.
    fd = os.open(lock_path(), os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock


def run_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The pytest run's temporary root: the same folder for all its xdist workers (a worker's
    own basetemp is a folder in it, ``popen-gwN``; without xdist the basetemp is the root)."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


def built_once(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(wheel, sdist) of this checkout as ``make package`` builds them (``python -m build
    --no-isolation``: the sdist, then the wheel from the sdist), built once per pytest run: the
    first test to ask builds under the lock into the run's root, the later ones (on any worker)
    wait for the lock and take the same two files. Read them, never change them. A failed build
    is not kept: the next test to ask builds again (and fails with the build's output too)."""
    out = run_root(tmp_path_factory) / "opstate-dist"
    with source_tree_lock():
        if not out.is_dir():
            partial = out.with_name("opstate-dist.partial")
            shutil.rmtree(partial, ignore_errors=True)
            result = subprocess.run(
                [sys.executable, "-m", "build", *BUILD_FLAGS, "--outdir", str(partial), str(ROOT)],
                capture_output=True,
                text=True,
                timeout=600,
            )
            if result.returncode != 0:
                pytest.fail(
                    "python -m build failed:\n" + result.stdout[-3000:] + result.stderr[-3000:]
                )
            partial.rename(out)  # whole or absent: a reader never sees half a build
    (wheel,) = out.glob("*.whl")
    (sdist,) = out.glob("*.tar.gz")
    return wheel, sdist
