"""The CLI without a clone (issue 42): the sdist and wheel ``make package`` builds (``python -m
build``: the wheel is built from the sdist, so the sdist holds everything) install into a fresh
virtualenv, and ``opstate --version``, ``--help`` and ``opstate serve`` (its page, its static
files and ``/operations/{name}``) work from a directory outside any checkout, importing opstate
from that virtualenv only. The page's static files are in the wheel. README.md's "Use it without
a clone" commands are run here where they can be (everything but the AWS calls)."""

from __future__ import annotations

import email.parser
import json
import os
import re
import shlex
import subprocess
import sys
import tarfile
import threading
import time
import tomllib
import urllib.error
import urllib.request
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest

import opstate
from tests.support.source_build import BUILD_FLAGS, built_once

ROOT = Path(__file__).resolve().parents[2]
STATIC = ROOT / "layers" / "opstate" / "opstate" / "local" / "static"
TOKEN = "wheel-test-api-token-0123456789abcdef"
SECTION = "## Use it without a clone"

pytestmark = pytest.mark.slow


def readme_section() -> str:
    body = (ROOT / "README.md").read_text(encoding="utf-8")
    return body.split(SECTION, 1)[1].split("\n## ", 1)[0]


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(wheel, sdist) as ``make package`` builds them (one build per test run, shared with
    test_cli_oldest_python.py: tests/support/source_build.py)."""
    return built_once(tmp_path_factory)


def test_make_package_builds_with_the_backend_the_dev_extra_installs() -> None:
    """``make package`` (and the build the tests install) is ``python -m build --no-isolation``
    (issue 49: no throwaway build environment, with setuptools pip-installed into it, per
    build): so the dev extra holds each of [build-system]'s requires, word for word."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    dev = project["project"]["optional-dependencies"]["dev"]
    assert set(project["build-system"]["requires"]) <= set(dev)
    recipe = (ROOT / "Makefile").read_text(encoding="utf-8").split("\npackage:", 1)[1]
    assert f"-m build {' '.join(BUILD_FLAGS)} --outdir dist ." in recipe.split("\n\n", 1)[0]


def clean_env(home: Path) -> dict[str, str]:
    """No PYTHONPATH, no store or key of the test run: what a new shell on a laptop has."""
    env = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(("OPSTATE_", "PYTHON", "GEMINI_", "GOOGLE_", "AWS_", "VIRTUAL_ENV"))
    }
    env["HOME"] = str(home)
    return env


