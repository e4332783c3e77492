"""Guards for a system that acts (issue 38, the engine's half): opstate creates or cancels at
Gemini only on Gemini's own word about a job it read right before acting, only on batches it
created, with child ids nobody can guess, from input bytes it verified, within a budget; and
what it keeps in a local results folder is private and never written through a link.

Each test is one of the issue's reproductions, tried as an attacker would with the project's
own fakes (the fake Gemini, the results folder, the embedded SQLite store, ``retry_once``
in-process); each fails on the release before the guard.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import shutil
import sqlite3
import stat
import time
from collections.abc import Iterator
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from opstate.config import settings
from opstate.domain.events import Source
from opstate.domain.model import OpEvent
from opstate.domain.retry import RetryPolicy
from opstate.domain.states import State
from opstate.ingest import ingest
from opstate.outcomes import file_sink as file_sink_module
from opstate.outcomes.file_sink import FileSink
from opstate.retry import budget as budget_module
from opstate.retry import lineage
from opstate.retry.authority import VIA_CLI
from opstate.retry.inputs import input_key
from opstate.retry.passes import RetryResult
from opstate.retry.policy import keep_policy
from opstate.retry.wiring import config_from
from opstate.store.retry_state import RETRY_DONE
from tests.integration.test_retry_engine import HOUR, MODEL, Rig, S, make_rig
from tests.integration.test_retry_scenario import ok, settle
from tests.support.fake_gemini import FakeGemini, Request
from tests.support.retry_rows import answered, failed, write_input


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.lstat().st_mode)


# -- repro 8: a local results folder is private and never written through a link ------------


def test_the_folder_sink_writes_private_folders_and_files(tmp_path: Path) -> None:
    root = tmp_path / "results"
    sink = FileSink(root)
    before = os.umask(0o022)  # the usual umask: what the sink creates must not rely on it
    try:
        with sink.open("inputs/abc/input.jsonl", name="x") as out:
            out.write(b'{"key": "a", "request": {}}\n')
            out.commit("")
    finally:
        os.umask(before)
    assert _mode(root) == 0o700
    assert _mode(root / "inputs") == 0o700 and _mode(root / "inputs/abc") == 0o700
    assert _mode(root / "inputs/abc/input.jsonl") == 0o600


def test_a_tree_an_older_release_wrote_0755_0644_is_still_read(tmp_path: Path) -> None:
    root = tmp_path / "results"
    folder = root / "batches/a/1"
    folder.mkdir(parents=True, mode=0o755)
    for part in (root, root / "batches", root / "batches/a", folder):
        part.chmod(0o755)
    (folder / "output.jsonl").write_bytes(b"old\n")
    (folder / "output.jsonl").chmod(0o644)
    sink = FileSink(root)
    stored = sink.head("batches/a/1/output.jsonl")
    assert stored is not None and stored.size == 4
    assert sink.read("batches/a/1/output.jsonl", 100) == b"old\n"
    assert b"".join(sink.chunks(stored.location)) == b"old\n"


def test_a_folder_swapped_for_a_link_after_the_checks_is_not_written_through(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The race of the issue made certain: the folder becomes a link to a folder outside the
    root right after the sink looked at it (as the temporary name is drawn), before the write."""
    root = tmp_path / "results"
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    sink = FileSink(root)
    with sink.open("batches/a/1/summary.json", name="a") as out:  # the folder exists
        out.write(b"{}")
        out.commit("")
    folder = root / "batches/a/1"
    real_uuid4 = file_sink_module.uuid.uuid4

    def swap() -> object:
        if not folder.is_symlink():
            folder.rename(root / "batches/a/moved")
            folder.symlink_to(outside)
        return real_uuid4()

    monkeypatch.setattr(file_sink_module.uuid, "uuid4", swap)
    try:
        with sink.open("batches/a/1/output.jsonl", name="a") as out:
            out.write(b"prompts")
            out.commit("")
    except Exception:  # refusing is fine too; writing outside is not
        pass
    assert list(outside.iterdir()) == []
    # Read by key through the link: no object, never the file outside.
    (outside / "output.jsonl").write_bytes(b"planted")
    assert sink.read("batches/a/1/output.jsonl", 100) is None
    assert sink.head("batches/a/1/output.jsonl") is None


