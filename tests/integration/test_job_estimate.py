"""A job's estimate corrected from its parts' ``usageMetadata`` (issue 46; docs/jobs.md, "The
estimate"; opstate.retry.job_rate): once a part's batch ended and its results are archived,
the ``promptTokenCount`` Gemini reported for its rows makes the job's rate, and the parts still
held are counted again at it (never the ones created: they are freed as reserved); ``get
jobs/<id>`` shows it. SQLite store, results folder, the real google-genai client and the fake
Gemini, which answers each row with the prompt tokens its own tokenizer counts (a token per 4
bytes: English text's rate, half opstate's default estimate)."""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from opstate.domain.parts import BYTES_PER_TOKEN, corrected_bytes_per_token, range_tokens
from opstate.retry.job_step import JOB
from opstate.retry.room import enqueued, open_slots
from tests.integration.test_job_feeding import CAP, big_input
from tests.integration.test_job_retry_room import submit_job_of
from tests.integration.test_retry_engine import Rig, make_rig
from tests.support.fake_gemini import FakeGemini
from tests.support.fake_gemini_limits import QueueLimits

MODEL = "gemini-2.5-flash"


@pytest.fixture
def rig(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: Any, fake_gemini: FakeGemini
) -> Iterator[Rig]:
    monkeypatch.setenv("OPSTATE_SUBMIT_ENQUEUED_TOKENS", f"{MODEL}={CAP}")
    yield from make_rig(monkeypatch, tmp_path, capsys, fake_gemini)


def answer_with_usage(rig: Rig) -> list[str]:
    """Every open batch answered, each row reporting its line's bytes / 4 prompt tokens."""
    ended = []
    for name in rig.fake.batches_created():
        if (rig.fake.resource(name) or {}).get("done"):
            continue
        rows = []
        for line in rig.fake.batch_input(name).splitlines(keepends=True):
            usage = {"promptTokenCount": len(line) // 4, "candidatesTokenCount": 1}
            rows.append({"key": json.loads(line)["key"], "response": {"usageMetadata": usage}})
        rig.finish(name, rows)
        ended.append(name)
    return ended


def test_the_parts_usage_corrects_the_estimate_of_the_parts_still_held(rig: Rig) -> None:
    rig.fake.limits = QueueLimits(enqueued_tokens={MODEL: CAP})
    data = big_input(600)
    job = submit_job_of(rig, data, MODEL)
    rig.run()
    before = {p["n"]: dict(p) for p in rig.state(job).doc[JOB]["parts"]}
    (first,) = [p for p in before.values() if p["phase"] == "created"]
    (ended,) = answer_with_usage(rig)
    assert ended == first["batch"]
    rig.run()
    plan = rig.state(job).doc[JOB]
    # Gemini counted a token per 4 bytes of the part: the rate is about 3 bytes a token (a
    # quarter kept back, three decimals rounded down), where the default is 2.
    sent = first["end"] - first["start"]
    told = sum(len(x) // 4 for x in data[first["start"] : first["end"]].splitlines(True))
    rate = math.floor(corrected_bytes_per_token(sent, told) * 1000) / 1000
    assert 3.0 <= rate < 3.1
    assert plan["estimate"] == {"sentBytes": sent, "promptTokens": told, "bytesPerToken": rate}
    parts = {p["n"]: p for p in plan["parts"]}
    assert parts[first["n"]]["tokens"] == first["tokens"]  # created: kept as reserved
    for n, part in parts.items():
        if n == first["n"]:
            continue
        size, rows = part["end"] - part["start"], part["rows"]
        if part["phase"] == "held":
            assert part["bpt"] == rate
            assert part["tokens"] == range_tokens(size, rows, rate) < before[n]["tokens"]
        # Every part, created or held, at or above its lines' count at the rate it is fed at.
        lines = data[part["start"] : part["end"]].splitlines(True)
        at = part.get("bpt", BYTES_PER_TOKEN)
        assert part["tokens"] >= sum(max(4, math.ceil(len(x) / at)) for x in lines)
    # The part created after the lesson reserved its recounted tokens.
    created = [p for p in plan["parts"] if p["phase"] == "created"]
    store = rig.store()
    try:
        assert enqueued(store, MODEL) == sum(p["tokens"] for p in created) <= CAP
    finally:
        store.close()
    shown = rig.cli("get", job, "--json")
    assert shown.code == 0, shown.err
    view = shown.json()["retry"]["job"]
    assert view["estimate"] == {"bytesPerToken": rate, "sentBytes": sent, "promptTokens": told}
    # The job finishes; every reservation is given back as it was taken.
    for _ in range(30):
        if (rig.state(job).doc.get("final") or {}).get("status") == "final":
            break
        answer_with_usage(rig)
        rig.run()
    assert rig.state(job).doc["final"]["status"] == "final"
    assert rig.fake.limits.refusals == [] and rig.fake.limits.peak_tokens[MODEL] <= CAP
    store = rig.store()
    try:
        assert (enqueued(store, MODEL), open_slots(store)) == (0, 0)
    finally:
        store.close()
