"""Integration fixtures: a fake Gemini API server (see ``tests/support/fake_gemini.py``)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.fake_gemini import FakeGemini


@pytest.fixture
def fake_gemini() -> Iterator[FakeGemini]:
    """A fake Gemini API on 127.0.0.1 (a free port), stopped after the test."""
    with FakeGemini() as fake:
        yield fake
