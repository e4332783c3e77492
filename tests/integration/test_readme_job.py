"""The README's quick start for a big job, run literally (issue 46): the commands of the first
``sh`` block of "One job of any size" are parsed out of README.md and run through the
``opstate`` CLI against the fake Gemini enforcing the Batch API's limits (the real google-genai
client), on a fresh embedded store. The input holds four times the model's cap (set small
here, ``OPSTATE_SUBMIT_ENQUEUED_TOKENS``, so the test stays small). The test plays Gemini only:
between passes it finishes the batches Gemini holds; ``opstate retry --once`` is run again
until ``get`` shows the job's final result."""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from opstate.config import settings
from tests.integration.test_job_feeding import CAP, big_input
from tests.support.cli import in_process
from tests.support.fake_gemini import FakeGemini
from tests.support.fake_gemini_limits import QueueLimits

ROOT = Path(__file__).resolve().parents[2]
HEADING = "### One job of any size"
MODEL = "gemini-2.5-flash"


def quick_start() -> list[list[str]]:
    section = ROOT.joinpath("README.md").read_text(encoding="utf-8").split(HEADING, 1)[1]
    block = section.split("```sh\n", 1)[1].split("```", 1)[0]
    commands = []
    for line in block.splitlines():
        words = shlex.split(line.partition("#")[0])
        if words:
            assert words[0] == "opstate", line
            commands.append(words[1:])
    return commands


@pytest.fixture
def cli(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: Any, fake_gemini: FakeGemini
) -> Iterator[Any]:
    monkeypatch.chdir(tmp_path)
    for key in ("OPSTATE_STORE", "OPSTATE_TABLE_NAME", "OPSTATE_RESULTS_URL"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("GEMINI_API_KEY", "test-key")
    monkeypatch.setenv("GOOGLE_GEMINI_BASE_URL", fake_gemini.base_url)
    monkeypatch.setenv("OPSTATE_RECONCILE_MAX_PAGES", "0")
    monkeypatch.setenv("OPSTATE_SUBMIT_ENQUEUED_TOKENS", f"{MODEL}={CAP}")
    settings.cache_clear()
    yield in_process(monkeypatch, capsys)
    settings.cache_clear()


def play_gemini(fake: FakeGemini, cli: Any) -> None:
    for name in fake.batches_created():
        if not (fake.resource(name) or {}).get("done"):
            keys = [json.loads(line)["key"] for line in fake.batch_input(name).splitlines()]
            fake.run_batch(name, [{"key": k, "response": {"candidates": []}} for k in keys])
            cli("refresh", name)
            cli("archive", "--once")


def test_the_readme_big_job_quick_start_runs(
    cli: Any, fake_gemini: FakeGemini, tmp_path: Path
) -> None:
    data = big_input(600)
    (tmp_path / "big.jsonl").write_bytes(data)
    fake_gemini.limits = QueueLimits(enqueued_tokens={MODEL: CAP})
    submit, once, get = quick_start()
    answer = cli(*submit)
    assert answer.code == 0, answer.err
    name = answer.json()["name"]
    assert name.startswith("jobs/") and answer.json()["parts"] >= 4
    assert len(fake_gemini.batches_created()) == 1  # what fit was created at once
    for _ in range(30):
        play_gemini(fake_gemini, cli)
        assert cli(*once).code == 0
        shown = cli(*[name if word == "jobs/ID" else word for word in get])
        assert shown.code == 0, shown.err
        # get's text view (issue 49): indented blocks, one "key  value" a line
        if re.search(r"waitingFor\s+nothing", shown.out) and re.search(
            r"status\s+final", shown.out
        ):
            break
    else:
        raise AssertionError(shown.out)
    assert re.search(r"maxAttempts\s+1\b", shown.out)  # the job's policy, as submitted
    assert re.search(r"ended\s+5\b", shown.out) or re.search(r"held\s+0\b", shown.out)
    # The job's cost is its parts' sum; these answers report no usage, so it is unknown, and
    # says which part (never a lower figure, never "an earlier release").
    assert re.search(r"reason\s+the cost of part batches/\S+ is unknown", shown.out), shown.out
    sent = b"".join(fake_gemini.batch_input(b) for b in fake_gemini.batches_created())
    assert sorted(sent.splitlines()) == sorted(data.splitlines())
    assert len(fake_gemini.limits.refusals) <= 2
    # The job's name is taken by wait --until final and results --download as a lineage's is.
    waited = cli("wait", name, "--until", "final", "--timeout", "5", "--json")
    assert waited.code == 0, waited.err
    assert waited.json()["final"]["rows"]["total"] == 600
    dest = tmp_path / "dl"
    downloaded = cli("results", name, "--download", str(dest))
    assert downloaded.code == 0, downloaded.err
    final = next(dest.rglob("final.jsonl")).read_bytes().splitlines()
    assert [json.loads(x)["key"] for x in final] == [
        json.loads(x)["key"] for x in data.splitlines()
    ]
