"""Operator flows of ``opstate``, run the way a busy operator runs them.

Replay: every per-line failure is a bad line with its number (permanent) or a stop at that line
(transient) with the summary still printed; a replay is idempotent; input is streamed. Errors:
a table of misconfigurations, each one sentence on stderr naming what to fix, with the
documented exit code. One JSON rule in and out. Everything goes through ``main`` (in process)
or the console module (subprocess), never through the CLI's internals.
"""

from __future__ import annotations

import json
import math
import os
import socket
import sqlite3
import subprocess
import sys
import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import boto3
import pytest

from opstate.config import settings
from opstate.domain.model import OpRecord
from opstate.domain.states import State
from opstate.store.port import StoreUnavailableError
from opstate.store.sqlite import SQLiteStore
from tests.support.cli import Result, in_clean_process
from tests.support.serve_process import OPSTATE, cli_env
from tests.support.template import create_table_from_template

T0 = "2026-05-10T09:00:00Z"
T1 = "2026-05-10T10:00:00Z"
T2 = "2026-05-10T11:00:00Z"
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def cli(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    """``main(argv)`` in tmp_path with a clean environment; returns a ``Result``."""
    yield in_clean_process(monkeypatch, capsys, tmp_path)
    settings.cache_clear()


def assert_one_sentence(result: Result, code: int, *mentions: str) -> None:
    """Exit ``code``; stderr is one ``opstate: error:`` line naming each of ``mentions``."""
    assert result.code == code, (result.code, result.out, result.err)
    assert "Traceback" not in result.err, result.err
    lines = [line for line in result.err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("opstate: error: "), result.err
    for mention in mentions:
        assert mention in lines[0], (mention, lines[0])


def report_line(name: str, state: str | None = None, ts: str | None = None, **extra: Any) -> str:
    body: dict[str, Any] = {"name": name}
    if state is not None:
        body["state"] = state
    if ts is not None:
        body["updateTime"] = ts
    body.update(extra)
    return json.dumps(body)


def webhook_line(name: str, kind: str = "batch.succeeded", ts: str = T1) -> str:
    return json.dumps({"type": kind, "version": "v1", "timestamp": ts, "data": {"id": name}})


def nested(depth: int) -> Any:
    value: Any = "leaf"
    for _ in range(depth):
        value = {"a": value}
    return value


def write_lines(path: Path, lines: list[str]) -> Path:
    path.write_text("\n".join(lines) + "\n")
    return path


def sqlite_url(path: Path) -> str:
    return f"sqlite:///{path}"


# --- 4. every per-line failure: bad with its number, or a stop at that line ---------------------


@pytest.fixture
def dynamo_store(moto_server: Any, monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv("AWS_ENDPOINT_URL_DYNAMODB", moto_server.endpoint)
    client = boto3.client("dynamodb", endpoint_url=moto_server.endpoint)
    name = f"ops-op-{uuid.uuid4().hex[:8]}"
    create_table_from_template(client, name)
    return f"dynamodb://{name}"


def test_lines_the_store_refuses_are_bad_lines_and_the_replay_goes_on(cli, dynamo_store, tmp_path):
    # Over the details limit (64 KiB), under the line cap (a line is capped like an API body,
    # 256 KiB: issue 24 made a 450 KB line a line-too-long, see test_replay_line_cap.py).
    big = {"blob": "x" * 100_000}
    path = write_lines(
        tmp_path / "odd.jsonl",
        [
            report_line("batches/ok1", "RUNNING", T1),  # 1
            report_line("batches/big", "RUNNING", T1, details=big),  # 2 ValidationException
            report_line("batches/deep", "RUNNING", T1, details=nested(900)),  # 3 RecursionError
            "[" * 100_000,  # 4 too deep for the JSON parser
            report_line("batches/ok2", "RUNNING", T1),  # 5
        ],
    )
    result = cli("replay", str(path), "--json", "--store", dynamo_store)
    assert result.code == 1, result.err
    assert "Traceback" not in result.err
    summary = result.json()
    # Details no store can hold are refused before the store is asked (opstate.domain.details).
    assert [(b["line"], b["error"]) for b in summary["badLines"]] == [
        (2, "invalid-details"),
        (3, "invalid-details"),
        (4, "invalid-json"),
    ]
    assert (summary["lines"], summary["applied"], summary["bad"]) == (5, 2, 3)
    assert summary["stoppedAtLine"] is None
    for lineno in (2, 3, 4):
        assert f"{path}:{lineno}: " in result.err
    got = cli("get", "batches/ok2", "--json", "--store", dynamo_store)
    assert got.json()["state"] == "RUNNING"
    assert cli("get", "batches/big", "--store", dynamo_store).code == 1  # nothing written


def test_a_deeply_nested_line_is_bad_on_sqlite_too(cli, tmp_path):
    path = write_lines(
        tmp_path / "deep.jsonl",
        [
            report_line("batches/deep", "RUNNING", T1, details=nested(900)),
            "[" * 100_000,
            report_line("batches/after", "RUNNING", T1),
        ],
    )
    result = cli("replay", str(path), "--json", "--store", sqlite_url(tmp_path / "d.db"))
    assert "Traceback" not in result.err
    summary = result.json()
    assert summary["applied"] >= 1 and summary["stoppedAtLine"] is None
    assert (2, "invalid-json") in [(b["line"], b["error"]) for b in summary["badLines"]]


class FlakyStore:
    """Makes ``SQLiteStore`` writes of chosen names fail once, the way an outage does."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, fail: dict[str, BaseException]) -> None:
        self.fail = dict(fail)
        original = SQLiteStore.put_if_absent

        def put_if_absent(store: SQLiteStore, record: OpRecord) -> Any:
            error = self.fail.pop(record.name, None)
            if error is not None:
                raise error
            return original(store, record)

        monkeypatch.setattr(SQLiteStore, "put_if_absent", put_if_absent)


def five_lines(tmp_path: Path) -> Path:
    return write_lines(
        tmp_path / "five.jsonl", [report_line(f"batches/t{i}", "RUNNING", T1) for i in range(1, 6)]
    )


@pytest.mark.parametrize(
    "error",
    [
        StoreUnavailableError("SQLite store ops.db: database is locked"),
        RuntimeError("something nobody planned for"),
    ],
    ids=["store-unavailable", "unexpected"],
)
def test_a_transient_failure_stops_at_its_line_with_a_summary_and_a_rerun_resumes(
    cli, tmp_path, monkeypatch, error
):
    path = five_lines(tmp_path)
    store = sqlite_url(tmp_path / "t.db")
    FlakyStore(monkeypatch, {"batches/t3": error})

    result = cli("replay", str(path), "--json", "--store", store)
    assert result.code == 1
    summary = result.json()  # never empty
    assert summary["stoppedAtLine"] == 3
    assert (summary["applied"], summary["bad"]) == (2, 0)
    assert_one_sentence(Result(result.code, "", result.err), 1, "line 3", "--from-line 3")

    # Resume where it stopped...
    resumed = cli("replay", str(path), "--json", "--store", store, "--from-line", "3")
    assert resumed.code == 0, resumed.err
    assert (resumed.json()["applied"], resumed.json()["lines"]) == (3, 3)
    # ...or replay the whole file: the lines already ingested change nothing.
    again = cli("replay", str(path), "--json", "--store", store)
    assert (again.code, again.json()["applied"]) == (0, 0)
    names = [r["name"] for r in cli("list", "--json", "--store", store).json()]
    assert names == [f"batches/t{i}" for i in range(1, 6)]


def test_ctrl_c_stops_a_replay_at_its_line_with_the_summary(cli, tmp_path, monkeypatch):
    path = five_lines(tmp_path)
    FlakyStore(monkeypatch, {"batches/t4": KeyboardInterrupt()})
    result = cli("replay", str(path), "--json", "--store", sqlite_url(tmp_path / "c.db"))
    assert result.code == 130
    assert (result.json()["stoppedAtLine"], result.json()["applied"]) == (4, 3)
    assert_one_sentence(Result(130, "", result.err), 130, "interrupted", "--from-line 4")


def test_text_summary_is_printed_when_a_replay_stops(cli, tmp_path, monkeypatch):
    path = five_lines(tmp_path)
    FlakyStore(monkeypatch, {"batches/t2": StoreUnavailableError("DynamoDB put failed")})
    result = cli("replay", str(path), "--store", sqlite_url(tmp_path / "x.db"))
    assert result.code == 1
    assert result.out.startswith("replayed 1 lines from")
    assert "stopped at line 2" in result.out


# --- 5. replays are idempotent -------------------------------------------------------------------


def test_replaying_lines_without_update_time_again_changes_nothing(cli, tmp_path):
    store = sqlite_url(tmp_path / "i.db")
    path = write_lines(
        tmp_path / "timeless.jsonl",
        [
            report_line("batches/i1", "RUNNING"),
            report_line("batches/i2"),  # "track": PENDING
            report_line("batches/i3", "SUCCEEDED", details={"k": 1}),
        ],
    )
    first = cli("replay", str(path), "--json", "--store", store)
    assert (first.code, first.json()["applied"]) == (0, 3)
    # A real observation arrives in between: same rank as the replayed RUNNING.
    real = cli("report", "batches/i1", "REQUIRES_ACTION", "--time", T0, "--store", store, "--json")
    assert real.json()["applied"] is True
    before = cli("list", "--json", "--store", store).json()

    second = cli("replay", str(path), "--json", "--store", store)
    assert second.code == 0
    assert second.json()["applied"] == 0
    assert cli("list", "--json", "--store", store).json() == before
    assert before[0]["state"] == "REQUIRES_ACTION"


def test_replaying_any_file_twice_applies_nothing_the_second_time(cli, tmp_path):
    store = sqlite_url(tmp_path / "twice.db")
    path = write_lines(
        tmp_path / "mixed.jsonl",
        [
            report_line("batches/m1", "PENDING", T0),
            report_line("batches/m1", "RUNNING", T1),
            webhook_line("batches/m1", ts=T2),
            report_line("batches/m2"),
            report_line("batches/m2", "RUNNING"),
            webhook_line("batches/m3", kind="batch.failed"),
            report_line("batches/m4", "RUNNING", T1, details={"a": 1}),
            report_line("batches/m4", "RUNNING", T2, details={"b": 2}),
        ],
    )
    assert cli("replay", str(path), "--store", store).code == 0
    before = cli("list", "--json", "--store", store).json()
    second = cli("replay", str(path), "--json", "--store", store)
    assert (second.code, second.json()["applied"]) == (0, 0)
    assert cli("list", "--json", "--store", store).json() == before


# --- 6. one JSON rule in, strict JSON out ---------------------------------------------------------


@pytest.mark.parametrize(
    "text", ['{"x": NaN}', '{"x": Infinity}', '{"x": -Infinity}', '{"x": 1e999}']
)
def test_report_details_follow_the_api_json_rule(cli, tmp_path, text):
    result = cli("report", "batches/n", "RUNNING", "--details", text, "--store", "memory://")
    assert_one_sentence(result, 2, "--details")


def test_replay_refuses_nan_lines_like_the_api(cli, tmp_path):
    path = write_lines(
        tmp_path / "nan.jsonl",
        [
            '{"name": "batches/n1", "state": "RUNNING", "details": {"p": NaN}}',
            '{"name": "batches/n2", "state": "RUNNING", "details": {"p": Infinity}}',
            report_line("batches/n3", "RUNNING", T1),
        ],
    )
    summary = cli("replay", str(path), "--json", "--store", sqlite_url(tmp_path / "n.db")).json()
    assert [(b["line"], b["error"]) for b in summary["badLines"]] == [
        (1, "invalid-json"),
        (2, "invalid-json"),
    ]


def strict_parse(text: str) -> Any:
    def refuse(constant: str) -> Any:
        raise AssertionError(f"{constant} in the output")

    return json.loads(text, parse_constant=refuse)


def test_get_and_list_print_strict_json_for_an_old_row_holding_nan(cli, tmp_path):
    # What the previous release's replay stored from a line with NaN.
    db = tmp_path / "old.db"
    old = SQLiteStore(db)
    try:
        # Today's store refuses such a record (opstate.domain.details): write the row as it was.
        assert old.put_if_absent(OpRecord("batches/old", State.RUNNING, 1, 1, "report")).ok
        with sqlite3.connect(db) as conn:
            conn.execute(
                "UPDATE operations SET details = ? WHERE name = ?",
                (json.dumps({"p": math.nan}), "batches/old"),
            )
    finally:
        old.close()
    got = cli("get", "batches/old", "--json", "--store", sqlite_url(db))
    assert got.code == 0 and strict_parse(got.out)["details"] == {"p": None}
    listed = cli("list", "--json", "--store", sqlite_url(db))
    assert strict_parse(listed.out)[0]["details"] == {"p": None}


# --- 7. replay streams its input -----------------------------------------------------------------


def stored_names(db: Path) -> set[str]:
    if not db.exists():
        return set()
    store = SQLiteStore(db)
    try:
        return {r.name for r in store.iter_all()}
    except Exception:  # the replay may still be creating the schema
        return set()
    finally:
        store.close()


def wait_until(condition: Callable[[], bool], process: subprocess.Popen[Any]) -> bool:
    """Poll ``condition`` while ``process`` runs; a hang guard, not a timed assertion."""
    for _ in range(600):
        if condition():
            return True
        if process.poll() is not None:
            return condition()
        threading.Event().wait(0.05)
    return False


def start_replay(source: str, db: Path, cwd: Path, stdin: Any) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [*OPSTATE, "replay", source, "--json", "--store", sqlite_url(db)],
        cwd=cwd,
        env=cli_env(),
        stdin=stdin,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_replay_from_stdin_ingests_lines_before_the_input_ends(tmp_path):
    db = tmp_path / "stream.db"
    process = start_replay("-", db, tmp_path, subprocess.PIPE)
    assert process.stdin is not None
    try:
        first = [report_line(f"batches/s{i}", "RUNNING", T1) for i in range(3)]
        process.stdin.write("\n".join(first) + "\n")
        process.stdin.flush()
        # The pipe stays open: a replay that reads everything first writes nothing yet.
        expected = {f"batches/s{i}" for i in range(3)}
        assert wait_until(lambda: expected <= stored_names(db), process)
        last = report_line("batches/s3", "RUNNING", T1) + "\n"
        out, err = process.communicate(input=last, timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()
    assert process.returncode == 0, err
    summary = json.loads(out)
    assert (summary["file"], summary["lines"], summary["applied"]) == ("<stdin>", 4, 4)


def test_replay_of_a_fifo_file_ingests_lines_before_the_writer_is_done(tmp_path):
    fifo = tmp_path / "events.pipe"
    os.mkfifo(fifo)
    db = tmp_path / "fifo.db"
    process = start_replay(str(fifo), db, tmp_path, subprocess.DEVNULL)
    try:
        with fifo.open("w") as writer:
            writer.write(report_line("batches/f0", "RUNNING", T1) + "\n")
            writer.flush()
            assert wait_until(lambda: "batches/f0" in stored_names(db), process)
            writer.write(report_line("batches/f1", "RUNNING", T1) + "\n")
        out, err = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()
    assert process.returncode == 0, err
    assert json.loads(out)["applied"] == 2


def test_progress_bar_counts_the_lines_of_a_file(cli, tmp_path, monkeypatch):
    import io

    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    lines = [report_line(f"batches/p{i}", "RUNNING", T1) for i in range(4)]
    path = write_lines(tmp_path / "p.jsonl", [lines[0], "", lines[1], "   ", lines[2], lines[3]])
    terminal = Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    result = cli("replay", str(path), "--store", sqlite_url(tmp_path / "p.db"))
    assert result.code == 0
    drawn = terminal.getvalue()
    assert "4/4 lines" in drawn and "/6 lines" not in drawn and "5/4" not in drawn


# --- 8. misconfigurations: one sentence naming the fix, the documented exit code -----------------


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass(frozen=True)
class Misconfiguration:
    id: str
    argv: tuple[str, ...]
    code: int
    mentions: tuple[str, ...]
    env: tuple[tuple[str, str | None], ...] = ()  # None: unset in the child
    setup: Callable[[Path], None] | None = None


def _corrupt_db(tmp_path: Path) -> None:
    (tmp_path / "corrupt.db").write_bytes(b"this is not a database, just text " * 200)


def _file_in_the_way(tmp_path: Path) -> None:
    (tmp_path / "plain-file").write_text("x")


# A machine with no AWS credentials anywhere (and no instance metadata to ask).
NO_AWS_CREDENTIALS: tuple[tuple[str, str | None], ...] = (
    ("AWS_ACCESS_KEY_ID", None),
    ("AWS_SECRET_ACCESS_KEY", None),
    ("AWS_SESSION_TOKEN", None),
    ("AWS_SECURITY_TOKEN", None),
    ("AWS_PROFILE", None),
    ("AWS_DEFAULT_PROFILE", None),
    ("AWS_ENDPOINT_URL", None),
    ("AWS_ENDPOINT_URL_DYNAMODB", None),
    ("AWS_SHARED_CREDENTIALS_FILE", "/nonexistent/credentials"),
    ("AWS_CONFIG_FILE", "/nonexistent/config"),
    ("AWS_EC2_METADATA_DISABLED", "true"),
    ("AWS_CONTAINER_CREDENTIALS_FULL_URI", None),
    ("AWS_CONTAINER_CREDENTIALS_RELATIVE_URI", None),
    ("AWS_WEB_IDENTITY_TOKEN_FILE", None),
    ("AWS_DEFAULT_REGION", "us-east-1"),
)

MISCONFIGURATIONS = [
    Misconfiguration(
        "sqlite-under-a-file",
        ("get", "batches/a", "--store", "sqlite:////etc/passwd/ops.db"),
        1,
        ("/etc/passwd",),
    ),
    Misconfiguration(
        "sqlite-under-a-relative-file",
        ("list", "--store", "sqlite:///plain-file/ops.db"),
        1,
        ("plain-file",),
        setup=_file_in_the_way,
    ),
    Misconfiguration(
        "sqlite-corrupt-file",
        ("get", "batches/a", "--store", "sqlite:///corrupt.db"),
        1,
        ("corrupt.db", "not an SQLite database"),
        setup=_corrupt_db,
    ),
    Misconfiguration(
        "sqlite-corrupt-file-replay",
        ("replay", "-", "--store", "sqlite:///corrupt.db"),
        1,
        ("corrupt.db",),
        setup=_corrupt_db,
    ),
    Misconfiguration(
        "serve-sqlite-under-a-file",
        ("serve", "--port", "0", "--store", "sqlite:////etc/passwd/ops.db"),
        1,
        ("/etc/passwd",),
        env=(("OPSTATE_WEBHOOK_SECRETS", "whsec_" + "A" * 32),),
    ),
    Misconfiguration(
        "serve-sqlite-corrupt-file",
        ("serve", "--port", "0", "--store", "sqlite:///corrupt.db"),
        1,
        ("corrupt.db", "not an SQLite database"),
        env=(("OPSTATE_WEBHOOK_SECRETS", "whsec_" + "A" * 32),),
        setup=_corrupt_db,
    ),
    Misconfiguration(
        "reconcile-sqlite-corrupt-file",
        ("reconcile", "--once", "--store", "sqlite:///corrupt.db"),
        1,
        ("corrupt.db", "not an SQLite database"),
        env=(("GEMINI_API_KEY", "k"), ("GOOGLE_GEMINI_BASE_URL", "http://127.0.0.1:9")),
        setup=_corrupt_db,
    ),
    Misconfiguration(
        "sqlite-directory",
        ("list", "--store", "sqlite:///."),
        1,
        ("is a directory",),
    ),
    Misconfiguration("store-url-scheme", ("list", "--store", "ftp://x/ops"), 2, ("store URL",)),
    Misconfiguration(
        "store-env-bad",
        ("list",),
        2,
        ("OPSTATE_STORE",),
        env=(("OPSTATE_STORE", "postgres://db/ops"),),
    ),
    Misconfiguration(
        "dynamodb-unreachable",
        ("get", "batches/a", "--store", "dynamodb://ops"),
        1,
        ("dynamodb://ops", "unavailable"),
        env=(("AWS_ENDPOINT_URL_DYNAMODB", f"http://127.0.0.1:{closed_port()}"),),
    ),
    Misconfiguration(
        "dynamodb-no-region",
        ("list", "--store", "dynamodb://ops"),
        2,
        ("AWS_REGION",),
        env=(("AWS_REGION", ""), ("AWS_DEFAULT_REGION", "")),
    ),
    Misconfiguration(
        "table-name-without-credentials",
        ("list",),
        1,
        ("dynamodb://ops", "chosen by OPSTATE_TABLE_NAME", "no AWS credentials"),
        env=(*NO_AWS_CREDENTIALS, ("OPSTATE_TABLE_NAME", "ops")),
    ),
    Misconfiguration(
        "serve-store-without-credentials",
        ("serve", "--port", "0"),
        1,
        ("dynamodb://ops", "chosen by OPSTATE_STORE", "no AWS credentials"),
        env=(
            *NO_AWS_CREDENTIALS,
            ("OPSTATE_STORE", "dynamodb://ops"),
            ("OPSTATE_WEBHOOK_SECRETS", "whsec_" + "A" * 32),
        ),
    ),
    Misconfiguration(
        "float-nan",
        ("list", "--store", "memory://"),
        2,
        ("OPSTATE_RECONCILE_SAFETY_MARGIN_SECONDS",),
        env=(("OPSTATE_RECONCILE_SAFETY_MARGIN_SECONDS", "nan"),),
    ),
    Misconfiguration(
        "float-inf-reconcile",
        ("reconcile", "--once", "--store", "memory://"),
        2,
        ("OPSTATE_RECONCILE_HTTP_TIMEOUT_SECONDS",),
        env=(
            ("OPSTATE_RECONCILE_HTTP_TIMEOUT_SECONDS", "inf"),
            ("GEMINI_API_KEY", "k"),
            ("GOOGLE_GEMINI_BASE_URL", f"http://127.0.0.1:{closed_port()}"),
        ),
    ),
    Misconfiguration(
        "int-not-a-number",
        ("track", "batches/a", "--store", "memory://"),
        2,
        ("OPSTATE_INGEST_MAX_ATTEMPTS",),
        env=(("OPSTATE_INGEST_MAX_ATTEMPTS", "many"),),
    ),
    Misconfiguration(
        "retention-zero",
        ("list", "--store", "memory://"),
        2,
        ("OPSTATE_RETENTION_DAYS",),
        env=(("OPSTATE_RETENTION_DAYS", "0"),),
    ),
    Misconfiguration(
        "replay-directory", ("replay", ".", "--store", "memory://"), 1, ("cannot read",)
    ),
    Misconfiguration(
        "replay-missing-file",
        ("replay", "absent.jsonl", "--store", "memory://"),
        1,
        ("absent.jsonl",),
    ),
    Misconfiguration(
        "no-gemini-key", ("reconcile", "--once", "--store", "memory://"), 1, ("GEMINI_API_KEY",)
    ),
]


@pytest.mark.parametrize("case", MISCONFIGURATIONS, ids=lambda case: case.id)
def test_misconfiguration_is_one_sentence_with_the_documented_code(
    case: Misconfiguration, tmp_path: Path
) -> None:
    if case.setup is not None:
        case.setup(tmp_path)
    completed = subprocess.run(
        [*OPSTATE, *case.argv],
        cwd=tmp_path,
        env=cli_env(dict(case.env)),
        input="",
        capture_output=True,
        text=True,
        timeout=120,
    )
    result = Result(completed.returncode, completed.stdout, completed.stderr)
    assert_one_sentence(result, case.code, *case.mentions)
    assert result.out == ""
    assert not (tmp_path / ".opstate").exists()  # nothing created on the way


# --- docs/cli.md is what the commands do ---------------------------------------------------------


def documented_exit_codes() -> dict[int, str]:
    text = (ROOT / "docs" / "cli.md").read_text(encoding="utf-8")
    section = text.split("## Exit codes", 1)[1].split("\n## ", 1)[0]
    codes: dict[int, str] = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 2 and cells[0].isdigit():
            codes[int(cells[0])] = cells[1]
    return codes


def test_every_exit_code_in_the_table_is_documented() -> None:
    codes = documented_exit_codes()
    assert set(codes) == {0, 1, 2, 124, 130}  # 124: opstate wait timed out (issue 26)
    assert "wait" in codes[124]
    assert {case.code for case in MISCONFIGURATIONS} <= set(codes)
    assert "store unavailable or unusable" in codes[1]
    assert "bad configuration variable" in codes[2]


def documented_shapes() -> dict[str, Any]:
    """The ``--json`` examples of docs/cli.md, by the ``<!-- shape: NAME -->`` marker above."""
    text = (ROOT / "docs" / "cli.md").read_text(encoding="utf-8")
    shapes: dict[str, Any] = {}
    for chunk in text.split("<!-- shape: ")[1:]:
        name, rest = chunk.split(" -->", 1)
        block = rest.split("```json", 1)[1].split("```", 1)[0]
        shapes[name.strip()] = json.loads(block)
    return shapes


def keys(value: Any) -> Any:
    """The shape of a JSON value: objects by their keys (recursively), arrays by the first."""
    if isinstance(value, dict):
        return {k: keys(v) for k, v in value.items() if k not in ("details", "reasons")}
    if isinstance(value, list):
        return [keys(value[0])] if value else []
    return type(value).__name__ if value is not None else None


def same_shape(documented: Any, actual: Any) -> bool:
    if isinstance(documented, dict):
        return (
            isinstance(actual, dict)
            and set(documented) == set(actual)
            and all(same_shape(documented[k], actual[k]) for k in documented)
        )
    if isinstance(documented, list):
        return isinstance(actual, list) and (
            not documented or not actual or same_shape(documented[0], actual[0])
        )
    return (
        documented is None
        or actual is None
        or documented == actual
        or ({documented, actual} <= {"int", "float"})
    )


def test_documented_json_shapes_are_what_the_commands_print(cli, tmp_path, monkeypatch) -> None:
    shapes = documented_shapes()
    assert {"get", "list", "report", "replay"} <= set(shapes)
    store = sqlite_url(tmp_path / "docs.db")
    report = cli("report", "batches/a", "RUNNING", "--time", T1, "--store", store, "--json")
    assert same_shape(keys(shapes["report"]), keys(report.json())), report.out
    track = cli("track", "batches/b", "--store", store, "--json")
    assert same_shape(keys(shapes["report"]), keys(track.json()))
    got = cli("get", "batches/a", "--store", store, "--json")
    assert same_shape(keys(shapes["get"]), keys(got.json())), got.out
    listed = cli("list", "--store", store, "--json")
    assert same_shape(keys(shapes["list"]), keys(listed.json())), listed.out

    path = write_lines(tmp_path / "r.jsonl", [report_line("batches/c", "RUNNING", T1), "{oops"])
    replay = cli("replay", str(path), "--store", store, "--json")
    assert same_shape(keys(shapes["replay"]), keys(replay.json())), replay.out
    FlakyStore(monkeypatch, {"batches/d": StoreUnavailableError("down")})
    path = write_lines(tmp_path / "s.jsonl", [report_line("batches/d", "RUNNING", T1)])
    stopped = cli("replay", str(path), "--store", store, "--json")
    assert stopped.code == 1 and same_shape(keys(shapes["replay"]), keys(stopped.json()))


def test_documented_reconcile_and_webhook_shapes(cli, tmp_path, fake_gemini) -> None:
    from tests.support.fake_gemini_webhooks import FakeGeminiWebhooks

    shapes = documented_shapes()
    fake_gemini.put_batch("batches/found", "BATCH_STATE_SUCCEEDED", update_time=T1)
    env = {"GEMINI_API_KEY": "k", "GOOGLE_GEMINI_BASE_URL": fake_gemini.base_url}
    run = cli("reconcile", "--once", "--store", sqlite_url(tmp_path / "r.db"), env=env)
    assert run.code == 0, run.err
    assert same_shape(keys(shapes["reconcile"]), keys(run.json())), run.out

    hooks = FakeGeminiWebhooks().start()
    try:
        env = {"GEMINI_API_KEY": "k", "GOOGLE_GEMINI_BASE_URL": hooks.url}
        url = "https://hooks.example.test/gemini/webhook"
        registered = cli("webhooks", "register", "--url", url, "--json", env=env)
        assert registered.code == 0, registered.err
        assert same_shape(keys(shapes["webhooks-register"]), keys(registered.json()))
        status = cli("webhooks", "status", "--json", env=env)
        documented = {k: v for k, v in shapes["webhooks-register"].items() if k != "secretStoredIn"}
        assert same_shape([keys(documented)], keys(status.json())), status.out
    finally:
        hooks.stop()


def test_documented_bad_line_errors_are_the_ones_replay_produces(cli, tmp_path) -> None:
    text = " ".join((ROOT / "docs" / "cli.md").read_text(encoding="utf-8").split())
    listed = text.split("`badLines[].error` is one of", 1)[1].split(";", 1)[0]
    documented = set(listed.replace("`", "").replace(",", " ").replace(" or ", " ").split())
    lines = [
        "{oops",  # invalid-json
        "[1]",  # invalid-body
        json.dumps({"foo": 1}),  # missing-field
        webhook_line("bad name!"),  # invalid-name
        report_line("batches/t", "RUNNING", "yesterday"),  # invalid-time
        json.dumps({"name": "batches/s", "state": 7}),  # invalid-state
        json.dumps({"name": "batches/d", "details": [1]}),  # invalid-details
    ]
    path = write_lines(tmp_path / "bad.jsonl", lines)
    summary = cli("replay", str(path), "--json", "--store", "memory://").json()
    produced = {b["error"] for b in summary["badLines"]}
    # store-rejected and line-too-long (a line over OPSTATE_MAX_BODY_BYTES) have their own tests.
    assert produced | {"store-rejected", "line-too-long"} == documented
