"""scripts/find-python.sh: the Makefiles' search for the runtime's interpreter (PATH, then
pyenv's versions, then Debian's), on fake machines made of symlinks to this interpreter."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "find-python.sh"
MINOR = "{}.{}".format(*sys.version_info[:2])


def run(tmp: Path, minor: str = MINOR) -> subprocess.CompletedProcess[str]:
    """The script with PATH = tmp/bin plus the basics, HOME = tmp (pyenv root tmp/.pyenv) and
    tmp/usr-bin as Debian's /usr/bin."""
    env = {
        "PATH": f"{tmp / 'bin'}:/usr/bin:/bin",
        "HOME": str(tmp),
        "FIND_PYTHON_SYSTEM_DIR": str(tmp / "usr-bin"),
    }
    return subprocess.run(
        ["bash", str(SCRIPT), minor], env=env, capture_output=True, text=True, timeout=60
    )


def link(path: Path, target: str = sys.executable) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.symlink_to(target)
    return path


def refusing_shim(path: Path) -> None:
    """pyenv's shim for a version that is not selected: on PATH, exits 127."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/sh\necho 'pyenv: python: command not found' >&2\nexit 127\n")
    path.chmod(0o755)


def test_path_first_when_it_runs(tmp_path: Path) -> None:
    on_path = link(tmp_path / "bin" / f"python{MINOR}")
    link(tmp_path / ".pyenv" / "versions" / f"{MINOR}.0" / "bin" / f"python{MINOR}")
    out = run(tmp_path)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == str(on_path)


def test_a_refusing_shim_falls_through_to_the_newest_pyenv_version(tmp_path: Path) -> None:
    refusing_shim(tmp_path / "bin" / f"python{MINOR}")
    versions = tmp_path / ".pyenv" / "versions"
    for patch in ("0", "2", "10"):
        link(versions / f"{MINOR}.{patch}" / "bin" / f"python{MINOR}")
    # Not a release of that minor version (a virtualenv, another minor): never taken.
    link(versions / f"{MINOR}.11-dev" / "bin" / f"python{MINOR}")
    link(tmp_path / "usr-bin" / f"python{MINOR}")
    out = run(tmp_path)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == str(versions / f"{MINOR}.10" / "bin" / f"python{MINOR}")


def test_an_interpreter_of_another_version_is_skipped(tmp_path: Path) -> None:
    # A python3.X on PATH that is really another version (a misnamed link) is not taken.
    fake = tmp_path / "bin" / f"python{MINOR}"
    fake.parent.mkdir(parents=True)
    fake.write_text("#!/bin/sh\nexec " + sys.executable + ' -c "import sys; sys.exit(1)"\n')
    fake.chmod(0o755)
    debian = link(tmp_path / "usr-bin" / f"python{MINOR}")
    out = run(tmp_path)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == str(debian)


def test_none_found_says_how_to_get_one_in_one_sentence(tmp_path: Path) -> None:
    refusing_shim(tmp_path / "bin" / "python3.99")
    out = run(tmp_path, "3.99")
    assert out.returncode == 1
    assert out.stdout == ""
    message = out.stderr.strip()
    assert "\n" not in message and message.count(". ") == 0 and message.endswith(".")
    assert "No Python 3.99 found" in message
    assert "pyenv install 3.99" in message and "apt-get install python3.99-venv" in message
