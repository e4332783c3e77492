"""The README's retry quick start, run literally (issue 40): the commands of the first ``sh``
block of "Retries and one final result per request" are parsed out of README.md and run, in
order, through the ``opstate`` CLI against the fake Gemini (the real google-genai client), on a
fresh embedded store. The test plays Gemini only: between two commands it finishes the batches
Gemini holds (the first attempt with three rows failed 503). ``opstate retry --once`` is run
"again until it prints "final": 1", as its comment says; nothing else moves the lineage (no
``refresh``, ``archive --once`` or ``serve``): issue 40's first finding was that the quick
start never finished.
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest

from opstate.config import settings
from tests.support.cli import in_process
from tests.support.fake_gemini import FakeGemini
from tests.support.retry_rows import answered, failed, input_keys, write_input

ROOT = Path(__file__).resolve().parents[2]
HEADING = "### Retries and one final result per request"
# The most passes the loop may take: submit's batch, one retry attempt, the final result.
MAX_PASSES = 6


def quick_start() -> list[tuple[list[str], str]]:
    """(argv after ``opstate``, the comment) of each command of the section's first block."""
    section = ROOT.joinpath("README.md").read_text(encoding="utf-8").split(HEADING, 1)[1]
    block = section.split("```sh\n", 1)[1].split("```", 1)[0]
    commands = []
    for line in block.splitlines():
        code, _, comment = line.partition("#")
        words = shlex.split(code)
        if words:
            assert words[0] == "opstate", line
            commands.append((words[1:], comment.strip()))
    return commands


@pytest.fixture
def cli(monkeypatch, tmp_path, capsys, fake_gemini):
    monkeypatch.chdir(tmp_path)
    for key in ("OPSTATE_STORE", "OPSTATE_TABLE_NAME", "OPSTATE_RESULTS_URL"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("GEMINI_API_KEY", "test-key")
    monkeypatch.setenv("GOOGLE_GEMINI_BASE_URL", fake_gemini.base_url)
    yield in_process(monkeypatch, capsys)
    settings.cache_clear()


def play_gemini(fake: FakeGemini, done: set[str]) -> None:
    """Finish every batch Gemini holds that has not finished: the first with three rows
    failed 503, later ones answering every row."""
    for index, name in enumerate(fake.batches_created()):
        if name in done:
            continue
        keys = input_keys(fake.batch_input(name))
        rows = [failed(k, 503, "UNAVAILABLE") if index == 0 and i < 3 else answered(k)
                for i, k in enumerate(keys)]  # fmt: skip
        fake.run_batch(name, rows)
        done.add(name)


def test_the_readme_retry_quick_start_finishes(
    cli, fake_gemini: FakeGemini, tmp_path: Path
) -> None:
    commands = quick_start()
    assert [argv[0] for argv, _ in commands] == ["submit", "retry", "results", "results"]
    keys = [f"k{i:02d}" for i in range(10)]
    write_input(tmp_path / "in.jsonl", keys)
    name = ""
    done: set[str] = set()
    for argv, comment in commands:
        argv = [name if word == "batches/ID" else word for word in argv]
        if argv[0] == "submit":
            result = cli(*argv)
            assert result.code == 0, result.err
            name = result.out.split()[0]
            assert name.startswith("batches/")
            assert "at most 2 retry batches" in result.out  # the policy kept, its bound
            continue
        if argv[0] == "retry":
            assert 'until it prints "final": 1' in comment
            for _ in range(MAX_PASSES):
                play_gemini(fake_gemini, done)
                result = cli(*argv)
                assert result.code == 0, result.err
                if result.json()["final"] == 1:
                    break
            else:
                pytest.fail(f"retry --once never printed final: 1 in {MAX_PASSES} passes")
            continue
        result = cli(*argv)
        assert result.code == 0, result.err
        if "--json" in argv:
            final = result.json()["final"]
            assert final["status"] == "final" and final["attempts"] == 2
            assert final["rows"] == {"total": 10, "answered": 10, "blocked": 0, "failed": 0}
        else:
            assert argv[argv.index("--download") + 1] == "out"
            fetched = sorted(p.name for p in (tmp_path / "out").iterdir())
            assert fetched == ["final.json", "final.jsonl", "output.jsonl", "summary.json"]
            lines = (tmp_path / "out" / "final.jsonl").read_bytes().splitlines()
            assert sorted(json.loads(line)["key"] for line in lines) == keys
    assert len(fake_gemini.batches_created()) == 2
