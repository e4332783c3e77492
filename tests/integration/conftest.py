"""Integration fixtures: a fake Gemini API server (see ``tests/support/fake_gemini.py``)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.ca_file import plain_http_env
from tests.support.fake_gemini import FakeGemini


@pytest.fixture(scope="session")
def plain_http_tls(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """``SSL_CERT_FILE`` naming a CA file of one certificate (``tests.support.ca_file``)."""
    return plain_http_env(Path(tmp_path_factory.getbasetemp()))


@pytest.fixture
def fake_gemini(
    monkeypatch: pytest.MonkeyPatch, plain_http_tls: dict[str, str]
) -> Iterator[FakeGemini]:
    """A fake Gemini API on 127.0.0.1 (a free port), stopped after the test. It speaks plain
    HTTP, so the TLS contexts of the google-genai clients the test makes (and its ``opstate``
    processes, which get its environment) are never used: each loads one certificate instead
    of certifi's bundle (``tests.support.ca_file``; issue 49)."""
    for key, value in plain_http_tls.items():
        monkeypatch.setenv(key, value)
    with FakeGemini() as fake:
        yield fake
