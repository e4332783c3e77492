"""A job in the retry pass (opstate.retry.job_step, issue 46): ``submit_job`` keeps and plans an
input of four times the model's cap, ``retry_once`` feeds its parts to the fake Gemini enforcing
the Batch API's limits, each part becomes attempt 0 of its own lineage, and once every part's
lineage wrote its final result the job writes one ``final.jsonl`` over the whole input, in its
order. SQLite store, results folder, the real google-genai client (``test_retry_engine``'s rig)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from opstate.config import SubmitSettings, settings
from opstate.domain.retry import RetryPolicy
from opstate.domain.states import State
from opstate.outcomes.wiring import results_url_for, sink_from_url
from opstate.retry import jobs
from opstate.retry.inputs import source_chunks
from opstate.retry.job_step import JOB
from opstate.retry.job_submit import submit_job
from tests.integration.test_job_feeding import CAP, big_input
from tests.integration.test_retry_engine import Rig, make_rig
from tests.support.fake_gemini import FakeGemini
from tests.support.fake_gemini_limits import QueueLimits

MODEL = "gemini-2.5-flash"


@pytest.fixture
def rig(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: Any, fake_gemini: FakeGemini
) -> Iterator[Rig]:
    yield from make_rig(monkeypatch, tmp_path, capsys, fake_gemini)


def submit(rig: Rig, data: bytes, policy: RetryPolicy) -> str:
    path = rig.tmp_path / "big.jsonl"
    path.write_bytes(data)
    current = settings()
    store = rig.store()
    try:
        job = submit_job(
            store,
            sink_from_url(results_url_for(current), current),
            source_chunks(path.as_uri()),
            model=MODEL,
            policy=policy,
            limits=SubmitSettings(submit_enqueued_tokens=((MODEL, CAP),)),
        )
    finally:
        store.close()
    assert job is not None
    return job.name


def answer_open(rig: Rig) -> None:
    for name in rig.fake.batches_created():
        if not (rig.fake.resource(name) or {}).get("done"):
            keys = [json.loads(line)["key"] for line in rig.fake.batch_input(name).splitlines()]
            rig.finish(name, [{"key": k, "response": {"candidates": []}} for k in keys])


def run_job(rig: Rig, name: str, passes: int = 40) -> dict[str, Any]:
    for _ in range(passes):
        rig.run()
        state = rig.state(name)
        if state.doc.get("final"):
            return dict(state.doc)
        answer_open(rig)
    raise AssertionError(f"{name} did not finish: {rig.state(name).doc[JOB]}")


def test_a_job_of_four_times_the_cap_ends_with_one_final_in_input_order(rig: Rig) -> None:
    data = big_input(600)
    rig.fake.limits = QueueLimits(enqueued_tokens={MODEL: CAP}, max_open=100)
    name = submit(rig, data, RetryPolicy(max_attempts=1))
    assert name.startswith("jobs/")
    doc = run_job(rig, name)
    plan = doc[JOB]
    assert len(plan["parts"]) >= 4 and jobs.finished(plan)
    # Every line sent exactly once, byte for byte.
    sent = b"".join(rig.fake.batch_input(p["batch"]) for p in plan["parts"])
    assert sent == data
    assert len(rig.fake.limits.refusals) <= 2
    assert rig.fake.limits.peak_tokens[MODEL] <= CAP
    # One final result over the whole input, one line per input line, in its order.
    final = Path(doc["final"]["location"].removeprefix("file://")).read_bytes()
    keys = [json.loads(line)["key"] for line in final.splitlines()]
    assert keys == [json.loads(line)["key"] for line in data.splitlines()]
    assert all("response" in json.loads(line) for line in final.splitlines())
    assert doc["final"]["rows"] == {"total": 600, "answered": 600, "blocked": 600, "failed": 0}
    store = rig.store()
    try:
        record = store.get(name)
        # Each part is attempt 0 of its own lineage, with a final result of its own.
        for part in plan["parts"]:
            state = store.get_retry(part["batch"])
            assert state is not None and state.doc["final"]["status"] == "final"
            assert state.doc["policy"]["maxAttempts"] == 1  # the job's policy
    finally:
        store.close()
    assert record is not None and record.state is State.SUCCEEDED


def test_a_stopped_job_creates_no_more_parts_and_its_unsent_lines_are_errors(rig: Rig) -> None:
    data = big_input(600)
    rig.fake.limits = QueueLimits(enqueued_tokens={MODEL: CAP})
    name = submit(rig, data, RetryPolicy())
    rig.run()
    assert len(rig.fake.batches_created()) == 1
    stopped = rig.cli("retry", "--stop", name)
    assert stopped.code == 0, stopped.err
    doc = run_job(rig, name)
    assert len(rig.fake.batches_created()) == 1
    final = [
        json.loads(line)
        for line in Path(doc["final"]["location"].removeprefix("file://")).read_bytes().splitlines()
    ]
    assert [row["key"] for row in final] == [json.loads(line)["key"] for line in data.splitlines()]
    sent = {
        json.loads(line)["key"]
        for line in rig.fake.batch_input(rig.fake.batches_created()[0]).splitlines()
    }
    for row in final:
        if row["key"] in sent:
            assert "response" in row
        else:
            assert row["error"]["code"] == "NOT_SUBMITTED"
            assert "stopped by the operator" in row["error"]["message"]
    store = rig.store()
    try:
        record = store.get(name)
    finally:
        store.close()
    assert record is not None and record.state is State.CANCELLED
    rows = doc["final"]["rows"]
    assert rows["total"] == 600 and rows["failed"] == doc["final"]["errors"]["NOT_SUBMITTED"]
    assert rows["failed"] == 600 - len(sent) and rows["answered"] == len(sent)


@pytest.mark.parametrize("change", ["same size", "shorter"])
def test_a_kept_input_changed_under_the_job_creates_nothing_from_it(rig: Rig, change: str) -> None:
    # A bucket writer (THREATS.md, actor c) swaps the kept input after the plan was written:
    # the part's upload hashes otherwise than planned, is deleted before any create, and the
    # job stops; its lines are NOT_SUBMITTED errors, never answers from planted bytes.
    data = big_input(600)
    rig.fake.limits = QueueLimits(enqueued_tokens={MODEL: CAP})
    name = submit(rig, data, RetryPolicy())
    kept = Path(rig.state(name).doc[JOB]["input"]["location"].removeprefix("file://"))
    planted = data.replace(b"lorem", b"LOREM", 1) if change == "same size" else data[10:]
    kept.chmod(0o600)
    kept.write_bytes(planted)
    doc = run_job(rig, name)
    assert rig.fake.batches_created() == []
    assert rig.fake.files_held() == []  # the upload was deleted
    final = Path(doc["final"]["location"].removeprefix("file://")).read_bytes().splitlines()
    assert final and all(json.loads(x)["error"]["code"] == "NOT_SUBMITTED" for x in final)
    assert "the kept input changed" in doc[JOB]["stoppedWhy"]


def test_submitting_the_same_input_again_finds_the_job(
    rig: Rig, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPSTATE_SUBMIT_ENQUEUED_TOKENS", f"{MODEL}={CAP}")
    settings.cache_clear()
    data = big_input(600)
    rig.fake.limits = QueueLimits(enqueued_tokens={MODEL: CAP})
    (rig.tmp_path / "big.jsonl").write_bytes(data)
    first = rig.cli("submit", "big.jsonl", "--model", MODEL, "--json")
    assert first.code == 0, first.err
    again = rig.cli("submit", "big.jsonl", "--model", MODEL, "--json")
    assert again.code == 0, again.err
    assert again.json()["name"] == first.json()["name"]
    assert (first.json()["created"], again.json()["created"]) == (True, False)
    assert len(rig.fake.batches_created()) == 1  # the first part, once
    other = rig.cli("submit", "big.jsonl", "--model", MODEL, "--display-name", "b", "--json")
    assert other.json()["name"] != first.json()["name"]


def test_two_passes_at_once_finish_the_job_creating_each_part_once(rig: Rig) -> None:
    # Two runners (two `retry --once`, serve beside the CLI) step the same job at once, each
    # with its own store connection and client: no part is created twice, one count is shared.
    import threading

    data = big_input(600)
    rig.fake.limits = QueueLimits(enqueued_tokens={MODEL: CAP})
    name = submit(rig, data, RetryPolicy())
    errors: list[BaseException] = []

    def run() -> None:
        try:
            rig.run()
        except BaseException as exc:  # surfaced below
            errors.append(exc)

    for _ in range(40):
        threads = [threading.Thread(target=run) for _ in range(2)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert not errors, errors
        if rig.state(name).doc.get("final"):
            break
        answer_open(rig)
    plan = rig.state(name).doc[JOB]
    assert jobs.finished(plan) and rig.state(name).doc.get("final")
    assert len(rig.fake.batches_created()) == len(plan["parts"])
    assert b"".join(rig.fake.batch_input(p["batch"]) for p in plan["parts"]) == data
    assert rig.fake.limits.peak_tokens[MODEL] <= CAP
