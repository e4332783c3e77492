"""The ``opstate`` CLI run in the test's own process: ``main(argv)`` with the settings read
afresh for each run and its output captured (``opstate`` as a subprocess:
``tests.support.serve_process.run_cli``)."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
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