@pytest.fixture(scope="module")
def installed(
    built: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Path, Path, dict[str, str]]]:
    """(the virtualenv's bin, a directory outside any checkout, the environment), with the
    wheel installed by pip with the serve extra. The README's own line (the virtualenv's own
    pip) is run word for word by test_cli_oldest_python.py on 3.12; here the virtualenv is made
    without pip and this run's pip installs into it (``pip --python``), and nothing is
    byte-compiled at install (``--no-compile``; the commands below compile what they import):
    issue 49, 13.3 s of CPU with the virtualenv's pip and compiling, 6.4 s so, plus 3.5 s for
    ensurepip. What is checked is the same: the wheel's requirements resolve on 3.13 and the
    installed package runs, alone, outside any checkout."""
    wheel, _ = built
    base = tmp_path_factory.mktemp("fresh")
    venv, work = base / "venv", base / "work"
    work.mkdir()
    env = clean_env(base)
    made = [sys.executable, "-m", "venv", "--without-pip", str(venv)]
    subprocess.run(made, check=True, timeout=120)
    pip = [sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"), "install"]
    pip += ["--disable-pip-version-check", "--no-compile"]
    started = time.monotonic()
    result = subprocess.run(
        [*pip, "--quiet", f"{wheel}[gemini,local]"],
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    print(
        f"fresh install of {wheel.name}[gemini,local] (pip --python, --no-compile): "
        f"{time.monotonic() - started:.1f} s"
    )
    yield venv / "bin", work, env


def test_the_wheel_holds_the_page_s_static_files_the_license_and_this_version(
    built: tuple[Path, Path],
) -> None:
    wheel, _ = built
    with zipfile.ZipFile(wheel) as zf:
        names = set(zf.namelist())
        dist_info = next(n.split("/")[0] for n in names if n.endswith(".dist-info/METADATA"))
        metadata = email.parser.Parser().parsestr(zf.read(f"{dist_info}/METADATA").decode())
        packed = {
            n.rsplit("/", 1)[1]: zf.read(n) for n in names if n.startswith("opstate/local/static/")
        }
        license_text = zf.read(f"{dist_info}/licenses/LICENSE")
    assert packed == {p.name: p.read_bytes() for p in STATIC.iterdir() if p.is_file()}
    assert "index.html" in packed
    assert license_text == (ROOT / "LICENSE").read_bytes()
    assert metadata["Version"] == opstate.__version__
    assert metadata["License-Expression"] == "Apache-2.0"
    assert "opstate/py.typed" in names
    assert not any(n.startswith(("tests/", "scripts/", "functions/")) for n in names)


def test_the_sdist_holds_what_the_wheel_is_built_from(built: tuple[Path, Path]) -> None:
    _, sdist = built
    with tarfile.open(sdist) as tar:
        names = {n.split("/", 1)[1] for n in tar.getnames() if "/" in n}
    assert {"LICENSE", "README.md", "pyproject.toml"} <= names
    assert {f"layers/opstate/opstate/local/static/{p.name}" for p in STATIC.iterdir()} <= names


def test_the_extras_readme_names_are_pyproject_s(built: tuple[Path, Path]) -> None:
    """Every extra a README install command names exists in the wheel's metadata."""
    wheel, _ = built
    with zipfile.ZipFile(wheel) as zf:
        meta_name = next(n for n in zf.namelist() if n.endswith(".dist-info/METADATA"))
        metadata = email.parser.Parser().parsestr(zf.read(meta_name).decode())
    provided = set(metadata.get_all("Provides-Extra") or [])
    named = set()
    for extras in re.findall(r"gemini-opstate\[([a-z,]+)\]", readme_section()):
        named |= set(extras.split(","))
    for extras in re.findall(r"\.whl\)\[([a-z,]+)\]", readme_section()):
        named |= set(extras.split(","))
    assert named and named <= provided


def run(
    bin_dir: Path, args: list[str], work: Path, env: dict[str, str]
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(bin_dir / args[0]), *args[1:]],
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_opstate_runs_from_the_virtualenv_outside_any_checkout(
    installed: tuple[Path, Path, dict[str, str]],
) -> None:
    bin_dir, work, env = installed
    where = run(bin_dir, ["python", "-c", "import opstate; print(opstate.__file__)"], work, env)
    assert where.returncode == 0, where.stderr
    assert Path(where.stdout.strip()).is_relative_to(bin_dir.parent), where.stdout
    version = run(bin_dir, ["opstate", "--version"], work, env)
    assert version.returncode == 0 and version.stdout == f"opstate {opstate.__version__}\n"
    helped = run(bin_dir, ["opstate", "--help"], work, env)
    assert helped.returncode == 0 and "serve" in helped.stdout and "submit" in helped.stdout


def test_the_readme_s_operator_commands_run_from_the_install(
    installed: tuple[Path, Path, dict[str, str]],
) -> None:
    """Each ``opstate`` line of the section's first block, with a local store standing in for
    ``dynamodb://TABLE`` (the AWS call is the one thing not run)."""
    bin_dir, work, env = installed
    # The stack's table exists; so does its stand-in (a read never invents a store: issue 49).
    store = "sqlite:///" + str(work / "ops.db")
    made = run(bin_dir, ["opstate", "track", "batches/standin", "--store", store], work, env)
    assert made.returncode == 0, made.stderr
    block = readme_section().split("```sh\n", 1)[1].split("```", 1)[0]
    commands = [shlex.split(line.split("#", 1)[0]) for line in block.splitlines()]
    ran = 0
    for words in commands:
        if not words or words[0] != "opstate":
            continue
        args = [store if w.startswith("dynamodb://") else w for w in words]
        result = run(bin_dir, args, work, env)
        assert result.returncode == 0, (words, result.stdout, result.stderr)
        ran += 1
    assert ran >= 2


def get(url: str, token: str | None = None) -> tuple[int, str]:
    return send(url, "GET", token)


def send(url: str, method: str, token: str | None = None) -> tuple[int, str]:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    request = urllib.request.Request(url, headers=headers, method=method)
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def test_opstate_serve_answers_its_page_and_operations_outside_any_checkout(
    installed: tuple[Path, Path, dict[str, str]],
) -> None:
    bin_dir, work, env = installed
    env = {**env, "OPSTATE_API_TOKEN": TOKEN, "PYTHONUNBUFFERED": "1"}
    process = subprocess.Popen(
        [str(bin_dir / "opstate"), "serve", "--port", "0"],
        cwd=work,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        text=True,
    )
    lines: list[str] = []
    found = threading.Event()

    def pump() -> None:
        assert process.stdout is not None
        for line in process.stdout:
            lines.append(line)
            if "listening on" in line:
                found.set()

    threading.Thread(target=pump, daemon=True).start()
    try:
        assert found.wait(60), "".join(lines)
        url = re.search(r"listening on (http://\S+)", "".join(lines))
        assert url is not None
        base = url.group(1).rstrip("/")
        status, page = get(base + "/")
        assert status == 200 and "<html" in page.lower()
        assert "/ui/static/console.js" in page  # index.html, from the installed package
        for asset in STATIC.iterdir():  # served from the installed package's files
            if asset.name == "index.html":
                continue
            status, served = get(f"{base}/ui/static/{asset.name}")
            assert status == 200 and served == asset.read_text(encoding="utf-8"), asset.name
        # /operations: track a job (PUT, no body), read it back (GET); the token is required.
        tracked = base + "/operations/batches/wheel-test"
        assert send(tracked, "PUT")[0] == 401
        status, body = send(tracked, "PUT", TOKEN)
        assert status == 200, body
        status, body = send(tracked, "GET", TOKEN)
        assert status == 200 and json.loads(body)["state"] == "PENDING", body
        assert (work / ".opstate" / "ops.db").exists(), "the store is the default, in the cwd"
    finally:
        process.terminate()
        process.wait(timeout=30)
