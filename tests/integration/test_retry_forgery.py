"""Children no one can forge (issue 47): a second producer on the same Gemini project (another
key, the same fake Gemini: jobs and files are visible to every key of the project) creates a
batch carrying a retry child's id (or a submit's id) after a create answered 503, with an
input and answers of its own. It is never adopted, its rows never reach ``final.jsonl``, and
the real child is created once.

Gemini shows every key of a project the display names of its files and batches (ARCHITECTURE
section 6: "Jobs and files are visible only to the project of the key that created them"), so
the producer is assumed to know whatever opstate put there, and in the worst case the id
itself: adoption rests on the upload opstate recorded before its create.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from google import genai
from google.genai import types

from opstate.domain.states import State
from opstate.gemini.submit import create_batch, upload_jsonl
from opstate.retry import lineage
from tests.integration.test_retry_engine import HOUR, MODEL, Rig, make_rig
from tests.integration.test_retry_guards import claimed_once
from tests.integration.test_retry_scenario import ok
from tests.support.fake_gemini import FakeGemini
from tests.support.retry_rows import answered, failed, request_bytes, write_input

FORGED = "forged by another producer"


@pytest.fixture
def rig(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: Any, fake_gemini: FakeGemini
) -> Iterator[Rig]:
    yield from make_rig(monkeypatch, tmp_path, capsys, fake_gemini)


def other_producer(fake: FakeGemini) -> genai.Client:
    """Another key of the same project: the same Gemini, its own client."""
    options = types.HttpOptions(
        base_url=fake.base_url, retry_options=types.HttpRetryOptions(attempts=1)
    )
    return genai.Client(vertexai=False, api_key="another-key", http_options=options)


def forged_row(key: str) -> dict[str, Any]:
    return {
        "key": key,
        "response": {"candidates": [{"content": {"parts": [{"text": FORGED}]}}]},
    }


def forge(fake: FakeGemini, display_name: str, keys: list[str], model: str = MODEL) -> str:
    """The other producer uploads an input of its own and creates a batch named
    ``display_name`` on ``model``; the batch ends with forged answers for ``keys``."""
    client = other_producer(fake)
    try:
        data = b"".join(request_bytes(k) for k in keys).replace(b"question", b"its own")
        file_name = upload_jsonl(client, chunks=[data], size=len(data), display_name="mine")
        name = create_batch(client, model, file_name, display_name).name
    finally:
        client.close()
    fake.run_batch(name, [forged_row(k) for k in keys])
    return name


def shown_names(fake: FakeGemini, *but: str) -> list[str]:
    """Every display name Gemini shows the project: its files' and its batches' (but ``but``)."""
    shown = []
    for name in [*fake.files_held(), *fake.files_deleted(), *fake.batches_created()]:
        if name in but:
            continue
        body = fake.resource(name) or {}
        shown.append(str(body.get("displayName") or body.get("metadata", {}).get("displayName")))
    return shown


def test_a_batch_a_second_producer_made_with_the_child_id_is_never_adopted(rig: Rig) -> None:
    keys = ["a", "b"]
    root, entry, later = claimed_once(rig, keys)  # the child's create answered 503
    # Worst case: the producer learned the id itself (the previous release showed it as the
    # upload's display name to every key of the project).
    forged = forge(rig.fake, entry["id"], keys)
    assert rig.run(later).submitted == 1
    (done,) = rig.state(root).doc["children"]
    child = done["name"]
    assert child != forged and child in rig.fake.batches_created()
    assert [n for n in rig.fake.batches_created() if n not in (root, forged)] == [child]
    assert rig.child_keys(child) == keys
    # No display name Gemini shows the project holds the id's secret part.
    assert not any(done["nonce"] in shown for shown in shown_names(rig.fake, forged))
    rig.finish(child, [answered(k) for k in keys])
    assert rig.run(later + HOUR).final == 1
    _, by_key = rig.final(root)
    assert {k: row["attempt"] for k, row in by_key.items()} == {"a": 1, "b": 1}
    assert FORGED not in json.dumps(by_key)
    assert forged not in json.dumps(rig.state(root).doc)


def test_a_forged_batch_on_the_planned_model_after_the_claim_is_still_not_adopted(
    rig: Rig,
) -> None:
    """The same, the forged batch made to look right in every way but its input: the display
    name Gemini shows for the child, the model, a createTime after the claim."""
    keys = ["a", "b"]
    root, entry, later = claimed_once(rig, keys)
    shown = (rig.fake.resource(rig.fake.files_held()[-1]) or {}).get("displayName", entry["id"])
    forged = forge(rig.fake, str(shown), keys)
    assert rig.run(later).submitted == 1
    (done,) = rig.state(root).doc["children"]
    assert done["name"] not in (forged, None)
    assert rig.fake.batches_created().count(forged) == 1
    assert len(rig.fake.batches_created()) == 3  # the root, the forgery, the child


def test_the_child_a_lost_create_made_is_adopted_on_its_recorded_upload(rig: Rig) -> None:
    """The create's answer is lost but the batch exists: the next claim finds it by the
    upload it recorded and adopts it; nothing else is created."""
    keys = ["a", "b"]
    root = rig.submit(keys, "--retry-attempts", "2")
    rig.finish(root, [failed(k, 503, "UNAVAILABLE") for k in keys])

    def lose(name: str) -> None:
        raise RuntimeError("the answer is lost")

    rig.fake.on_create(lose)
    now = time.time_ns()
    assert rig.run(now).submitted == 0
    rig.fake.on_create(None)
    (entry,) = rig.state(root).doc["children"]
    lost = rig.fake.batches_created()[-1]
    assert entry["phase"] == lineage.CREATING and entry["upload"]["file"]
    assert (rig.fake.resource(lost) or {})["metadata"]["inputConfig"]["fileName"] == entry[
        "upload"
    ]["file"]
    assert rig.run(now + 2 * HOUR).submitted == 1
    (done,) = rig.state(root).doc["children"]
    assert done["name"] == lost and rig.fake.batches_created() == [root, lost]


def test_a_job_on_the_recorded_upload_but_another_model_is_not_adopted(rig: Rig) -> None:
    keys = ["a", "b"]
    root, _, later = claimed_once(rig, keys)
    upload = rig.state(root).doc["children"][0]["upload"]["file"]
    client = other_producer(rig.fake)
    try:
        other = create_batch(client, "gemini-2.5-pro", upload, "anything").name
    finally:
        client.close()
    assert rig.run(later).submitted == 1
    (done,) = rig.state(root).doc["children"]
    assert done["name"] not in (other, None)


def test_a_submit_run_again_never_adopts_a_batch_carrying_its_id(rig: Rig) -> None:
    """``opstate submit`` after a create that answered 503: the producer copies the submit id
    (shown in the upload's or the batch's display name) onto a batch of its own; submitting
    again creates the real batch instead of tracking the forgery."""
    source = write_input(rig.tmp_path / "in.jsonl", ["a", "b"])
    args = ["submit", str(source), "--model", MODEL, "--retry-attempts", "1", "--json"]
    rig.fake.fail_create(503, "The service is currently unavailable.", times=1)
    assert rig.cli(*args).code != 0
    markers = list((rig.tmp_path / "results").glob("inputs/*/submit-*.json"))
    assert len(markers) == 1
    submit_id = markers[0].name.removeprefix("submit-").removesuffix(".json")
    forged = forge(rig.fake, f"nightly {submit_id}", ["a", "b"])
    again = ok(rig.cli(*args)).json()
    assert again["created"] is True and again["name"] != forged
    assert rig.fake.batches_created() == [forged, again["name"]]
    got = ok(rig.cli("get", again["name"], "--json")).json()
    assert got["state"] == State.PENDING.value


def previous_release_claim(rig: Rig, keys: list[str]) -> tuple[str, dict[str, Any], int]:
    """A child the previous release claimed: its create answered 503, and it recorded no
    upload (its batch would have carried its id as the display name)."""
    root, _, later = claimed_once(rig, keys)
    store = rig.store()
    try:
        state = store.get_retry(root)
        assert state is not None
        doc = lineage.mutable(state.doc)
        (entry,) = doc["children"]
        del entry["upload"]
        assert store.set_retry(root, state.rev, replace(state, doc=doc))
    finally:
        store.close()
    return root, entry, later


def test_a_claim_of_the_previous_release_adopts_only_a_job_holding_its_planned_bytes(
    rig: Rig,
) -> None:
    keys = ["a", "b"]
    root, entry, later = previous_release_claim(rig, keys)
    planned = Path(str(entry["input"]).removeprefix("file://")).read_bytes()
    forged = forge(rig.fake, entry["id"], keys)  # its id, other bytes: not adopted
    client = other_producer(rig.fake)  # what the previous release created: the same bytes
    try:
        upload = upload_jsonl(client, chunks=[planned], size=len(planned), display_name="x")
        ours = create_batch(client, MODEL, upload, entry["id"]).name
    finally:
        client.close()
    assert rig.run(later).submitted == 1
    (done,) = rig.state(root).doc["children"]
    assert done["name"] == ours and forged in rig.fake.batches_created()
    assert rig.fake.batches_created()[-1] == ours  # nothing created after it


def test_a_claim_of_the_previous_release_never_adopts_a_forgery(rig: Rig) -> None:
    keys = ["a", "b"]
    root, entry, later = previous_release_claim(rig, keys)
    forged = forge(rig.fake, entry["id"], keys)
    assert rig.run(later).submitted == 1
    (done,) = rig.state(root).doc["children"]
    assert done["name"] not in (forged, None) and done["upload"]["file"]
