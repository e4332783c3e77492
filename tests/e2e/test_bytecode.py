"""The build ships bytecode: Lambda's /var/task and /opt are read-only, so a module without a
usable .pyc is compiled from source on every cold start.

For each built function: every ``.py`` of its code and of its layers has a
``__pycache__/<name>.cpython-313.pyc`` written by CPython 3.13 (the magic number) in
``unchecked-hash`` mode (used whatever the files' mtimes); and every module the function imports
at init (plus what its first request imports: the ``opstate`` package, google-genai for the
reconciler; the CLI and the local server, never loaded in Lambda, aside) comes from such a file.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.e2e.harness import RIE_PYTHON, BuiltTemplate

pytestmark = pytest.mark.e2e

FUNCTIONS = (
    "WebhookFunction",
    "ReconcileFunction",
    "NotifyFunction",
    "ArchiverFunction",
    "SubmitFunction",
)
# What the first request imports beyond the handler module (lazy imports).
FIRST_REQUEST = {
    "ReconcileFunction": ["google.genai", "google.genai.types"],
    "ArchiverFunction": ["google.genai", "google.genai.types"],
    "SubmitFunction": ["google.genai", "google.genai.types"],
}
# PEP 552 flags: bit 0 = hash-based, bit 1 = check_source. unchecked-hash = 0b01.
UNCHECKED_HASH = 0b01
# Lambda's python3.13 runtime reads __pycache__/<name>.cpython-313.pyc.
CACHE_TAG = "cpython-313"

PROBE = """
import importlib, importlib.util, json, pkgutil, sys
import app
import opstate
for info in pkgutil.walk_packages(opstate.__path__, "opstate."):
    # The CLI and the local server are never imported in Lambda (waitress is not in the layer).
    if info.name.startswith(("opstate.cli", "opstate.local")):
        continue
    # The ledger's msgspec structs come with the archiver's own requirements; the ledger
    # counts without them elsewhere.
    if info.name == "opstate.outcomes.ledger_rows" and not importlib.util.find_spec("msgspec"):
        continue
    importlib.import_module(info.name)
for name in sys.argv[1:]:
    importlib.import_module(name)
print(json.dumps(sorted({m.__file__ for m in list(sys.modules.values())
                         if getattr(m, "__file__", None) and m.__file__.endswith(".py")})))
"""


def pyc_problem(source: Path) -> str | None:
    """Why ``source`` has no usable 3.13 unchecked-hash .pyc (None: it has one)."""
    cached = Path(importlib.util.cache_from_source(str(source)))
    if not cached.is_file():
        return "no .pyc"
    header = cached.read_bytes()[:8]
    if header[:4] != importlib.util.MAGIC_NUMBER:
        return f"compiled by another Python (magic {header[:4]!r})"
    flags = int.from_bytes(header[4:8], "little")
    if flags != UNCHECKED_HASH:
        return f"not unchecked-hash (flags {flags:#b})"
    return None


def code_dirs(template: BuiltTemplate, logical_id: str) -> list[Path]:
    return [template.code_dir(logical_id), *(d / "python" for d in template.layer_dirs(logical_id))]


@pytest.fixture(scope="module")
def template(built_template: BuiltTemplate) -> BuiltTemplate:
    # The magic number and cache tag checked are this interpreter's: the runtime's (python3.13).
    assert sys.implementation.cache_tag == CACHE_TAG, sys.version
    assert built_template.runtime == "python3.13"
    return built_template


@pytest.mark.parametrize("logical_id", FUNCTIONS)
def test_every_built_source_file_has_its_313_unchecked_hash_pyc(
    template: BuiltTemplate, logical_id: str
) -> None:
    problems = []
    for root in code_dirs(template, logical_id):
        for source in root.rglob("*.py"):
            problem = pyc_problem(source)
            if problem:
                problems.append(f"{source.relative_to(root)}: {problem}")
        others = [p.name for p in root.rglob("*.pyc") if f".{CACHE_TAG}." not in p.name]
        assert not others, f"bytecode of another Python in {root}: {others[:5]}"
    assert not problems, f"{len(problems)} files, e.g. {problems[:10]}"


@pytest.mark.parametrize("logical_id", FUNCTIONS)
def test_every_module_a_function_imports_comes_with_bytecode(
    template: BuiltTemplate, logical_id: str
) -> None:
    dirs = code_dirs(template, logical_id)
    out = subprocess.run(
        [str(RIE_PYTHON), "-c", PROBE, *FIRST_REQUEST.get(logical_id, [])],
        cwd=template.code_dir(logical_id),
        env={
            "PATH": "/usr/bin:/bin",
            "PYTHONPATH": ":".join(str(d) for d in dirs),
            "PYTHONNOUSERSITE": "1",
            "PYTHONDONTWRITEBYTECODE": "1",  # the test must not add any .pyc itself
            "AWS_DEFAULT_REGION": "us-east-1",
            "POWERTOOLS_TRACE_DISABLED": "true",
        },
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    loaded = [Path(f) for f in json.loads(out.stdout.splitlines()[-1])]
    from_build = [f for f in loaded if any(f.is_relative_to(d) for d in dirs)]
    assert len(from_build) > 20, from_build  # the handler, opstate, Powertools, boto3...
    problems = [f"{f}: {p}" for f in from_build if (p := pyc_problem(f))]
    assert not problems, problems[:10]
