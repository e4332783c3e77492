"""mypy's cache kept between checkouts (issue 49, scripts/mypy-cache.sh): `make typecheck`
seeds a checkout without .mypy_cache from MYPY_SHARED_CACHE and keeps its cache there after
mypy passed. What must hold: a seed never overwrites a checkout's own cache, a keep replaces
the shared copy whole, the build never fails for the cache's sake, and mypy itself still
finds an error the cached checkout did not have (the cache saves work, never a check)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "mypy-cache.sh"

needs_sh = pytest.mark.skipif(shutil.which("sh") is None, reason="no sh")


def cache(action: str, shared: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["sh", str(SCRIPT), action, shared],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=60,
    )


def tree(folder: Path) -> dict[str, str]:
    return {
        str(p.relative_to(folder)): p.read_text("utf-8")
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


@needs_sh
def test_seed_copies_the_shared_cache_into_a_checkout_without_one(tmp_path: Path) -> None:
    shared = tmp_path / "home" / "mypy"
    (shared / "3.12").mkdir(parents=True)
    (shared / "3.12" / "os.meta.json").write_text("{}", "utf-8")
    checkout = tmp_path / "clone"
    checkout.mkdir()
    assert cache("seed", str(shared), checkout).returncode == 0
    assert tree(checkout / ".mypy_cache") == {"3.12/os.meta.json": "{}"}
    assert [p.name for p in checkout.iterdir()] == [".mypy_cache"]  # no seed folder left


@needs_sh
def test_seed_leaves_a_checkouts_own_cache_alone(tmp_path: Path) -> None:
    shared = tmp_path / "mypy"
    shared.mkdir()
    (shared / "shared.json").write_text("shared", "utf-8")
    checkout = tmp_path / "clone"
    (checkout / ".mypy_cache").mkdir(parents=True)
    (checkout / ".mypy_cache" / "own.json").write_text("own", "utf-8")
    assert cache("seed", str(shared), checkout).returncode == 0
    assert tree(checkout / ".mypy_cache") == {"own.json": "own"}


@needs_sh
def test_keep_replaces_the_shared_copy_whole(tmp_path: Path) -> None:
    shared = tmp_path / "cache" / "gemini-opstate" / "mypy"
    shared.mkdir(parents=True)
    (shared / "stale.json").write_text("stale", "utf-8")
    checkout = tmp_path / "clone"
    (checkout / ".mypy_cache" / "3.14").mkdir(parents=True)
    (checkout / ".mypy_cache" / "3.14" / "new.json").write_text("new", "utf-8")
    assert cache("keep", str(shared), checkout).returncode == 0
    assert tree(shared) == {"3.14/new.json": "new"}
    # Nothing of the swap is left beside it.
    assert sorted(p.name for p in shared.parent.iterdir()) == ["mypy"]


@needs_sh
def test_the_cache_never_fails_the_build(tmp_path: Path) -> None:
    checkout = tmp_path / "clone"
    (checkout / ".mypy_cache").mkdir(parents=True)
    blocked = tmp_path / "file"
    blocked.write_text("not a folder", "utf-8")
    # A shared place that cannot be made (under a file), an empty one (turned off), and a
    # seed from a place that does not exist: each exits 0 and changes nothing.
    for action, shared in (("keep", str(blocked / "mypy")), ("keep", ""), ("seed", "")):
        result = cache(action, shared, checkout)
        assert result.returncode == 0, result.stderr
    assert cache("seed", str(tmp_path / "none"), tmp_path).returncode == 0
    assert not (tmp_path / ".mypy_cache").exists()
    assert cache("clean", "x", checkout).returncode == 2


@needs_sh
def test_a_seeded_cache_still_finds_a_new_error(tmp_path: Path) -> None:
    """The cache a clean checkout kept, seeded into another whose module has a type error:
    mypy reports it (mypy checks a module again when its source's hash differs)."""
    shared = tmp_path / "shared"
    env = {k: v for k, v in os.environ.items() if not k.startswith("MYPY")}

    def checkout(name: str, body: str) -> Path:
        folder = tmp_path / name
        folder.mkdir()
        (folder / "mod.py").write_text(body, "utf-8")
        return folder

    def mypy(folder: Path) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "mypy", "--strict", "--no-site-packages", "mod.py"],
            cwd=folder,
            capture_output=True,
            text=True,
            timeout=300,
            env=env,
        )

    clean = checkout("clean", "def f(x: int) -> int:\n    return x + 1\n")
    assert mypy(clean).returncode == 0
    assert cache("keep", str(shared), clean).returncode == 0
    broken = checkout("broken", 'def f(x: int) -> int:\n    return x + "1"\n')
    assert cache("seed", str(shared), broken).returncode == 0
    assert (broken / ".mypy_cache").is_dir()
    result = mypy(broken)
    assert result.returncode == 1
    assert 'Unsupported operand types for + ("int" and "str")' in result.stdout
