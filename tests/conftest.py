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
