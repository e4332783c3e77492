"""Builds of the project from its source tree, one at a time across processes (pytest-xdist's
workers): setuptools writes ``layers/opstate/gemini_opstate.egg-info`` and ``build/`` inside the
tree, and two builds at once fail on each other's half-written files ("No such file or
directory: 'gemini_opstate-0.6.0/layers/opstate/opstate/store/...'" from ``build_sdist``)."""

from __future__ import annotations

import fcntl
import hashlib
import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


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


def build_from_source(
    outdir: Path, *flags: str, timeout: float = 600
) -> subprocess.CompletedProcess[str]:
    """``python -m build FLAGS --outdir OUTDIR`` on this checkout, under the lock."""
    with source_tree_lock():
        return subprocess.run(
            [sys.executable, "-m", "build", *flags, "--outdir", str(outdir), str(ROOT)],
            capture_output=True,
            text=True,
            timeout=timeout,
        )
