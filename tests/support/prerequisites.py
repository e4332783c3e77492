"""Real parts a suite needs (a Docker engine, a browser, built artifacts): skip locally with one
line naming what is missing, fail under CI (where .ci/run provides them)."""

from __future__ import annotations

import os

import pytest


def in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() in {"1", "true", "yes"}


def require(condition: bool, message: str, *, fail_prefix: str, skip_prefix: str) -> None:
    """Nothing when ``condition`` holds; else fail under CI, skip elsewhere."""
    if condition:
        return
    if in_ci():
        pytest.fail(f"{fail_prefix}{message}", pytrace=False)
    pytest.skip(f"{skip_prefix}{message}")
