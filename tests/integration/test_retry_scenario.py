"""Issue 33's done-when scenario, through the CLI in-process, on the embedded SQLite store,
with the real google-genai client talking to the fake Gemini server: submit 100 keyed requests,
retry the 10 rows that failed 503 (twice), and end with one final line per request.

Also: without a policy nothing is ever created; an EXPIRED batch submitted with
``--resubmit-expired`` is resubmitted whole exactly once; a batch tracked with ``--input``
retries the same way; one whose input opstate does not hold says ``retry: unavailable``.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from opstate.config import settings
from tests.support.cli import Result, in_process
from tests.support.fake_gemini import FakeGemini
from tests.support.retry_rows import (
    answered,
    blocked,
    failed,
    input_keys,
    request_line,
    write_input,
)

MODEL = "gemini-2.5-flash"


@pytest.fixture
def cli(monkeypatch, tmp_path, capsys, fake_gemini):
    monkeypatch.chdir(tmp_path)
    for key in ("OPSTATE_STORE", "OPSTATE_TABLE_NAME", "OPSTATE_WEBHOOK_SECRETS"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("GEMINI_API_KEY", "test-key")
    monkeypatch.setenv("GOOGLE_GEMINI_BASE_URL", fake_gemini.base_url)
    monkeypatch.setenv("OPSTATE_RECONCILE_MAX_PAGES", "0")
    monkeypatch.setenv("OPSTATE_RESULTS_URL", (tmp_path / "results").as_uri())
    yield in_process(monkeypatch, capsys)
    settings.cache_clear()


def ok(result: Result) -> Result:
    assert result.code == 0, result.err
    return result


def settle(cli, name: str) -> None:
    """Read the finished batch (``opstate refresh``) and archive its results."""
    ok(cli("refresh", name))
    ok(cli("archive", "--once"))


def retry(cli) -> dict[str, int]:
    return ok(cli("retry", "--once")).json()


def test_the_done_when_scenario(cli, fake_gemini: FakeGemini, tmp_path: Path) -> None:
    keys = [f"k{i:03d}" for i in range(100)]
    source = write_input(tmp_path / "in.jsonl", keys)
    submitted = ok(cli("submit", str(source), "--model", MODEL, "--retry-attempts", "2", "--json"))
    root = submitted.json()["name"]
    assert fake_gemini.batches_created() == [root]
    assert fake_gemini.batch_input(root) == source.read_bytes()

    transient, permanent, no_answer = keys[:10], keys[10:15], keys[15:18]
    rows = (
        [failed(k, 503, "UNAVAILABLE") for k in transient]
        + [failed(k, 400, "INVALID_ARGUMENT") for k in permanent]
        + [blocked(k) for k in no_answer]
        + [answered(k) for k in keys[18:]]
    )
    fake_gemini.run_batch(root, rows)
    settle(cli, root)
    first = retry(cli)
    assert (first["planned"], first["submitted"], first["final"]) == (1, 1, 0)
    created = fake_gemini.batches_created()
    assert len(created) == 2
    child = created[1]
    original = {json.loads(line)["key"]: line for line in source.read_bytes().splitlines()}
    child_input = fake_gemini.batch_input(child).splitlines()
    assert child_input == [original[k] for k in transient]  # the original lines, unchanged

    # Nothing more happens while the child runs.
    assert retry(cli)["submitted"] == 0
    assert len(fake_gemini.batches_created()) == 2

    fake_gemini.run_batch(
        child,
        [answered(k) for k in transient[:8]]
        + [failed(k, 503, "UNAVAILABLE") for k in transient[8:]],
    )
    settle(cli, child)
    second = retry(cli)
    assert (second["planned"], second["submitted"]) == (1, 1)
    grandchild = fake_gemini.batches_created()[2]
    assert input_keys(fake_gemini.batch_input(grandchild)) == transient[8:]

    fake_gemini.run_batch(grandchild, [answered(k) for k in transient[8:]])
    settle(cli, grandchild)
    third = retry(cli)
    assert (third["planned"], third["submitted"], third["final"]) == (0, 0, 1)
    assert len(fake_gemini.batches_created()) == 3

    view = ok(cli("results", root, "--json")).json()
    final = view["final"]
    assert final["status"] == "final"
    assert final["rows"] == {"total": 100, "answered": 95, "blocked": 3, "failed": 5}
    assert final["errors"] == {"400": 5}
    assert final["attempts"] == 3
    assert view["lineage"] == [root, child, grandchild]
    lines = Path(final["location"].removeprefix("file://")).read_bytes().splitlines()
    assert len(lines) == 100
    by_key = {json.loads(line)["key"]: json.loads(line) for line in lines}
    assert set(by_key) == set(keys)
    assert by_key[transient[9]]["attempt"] == 2 and "response" in by_key[transient[9]]
    assert by_key[transient[0]]["attempt"] == 1
    assert by_key[permanent[0]]["error"]["code"] == 400 and by_key[permanent[0]]["attempt"] == 0

    got = ok(cli("get", child, "--json")).json()
    assert (got["parent"], got["root"], got["attempt"]) == (root, root, 1)
    got = ok(cli("get", grandchild, "--json")).json()
    assert (got["parent"], got["root"], got["attempt"]) == (child, root, 2)

    # Once final, further passes do nothing.
    assert retry(cli) == dict.fromkeys(first, 0) | {"planned": 0}


def test_without_a_policy_nothing_is_ever_created(cli, fake_gemini, tmp_path) -> None:
    keys = [f"k{i}" for i in range(5)]
    source = write_input(tmp_path / "in.jsonl", keys)
    root = ok(cli("submit", str(source), "--model", MODEL, "--json")).json()["name"]
    fake_gemini.run_batch(root, [failed(k, 503, "UNAVAILABLE") for k in keys])
    settle(cli, root)
    for _ in range(2):
        result = retry(cli)
        assert result["planned"] == result["submitted"] == 0
    assert fake_gemini.batches_created() == [root]


def test_an_expired_batch_is_resubmitted_whole_once(cli, fake_gemini, tmp_path) -> None:
    keys = [f"k{i}" for i in range(7)]
    source = write_input(tmp_path / "in.jsonl", keys)
    root = ok(cli("submit", str(source), "--model", MODEL, "--resubmit-expired", "--json")).json()[
        "name"
    ]
    fake_gemini.set_batch_state(root, "BATCH_STATE_EXPIRED")
    settle(cli, root)
    assert retry(cli)["submitted"] == 1
    assert retry(cli)["submitted"] == 0
    created = fake_gemini.batches_created()
    assert len(created) == 2
    assert fake_gemini.batch_input(created[1]) == source.read_bytes()
    fake_gemini.run_batch(created[1], [answered(k) for k in keys])
    settle(cli, created[1])
    assert retry(cli)["final"] == 1
    final = ok(cli("results", root, "--json")).json()["final"]
    assert final["rows"] == {"total": 7, "answered": 7, "blocked": 0, "failed": 0}
    assert len(fake_gemini.batches_created()) == 2


def test_a_batch_tracked_with_its_input_retries_the_same_way(cli, fake_gemini, tmp_path) -> None:
    keys = [f"k{i}" for i in range(6)]
    source = write_input(tmp_path / "in.jsonl", keys)
    fake_gemini.put_batch("batches/elsewhere", "BATCH_STATE_RUNNING", model=f"models/{MODEL}")
    ok(
        cli(
            "track",
            "batches/elsewhere",
            "--retry-attempts",
            "1",
            "--input",
            source.resolve().as_uri(),
        )
    )
    fake_gemini.run_batch(
        "batches/elsewhere",
        [failed(k, 429, "RESOURCE_EXHAUSTED") for k in keys[:2]] + [answered(k) for k in keys[2:]],
    )
    settle(cli, "batches/elsewhere")
    assert retry(cli)["submitted"] == 1
    child = fake_gemini.batches_created()[-1]
    assert input_keys(fake_gemini.batch_input(child)) == keys[:2]


def test_a_batch_whose_input_opstate_does_not_hold_is_unavailable(cli, fake_gemini) -> None:
    fake_gemini.put_batch("batches/noinput", "BATCH_STATE_RUNNING")
    ok(cli("track", "batches/noinput", "--retry-attempts", "2"))
    result = retry(cli)
    assert result["unavailable"] == 1
    got = ok(cli("get", "batches/noinput", "--json")).json()
    assert got["retry"]["status"] == "unavailable"
    assert "does not hold" in got["retry"]["reason"]
    fake_gemini.run_batch("batches/noinput", [failed("a", 503, "UNAVAILABLE")])
    settle(cli, "batches/noinput")
    assert retry(cli)["submitted"] == 0
    assert fake_gemini.batches_created() == []


def test_a_batch_created_with_keyed_inlined_requests_retries_from_them(
    cli, fake_gemini: FakeGemini
) -> None:
    """The REST batch resource holds inlined requests: opstate keeps them as the input."""
    keys = ["a", "b", "c"]
    name = "batches/inlined"
    fake_gemini.put_batch(name, "BATCH_STATE_RUNNING")
    body = fake_gemini.resource(name)
    assert body is not None
    body["metadata"]["inputConfig"] = {
        "requests": {
            "requests": [
                {"request": request_line(k)["request"], "metadata": {"key": k}} for k in keys
            ]
        }
    }
    fake_gemini.put(name, body)
    ok(cli("track", name, "--retry-attempts", "1"))
    fake_gemini.run_batch(name, [failed("a", 503, "UNAVAILABLE"), answered("b"), answered("c")])
    settle(cli, name)
    assert retry(cli)["submitted"] == 1
    child = fake_gemini.batches_created()[-1]
    assert [json.loads(line) for line in fake_gemini.batch_input(child).splitlines()] == [
        request_line("a")
    ]


def test_inlined_requests_without_keys_leave_retry_unavailable(
    cli, fake_gemini: FakeGemini
) -> None:
    name = "batches/unkeyed"
    fake_gemini.put_batch(name, "BATCH_STATE_RUNNING")
    body = fake_gemini.resource(name)
    assert body is not None
    body["metadata"]["inputConfig"] = {
        "requests": {"requests": [{"request": request_line("a")["request"]}]}
    }
    fake_gemini.put(name, body)
    ok(cli("track", name, "--retry-attempts", "1"))
    assert retry(cli)["unavailable"] == 1
    assert ok(cli("get", name, "--json")).json()["retry"]["status"] == "unavailable"


def test_an_input_that_cannot_be_read_leaves_retry_unavailable_saying_why(
    cli, fake_gemini: FakeGemini, tmp_path: Path
) -> None:
    """A file named by a --input that is gone by the time the pass runs (or one only another
    machine has: a DynamoDB store shared with an operator's laptop) is never a crash loop."""
    name = "batches/gone"
    fake_gemini.put_batch(name, "BATCH_STATE_RUNNING")
    source = write_input(tmp_path / "gone.jsonl", ["a"])
    ok(cli("track", name, "--retry-attempts", "1", "--input", source.as_uri()))
    source.unlink()
    result = retry(cli)
    assert (result["unavailable"], result["errors"]) == (1, 0)
    shown = ok(cli("get", name, "--json")).json()["retry"]
    # Every reader sees only that the input is unusable; the operator's get (on the store) and
    # the log say why (issue 38: an API caller must not learn whether an object exists).
    assert shown["reason"] == "input unusable"
    assert "cannot read" in shown["detail"] and "gone.jsonl" in shown["detail"]


def test_a_pass_over_a_waiting_root_not_yet_due_writes_nothing(
    cli, fake_gemini: FakeGemini, tmp_path: Path
) -> None:
    """opstate retry --once looks at every active root; one whose child still runs and whose
    next look is not due yet keeps its state as it is (no write per pass: on DynamoDB each
    would cost a write and a stream record)."""
    from opstate.store.sqlite import SQLiteStore

    keys = ["a", "b"]
    source = write_input(tmp_path / "in.jsonl", keys)
    root = ok(cli("submit", str(source), "--model", MODEL, "--retry-attempts", "1", "--json"))
    name = root.json()["name"]
    fake_gemini.run_batch(name, [failed("a", 503, "UNAVAILABLE"), answered("b")])
    settle(cli, name)
    assert retry(cli)["submitted"] == 1

    def rev() -> int:
        store = SQLiteStore(str(tmp_path / ".opstate" / "ops.db"))
        try:
            state = store.get_retry(name)
            assert state is not None
            return state.rev
        finally:
            store.close()

    before = rev()
    for _ in range(3):
        assert retry(cli)["waiting"] == 1
    assert rev() == before
