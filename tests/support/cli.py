"""The ``opstate`` CLI run in the test's own process: ``main(argv)`` with the settings read
afresh for each run and its output captured (``opstate`` as a subprocess:
``tests.support.serve_process.run_cli``)."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any, NamedTuple

import pytest

from opstate.cli import main
from opstate.config import settings


class Result(NamedTuple):
    """One run: its exit code, stdout and stderr (a tuple too: ``code, out, err = run(...)``)."""

    code: int
    out: str
    err: str

    def json(self) -> Any:
        return json.loads(self.out)


def in_process(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> Callable[..., Result]:
    """A ``run(*argv, env=None)``: ``env`` is set (through ``monkeypatch``) before the run, the
    settings cache is cleared before and after it, and what it printed is captured."""

    def run(*argv: str, env: Mapping[str, str] | None = None) -> Result:
        for key, value in (env or {}).items():
            monkeypatch.setenv(key, value)
        settings.cache_clear()
        try:
            code = main(list(argv))
        finally:
            settings.cache_clear()
        captured = capsys.readouterr()
        return Result(code, captured.out, captured.err)

    return run


# The settings a run would otherwise take from the environment the suite runs in.
RUN_SETTINGS = (
    "OPSTATE_STORE",
    "OPSTATE_TABLE_NAME",
    "OPSTATE_WEBHOOK_SECRETS",
    "OPSTATE_WEBHOOK_SECRET_ARN",
    "GEMINI_API_KEY",
    "GOOGLE_GEMINI_BASE_URL",
)


def in_clean_process(
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    folder: Path,
    also: Iterable[str] = (),
) -> Callable[..., Result]:
    """``in_process`` run in ``folder`` with none of ``RUN_SETTINGS`` (nor ``also``) set."""
    monkeypatch.chdir(folder)
    for name in (*RUN_SETTINGS, *also):
        monkeypatch.delenv(name, raising=False)
    return in_process(monkeypatch, capsys)
