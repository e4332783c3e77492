"""The operator CLI on the oldest Python it supports (issue 49): the wheel says
``requires-python >=3.12`` (the Lambda functions stay on 3.13, template.yaml's runtime), so the
wheel ``make package`` builds (built once per test run, shared with test_wheel_install.py) is
installed into a fresh virtualenv of a CPython 3.12 found on this machine (scripts/find-python.sh:
PATH, pyenv's versions, Debian's package) from a folder outside any checkout by README.md's "Use
it without a clone" line (its ``python3`` that Python), and the operator's commands run there:
``--version``, ``track`` / ``get`` / ``list`` on an embedded SQLite store, then ``submit`` and
``retry --once`` against the fake Gemini (the real google-genai client on 3.12) until the
lineage's final result is written.

No 3.12 on the machine: skipped with one line, failed under CI=true (.ci/run's machine has
pyenv's 3.12)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

import opstate
from tests.support.fake_gemini import FakeGemini
from tests.support.prerequisites import require
from tests.support.retry_rows import answered, failed, input_keys, write_input
from tests.support.source_build import built_once

ROOT = Path(__file__).resolve().parents[2]
OLDEST = "3.12"
SECTION = "## Use it without a clone"

pytestmark = pytest.mark.slow


def find_python(minor: str) -> str | None:
    found = subprocess.run(
        [str(ROOT / "scripts" / "find-python.sh"), minor],
        capture_output=True,
        text=True,
        timeout=60,
    )
    return found.stdout.strip() or None


def test_pyproject_says_the_oldest_python_and_lambda_stays_on_3_13() -> None:
    """What this file tests is what the wheel promises (and no more)."""
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    assert project["project"]["requires-python"] == f">={OLDEST}"
    assert project["tool"]["ruff"]["target-version"] == "py" + OLDEST.replace(".", "")
    assert project["tool"]["mypy"]["python_version"] == OLDEST
    template = (ROOT / "template.yaml").read_text(encoding="utf-8")
    assert "Runtime: python3.13" in template and "python3.12" not in template


def clean_env(home: Path) -> dict[str, str]:
    """A new shell on a laptop: no PYTHONPATH, no store, key or AWS setting of the test run."""
    env = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(("OPSTATE_", "PYTHON", "GEMINI_", "GOOGLE_", "AWS_", "VIRTUAL_ENV"))
    }
    env["HOME"] = str(home)
    return env


def readme_venv_line() -> str:
    """The "Use it without a clone" line that makes the operator's virtualenv, comment cut."""
    section = (ROOT / "README.md").read_text(encoding="utf-8").split(SECTION, 1)[1]
    line = next(x for x in section.splitlines() if x.startswith("python3 -m venv "))
    return line.split("#", 1)[0].strip()


