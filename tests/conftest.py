"""Shared fixtures. Tests never reach AWS or Google: fake credentials, 127.0.0.1 only."""

from __future__ import annotations

import os
from collections.abc import Iterator
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


# --- pytest-xdist (`make test` runs pytest -n auto --dist loadgroup) ------------------------------
# Tests that share something costly or single stay on one worker: a module's tests that share a
# module-scoped fixture (a built wheel, a served page), the sam local tests (one moto server on
# the Docker bridge, the names events/env.json gives, Docker's cores) and the browser tests (one
# chromium). Modules known to be slow are scheduled first, so that no worker starts a long one
# last while the others are idle. Without xdist the marks do nothing and the order is the same.
_WHOLE_DIRECTORY_GROUPS = ("samlocal", "browser")
# Slowest first: a module's first matching prefix gives its rank (lower runs earlier); every
# other module keeps its place after them. Measured with --durations (README, "Timings").
_SLOW_FIRST = (
    "tests/samlocal/",
    "tests/integration/test_wheel_install.py",
    "tests/integration/test_cli_oldest_python.py",
    "tests/browser/",
    "tests/e2e/",
    "tests/reliability/",
)


def _module_path(item: pytest.Item) -> str:
    return item.nodeid.split("::", 1)[0]


def _shares_a_costly_fixture(item: pytest.Item) -> bool:
    info = getattr(item, "_fixtureinfo", None)
    if info is None:
        return False
    return any(
        defs[-1].scope in ("module", "class", "package")
        for defs in info.name2fixturedefs.values()
        if defs
    )


def _group_of(item: pytest.Item) -> str | None:
    path = _module_path(item)
    for directory in _WHOLE_DIRECTORY_GROUPS:
        if path.startswith(f"tests/{directory}/"):
            return directory
    return path if _shares_a_costly_fixture(item) else None


def _rank(item: pytest.Item) -> int:
    path = _module_path(item)
    return next(
        (i for i, prefix in enumerate(_SLOW_FIRST) if path.startswith(prefix)), len(_SLOW_FIRST)
    )


@pytest.hookimpl(tryfirst=True)  # before xdist reads the xdist_group marks
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        group = _group_of(item)
        if group is not None and item.get_closest_marker("xdist_group") is None:
            item.add_marker(pytest.mark.xdist_group(group))
    items.sort(key=_rank)  # stable: a module's tests keep their order
