"""Browser tests: Debian's ``chromium`` driven by PyPI's ``playwright``.

Playwright's own browser download is never used: the system executable is launched headless
with a fresh profile and no background networking. A missing browser or package skips these
tests with one line naming what is missing, and fails them under ``CI=true`` (like the e2e
tests' prerequisites: ``.ci/run`` installs chromium when it is absent).
"""

from __future__ import annotations

import importlib.util
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.prerequisites import in_ci

CHROMIUM_CANDIDATES = ("/usr/bin/chromium", "/usr/bin/chromium-browser")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
# Where the tests leave their screenshots (kept after the run, ignored by git).
ARTIFACTS = Path(__file__).resolve().parents[2] / ".artifacts" / "browser"


def chromium_path() -> str | None:
    configured = os.environ.get("OPSTATE_CHROMIUM")
    if configured:
        return configured if os.access(configured, os.X_OK) else None
    for candidate in CHROMIUM_CANDIDATES:
        if os.access(candidate, os.X_OK):
            return candidate
    return shutil.which("chromium")


def missing() -> str | None:
    """What the browser tests lack, in one sentence, or None."""
    lacks = []
    if chromium_path() is None:
        lacks.append("the chromium browser (apt-get install -y chromium)")
    if importlib.util.find_spec("playwright") is None:
        lacks.append("the playwright package (pip install -e '.[dev]')")
    return " and ".join(lacks) if lacks else None


@pytest.fixture(scope="session")
def chromium(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """A headless chromium context with a fresh user-data-dir, for the session."""
    lacking = missing()
    if lacking is not None:
        if in_ci():
            pytest.fail(f"browser tests under CI need {lacking}", pytrace=False)
        pytest.skip(f"browser tests need {lacking}")
    from playwright.sync_api import sync_playwright

    profile = tmp_path_factory.mktemp("chromium-profile")
    with sync_playwright() as playwright:
        context = playwright.chromium.launch_persistent_context(
            str(profile),
            executable_path=chromium_path(),
            headless=True,
            args=CHROMIUM_ARGS,
            viewport={"width": 1280, "height": 860},
            locale="en-GB",
            timezone_id="UTC",
        )
        try:
            yield context
        finally:
            context.close()


@pytest.fixture
def page(chromium: Any) -> Iterator[Any]:
    """A fresh tab; JavaScript errors on the page fail the test."""
    tab = chromium.new_page()
    errors: list[str] = []
    tab.on("pageerror", lambda exc: errors.append(str(exc)))
    try:
        yield tab
    finally:
        tab.close()
    assert not errors, errors