# -- the engine: a rig of the SQLite store, the results folder and the fake Gemini ------------


@pytest.fixture
def rig(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: Any, fake_gemini: FakeGemini
) -> Iterator[Rig]:
    yield from make_rig(monkeypatch, tmp_path, capsys, fake_gemini)


def reported(
    rig: Rig, name: str, state: State, details: dict[str, Any], policy: RetryPolicy
) -> None:
    """A report's record (its state and details as the caller said, as a ``PUT /operations``
    left it) and a policy kept beside it by the operator (``via`` cli: a policy that may act
    and read a local input): the engine's guards hold whoever attached the policy."""
    store = rig.store()
    try:
        ingest(store, OpEvent(name, state, time.time_ns(), Source.REPORT, details))
        record = store.get(name)
        assert record is not None
        keep_policy(store, record, policy, time.time_ns(), via=VIA_CLI)
    finally:
        store.close()


def uploads(rig: Rig) -> list[Request]:
    return [r for r in rig.requests() if r.path.startswith("/upload/")]


def cancels(rig: Rig) -> list[Request]:
    return [r for r in rig.requests() if r.method == "POST" and r.verb == "cancel"]


def rfc3339(ns: int) -> str:
    return datetime.fromtimestamp(ns / S, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


# -- repro 1: a report never makes opstate create; the model is Gemini's ----------------------


def test_a_reported_expiry_of_a_name_gemini_does_not_know_creates_nothing(
    rig: Rig, tmp_path: Path
) -> None:
    source = write_input(tmp_path / "theirs.jsonl", ["a", "b", "c"])
    made_up = "batches/made-up-by-a-caller"
    reported(
        rig,
        made_up,
        State.FAILED,
        {"reason": "expired", "model": "gemini-2.5-pro"},
        RetryPolicy(max_attempts=10, resubmit_expired=True, input=source.as_uri()),
    )
    ok(rig.cli("archive", "--once"))  # Gemini answers 404: nothing to archive, settled
    rig.fake.reset_requests()
    result = rig.run()
    assert rig.fake.batches_created() == [] and uploads(rig) == []
    assert (result.planned, result.submitted, result.unavailable, result.final) == (0, 0, 1, 1)
    state = rig.state(made_up)
    assert state.status == RETRY_DONE and state.doc["unknown"] == [made_up]
    assert "Gemini knows no batch batches/made-up-by-a-caller (404)" in state.doc["unavailable"]
    # The final result says what is known: no answer, never "expired".
    _, by_key = rig.final(made_up)
    assert {row["error"]["code"] for row in by_key.values()} == {"missing"}
    assert rig.run().as_dict() == RetryResult().as_dict()  # and nothing later either


def test_a_resubmit_runs_on_the_model_gemini_says_not_the_reported_one(
    rig: Rig, tmp_path: Path
) -> None:
    source = write_input(tmp_path / "theirs.jsonl", ["a", "b"])
    name = "batches/expired-elsewhere"
    rig.fake.put_batch(name, "EXPIRED", model="models/gemini-2.5-flash-lite")
    reported(
        rig,
        name,
        State.FAILED,
        {"reason": "expired", "model": "gemini-2.5-pro"},
        RetryPolicy(max_attempts=1, resubmit_expired=True, input=source.as_uri()),
    )
    ok(rig.cli("archive", "--once"))
    assert rig.run().submitted == 1
    (child,) = rig.fake.batches_created()
    assert (rig.fake.resource(child) or {})["metadata"]["model"] == "models/gemini-2.5-flash-lite"
    assert rig.fake.batch_input(child) == source.read_bytes()
    (entry,) = rig.state(name).doc["children"]
    assert entry["model"] == "models/gemini-2.5-flash-lite"


def test_a_report_of_an_expiry_gemini_does_not_confirm_creates_nothing(
    rig: Rig, tmp_path: Path
) -> None:
    source = write_input(tmp_path / "theirs.jsonl", ["a", "b"])
    name = "batches/failed-elsewhere"
    rig.fake.put_batch(name, "FAILED")  # Gemini: FAILED, not EXPIRED
    reported(
        rig,
        name,
        State.FAILED,
        {"reason": "expired"},
        RetryPolicy(max_attempts=3, resubmit_expired=True, input=source.as_uri()),
    )
    ok(rig.cli("archive", "--once"))
    result = rig.run()
    assert (result.planned, result.submitted, result.final) == (0, 0, 1)
    assert rig.fake.batches_created() == [] and uploads(rig) == []


# -- repro 2 and 7: cancel only opstate's own batches, never young ones, a few times ----------


def test_a_tiny_pending_timeout_on_a_batch_opstate_did_not_create_never_cancels_it(
    rig: Rig, tmp_path: Path
) -> None:
    source = write_input(tmp_path / "mine.jsonl", ["a", "b"])
    theirs = "batches/another-producers"
    created = time.time_ns() - 3 * HOUR
    rig.fake.put_batch(theirs, "PENDING", create_time=rfc3339(created), display_name="nightly")
    # As the previous release kept it (a PUT with "retry": {"pendingTimeoutHours": 1e-9}).
    reported(
        rig,
        theirs,
        State.PENDING,
        {},
        RetryPolicy(max_attempts=2, pending_timeout_hours=1e-9, input=source.as_uri()),
    )
    rig.fake.reset_requests()
    for later in (time.time_ns() + HOUR, time.time_ns() + 30 * HOUR):
        result = rig.run(later)
        assert (result.cancelled, result.submitted) == (0, 0)
    assert cancels(rig) == [] and rig.fake.batches_created() == []
    assert (rig.fake.resource(theirs) or {})["metadata"]["state"] == "BATCH_STATE_PENDING"
    assert rig.state(theirs).doc["notOurs"] == [theirs]
    # Read once: known not to be ours, it is not read again.
    assert sum(1 for r in rig.requests() if r.name == theirs) == 1


def test_a_pending_member_gemini_does_not_know_is_never_cancelled_nor_read_again(
    rig: Rig, tmp_path: Path
) -> None:
    source = write_input(tmp_path / "in.jsonl", ["a"])
    made_up = "batches/reported-pending"
    reported(
        rig,
        made_up,
        State.PENDING,
        {},
        RetryPolicy(max_attempts=1, pending_timeout_hours=1.0, input=source.as_uri()),
    )
    rig.fake.reset_requests()
    for later in (2 * HOUR, 3 * HOUR):
        assert rig.run(time.time_ns() + later).cancelled == 0
    assert cancels(rig) == [] and rig.state(made_up).doc["unknown"] == [made_up]
    assert sum(1 for r in rig.requests() if r.name == made_up) == 1  # read once: 404


def test_a_pending_timeout_below_an_hour_is_refused_and_a_stored_one_clamped(
    rig: Rig, tmp_path: Path
) -> None:
    code, _, err = rig.cli(
        "submit",
        str(write_input(tmp_path / "x.jsonl", ["x"])),
        "--model",
        MODEL,
        "--pending-timeout-hours",
        "0.01",
    )
    assert code == 2 and "must be at least 1" in err, err
    assert rig.fake.batches_created() == []
    root = rig.submit(["a", "b"], "--pending-timeout-hours", "1")
    store = rig.store()  # the policy as a release before the floor could keep it
    try:
        record = store.get(root)
        assert record is not None
        state = store.get_retry(root)
        assert state is not None
        doc = {**state.doc, "policy": {**state.doc["policy"], "pendingTimeoutHours": 1e-9}}
        assert store.set_retry(root, state.rev, replace(state, doc=doc))
    finally:
        store.close()
    now = time.time_ns()
    rig.fake.reset_requests()
    assert rig.run(now + 50 * 60 * S).cancelled == 0  # 50 minutes after Gemini's createTime
    assert cancels(rig) == []
    assert rig.run(now + 61 * 60 * S).cancelled == 1  # an hour after it: opstate's own, cancelled
    assert [r.name for r in cancels(rig)] == [root]


def test_a_root_the_previous_release_submitted_is_still_ours_by_its_marker(rig: Rig) -> None:
    """No ``submitId`` in its state (the previous release kept none): the submit id in its
    display name is opstate's when its marker lies beside the kept input."""
    root = rig.submit(["a", "b"], "--pending-timeout-hours", "1")
    store = rig.store()
    try:
        state = store.get_retry(root)
        assert state is not None and "submitId" in state.doc
        doc = {k: v for k, v in state.doc.items() if k != "submitId"}
        assert store.set_retry(root, state.rev, replace(state, doc=doc))
    finally:
        store.close()
    rig.fake.reset_requests()
    assert rig.run(time.time_ns() + 2 * HOUR).cancelled == 1
    assert [r.name for r in cancels(rig)] == [root]


def test_a_display_name_with_a_submit_id_but_no_marker_is_not_ours(
    rig: Rig, tmp_path: Path
) -> None:
    source = write_input(tmp_path / "in.jsonl", ["a"])
    theirs = "batches/looks-submitted"
    shown = "nightly opstate-s-0123456789abcdef"
    rig.fake.put_batch(
        theirs, "PENDING", display_name=shown, create_time=rfc3339(time.time_ns() - 3 * HOUR)
    )
    reported(
        rig,
        theirs,
        State.PENDING,
        {},
        RetryPolicy(max_attempts=1, pending_timeout_hours=1.0, input=source.as_uri()),
    )
    rig.fake.reset_requests()
    assert rig.run(time.time_ns() + 2 * HOUR).cancelled == 0
    assert cancels(rig) == []


def test_a_create_cancel_loop_stops_after_three_cancels(rig: Rig) -> None:
    keys = ["a", "b", "c"]
    root = rig.submit(keys, "--pending-timeout-hours", "1", "--retry-attempts", "10")
    at = time.time_ns()

    def created_now(name: str) -> None:  # Gemini's createTime on the test's clock
        body = rig.fake.resource(name) or {}
        body["metadata"] = {**body["metadata"], "createTime": rfc3339(at)}
        rig.fake.put(name, body)

    rig.fake.on_create(created_now)
    members = [root]
    for _ in range(6):
        at += 2 * HOUR
        result = rig.run(at)
        if rig.state(root).doc.get("stopped"):
            break
        assert result.cancelled == 1
        settle(rig.cli, members[-1])  # Gemini says CANCELLED
        assert rig.run(at).submitted == 1  # resubmitted whole
        members.append(rig.fake.batches_created()[-1])
    state = rig.state(root)
    assert len(cancels(rig)) == 3 and state.doc["cancelled"] == members[:3]
    assert "cancelled 3 batches for their pending timeout" in state.doc["stopped"]
    assert rig.fake.batches_created() == members and len(members) == 4
    # Stopped: the last batch runs on, nothing more is cancelled or created.
    assert rig.run(at + 10 * HOUR).as_dict()["cancelled"] == 0
    rig.finish(members[-1], [answered(k) for k in keys])
    assert rig.run(at + 11 * HOUR).final == 1
    assert rig.fake.batches_created() == members


# -- repro 3: child ids nobody can guess; a found job adopted only after reading it -----------


def failing_root(rig: Rig, keys: list[str]) -> str:
    root = rig.submit(keys, "--retry-attempts", "2")
    rig.finish(root, [failed(k, 503, "UNAVAILABLE") for k in keys])
    return root


def claimed_once(rig: Rig, keys: list[str]) -> tuple[str, dict[str, Any], int]:
    """A root whose first child's create answered 503: the entry is ``creating``, searched
    for before the next create (after its retry time)."""
    root = failing_root(rig, keys)
    rig.fake.fail_create(503, "The service is currently unavailable.", times=1)
    now = time.time_ns()
    assert rig.run(now).submitted == 0
    (entry,) = rig.state(root).doc["children"]
    assert entry["phase"] == lineage.CREATING
    return root, entry, now + int(config_from(settings()).check_s * S) + S


def test_a_batch_named_as_the_old_derived_id_would_name_the_child_is_not_adopted(
    rig: Rig,
) -> None:
    keys = ["a", "b"]
    root = failing_root(rig, keys)
    guessed = lineage.legacy_child_id(root, rig.created_ns(root), 1, 0)
    planted = "batches/planted"
    rig.fake.put_batch(
        planted, "SUCCEEDED", display_name=guessed, create_time=rfc3339(time.time_ns())
    )
    rig.fake.fail_create(503, "The service is currently unavailable.", times=1)
    now = time.time_ns()
    assert rig.run(now).submitted == 0
    (entry,) = rig.state(root).doc["children"]
    assert len(entry["nonce"]) == 32 and entry["nonce"] in entry["id"] and guessed != entry["id"]
    assert rig.run(now + 2 * HOUR).submitted == 1
    (entry,) = rig.state(root).doc["children"]
    assert entry["name"] != planted and entry["name"] in rig.fake.batches_created()
    shown = (rig.fake.resource(entry["name"]) or {})["metadata"]["displayName"]
    assert shown == entry["id"]


def test_a_listing_that_names_a_job_without_the_id_is_not_adopted(rig: Rig) -> None:
    root, entry, later = claimed_once(rig, ["a", "b"])
    other = "batches/someone-elses"
    rig.fake.put_batch(other, "RUNNING", display_name="not the child")

    def listing(request: Request) -> tuple[int, dict[str, Any]]:  # the listing lies
        item = {"name": other, "metadata": {"name": other, "displayName": entry["id"]}}
        return 200, {"operations": [item]}

    rig.fake.route("GET", "batches", listing)
    assert rig.run(later).submitted == 1
    (done,) = rig.state(root).doc["children"]
    assert done["name"] != other and done["name"] in rig.fake.batches_created()


def test_a_job_carrying_the_id_with_a_retry_state_of_its_own_is_not_adopted(
    rig: Rig, tmp_path: Path
) -> None:
    root, entry, later = claimed_once(rig, ["a", "b"])
    other = "batches/tracked-root"
    rig.fake.put_batch(other, "RUNNING", display_name=entry["id"])
    source = write_input(tmp_path / "o.jsonl", ["z"])
    reported(rig, other, State.RUNNING, {}, RetryPolicy(max_attempts=1, input=source.as_uri()))
    assert rig.run(later).submitted == 1
    (done,) = rig.state(root).doc["children"]
    assert done["name"] not in (other, None)


def test_two_jobs_carrying_one_id_stop_the_lineage_and_neither_is_adopted(rig: Rig) -> None:
    root, entry, later = claimed_once(rig, ["a", "b"])
    for name in ("batches/twin-1", "batches/twin-2"):
        rig.fake.put_batch(name, "RUNNING", display_name=entry["id"])
    result = rig.run(later)
    assert (result.submitted, result.stopped) == (0, 1)
    state = rig.state(root)
    (done,) = state.doc["children"]
    assert done["phase"] == lineage.REFUSED and done["name"] is None
    assert "several batches carry the retry id" in state.doc["stopped"]
    assert len(rig.fake.batches_created()) == 1  # the root only


def test_a_plan_of_the_previous_release_still_creates_its_child(rig: Rig) -> None:
    """A plan the release before issue 38 wrote: a derived id, no nonce, sha256 or model (the
    model was the root's ``doc.model``, which may have come from a report): the child is
    created under a nonce id (the old one kept as ``legacyId``), on the model Gemini says."""
    keys = ["a", "b", "c"]
    root = failing_root(rig, keys)
    store = rig.store()
    try:
        state = store.get_retry(root)
        assert state is not None
        kept = state.doc["input"]["location"]
        old_id = lineage.legacy_child_id(root, rig.created_ns(root), 1, 0)
        legacy = {
            "id": old_id, "attempt": 1, "parent": root, "name": None, "rows": 3,
            "bytes": state.doc["input"]["bytes"], "input": kept, "whole": True,
            "phase": lineage.PLANNED, "claims": 0, "claimUntilNs": 0, "error": None,
        }  # fmt: skip
        doc = {**state.doc, "model": "models/reported-by-a-caller", "children": [legacy]}
        doc.pop("submitId", None)
        assert store.set_retry(root, state.rev, replace(state, doc=doc))
    finally:
        store.close()
    assert rig.run().submitted == 1
    (entry,) = rig.state(root).doc["children"]
    assert entry["legacyId"] == old_id and entry["id"] != old_id and len(entry["nonce"]) == 32
    child = rig.fake.batches_created()[-1]
    assert entry["name"] == child
    assert (rig.fake.resource(child) or {})["metadata"]["model"] == f"models/{MODEL}"
    assert (rig.fake.resource(child) or {})["metadata"]["displayName"] == entry["id"]


# -- repro 4: the kept input is verified from its bytes -------------------------------------


def kept_path(rig: Rig, root: str) -> Path:
    location = rig.state(root).doc["input"]["location"]
    return Path(str(location).removeprefix("file://"))


def swap(path: Path, keys: list[str]) -> None:
    """Whoever can write the results folder replaces the kept input: the same keys and size,
    other prompts."""
    data = path.read_bytes()
    forged = data.replace(b"question", b"leak-me!")
    assert len(forged) == len(data) and forged != data
    path.chmod(0o600)
    path.write_bytes(forged)


def test_a_swapped_kept_input_is_detected_before_rows_are_cut_from_it(rig: Rig) -> None:
    keys = ["a", "b", "c"]
    root = rig.submit(keys, "--retry-attempts", "1")
    rig.finish(root, [failed("a", 503, "UNAVAILABLE"), answered("b"), answered("c")])
    swap(kept_path(rig, root), keys)
    rig.fake.reset_requests()
    result = rig.run()
    assert (result.submitted, result.unavailable) == (0, 1)
    assert rig.fake.batches_created() == [root] and uploads(rig) == []
    doc = rig.state(root).doc
    assert doc["unavailable"] == "input unusable"  # the detail is the log's and the operator's
    assert "no longer has its recorded sha256" in doc["unavailableDetail"]


def test_a_swapped_input_is_never_uploaded_whole(rig: Rig) -> None:
    keys = ["a", "b", "c"]
    root = rig.submit(keys, "--resubmit-expired")
    rig.fake.set_batch_state(root, "BATCH_STATE_EXPIRED")
    settle(rig.cli, root)
    held = rig.fake.files_held()
    swap(kept_path(rig, root), keys)
    result = rig.run()
    assert (result.submitted, result.stopped) == (0, 1)
    assert rig.fake.batches_created() == [root]
    assert rig.fake.files_held() == held  # no upload finalized
    assert "no longer has its recorded sha256" in rig.state(root).doc["stopped"]


def test_each_child_input_is_recorded_with_its_sha256(rig: Rig) -> None:
    keys = ["a", "b", "c"]
    root = rig.submit(keys, "--retry-attempts", "1")
    rig.finish(root, [failed(k, 503, "UNAVAILABLE") for k in keys[:2]] + [answered("c")])
    assert rig.run().submitted == 1
    (entry,) = rig.state(root).doc["children"]
    data = Path(str(entry["input"]).removeprefix("file://")).read_bytes()
    assert entry["sha256"] == hashlib.sha256(data).hexdigest()
    assert rig.fake.batch_input(entry["name"]) == data


def test_an_input_planted_where_opstate_keeps_it_is_not_reused(rig: Rig, tmp_path: Path) -> None:
    keys = ["a", "b"]
    source = write_input(tmp_path / "in.jsonl", keys)
    data = source.read_bytes()
    planted = rig.tmp_path / "results" / input_key(hashlib.sha256(data).hexdigest())
    planted.parent.mkdir(parents=True)
    planted.write_bytes(data.replace(b"question", b"leak-me!"))  # the same size
    answer = ok(rig.cli("submit", str(source), "--model", MODEL, "--json")).json()
    assert rig.fake.batch_input(answer["name"]) == data
    assert planted.read_bytes() == data  # written again from the source


# -- the budget: what retries may create, deployment-wide -----------------------------------


def counted(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    names: list[str] = []
    monkeypatch.setattr(budget_module, "count", lambda name, *a, **k: names.append(name))
    return names


def test_the_batches_per_hour_budget_holds_a_root_back_until_the_hour_passed(
    rig: Rig, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPSTATE_RETRY_MAX_BATCHES_PER_HOUR", "1")
    metrics = counted(monkeypatch)
    first, second = failing_root(rig, ["a", "b"]), failing_root(rig, ["c", "d"])
    now = time.time_ns() // HOUR * HOUR + S  # the bound is per UTC clock hour (issue 47)
    result = rig.run(now)
    assert (result.planned, result.submitted) == (2, 1)
    assert metrics == ["RetryBudgetReached"]
    phases = {
        root: [c["phase"] for c in rig.state(root).doc["children"]] for root in (first, second)
    }
    assert sorted(phases.values()) == [[lineage.CREATED], [lineage.PLANNED]]
    waiting = next(root for root, phase in phases.items() if phase == [lineage.PLANNED])
    assert rig.state(waiting).due_ns > now  # due again later
    assert rig.run(now + HOUR // 2).submitted == 0  # still within the hour
    assert len(rig.fake.batches_created()) == 3
    assert rig.run(now + HOUR + S).submitted == 1
    assert [c["phase"] for c in rig.state(waiting).doc["children"]] == [lineage.CREATED]


def test_lineages_that_ended_still_count_for_the_hour(
    rig: Rig, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 47: with the bound at 1, three lineages each created their retry and finished
    between passes; 0.6.0 counted the active lineages' children only, so each pass found none
    in the hour and the three created three retry batches within 15 minutes."""
    monkeypatch.setenv("OPSTATE_RETRY_MAX_BATCHES_PER_HOUR", "1")
    now = time.time_ns() // HOUR * HOUR + S
    created = 0
    for n in range(3):
        keys = [f"l{n}-a", f"l{n}-b"]
        root = failing_root(rig, keys)
        created += rig.run(now + n * 5 * 60 * S).submitted
        for entry in rig.state(root).doc["children"]:
            if entry["name"]:
                rig.finish(entry["name"], [answered(k) for k in keys])
        rig.run(now + n * 5 * 60 * S + S)  # the lineage ends: its final result is written
    assert created == 1
    assert len(rig.fake.batches_created()) == 3 + 1  # three roots, one retry


def test_the_active_lineages_budget_lets_a_new_lineage_start_once_one_ended(
    rig: Rig, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPSTATE_RETRY_MAX_ACTIVE_LINEAGES", "1")
    metrics = counted(monkeypatch)
    first = failing_root(rig, ["a", "b"])
    assert rig.run().submitted == 1
    second = failing_root(rig, ["c", "d"])
    assert rig.run().submitted == 0
    assert metrics == ["RetryBudgetReached"]
    assert [c["phase"] for c in rig.state(second).doc["children"]] == [lineage.PLANNED]
    child = rig.fake.batches_created()[1]
    rig.finish(child, [answered("a"), answered("b")])
    result = rig.run()
    assert (result.final, result.submitted) == (1, 1)  # the first ended: the second starts
    assert rig.state(first).status == RETRY_DONE
    assert [c["phase"] for c in rig.state(second).doc["children"]] == [lineage.CREATED]


def test_an_s3_object_planted_with_the_right_sha256_metadata_is_not_reused() -> None:
    """S3's metadata says what the writer said: an object planted under the kept input's key
    with the true sha256 in its metadata (and the true size) is read and rewritten, not reused."""
    import boto3
    from moto import mock_aws

    from opstate.outcomes.s3_sink import S3Sink
    from opstate.retry.inputs import keep_input

    good = b"".join(
        json.dumps({"key": k, "request": {"contents": [{"parts": [{"text": k}]}]}}).encode() + b"\n"
        for k in ("a", "b")
    )
    forged = good.replace(b'"text": "a"', b'"text": "z"')
    sha = hashlib.sha256(good).hexdigest()
    with mock_aws():
        s3 = boto3.client("s3", region_name="us-east-1")
        s3.create_bucket(Bucket="results")
        key = f"pre/{input_key(sha)}"
        s3.put_object(Bucket="results", Key=key, Body=forged, Metadata={"sha256": sha})
        kept = keep_input(lambda: iter((good,)), S3Sink("results", "pre", client=s3), 4096)
        assert kept.sha256 == sha
        assert s3.get_object(Bucket="results", Key=key)["Body"].read() == good


# -- retry states the previous release wrote (tests/fixtures/previous_release) ----------------

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "previous_release"
FIXTURE_DIR = "/tmp/opstate-previous-release-retry"  # make_retry_fixture.RETRY_DIR


def test_retry_states_of_the_previous_release_are_carried_on_safely(
    rig: Rig, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``retry_ops.db`` as the release before issue 38 left it (make_retry_fixture.py), its
    results folder moved under this test's: a child it left ``creating`` under a derived id is
    searched for under both ids and created under a nonce id on the model Gemini says; a
    report's 1e-9 h pending timeout on a batch opstate did not create cancels nothing."""
    moved = rig.tmp_path / "previous"
    for relative, data in json.loads((FIXTURE / "retry_results.json").read_text()).items():
        path = moved / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(base64.b64decode(data))
    shutil.copyfile(FIXTURE / "retry_ops.db", rig.db)
    conn = sqlite3.connect(rig.db)
    with conn:
        for column in ("retry", "archive"):
            conn.execute(
                f"UPDATE operations SET {column} = replace({column}, ?, ?)",
                (FIXTURE_DIR, str(moved)),
            )
    conn.close()
    monkeypatch.setenv("OPSTATE_RESULTS_URL", (moved / "results").as_uri())
    gemini = json.loads((FIXTURE / "retry_gemini.json").read_text())
    for name, body in gemini["batches"].items():
        rig.fake.put(name, body)
    rig.fake._submits.count = 1000  # this fake names its batches from 1: not the fixture's
    submitted, reported = gemini["submitted"], gemini["reported"]
    (old,) = rig.state(submitted).doc["children"]
    assert (old["phase"], old["claims"], "nonce" in old) == (lineage.CREATING, 1, False)
    assert rig.state(reported).doc["model"] == "gemini-2.5-pro"

    rig.fake.reset_requests()
    result = rig.run(time.time_ns() + 2 * HOUR)
    assert (result.submitted, result.cancelled, result.errors) == (1, 0, 0)
    (entry,) = rig.state(submitted).doc["children"]
    assert entry["legacyId"] == old["id"] and len(entry["nonce"]) == 32
    assert entry["id"] == f"opstate-{entry['nonce']}-a1-0" and entry["phase"] == lineage.CREATED
    searched = [r for r in rig.requests() if r.method == "GET" and r.name == "batches"]
    assert len(searched) >= 2  # under its new id, then its old one
    child = entry["name"]
    assert child not in (submitted, reported)
    shown = (rig.fake.resource(child) or {})["metadata"]
    assert shown["displayName"] == entry["id"] and shown["model"] == f"models/{MODEL}"
    assert rig.child_keys(child) == ["a", "b"]
    # Its policy came without a provenance (docs/security.md, "Acting"): no timeout acted on.
    assert cancels(rig) == [] and not any(r.name == reported for r in rig.requests())

    rig.finish(child, [answered("a"), answered("b")])
    assert rig.run(time.time_ns() + 2 * HOUR).final == 1
    final, by_key = rig.final(submitted)
    assert final["rows"] == {"total": 3, "answered": 3, "blocked": 0, "failed": 0}
    assert {key: row["attempt"] for key, row in by_key.items()} == {"a": 1, "b": 1, "c": 0}
