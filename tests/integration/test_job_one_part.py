"""A batch submitted alone in the project's queue (issue 46; docs/jobs.md, "A batch submitted
alone"): ``opstate submit`` of an input that fits one part takes its tokens and a batch slot in
the counters a job's parts and retry batches take, frees them when its batch ends, and, when
the queue has no room (by opstate's count, or a full queue's 429 at Gemini), is held as a job
of one part instead of failing. SQLite store, results folder, the real google-genai client and
the fake Gemini enforcing the Batch API's limits, counting tokens as opstate estimates them (so
that its peak is opstate's own count)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from opstate.retry.job_step import JOB
from opstate.retry.solo_room import RESERVED
from opstate.store.retry_state import RETRY_DONE
from tests.integration.test_job_feeding import CAP, big_input
from tests.integration.test_job_retry_room import (
    MODEL,
    OTHER,
    counted,
    finish_all,
    half_bytes,
    submit_job_of,
)
from tests.integration.test_retry_engine import Rig, make_rig
from tests.support.fake_gemini import FakeGemini
from tests.support.fake_gemini_limits import QueueLimits, queue_full_body
from tests.support.retry_rows import answered, request_bytes, write_input


@pytest.fixture
def rig(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: Any, fake_gemini: FakeGemini
) -> Iterator[Rig]:
    monkeypatch.setenv("OPSTATE_SUBMIT_ENQUEUED_TOKENS", f"{MODEL}={CAP},{OTHER}={CAP}")
    yield from make_rig(monkeypatch, tmp_path, capsys, fake_gemini)


KEYS = [f"small-{i}-" + "y" * 100 for i in range(5)]


def submitted(rig: Rig, keys: list[str], *flags: str) -> dict[str, Any]:
    """``opstate submit FILE --model MODEL --json`` of ``keys``: exit 0, its JSON."""
    rig.inputs += 1
    source = write_input(rig.tmp_path / f"small-{rig.inputs}.jsonl", keys)
    answer = rig.cli("submit", str(source), "--model", MODEL, *flags, "--json")
    assert answer.code == 0, answer.err
    found: dict[str, Any] = answer.json()
    return found


def test_a_one_part_submit_into_a_full_queue_is_held_then_created_when_room_frees(
    rig: Rig,
) -> None:
    # A job's first part holds nearly the whole cap; the fake enforces it from here on.
    rig.fake.limits = QueueLimits(count_tokens=half_bytes)
    job = submit_job_of(rig, big_input(600), MODEL)
    rig.run()
    first = list(rig.fake.batches_created())
    assert len(first) == 1
    rig.fake.limits.enqueued_tokens[MODEL] = CAP
    # The old code created a plain batch here: Gemini refused it (exit 1, nothing held).
    answer = submitted(rig, KEYS)
    name = answer["name"]
    assert name.startswith("jobs/") and answer["parts"] == 1
    assert rig.fake.limits.refusals == []  # nothing sent over the cap
    assert rig.fake.batches_created() == first
    (part,) = rig.state(name).doc[JOB]["parts"]
    assert part["phase"] == "held"
    finish_all(rig, [job, name])  # every pass: opstate's count within the cap
    assert rig.fake.limits.refusals == []
    assert rig.fake.limits.peak_tokens[MODEL] <= CAP
    (part,) = rig.state(name).doc[JOB]["parts"]
    assert rig.fake.batch_input(part["batch"]) == b"".join(request_bytes(k) for k in KEYS)
    assert counted(rig) == (0, 0)


def test_a_one_part_submit_with_room_is_todays_batch_counted_until_it_ends(rig: Rig) -> None:
    rig.fake.limits = QueueLimits(enqueued_tokens={MODEL: CAP}, count_tokens=half_bytes)
    answer = submitted(rig, KEYS)
    # Today's shape: the batch's own name and the same keys.
    name = answer["name"]
    assert name.startswith("batches/")
    assert set(answer) == {
        "name",
        "state",
        "created",
        "displayName",
        "input",
        "retry",
        "retryBatchesAtMost",
    }
    state = rig.state(name)
    held = state.doc[RESERVED]
    assert held["model"] == MODEL and 0 < held["tokens"] <= CAP
    assert counted(rig) == (held["tokens"], 1)
    # Beside it, a job's parts take only what is left: its first part is held.
    job = submit_job_of(rig, big_input(600), MODEL)
    rig.run()
    assert rig.fake.batches_created() == [name]
    assert rig.state(job).doc[JOB]["parts"][0]["phase"] == "held"
    # Not ended: nothing freed, the part still held.
    rig.run()
    assert counted(rig) == (held["tokens"], 1)
    assert rig.fake.batches_created() == [name]
    rig.finish(name, [answered(k) for k in KEYS])
    finish_all(rig, [job])
    assert rig.fake.limits.refusals == []
    assert rig.fake.limits.peak_tokens[MODEL] <= CAP
    state = rig.state(name)
    assert state.doc[RESERVED] == {**held, "freed": True}
    assert state.status == RETRY_DONE
    assert counted(rig) == (0, 0)


def test_a_one_part_submit_gemini_refuses_for_a_full_queue_is_held_not_failed(
    rig: Rig,
) -> None:
    # opstate's count has room, Gemini's queue has not (a batch opstate does not count): the
    # create is answered with a full queue's 429 (queue_full_body: the generic sentence, no
    # RetryInfo). The old code: "opstate: error: Gemini: RESOURCE_EXHAUSTED ...", exit 1.
    rig.fake.limits = QueueLimits(count_tokens=half_bytes)
    rig.fake.fail_create(429, body=queue_full_body(), times=1)
    answer = submitted(rig, KEYS)
    name = answer["name"]
    assert name.startswith("jobs/") and answer["parts"] == 1
    assert rig.fake.batches_created() == []
    assert counted(rig) == (0, 0)  # the refused create's room given back
    marker = next((rig.tmp_path / "results" / "inputs").glob("*/submit-*.json"))
    assert RESERVED not in json.loads(marker.read_bytes())
    finish_all(rig, [name])
    (part,) = rig.state(name).doc[JOB]["parts"]
    assert part["phase"] == "ended"
    assert counted(rig) == (0, 0)


def test_a_batch_submitted_before_this_release_frees_nothing(rig: Rig) -> None:
    # A batch kept with no reservation (0.6.0, or the code before): its end frees nothing.
    rig.fake.limits = QueueLimits(count_tokens=half_bytes)
    name = submitted(rig, KEYS)["name"]
    store = rig.store()
    try:
        state = store.get_retry(name)
        assert state is not None
        held = state.doc[RESERVED]
        doc = {k: v for k, v in state.doc.items() if k != RESERVED}
        assert store.set_retry(name, state.rev, replace(state, doc=doc, status=RETRY_DONE))
        # What another runner holds stays held: the old batch's end gives none of it back.
    finally:
        store.close()
    rig.finish(name, [answered(k) for k in KEYS])
    rig.run()
    assert counted(rig) == (held["tokens"], 1)
    assert RESERVED not in rig.state(name).doc


def test_a_counted_batch_keeps_its_policy_rules_stop_and_track_as_before(rig: Rig) -> None:
    # Held active only for its room: no policy to stop (as before), and a policy tracked later
    # retries its failed rows after the room is freed.
    from tests.support.retry_rows import failed

    rig.fake.limits = QueueLimits(count_tokens=half_bytes)
    name = submitted(rig, KEYS)["name"]
    stop = rig.cli("retry", "--stop", name)
    assert stop.code != 0 and "off: nothing to stop" in stop.err
    assert rig.cli("track", name, "--retry-attempts", "1").code == 0
    rig.finish(name, [failed(k, 503, "UNAVAILABLE") for k in KEYS])
    rig.run()
    state = rig.state(name)
    assert state.doc[RESERVED]["freed"] is True
    (child,) = state.doc["children"]
    assert child["phase"] == "created" and child["reserved"]["tokens"] > 0
    assert counted(rig) == (child["reserved"]["tokens"], 1)


def test_waiting_for_the_final_result_of_a_counted_batch_without_a_policy_is_as_before(
    rig: Rig,
) -> None:
    # Its state is active only to free its room: ``wait --until final`` answers once the batch
    # is archived, as for any batch without a policy, not once a pass has freed the room.
    rig.fake.limits = QueueLimits(count_tokens=half_bytes)
    name = submitted(rig, KEYS)["name"]
    rig.finish(name, [answered(k) for k in KEYS])
    waited = rig.cli("wait", name, "--until", "final", "--timeout", "2", "--json")
    assert waited.code == 0, waited.err
    assert counted(rig)[1] == 1  # no pass ran: the room is freed by the next one
    # The same answer as for the batch kept as before this release (no reservation: done).
    store = rig.store()
    try:
        state = store.get_retry(name)
        assert state is not None
        doc = {k: v for k, v in state.doc.items() if k != RESERVED}
        assert store.set_retry(name, state.rev, replace(state, doc=doc, status=RETRY_DONE))
    finally:
        store.close()
    before = rig.cli("wait", name, "--until", "final", "--timeout", "2", "--json")
    assert before.code == 0 and before.json() == waited.json()


def test_a_submit_left_without_its_create_answer_reuses_its_recorded_room_once(rig: Rig) -> None:
    # A 503 on the create (the batch may exist): the room stays recorded in the marker and
    # counted; the same submit run again uses it (no second reservation) and the batch's end
    # gives it back once.
    rig.fake.limits = QueueLimits(count_tokens=half_bytes)
    rig.fake.fail_create(503, times=1)
    source = write_input(rig.tmp_path / "again.jsonl", KEYS)
    first = rig.cli("submit", str(source), "--model", MODEL, "--json")
    assert first.code != 0
    marker = next((rig.tmp_path / "results" / "inputs").glob("*/submit-*.json"))
    held = json.loads(marker.read_bytes())[RESERVED]
    assert counted(rig) == (held["tokens"], 1)
    again = rig.cli("submit", str(source), "--model", MODEL, "--json")
    assert again.code == 0, again.err
    name = again.json()["name"]
    assert name.startswith("batches/") and counted(rig) == (held["tokens"], 1)
    assert rig.state(name).doc[RESERVED] == held
    rig.finish(name, [answered(k) for k in KEYS])
    rig.run()
    rig.run()
    assert counted(rig) == (0, 0)
