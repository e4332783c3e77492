"""The README's "Try it offline" block, run as written (issue 49): ``make fake-gemini``'s own
command is started (``python -m tests.support.offline_gemini``, on a free port and with batches
ending sooner: the only two changes), the export line it prints is the README's (but for the
port) and is what the commands get, then each ``opstate`` line runs in order through the CLI,
``retry --once`` "again every few seconds, until it prints "final": 1". No Gemini key, no test
hook: the fake plays Gemini by itself (every third row of a first attempt fails 503)."""

from __future__ import annotations

import json
import re
import shlex
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from opstate.config import settings
from tests.support.cli import Result, in_process
from tests.support.offline_gemini import DEFAULT_PORT

ROOT = Path(__file__).resolve().parents[2]
HEADING = "### Try it offline"
MAX_PASSES = 40
OFFLINE = [sys.executable, "-m", "tests.support.offline_gemini"]


def block() -> list[str]:
    section = ROOT.joinpath("README.md").read_text(encoding="utf-8").split(HEADING, 1)[1]
    text = section.split("```sh\n", 1)[1].split("```", 1)[0]
    return [line.partition("#")[0].strip() for line in text.splitlines() if line.strip()]


def make_recipe(target: str) -> str:
    text = ROOT.joinpath("Makefile").read_text(encoding="utf-8")
    return text.split(f"\n{target}:", 1)[1].split("\n\t", 1)[1].split("\n", 1)[0]


@pytest.fixture
def fake_gemini_process() -> Iterator[tuple[subprocess.Popen[str], str]]:
    process = subprocess.Popen(
        [*OFFLINE, "--port", "0", "--finish-after", "0.3"],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert process.stdout is not None
        printed = [process.stdout.readline() for _ in range(3)]
        yield process, "".join(printed)
    finally:
        process.terminate()
        process.wait(timeout=10)


def test_the_readme_offline_try_runs_as_written(
    fake_gemini_process: tuple[subprocess.Popen[str], str],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
) -> None:
    process, printed = fake_gemini_process
    lines = block()
    assert lines[0] == "make fake-gemini"
    assert make_recipe("fake-gemini") == "$(PY) -m tests.support.offline_gemini $(FAKE_GEMINI_ARGS)"
    port = re.search(r"listening on http://127\.0\.0\.1:(\d+)", printed)
    assert port is not None, printed
    export = lines[1]
    # what it prints is the README's line, on the port it took
    assert export.replace(str(DEFAULT_PORT), port.group(1)) in printed.splitlines()
    words = shlex.split(export.replace(str(DEFAULT_PORT), port.group(1)))
    assert words[0] == "export"
    for key in ("OPSTATE_STORE", "OPSTATE_TABLE_NAME", "OPSTATE_RESULTS_URL", "GEMINI_API_KEY"):
        monkeypatch.delenv(key, raising=False)
    for word in words[1:]:
        key, _, value = word.partition("=")
        monkeypatch.setenv(key, value)
    # from the clone: the example input at its place, the store and results in a fresh folder
    (tmp_path / "examples" / "offline").mkdir(parents=True)
    shutil.copy(ROOT / "examples" / "offline" / "in.jsonl", tmp_path / "examples" / "offline")
    monkeypatch.chdir(tmp_path)
    cli = in_process(monkeypatch, capsys)
    name = ""
    try:
        for line in lines[2:]:
            argv = shlex.split(line)
            assert argv[0] == "opstate", line
            argv = [name if word == "batches/ID" else word for word in argv[1:]]
            if argv[0] == "submit":
                result = ok(cli(*argv))
                name = result.out.split()[0]
                assert name.startswith("batches/") and "9 requests" in result.out
            elif argv[0] == "retry":
                passes = until_final(cli, argv)
                assert 2 <= passes <= MAX_PASSES
            elif argv[:1] == ["results"] and "--download" in argv:
                ok(cli(*argv))
                final = (tmp_path / "out" / "final.jsonl").read_text().splitlines()
                rows = [json.loads(row) for row in final]
                assert sorted(r["key"] for r in rows) == [f"q{i}" for i in range(1, 10)]
                assert all("response" in r for r in rows)
            else:
                text = ok(cli(*argv)).out.splitlines()
                block_at = text.index("final")
                shown = [row.split() for row in text[block_at:]]
                assert ["status", "final"] in shown and ["answered", "9"] in shown
                assert ["total", "9"] in shown and ["failed", "0"] in shown
                assert any(row[:1] == ["usd"] and row[1] != "-" for row in shown)  # priced
    finally:
        settings.cache_clear()
    assert process.poll() is None  # still serving


def ok(result: Result) -> Result:
    assert result.code == 0, result.err
    return result


def until_final(cli: object, argv: list[str]) -> int:
    for passes in range(1, MAX_PASSES + 1):
        counts = json.loads(ok(cli(*argv)).out)  # type: ignore[operator]
        if counts["final"] == 1:
            return passes
        time.sleep(0.25)
    raise AssertionError("the lineage never became final")
