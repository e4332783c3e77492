"""Shared fixtures. Tests never reach AWS or Google: fake credentials, 127.0.0.1 only."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

# Set before any boto3 client exists, so no test can sign a request with real credentials.
for _key, _value in {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_SESSION_TOKEN": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
    "AWS_REGION": "us-east-1",
    "POWERTOOLS_METRICS_NAMESPACE": "GeminiOpstateTest",
    "POWERTOOLS_TRACE_DISABLED": "true",
    "POWERTOOLS_DEV": "false",
}.items():
    os.environ[_key] = _value
# The disk's temporary directory, read before anything changes TMPDIR (token_tmp_path).
_DISK_TMP = "/var/tmp" if os.path.isdir("/var/tmp") else None
os.environ.pop("AWS_PROFILE", None)
os.environ.pop("GEMINI_API_KEY", None)
os.environ.pop("GOOGLE_API_KEY", None)

from tests.support.motoserver import MotoServer, start_moto_server  # noqa: E402


@pytest.fixture(scope="session")
def moto_server() -> Iterator[MotoServer]:
    """One moto server process for the session; tests isolate by unique resource names."""
    server = start_moto_server()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def token_tmp_path(tmp_path: Path) -> Iterator[Path]:
    """A temporary folder opstate accepts as a credentials folder: ``tmp_path``, unless that
    resolves under /proc, /sys or /dev, which opstate refuses on purpose (``make test`` puts
    tmp_path on /dev/shm when it can: the Makefile's PYTEST_TMP_ROOT); then a folder made on
    the disk's temporary directory and removed afterwards."""
    if not str(tmp_path.resolve()).startswith(("/proc/", "/sys/", "/dev/")):
        yield tmp_path
        return
    folder = Path(tempfile.mkdtemp(prefix="opstate-token-", dir=_DISK_TMP))
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture
def aws_secrets() -> Iterator[Any]:
    """A Secrets Manager client in moto's in-process mock, with Powertools' parameter cache
    cleared before and after."""
    import boto3
    from aws_lambda_powertools.utilities import parameters
    from moto import mock_aws

    parameters.clear_caches()
    with mock_aws():
        yield boto3.client("secretsmanager", region_name="us-east-1")
    parameters.clear_caches()


# --- pytest-xdist (`make test` runs pytest -n auto --dist loadfile) ------------------------------
# loadfile: a module's tests run on one worker, so a module-scoped fixture (a built wheel, a served
# page, a browser) is made once, not once per worker that gets one of its tests. (xdist_group
# with --dist loadgroup would be finer, but pytest 9.2's structured node ids make xdist 3.8 drop
# the groups silently: pytest-dev/pytest-xdist#1386.) Session fixtures (the moto server) start
# once per worker. The slowest modules are sent first, so that no worker starts a long one while
# the others are done; without xdist the order changes nothing but when they run.
# Slowest first: a module's first matching prefix gives its rank (lower runs earlier); every
# other module keeps its place after them. From `pytest --durations` (README, "Timings").
_SLOW_FIRST = (
    "tests/samlocal/test_sam_local.py",
    "tests/integration/test_wheel_install.py",
    "tests/integration/test_cli_oldest_python.py",
    "tests/browser/",
    "tests/e2e/",
    "tests/reliability/",
)


def _rank(item: pytest.Item) -> int:
    path = item.nodeid.split("::", 1)[0]
    return next(
        (i for i, prefix in enumerate(_SLOW_FIRST) if path.startswith(prefix)), len(_SLOW_FIRST)
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    items.sort(key=_rank)  # stable: a module's tests keep their order


@pytest.fixture(autouse=True)
def _fresh_container() -> Iterator[None]:
    """The AWS wiring keeps the re-drive's and discovery's cadences and discovery's settled
    records in process memory, as a Lambda container does (``opstate.wiring.reconcile``):
    each test starts as a new container, so what one test's runs kept never holds back or
    answers for the next test's."""
    import sys

    module = sys.modules.get("opstate.wiring.reconcile")
    if module is not None:
        module.new_container()
    yield