@pytest.fixture(scope="module")
def oldest_install(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, Path, dict]]:
    """(the virtualenv's bin, a folder outside any checkout, the environment): the README's
    line run as written by bash in a folder holding ``dist/<the wheel>``, with ``python3`` the
    oldest supported Python (first on PATH) and HOME a fresh folder."""
    python = find_python(OLDEST)
    require(
        python is not None,
        f"no CPython {OLDEST} on this machine (pyenv install {OLDEST}, or PATH)",
        fail_prefix="the CLI's oldest-Python test under CI needs ",
        skip_prefix="the CLI's oldest-Python test needs ",
    )
    assert python is not None
    home = tmp_path_factory.mktemp("oldest")
    work, shims = home / "work", home / "shims"
    shims.mkdir()
    (shims / "python3").symlink_to(python)
    wheel, _ = built_once(tmp_path_factory)  # make package's wheel, built once per test run
    (work / "dist").mkdir(parents=True)
    shutil.copy2(wheel, work / "dist" / wheel.name)
    env = clean_env(home)
    # pip reads these as its --no-compile / --disable-pip-version-check (the line stays as is).
    env |= {"PIP_NO_COMPILE": "1", "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    env["PATH"] = f"{shims}{os.pathsep}{env.get('PATH', '')}"
    installed = subprocess.run(
        ["bash", "-c", readme_venv_line()],
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert installed.returncode == 0, installed.stdout[-3000:] + installed.stderr[-3000:]
    yield home / ".opstate-cli" / "bin", work, env


def opstate_cli(
    install: tuple[Path, Path, dict], *args: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    bin_dir, work, base_env = install
    return subprocess.run(
        [str(bin_dir / "opstate"), *args],
        cwd=work,
        env={**base_env, **(env or {})},
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_the_cli_runs_on_the_oldest_python(oldest_install: tuple[Path, Path, dict]) -> None:
    bin_dir, work, env = oldest_install
    said = subprocess.run(
        [str(bin_dir / "python"), "-c", "import sys, opstate; print(sys.version_info[:2]);"
         " print(opstate.__file__)"],
        cwd=work, env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert said.returncode == 0, said.stderr
    version, where = said.stdout.splitlines()
    assert version == str(tuple(int(p) for p in OLDEST.split(".")))
    assert Path(where).is_relative_to(bin_dir.parent), where
    shown = opstate_cli(oldest_install, "--version")
    assert shown.returncode == 0 and shown.stdout == f"opstate {opstate.__version__}\n"
    store = "sqlite:///" + str(work / "ops.db")
    tracked = opstate_cli(oldest_install, "track", "batches/on-3-12", "--store", store)
    assert tracked.returncode == 0, tracked.stderr
    got = opstate_cli(oldest_install, "get", "batches/on-3-12", "--store", store, "--json")
    assert got.returncode == 0, got.stderr
    assert json.loads(got.stdout)["state"] == "PENDING"
    listed = opstate_cli(oldest_install, "list", "--store", store)
    assert listed.returncode == 0 and "batches/on-3-12" in listed.stdout, listed


def test_submit_and_retry_finish_a_lineage_on_the_oldest_python(
    oldest_install: tuple[Path, Path, dict],
) -> None:
    """The README's retry quick start (submit, retry --once until final, results) on 3.12:
    the first batch fails two rows 503, the retry batch answers them."""
    _, work, _ = oldest_install
    keys = [f"k{i}" for i in range(5)]
    write_input(work / "in.jsonl", keys)
    store = "sqlite:///" + str(work / "retry.db")
    with FakeGemini() as fake:
        gemini = {"GEMINI_API_KEY": "test-key", "GOOGLE_GEMINI_BASE_URL": fake.base_url}
        submitted = opstate_cli(
            oldest_install,
            *("submit", "in.jsonl", "--model", "gemini-2.5-flash", "--retry-attempts", "2"),
            *("--store", store),
            env=gemini,
        )
        assert submitted.returncode == 0, submitted.stderr
        root = submitted.stdout.split()[0]
        assert root.startswith("batches/"), submitted.stdout
        finished: set[str] = set()
        for _ in range(6):
            for index, name in enumerate(fake.batches_created()):
                if name not in finished:
                    asked = input_keys(fake.batch_input(name))
                    rows = [failed(k, 503, "UNAVAILABLE") if index == 0 and i < 2
                            else answered(k) for i, k in enumerate(asked)]  # fmt: skip
                    fake.run_batch(name, rows)
                    finished.add(name)
            passed = opstate_cli(oldest_install, "retry", "--once", "--store", store, env=gemini)
            assert passed.returncode == 0, passed.stderr
            if json.loads(passed.stdout)["final"] == 1:
                break
        else:
            pytest.fail("retry --once never wrote the final result on the oldest Python")
        results = opstate_cli(oldest_install, "results", root, "--json", "--store", store)
        assert results.returncode == 0, results.stderr
        final = json.loads(results.stdout)["final"]
        assert final["status"] == "final"
        assert final["rows"] == {"total": 5, "answered": 5, "blocked": 0, "failed": 0}
        assert len(fake.batches_created()) == 2
