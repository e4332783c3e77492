"""Retry batches in the project's queue (issue 46; docs/jobs.md, "The shared count"): a
lineage's retry child and a job's parts take their tokens of one model's cap and their batch
slots from the same counters, so together they never pass ``OPSTATE_SUBMIT_ENQUEUED_TOKENS``
nor ``OPSTATE_SUBMIT_MAX_BATCHES``; a child that does not fit waits (planned: nothing refused,
no attempt spent) and its room is freed when its batch ends. SQLite store, results folder, the
real google-genai client and the fake Gemini enforcing the Batch API's limits, counting tokens
as opstate estimates them (so that its peak is opstate's own count)."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from opstate.config import SubmitSettings, settings
from opstate.domain.parts import range_tokens
from opstate.domain.retry import RetryPolicy
from opstate.outcomes.wiring import results_url_for, sink_from_url
from opstate.retry import lineage, room
from opstate.retry.inputs import source_chunks
from opstate.retry.job_step import JOB
from opstate.retry.job_submit import submit_job
from opstate.retry.room import enqueued, open_slots
from opstate.retry.wiring import config_from
from tests.integration.test_job_feeding import CAP, big_input
from tests.integration.test_retry_engine import Rig, make_rig
from tests.support.fake_gemini import FakeGemini
from tests.support.fake_gemini_limits import QueueLimits, queue_full_body
from tests.support.retry_rows import failed

MODEL = "gemini-2.5-flash"
OTHER = "gemini-2.5-flash-lite"


def half_bytes(data: bytes) -> int:
    """opstate's estimate of a file's tokens (``domain.parts``: half its bytes, a line at least
    4): the fake counts so, and a peak over the cap is a peak over opstate's own count."""
    return sum(max(4, -(-len(line) // 2)) for line in data.splitlines(keepends=True))


@pytest.fixture
def rig(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: Any, fake_gemini: FakeGemini
) -> Iterator[Rig]:
    monkeypatch.setenv("OPSTATE_SUBMIT_ENQUEUED_TOKENS", f"{MODEL}={CAP},{OTHER}={CAP}")
    yield from make_rig(monkeypatch, tmp_path, capsys, fake_gemini)


def submit_job_of(rig: Rig, data: bytes, model: str, max_batches: int = 100) -> str:
    path = rig.tmp_path / f"big-{model}.jsonl"
    path.write_bytes(data)
    current = settings()
    store = rig.store()
    try:
        job = submit_job(
            store,
            sink_from_url(results_url_for(current), current),
            source_chunks(path.as_uri()),
            model=model,
            policy=RetryPolicy(),
            limits=SubmitSettings(
                submit_enqueued_tokens=((model, CAP),), submit_max_batches=max_batches
            ),
        )
    finally:
        store.close()
    assert job is not None
    return job.name


def failing_root(rig: Rig, rows: int) -> str:
    """A batch of ``rows`` keys submitted with one retry, ended with every row failed for a
    passing reason: its lineage plans one retry child of every row."""
    keys = [f"r{i}-" + "x" * 200 for i in range(rows)]
    root = rig.submit(keys, "--retry-attempts", "1")
    rig.finish(root, [failed(k, 503, "UNAVAILABLE") for k in keys])
    return root


def counted(rig: Rig, model: str = MODEL) -> tuple[int, int]:
    store = rig.store()
    try:
        return enqueued(store, model), open_slots(store)
    finally:
        store.close()


def children_of(rig: Rig, root: str) -> list[dict[str, Any]]:
    return lineage.children(rig.state(root).doc)


def answer_open(rig: Rig) -> None:
    for name in rig.fake.batches_created():
        if not (rig.fake.resource(name) or {}).get("done"):
            keys = [json.loads(line)["key"] for line in rig.fake.batch_input(name).splitlines()]
            rig.finish(name, [{"key": k, "response": {"candidates": []}} for k in keys])


def finish_all(rig: Rig, names: list[str], max_open: int | None = None) -> None:
    for _ in range(40):
        rig.run()
        tokens, slots = counted(rig)
        assert tokens <= CAP
        assert max_open is None or slots <= max_open
        if all((rig.state(n).doc.get("final") or {}).get("status") == "final" for n in names):
            return
        answer_open(rig)
    raise AssertionError("the lineage and the job did not finish")


def test_a_retry_child_waits_for_the_tokens_a_jobs_part_holds_and_frees_its_own(
    rig: Rig, monkeypatch: pytest.MonkeyPatch
) -> None:
    rig.fake.limits = QueueLimits(count_tokens=half_bytes)
    job = submit_job_of(rig, big_input(600), MODEL)
    rig.run()
    first = list(rig.fake.batches_created())
    assert len(first) == 1  # the job's first part: near the whole cap
    held_tokens = counted(rig)[0]
    assert CAP - held_tokens < 1000
    # A plain batch (submitted while a higher cap was configured: counted, it fits beside the
    # part; its room is freed when it ends) fails every row; its retry child (about 2,800
    # tokens) does not fit beside the part. The fake enforces the cap from here on.
    monkeypatch.setenv("OPSTATE_SUBMIT_ENQUEUED_TOKENS", f"{MODEL}={2 * CAP},{OTHER}={CAP}")
    settings.cache_clear()
    root = failing_root(rig, 20)
    monkeypatch.setenv("OPSTATE_SUBMIT_ENQUEUED_TOKENS", f"{MODEL}={CAP},{OTHER}={CAP}")
    settings.cache_clear()
    rig.fake.limits.enqueued_tokens[MODEL] = CAP
    rig.fake.limits.peak_tokens.clear()
    before = len(rig.fake.requests)
    rig.run()
    # The child does not fit by opstate's count: not created, not refused, no attempt spent.
    assert rig.fake.limits.refusals == []
    assert rig.fake.batches_created() == [*first, root]
    (child,) = children_of(rig, root)
    assert child["phase"] == lineage.PLANNED and not child.get("claims")
    assert not [r for r in rig.fake.requests[before:] if r.method == "POST"]
    assert counted(rig) == (held_tokens, 1)
    # The part ends: its tokens are freed, and the child is created (before or after the next
    # part: never beside it) with its reservation recorded.
    for _ in range(6):
        answer_open(rig)
        rig.run()
        assert counted(rig)[0] <= CAP
        (child,) = children_of(rig, root)
        if child["phase"] == lineage.CREATED:
            break
    assert child["phase"] == lineage.CREATED
    reserved = child["reserved"]
    # Its tokens: its input's bytes and rows as domain.parts bounds them (at or above the
    # line-by-line count, within 4 a line).
    sent = half_bytes(rig.fake.batch_input(child["name"]))
    assert reserved == {"model": MODEL, "tokens": range_tokens(child["bytes"], 20)}
    assert sent <= reserved["tokens"] <= sent + 4 * 20
    finish_all(rig, [job, root])
    assert rig.fake.limits.refusals == []
    assert rig.fake.limits.peak_tokens[MODEL] <= CAP
    # Everything ended: every reservation given back, the child's once.
    assert counted(rig) == (0, 0)
    (child,) = children_of(rig, root)
    assert child["reserved"] == {**reserved, "freed": True}


def test_retry_children_and_parts_share_the_open_batch_limit(
    rig: Rig, monkeypatch: pytest.MonkeyPatch
) -> None:
    # One batch open in the project at once, by opstate's count: a child of MODEL and the
    # parts of a job of another model take turns, never both open.
    monkeypatch.setenv("OPSTATE_SUBMIT_MAX_BATCHES", "1")
    rig.fake.limits = QueueLimits(max_open=1, count_tokens=half_bytes)
    root = failing_root(rig, 5)  # ended before the job: the fake's one slot is free again
    rig.run()
    (child,) = children_of(rig, root)
    assert child["phase"] == lineage.CREATED and counted(rig) == (child["reserved"]["tokens"], 1)
    job = submit_job_of(rig, big_input(300), OTHER, max_batches=1)
    rig.run()
    assert rig.state(job).doc[JOB]["parts"][0]["phase"] == "held"  # no slot: held, not refused
    finish_all(rig, [job, root], max_open=1)
    assert rig.fake.limits.refusals == []
    assert rig.fake.limits.peak_open <= 1
    assert counted(rig) == (0, 0) and counted(rig, OTHER) == (0, 0)


def test_a_child_gemini_refuses_for_a_full_queue_gives_its_room_back_and_backs_off(
    rig: Rig,
) -> None:
    # opstate's count had room, Gemini's queue had not (a batch opstate does not count): the
    # create is refused with a full queue's 429 (queue_full_body: the generic sentence, no
    # RetryInfo). The child backs off as before (creating, one refusal, no attempt spent) and
    # its reservation is given back in the write that says so; the next try takes it again.
    rig.fake.limits = QueueLimits(count_tokens=half_bytes)
    root = failing_root(rig, 5)
    rig.fake.fail_create(429, body=queue_full_body(), times=1)
    rig.run(every=False)
    (child,) = children_of(rig, root)
    assert child["phase"] == lineage.CREATING and child["refusals"] == 1
    assert child["backoffUntilNs"] > 0 and "reserved" not in child
    assert counted(rig) == (0, 0)
    rig.run()  # an operator's pass tries at once
    (child,) = children_of(rig, root)
    assert child["phase"] == lineage.CREATED and child["attempt"] == 1
    assert counted(rig) == (child["reserved"]["tokens"], 1)
    finish_all(rig, [root])
    assert counted(rig) == (0, 0)


def test_a_child_waiting_for_room_gets_the_room_its_ended_sibling_held(
    rig: Rig, monkeypatch: pytest.MonkeyPatch
) -> None:
    # An attempt cut into two retry batches (OPSTATE_RETRY_MAX_ROWS) of about 60 % of the cap
    # each: the second waits while the first is open, and is created once the first ended
    # (its room freed before the claim, not only once nothing is left to create).
    monkeypatch.setenv("OPSTATE_SUBMIT_ENQUEUED_TOKENS", f"{MODEL}={10 * CAP}")
    monkeypatch.setenv("OPSTATE_RETRY_MAX_ROWS", "50")
    rig.fake.limits = QueueLimits(count_tokens=half_bytes)
    root = failing_root(rig, 100)  # one batch: submitted under a larger cap
    monkeypatch.setenv("OPSTATE_SUBMIT_ENQUEUED_TOKENS", f"{MODEL}={CAP}")
    rig.run()
    kids = children_of(rig, root)
    assert [k["phase"] for k in kids] == [lineage.CREATED, lineage.PLANNED]
    assert CAP // 2 < counted(rig)[0] <= CAP
    answer_open(rig)
    rig.run()
    kids = children_of(rig, root)
    assert [k["phase"] for k in kids] == [lineage.CREATED, lineage.CREATED]
    assert kids[0]["reserved"]["freed"] is True and "freed" not in kids[1]["reserved"]
    assert counted(rig) == (kids[1]["reserved"]["tokens"], 1)
    finish_all(rig, [root])
    assert counted(rig) == (0, 0) and rig.fake.limits.refusals == []


def test_a_running_job_takes_a_cap_learned_by_another_and_the_operator_forgets_it(
    rig: Rig,
) -> None:
    # Another job of the model learned a cap (opstate.retry.room, kept in the store): this
    # job feeds under it from its next step, its record shows it; `opstate retry --forget-cap`
    # forgets it for the next jobs (this one keeps its own).
    rig.fake.limits = QueueLimits(count_tokens=half_bytes)
    job = submit_job_of(rig, big_input(600), MODEL)
    store = rig.store()
    try:
        room.learn(store, MODEL, CAP // 3)
    finally:
        store.close()
    rig.run()
    plan = rig.state(job).doc[JOB]
    assert plan["learnedCap"] == CAP // 3
    created = [p for p in plan["parts"] if p["phase"] == "created"]
    assert created and all(p["tokens"] <= CAP // 3 for p in created)  # split under it
    assert counted(rig)[0] <= CAP // 3
    shown = rig.cli("get", job, "--json")
    assert shown.code == 0, shown.err
    view = shown.json()["retry"]["job"]
    assert (view["learnedCap"], view["cap"]) == (CAP // 3, CAP // 3)
    forgot = rig.cli("retry", "--forget-cap", f"models/{MODEL}")
    assert forgot.code == 0, forgot.err
    assert forgot.json() == {"model": MODEL, "forgotten": CAP // 3, "cap": CAP}
    again = rig.cli("retry", "--forget-cap", MODEL)
    assert again.json() == {"model": MODEL, "forgotten": None, "cap": CAP}
    store = rig.store()
    try:
        assert room.learned(store, MODEL) is None
    finally:
        store.close()
    rig.run()
    assert rig.state(job).doc[JOB]["learnedCap"] == CAP // 3  # the job keeps its own


def test_a_create_left_unanswered_keeps_its_reservation_and_the_adoption_takes_no_second(
    rig: Rig,
) -> None:
    # The create reaches Gemini (the batch exists) but its answer is lost: the reservation
    # written with the claim stays (the batch may exist), the next claim finds the batch by
    # its upload and adopts it under the same reservation: counted once, freed once.
    rig.fake.limits = QueueLimits(count_tokens=half_bytes)
    root = failing_root(rig, 5)

    def lost(_: str) -> None:
        rig.fake.on_create(None)
        raise ConnectionError("the answer is lost")

    rig.fake.on_create(lost)
    now = time.time_ns()
    rig.run(now)
    (child,) = children_of(rig, root)
    assert child["phase"] == lineage.CREATING and child["upload"]
    taken = child["reserved"]
    assert counted(rig) == (taken["tokens"], 1)
    later = now + int(config_from(settings()).check_s * 1e9) + 1
    rig.run(later)
    (child,) = children_of(rig, root)
    assert child["phase"] == lineage.CREATED and child["claims"] == 2
    assert child["reserved"] == taken and counted(rig) == (taken["tokens"], 1)
    assert len(rig.fake.batches_created()) == 2  # the root and the one child: adopted
    finish_all(rig, [root])
    assert counted(rig) == (0, 0)
