"""The retry flow as a newcomer meets it (issue 40), through the CLI in-process on the embedded
SQLite store, with the real google-genai client talking to the fake Gemini server: the final
result in hand (``results --download``, ``wait --until final --json``), honest exit codes and
waits, ``track --input`` checked as ``submit`` checks it, flags that mean what they say, a
lineage stopped on purpose, the views (attempts, phases, ``list`` columns, EXPIRED, readable
text), a retry batch that fails as a whole, a failed create that deletes its upload, and
commands that refuse or have nothing to do without loading google-genai.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from opstate.cli import wait as wait_cli
from opstate.config import settings
from opstate.store.sqlite import SQLiteStore
from tests.support.cli import Result, in_process
from tests.support.retry_rows import answered, failed, input_keys, write_input

MODEL = "gemini-2.5-flash"
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def cli(monkeypatch, tmp_path, capsys, fake_gemini):
    monkeypatch.chdir(tmp_path)
    for key in (
        "OPSTATE_STORE",
        "OPSTATE_TABLE_NAME",
        "OPSTATE_WEBHOOK_SECRETS",
        "OPSTATE_RETRY_MAX_ATTEMPTS",
        "OPSTATE_RETRY_RESUBMIT_EXPIRED",
    ):
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


def submit(cli, tmp_path: Path, keys: list[str], *flags: str) -> str:
    source = write_input(tmp_path / "in.jsonl", keys)
    return ok(cli("submit", str(source), "--model", MODEL, *flags, "--json")).json()["name"]


def until_final(cli, passes: int = 6) -> dict[str, int]:
    for _ in range(passes):
        counts = ok(cli("retry", "--once")).json()
        if counts["final"]:
            return counts
    raise AssertionError("no final result")


# --- 1. retry --once reads the lineage's open batches itself -------------------------------------


def test_retry_once_reads_open_members_and_archives_them(cli, fake_gemini, tmp_path) -> None:
    keys = [f"k{i}" for i in range(6)]
    root = submit(cli, tmp_path, keys, "--retry-attempts", "2")
    first = ok(cli("retry", "--once")).json()
    # the root is read from Gemini (still PENDING there): the lineage waits
    assert (first["read"], first["waiting"], first["planned"]) == (1, 1, 0)
    fake_gemini.run_batch(root, [failed(k, 503, "UNAVAILABLE") for k in keys[:2]]
                          + [answered(k) for k in keys[2:]])  # fmt: skip
    second = ok(cli("retry", "--once")).json()  # no refresh, no archive --once before it
    assert (second["read"], second["archived"], second["submitted"]) == (1, 1, 1)
    child = fake_gemini.batches_created()[1]
    assert input_keys(fake_gemini.batch_input(child)) == keys[:2]


def test_retry_once_with_no_lineage_needs_no_key(cli, monkeypatch) -> None:
    monkeypatch.delenv("GEMINI_API_KEY")
    counts = ok(cli("retry", "--once")).json()
    assert counts["planned"] == counts["read"] == counts["final"] == 0


# --- 2-4. the final result in hand, wait's view and its exit codes -------------------------------


def finished_with_failures(cli, fake_gemini, tmp_path) -> tuple[str, list[str]]:
    """A root whose lineage is final with one row failed 400 (no answer)."""
    keys = [f"k{i}" for i in range(4)]
    root = submit(cli, tmp_path, keys, "--retry-attempts", "1")
    fake_gemini.run_batch(root, [failed(keys[0], 400, "INVALID_ARGUMENT")]
                          + [answered(k) for k in keys[1:]])  # fmt: skip
    until_final(cli)
    return root, keys


def test_download_copies_the_final_result(cli, fake_gemini, tmp_path) -> None:
    root, _ = finished_with_failures(cli, fake_gemini, tmp_path)
    ok(cli("results", root, "--download", str(tmp_path / "got")))
    names = sorted(p.name for p in (tmp_path / "got").iterdir())
    assert names == ["final.json", "final.jsonl", "output.jsonl", "summary.json"]
    ledger = json.loads((tmp_path / "got" / "final.json").read_text())
    assert ledger["rows"]["total"] == 4 and ledger["name"] == root


def test_wait_until_final_json_is_the_full_view_and_exits_1_with_unanswered_rows(
    cli, fake_gemini, tmp_path
) -> None:
    root, _ = finished_with_failures(cli, fake_gemini, tmp_path)
    result = cli("wait", root, "--until", "final", "--timeout", "5", "--json")
    view = result.json()
    for key in ("final", "results", "retry", "parent", "root", "attempt"):
        assert key in view, key
    assert view["final"]["status"] == "final" and view["final"]["rows"]["failed"] == 1
    assert view["root"] == root and view["attempt"] == 0 and view["parent"] is None
    # 0 only when every original request has an answer: one has none here
    assert result.code == 1
    assert "has no answer for 1 of 4 requests" in result.err
    # the same record: terminal (SUCCEEDED) and archived say 0
    assert cli("wait", root, "--until", "archived", "--timeout", "5").code == 0
    help_text = subprocess.run(
        [sys.executable, "-m", "opstate.cli", "wait", "--help"],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    assert "every original request has an answer" in " ".join(help_text.split())


def test_wait_says_once_what_would_move_a_record_nothing_polls(cli, monkeypatch, tmp_path) -> None:
    monkeypatch.setattr(wait_cli, "NOTICE_AFTER_S", 0.0)
    ok(cli("track", "batches/still"))
    result = cli("wait", "batches/still", "--timeout", "0.6")
    assert result.code == 124
    said = [line for line in result.err.splitlines() if "still waiting" in line]
    assert len(said) == 1, result.err
    for command in ("opstate serve", "opstate reconcile --once", "opstate retry --once"):
        assert command in said[0]


# --- 6. unavailable


def test_unavailable_retry_shows_in_final_status(cli, fake_gemini, tmp_path) -> None:
    fake_gemini.put_batch("batches/elsewhere", "BATCH_STATE_PENDING")
    ok(cli("track", "batches/elsewhere", "--retry-attempts", "2"))  # no --input, file input
    ok(cli("retry", "--once"))
    final = ok(cli("get", "batches/elsewhere", "--json")).json()["retry"]
    assert final["status"] == "unavailable"
    store = SQLiteStore(tmp_path / ".opstate" / "ops.db")
    try:
        from opstate.domain.retry import final_view

        state = store.get_retry("batches/elsewhere")
        assert state is not None
        view = final_view(state.doc)
    finally:
        store.close()
    assert view["status"] == "unavailable" and "does not hold" in view["reason"]


# --- 7. track --input is checked as submit checks it


def test_track_input_with_a_bad_line_writes_nothing(cli, tmp_path) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"key": "a", "request": {}}\n{"key": "a", "request": {}}\n')
    result = cli("track", "batches/t1", "--retry-attempts", "2", "--input", str(bad))
    assert result.code == 2
    assert "line 2" in result.err and "nothing written" in result.err
    assert cli("get", "batches/t1").code == 1  # no record


# --- 8. flags mean what they say ----------------------------------------------------------------


def test_resubmit_expired_alone_retries_no_row(cli, fake_gemini, tmp_path) -> None:
    source = write_input(tmp_path / "in.jsonl", ["a", "b"])
    flags = ("--resubmit-expired", "--input", str(source), "--json")
    answer = ok(cli("track", "batches/x1", *flags)).json()
    assert answer["retry"]["policy"]["maxAttempts"] == 0  # was 2, unasked
    assert answer["retryBatchesAtMost"] == 1  # the one whole resubmit
    text = ok(cli("track", "batches/x2", "--pending-timeout-hours", "5")).out
    # rows unknown (no --input): bounded by OPSTATE_RETRY_MAX_BATCHES only
    assert "maxAttempts 0" in text and "at most 10 retry batches" in text


def test_submit_prints_the_policy_and_refuses_another_policy_for_the_same_file(
    cli, fake_gemini, tmp_path
) -> None:
    source = write_input(tmp_path / "in.jsonl", ["a", "b"])
    first = ok(cli("submit", str(source), "--model", MODEL, "--retry-attempts", "2"))
    assert "maxAttempts 2" in first.out and "at most 2 retry batches" in first.out
    again = cli("submit", str(source), "--model", MODEL, "--retry-attempts", "3")
    assert again.code == 2 and "nothing changed" in again.err
    root = first.out.split()[0]
    assert ok(cli("get", root, "--json")).json()["retry"]["policy"]["maxAttempts"] == 2
    same = ok(cli("submit", str(source), "--model", MODEL, "--retry-attempts", "2"))
    assert "already submitted" in same.out
    assert len(fake_gemini.batches_created()) == 1


def test_retry_help_has_a_description() -> None:
    shown = subprocess.run(
        [sys.executable, "-m", "opstate.cli", "retry", "--help"],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    assert "One retry pass over every active lineage" in shown and "--stop ROOT" in shown


def test_a_stopped_lineage_creates_nothing_more_and_gets_its_final(
    cli, fake_gemini, tmp_path
) -> None:
    keys = ["a", "b", "c"]
    root = submit(cli, tmp_path, keys, "--retry-attempts", "2")
    ok(cli("retry", "--stop", root))
    fake_gemini.run_batch(root, [failed("a", 503, "UNAVAILABLE"), answered("b"), answered("c")])
    counts = until_final(cli)
    assert counts["submitted"] == 0 and fake_gemini.batches_created() == [root]
    view = ok(cli("get", root, "--json")).json()["retry"]
    assert view["status"] == "final"
    again = cli("retry", "--stop", root)
    assert again.code == 1 and "nothing to stop" in again.err


# --- 9. views ----------------------------------------------------------------------------------


def test_views_show_attempts_phases_lineage_columns_and_expired(cli, fake_gemini, tmp_path) -> None:
    keys = ["a", "b"]
    root = submit(cli, tmp_path, keys, "--retry-attempts", "2")
    fake_gemini.run_batch(root, [failed("a", 503, "UNAVAILABLE"), answered("b")])
    ok(cli("retry", "--once"))
    child = fake_gemini.batches_created()[1]
    pending = ok(cli("results", root, "--json")).json()["final"]
    assert pending["status"] == "pending" and pending["attempts"] == 2
    fake_gemini.set_batch_state(child, "EXPIRED")
    ok(cli("retry", "--once"))
    children = ok(cli("get", root, "--json")).json()["retry"]["children"]
    assert children[0]["phase"] == "ended" and children[0]["state"] == "EXPIRED"
    table = ok(cli("list")).out.splitlines()
    assert table[0].split() == [
        "NAME", "KIND", "STATE", "VERSION", "UPDATED", "ATTEMPT", "PARENT",
    ]  # fmt: skip
    row = next(line.split() for line in table if line.startswith(child))
    assert row[2] == "EXPIRED" and row[-2:] == ["1", root]
    assert "FAILED (EXPIRED)" in ok(cli("get", child)).out
    waited = cli("wait", child, "--timeout", "5")
    assert waited.code == 1 and "FAILED (EXPIRED)" in waited.out
    text = ok(cli("results", root)).out
    # neither Python reprs nor raw JSON: the final result as an indented block (issue 49)
    lines = text.splitlines()
    assert "{'" not in text and '{"' not in text
    assert lines[lines.index("final") + 1].split() == ["status", "final"]


# --- 10. a retry batch that fails as a whole; a failed create deletes its upload


def test_a_child_that_fails_whole_is_retried_and_its_rows_say_why(
    cli, fake_gemini, tmp_path
) -> None:
    keys = ["a", "b", "c"]
    root = submit(cli, tmp_path, keys, "--retry-attempts", "2")
    fake_gemini.run_batch(root, [failed("a", 503, "UNAVAILABLE"), answered("b"), answered("c")])
    ok(cli("retry", "--once"))
    child = fake_gemini.batches_created()[1]
    fake_gemini.set_batch_state(child, "FAILED")
    ok(cli("retry", "--once"))
    created = fake_gemini.batches_created()
    assert len(created) == 3  # attempt 2: the failed child's keys again
    grandchild = created[2]
    assert input_keys(fake_gemini.batch_input(grandchild)) == ["a"]
    fake_gemini.set_batch_state(grandchild, "FAILED")
    until_final(cli)
    final = ok(cli("results", root, "--json")).json()["final"]
    lines = Path(final["location"].removeprefix("file://")).read_bytes().splitlines()
    row = next(json.loads(line) for line in lines if json.loads(line)["key"] == "a")
    assert row["attempt"] == 2 and row["error"]["code"] == "FAILED"
    assert grandchild in row["error"]["message"]
    assert final["errors"] == {"FAILED": 1}


def test_a_refused_create_deletes_its_upload(cli, fake_gemini, tmp_path) -> None:
    fake_gemini.fail_create(400, "model not found")
    source = write_input(tmp_path / "in.jsonl", ["a"])
    result = cli("submit", str(source), "--model", MODEL)
    assert result.code == 1 and "model not found" in result.err
    assert fake_gemini.files_held() == [] and len(fake_gemini.files_deleted()) == 1


# --- 13. what discovery takes in, said and chosen ------------------------------------------------


@pytest.mark.parametrize(("choice", "found"), [("all", 1), ("tracked", 0)])
def test_discovery_is_said_and_a_setting(cli, fake_gemini, choice, found) -> None:
    fake_gemini.put_batch("batches/someone-elses", "BATCH_STATE_RUNNING")
    env = {"OPSTATE_RECONCILE_MAX_PAGES": "5", "OPSTATE_DISCOVER": choice}
    result = ok(cli("reconcile", "--once", env=env))
    assert result.json()["discovered"] == found
    # said on stderr when it took batches in (what they are and the setting), else quiet
    assert ("discovery: all - every batch" in result.err) == bool(found), result.err
    assert (cli("get", "batches/someone-elses").code == 0) == bool(found)


def test_a_bad_discover_setting_is_refused(cli) -> None:
    result = cli("reconcile", "--once", env={"OPSTATE_DISCOVER": "some"})
    assert result.code == 2 and "OPSTATE_DISCOVER must be all or tracked" in result.err


# --- 11. refusing, or nothing to do, without google-genai

PROBE = (
    "import sys\n"
    "from opstate.cli import main\n"
    "code = main(sys.argv[1:])\n"
    "print('LOADED' if 'google.genai' in sys.modules else 'NOT-LOADED', code)\n"
)


def probe(tmp_path: Path, *argv: str) -> tuple[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPSTATE_", "GEMINI_"))}
    env["OPSTATE_STORE"] = "sqlite:///ops.db"
    done = subprocess.run(
        [sys.executable, "-c", PROBE, *argv], cwd=tmp_path, env=env,
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    return done.stdout.strip(), done.stderr


def test_a_bad_file_is_refused_without_key_or_google_genai(tmp_path) -> None:
    (tmp_path / "bad.jsonl").write_text('{"key": "a"}\n')
    printed, said = probe(tmp_path, "submit", "bad.jsonl", "--model", MODEL)
    assert printed == "NOT-LOADED 2", said
    assert "line 1" in said and 'no "request"' in said
    assert not (tmp_path / "ops.db").exists() and not (tmp_path / ".opstate").exists()


@pytest.mark.parametrize("argv", [["archive", "--once"], ["retry", "--once"]])
def test_nothing_to_do_loads_no_google_genai(tmp_path, argv) -> None:
    printed, said = probe(tmp_path, *argv)
    assert printed.endswith("NOT-LOADED 0"), said


def test_serve_pass_reads_the_open_batches_of_a_lineage(cli, fake_gemini, tmp_path) -> None:
    """``opstate serve``'s archive-and-retry pass (``local_archiver``) reads a lineage's open
    batches first: the root, still PENDING in the store (its poll not due), is read, archived
    and its failed row retried in one pass."""
    from opstate.config import Settings
    from opstate.local.reconcile_loop import local_archiver

    keys = ["a", "b"]
    root = submit(cli, tmp_path, keys, "--retry-attempts", "1")
    fake_gemini.run_batch(root, [failed("a", 503, "UNAVAILABLE"), answered("b")])
    config = Settings.from_env(os.environ)
    store = SQLiteStore(tmp_path / ".opstate" / "ops.db")
    try:
        archive = local_archiver(store, config, lambda _line: None)
        assert archive is not None
        counts = archive(lambda: 100.0)
    finally:
        store.close()
    assert (counts["retry_read"], counts["archived"], counts["retry_submitted"]) == (1, 1, 1)
