"""The ``opstate`` operator commands: in-process through ``main`` (fast) and as subprocesses.

Stores: the embedded SQLite file and DynamoDB in moto server. Gemini: the real google-genai
client against fake servers on 127.0.0.1. Secrets Manager: moto server.
"""

from __future__ import annotations

import io
import json
import stat
import subprocess
import sys
import uuid

import boto3
import pytest

from opstate.cli.common import EXIT_FAILURE, EXIT_OK, EXIT_USAGE
from opstate.cli.progress import LineBar
from opstate.config import settings
from opstate.domain.views import record_to_json
from opstate.signatures import StaticSecretsVerifier
from opstate.store.sqlite import SQLiteStore
from opstate.webhook_secrets import merge_new, parse_stored, secret_matches
from tests.support.cli import Result, in_clean_process
from tests.support.fake_gemini_webhooks import FakeGeminiWebhooks
from tests.support.fake_gemini_webhooks import new_secret as fake_new_secret
from tests.support.serve_process import cli_env, run_cli
from tests.support.template import create_table_from_template

RECORD_KEYS = {
    "name",
    "kind",
    "backend",
    "state",
    "updateTime",
    "version",
    "source",
    "details",
    "createdAt",
    "appliedAt",
}
T1 = "2026-05-10T10:00:00Z"
T0 = "2026-05-10T09:00:00Z"


@pytest.fixture
def cli(monkeypatch, tmp_path, capsys):
    """Run ``main(argv)`` in tmp_path with a clean environment; returns a ``Result``."""
    yield in_clean_process(monkeypatch, capsys, tmp_path)
    settings.cache_clear()


def assert_one_sentence(result: Result, code: int) -> None:
    assert result.code == code, (result.out, result.err)
    lines = [line for line in result.err.splitlines() if line.strip()]
    assert lines and lines[-1].startswith("opstate: error:")
    assert "Traceback" not in result.err


# --- get / list / track / report on the embedded store -------------------------------------------


def test_track_report_get_and_list(cli, tmp_path):
    result = cli("track", "batches/a")
    assert result.code == EXIT_OK
    assert result.out.strip() == "batches/a: created, now PENDING (version 1)"

    result = cli("report", "v1beta/batches/a", "running", "--time", T1, "--json")
    assert result.code == EXIT_OK
    assert result.json() == {
        "applied": True,
        "reason": "advanced",
        "name": "batches/a",
        "state": "RUNNING",
        "version": 2,
    }
    # A slower, older observation is dropped: the record never moves backwards.
    result = cli("report", "batches/a", "RUNNING", "--time", T0, "--json")
    assert result.json()["reason"] == "stale-or-equal-update-time"
    assert result.json()["version"] == 2
    result = cli("report", "batches/b", "SUCCEEDED", "--time", T1, "--details", '{"k": 1}')
    assert result.out.strip() == "batches/b: created, now SUCCEEDED (version 1)"
    result = cli("report", "batches/b", "RUNNING")
    assert result.out.strip() == (
        "batches/b: dropped (regress-from-terminal), stays SUCCEEDED (version 1)"
    )

    result = cli("get", "batches/a", "--json")
    assert result.code == EXIT_OK
    record = result.json()
    assert set(record) == RECORD_KEYS
    assert (record["state"], record["version"], record["updateTime"]) == (
        "RUNNING",
        2,
        "2026-05-10T10:00:00.000000000Z",
    )
    store = SQLiteStore(tmp_path / ".opstate" / "ops.db")
    try:
        stored = store.get("batches/a")
        assert stored is not None
        assert record == record_to_json(stored)
    finally:
        store.close()

    text = cli("get", "batches/b").out
    # nested details as an indented block, not JSON (issue 49)
    assert "state       SUCCEEDED" in text and "details" in text.splitlines()
    assert "  k  1" in text.splitlines() and '{"k": 1}' not in text

    listed = cli("list", "--json").json()
    assert [r["name"] for r in listed] == ["batches/a", "batches/b"]
    assert listed[0] == record
    assert [r["name"] for r in cli("list", "--open", "--json").json()] == ["batches/a"]
    assert cli("list", "--kind", "video", "--json").json() == []
    table = cli("list").out.splitlines()
    assert table[0].split() == ["NAME", "KIND", "STATE", "VERSION", "UPDATED"]
    assert table[1].split()[:4] == ["batches/a", "batch", "RUNNING", "2"]


def test_missing_record_is_exit_1(cli):
    assert_one_sentence(cli("get", "batches/nope"), EXIT_FAILURE)


@pytest.mark.parametrize(
    "argv",
    [
        [],
        ["get"],
        ["frobnicate"],
        ["get", "just-an-id"],
        ["track", "batches/../x"],
        ["report", "batches/a", "DONE"],
        ["report", "batches/a", "RUNNING", "--time", "yesterday"],
        ["report", "batches/a", "RUNNING", "--details", "[1]"],
        ["list", "--kind", "nope"],
        ["get", "batches/a", "--store", "ftp://somewhere"],
        ["reconcile"],
        ["serve", "--port", "70000"],
        ["serve", "--reconcile-every", "0"],
        ["webhooks"],
        ["webhooks", "register"],
        ["webhooks", "register", "--url", "https://x.test/h", "--events", "batch.exploded"],
    ],
)
def test_usage_errors_exit_2(cli, argv):
    result = cli(*argv)
    assert result.code == EXIT_USAGE, (argv, result.out, result.err)
    assert result.err.strip() and "Traceback" not in result.err
    assert result.out == ""


def test_console_script_exit_codes_and_lean_imports(tmp_path):
    assert run_cli(["--help"], cwd=tmp_path).returncode == 0
    usage = run_cli(["get"], cwd=tmp_path)
    assert usage.returncode == 2 and "NAME" in usage.stderr
    # Operator commands that do not talk to Gemini never import google.genai.
    probe = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys; from opstate.cli import main; "
            "code = main(['list', '--store', 'memory://', '--json']); "
            "print(code, 'google.genai' in sys.modules)",
        ],
        cwd=tmp_path,
        env=cli_env(),
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert probe.stdout.split()[-2:] == ["0", "False"], probe.stderr


# --- replay -------------------------------------------------------------------------------------


def webhook_line(name: str, kind: str = "batch.succeeded", ts: str = T1) -> str:
    return json.dumps({"type": kind, "version": "v1", "timestamp": ts, "data": {"id": name}})


def report_line(name: str, state: str, ts: str) -> str:
    return json.dumps({"name": name, "state": state, "updateTime": ts})


REPLAY_LINES = [
    webhook_line("batches/r1"),  # 1 created
    report_line("batches/r2", "RUNNING", T1),  # 2 created
    "",  # 3 blank: skipped silently
    "{not json",  # 4 bad
    report_line("batches/r2", "RUNNING", T0),  # 5 stale
    "[1, 2]",  # 6 bad: not an object
    webhook_line("bad name!"),  # 7 bad: invalid name
    webhook_line("batches/r3", kind="batch.exploded"),  # 8 dropped: unsupported type
    report_line("batches/r1", "RUNNING", T1),  # 9 regress-from-terminal
    json.dumps({"foo": 1}),  # 10 bad: neither shape
    webhook_line("batches/r1"),  # 11 a redelivery: stale
]


def test_replay_reports_bad_lines_and_summarises_by_reason(cli, tmp_path):
    path = tmp_path / "events.jsonl"
    path.write_text("\n".join(REPLAY_LINES) + "\n")
    result = cli("replay", str(path))
    assert result.code == EXIT_FAILURE
    for lineno in (4, 6, 7, 10):
        assert f"{path}:{lineno}: " in result.err
    assert "\r" not in result.err  # no progress bar when stderr is not a terminal
    assert result.out.splitlines()[0] == (
        f"replayed 10 lines from {path}: 2 applied, 4 dropped, 4 bad"
    )
    assert "stale-or-equal-update-time   2" in result.out
    assert "bad lines: 4, 6, 7, 10" in result.out

    # The same file again, as JSON, against a fresh store.
    result = cli("replay", str(path), "--json", "--store", f"sqlite:///{tmp_path / 'b.db'}")
    assert result.code == EXIT_FAILURE
    summary = result.json()
    assert summary["reasons"] == {
        "created": 2,
        "regress-from-terminal": 1,
        "stale-or-equal-update-time": 2,
        "unsupported-event-type": 1,
    }
    assert (summary["lines"], summary["applied"], summary["dropped"], summary["bad"]) == (
        10,
        2,
        4,
        4,
    )
    assert [(b["line"], b["error"]) for b in summary["badLines"]] == [
        (4, "invalid-json"),
        (6, "invalid-body"),
        (7, "invalid-name"),
        (10, "missing-field"),
    ]
    assert summary["stoppedAtLine"] is None
    got = cli("get", "batches/r1", "--json", "--store", f"sqlite:///{tmp_path / 'b.db'}").json()
    assert (got["state"], got["version"]) == ("SUCCEEDED", 1)


def test_replay_of_good_lines_exits_0_and_draws_a_bar_on_a_terminal(cli, tmp_path, monkeypatch):
    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    path = tmp_path / "good.jsonl"
    path.write_text("\n".join(webhook_line(f"batches/g{i}") for i in range(5)) + "\n")
    terminal = Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    result = cli("replay", str(path))
    assert result.code == EXIT_OK
    # drawn by tqdm (issue 49): a bar redrawn in place, the count of lines
    assert "\r" in terminal.getvalue() and "5/5 lines" in terminal.getvalue()
    assert "100%|" in terminal.getvalue()
    assert "5 applied, 0 dropped, 0 bad" in result.out


def test_progress_draws_nothing_when_disabled():
    stream = io.StringIO()
    progress = LineBar(3, False, stream)
    for _ in range(3):
        progress.advance()
    progress.message("x.jsonl:2: bad")
    progress.clear()
    assert stream.getvalue() == "x.jsonl:2: bad\n"


def test_replay_of_a_missing_file_is_exit_1(cli, tmp_path):
    assert_one_sentence(cli("replay", str(tmp_path / "absent.jsonl")), EXIT_FAILURE)


# --- DynamoDB (moto server) -----------------------------------------------------------------------


@pytest.fixture
def dynamo_table(moto_server, monkeypatch):
    monkeypatch.setenv("AWS_ENDPOINT_URL_DYNAMODB", moto_server.endpoint)
    client = boto3.client("dynamodb", endpoint_url=moto_server.endpoint)
    name = f"ops-cli-{uuid.uuid4().hex[:8]}"
    create_table_from_template(client, name)
    return name


def test_cli_against_dynamodb(cli, dynamo_table, tmp_path):
    store = f"dynamodb://{dynamo_table}"
    assert cli("track", "batches/d1", "--store", store).code == EXIT_OK
    result = cli("report", "batches/d1", "RUNNING", "--time", T1, "--store", store, "--json")
    assert (result.code, result.json()["version"]) == (EXIT_OK, 2)
    path = tmp_path / "d.jsonl"
    path.write_text(webhook_line("batches/d1") + "\n" + webhook_line("batches/d2") + "\n")
    assert cli("replay", str(path), "--store", store).code == EXIT_OK

    # OPSTATE_STORE is the default --store.
    record = cli("get", "batches/d1", "--json", env={"OPSTATE_STORE": store}).json()
    assert set(record) == RECORD_KEYS
    assert (record["state"], record["version"], record["source"]) == ("SUCCEEDED", 3, "webhook")
    listed = cli("list", "--json", "--store", store).json()
    assert [r["name"] for r in listed] == ["batches/d1", "batches/d2"]
    assert listed[0] == record
    assert cli("list", "--open", "--json", "--store", store).json() == []


def test_unreachable_store_is_one_sentence(cli, moto_server, monkeypatch):
    monkeypatch.setenv("AWS_ENDPOINT_URL_DYNAMODB", moto_server.endpoint)
    result = cli("get", "batches/x", "--store", "dynamodb://no-such-table-here")
    assert_one_sentence(result, EXIT_FAILURE)
    # a missing table is named as such, not "unavailable, try again later" (issue 49)
    assert "no store at dynamodb://no-such-table-here" in result.err
    assert "does not exist" in result.err and "try again later" not in result.err


# --- reconcile --once (fake Gemini) ---------------------------------------------------


def test_reconcile_once_prints_the_run_as_json(cli, fake_gemini, tmp_path):
    fake_gemini.put_batch("batches/found-1", "BATCH_STATE_SUCCEEDED", update_time=T1)
    env = {"GEMINI_API_KEY": "test-key", "GOOGLE_GEMINI_BASE_URL": fake_gemini.base_url}
    result = cli("reconcile", "--once", env=env)
    assert result.code == EXIT_OK, result.err
    run = result.json()
    assert {"discovered", "polled", "applied", "errors", "remaining_due", "lost", "overdue"} <= set(
        run
    )
    assert run["discovered"] >= 1 and run["applied"] >= 1
    record = cli("get", "batches/found-1", "--json").json()
    assert (record["state"], record["source"]) == ("SUCCEEDED", "poll")


def test_list_lost_and_overdue(cli, tmp_path):
    from opstate.store import PollState
    from opstate.store.sqlite import SQLiteStore

    for name in ("batches/gone", "batches/slow", "batches/fine"):
        assert cli("report", name, "running", "--time", T1).code == EXIT_OK
    store = SQLiteStore(tmp_path / ".opstate" / "ops.db")
    try:
        lost_ns, overdue_ns = 1_780_000_000 * 10**9, 1_780_000_100 * 10**9
        lost = PollState(due_ns=0, misses=3, missing_since_ns=lost_ns - 1, lost_ns=lost_ns)
        assert store.set_poll("batches/gone", 1, lost)
        assert store.set_poll("batches/slow", 1, PollState(due_ns=0, overdue_ns=overdue_ns))
    finally:
        store.close()

    listed = cli("list", "--lost", "--json").json()
    assert [(r["name"], r["state"], r["not_found_count"]) for r in listed] == [
        ("batches/gone", "RUNNING", 3)
    ]
    assert listed[0]["lost_at"].startswith("2026-05-28T")
    overdue = cli("list", "--overdue", "--json").json()
    assert [r["name"] for r in overdue] == ["batches/slow"]
    assert overdue[0]["overdue_at"] and overdue[0]["lost_at"] is None
    table = cli("list", "--lost").out.splitlines()
    assert table[0].split() == ["NAME", "KIND", "STATE", "VERSION", "UPDATED", "LOST", "OVERDUE"]
    assert table[1].startswith("batches/gone")


def test_reconcile_without_a_key_is_exit_1(cli):
    assert_one_sentence(cli("reconcile", "--once"), EXIT_FAILURE)


# --- webhooks (fake Gemini webhooks API + Secrets Manager in moto) --------------------------------


@pytest.fixture
def fake_webhooks():
    fake = FakeGeminiWebhooks().start()
    yield fake
    fake.stop()


@pytest.fixture
def gemini_env(fake_webhooks):
    return {"GEMINI_API_KEY": "test-key", "GOOGLE_GEMINI_BASE_URL": fake_webhooks.url}


@pytest.fixture
def secret_arn(moto_server, monkeypatch):
    monkeypatch.setenv("AWS_ENDPOINT_URL_SECRETS_MANAGER", moto_server.endpoint)
    client = boto3.client("secretsmanager", endpoint_url=moto_server.endpoint)
    # Created without a value, as a template would before the first `webhooks register`.
    arn: str = client.create_secret(Name=f"opstate-webhook-{uuid.uuid4().hex[:8]}")["ARN"]
    return arn


def stored_secrets(arn: str) -> list[str]:
    client = boto3.client("secretsmanager")
    value: list[str] = json.loads(client.get_secret_value(SecretId=arn)["SecretString"])
    return value


def test_register_status_rotate_with_secrets_manager(cli, fake_webhooks, gemini_env, secret_arn):
    url = "https://hooks.example.test/gemini/webhook"
    result = cli(
        "webhooks", "register", "--url", url, "--secret-arn", secret_arn, "--json", env=gemini_env
    )
    assert result.code == EXIT_OK, result.err
    view = result.json()
    assert (view["id"], view["uri"], view["state"]) == ("wh1", url, "enabled")
    assert "batch.succeeded" in view["subscribedEvents"]
    assert secret_arn in view["secretStoredIn"]
    first = fake_webhooks.current_secret("wh1")
    assert stored_secrets(secret_arn) == [first]
    assert first not in result.out + result.err  # stored, so never printed

    status = cli("webhooks", "status", "--json", env=gemini_env)
    assert status.code == EXIT_OK
    hooks = status.json()
    assert [(h["id"], h["state"]) for h in hooks] == [("wh1", "enabled")]
    assert hooks[0]["signingSecrets"][0]["truncatedSecret"].endswith(first[-4:])
    assert first not in status.out

    # Rotation keeps the previous secret valid next to the new one.
    result = cli("webhooks", "rotate", "--secret-arn", secret_arn, env=gemini_env)
    assert result.code == EXIT_OK, result.err
    second = fake_webhooks.current_secret("wh1")
    assert stored_secrets(secret_arn) == [second, first]
    assert second not in result.out + result.err
    verifier = StaticSecretsVerifier(stored_secrets(secret_arn))
    assert verifier.secret_count == 2

    # A rotation that revokes at once drops the key this webhook listed before and no longer
    # lists. The key Gemini had already stopped listing before this rotation is not known to
    # be this webhook's (it could be another project's): kept.
    fake_webhooks.revoke("wh1", first)
    result = cli(
        "webhooks", "rotate", "--secret-arn", secret_arn, "--revoke-now", "--json", env=gemini_env
    )
    assert result.code == EXIT_OK, result.err
    third = fake_webhooks.current_secret("wh1")
    assert stored_secrets(secret_arn) == [third, first]
    assert result.json() == {
        "id": "wh1",
        "revocation": "revoke_previous_secrets_immediately",
        "secretStoredIn": f"Secrets Manager secret {secret_arn}",
        "storedSecrets": 2,
    }

    # A webhook Gemini disabled is flagged.
    fake_webhooks.webhooks["wh1"].state = "disabled_due_to_failed_deliveries"
    text = cli("webhooks", "status", env=gemini_env).out
    assert "wh1  disabled_due_to_failed_deliveries" in text and "not enabled" in text


def test_register_to_the_local_secret_file(cli, fake_webhooks, gemini_env, tmp_path):
    url = "https://tunnel.example.test/gemini/webhook"
    result = cli(
        "webhooks", "register", "--url", url, "--events", "batch.succeeded", env=gemini_env
    )
    assert result.code == EXIT_OK, result.err
    path = tmp_path / ".opstate" / "webhook-secret"
    secret = fake_webhooks.current_secret("wh1")
    assert path.read_text().split() == [secret]
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert secret not in result.out + result.err
    assert fake_webhooks.webhooks["wh1"].subscribed_events == ["batch.succeeded"]

    # Two webhooks: rotate must be told which one.
    cli("webhooks", "register", "--url", url + "2", env=gemini_env)
    result = cli("webhooks", "rotate", env=gemini_env)
    assert result.code == EXIT_USAGE and "--id" in result.err
    result = cli("webhooks", "rotate", "--id", "wh2", "--revoke-now", env=gemini_env)
    assert result.code == EXIT_OK, result.err
    # wh2's old secret was revoked at once: pruned; wh1's secret is still live: kept.
    assert path.read_text().split() == [
        fake_webhooks.current_secret("wh2"),
        fake_webhooks.current_secret("wh1"),
    ]


def test_gemini_refusals_and_missing_key_are_one_sentence(cli, gemini_env):
    result = cli("webhooks", "register", "--url", "http://plain.example.test/h", env=gemini_env)
    assert_one_sentence(result, EXIT_FAILURE)
    assert "Gemini refused to create the webhook" in result.err
    assert_one_sentence(cli("webhooks", "status", env={"GEMINI_API_KEY": ""}), EXIT_FAILURE)
    result = cli("webhooks", "rotate", "--id", "wh-missing", env={**gemini_env})
    assert_one_sentence(result, EXIT_FAILURE)


# --- secret list helpers ---------------------------------------------------------------


def test_secret_list_helpers():
    a, b = (fake_new_secret() for _ in range(2))
    assert parse_stored(json.dumps([a, "placeholder", b])).keys == (a, b)
    assert parse_stored(f"{a} {b}").keys == (a, b)
    assert parse_stored("").keys == ()
    assert merge_new("whsec_n", ["whsec_o", "whsec_n"]) == ["whsec_n", "whsec_o"]
    assert len(merge_new("whsec_n", [f"whsec_{i}" for i in range(40)])) == 32
    assert secret_matches("whsec_abcdefXYZ1", "whsec_abc...XYZ1")
    assert secret_matches("whsec_abcdefXYZ1", "abcd****XYZ1")
    assert not secret_matches("whsec_abcdefXYZ1", "whsec_abd...XYZ1")
    assert not secret_matches("whsec_abcdefXYZ1", "...")


# --- reconcile --once --budget (issue 24: a Retry-After: 40 held the pass 43 s) ---------------


def test_reconcile_once_never_sleeps_past_its_budget(cli, fake_gemini):
    import time

    for name in ("batches/slow-1", "batches/slow-2", "batches/slow-3"):
        assert cli("track", name).code == EXIT_OK
        fake_gemini.put_batch(name, "BATCH_STATE_RUNNING", update_time=T1)
        fake_gemini.fail(name, 429, retry_after="40")
    env = {
        "GEMINI_API_KEY": "test-key",
        "GOOGLE_GEMINI_BASE_URL": fake_gemini.base_url,
        "OPSTATE_RECONCILE_WORKERS": "1",
        "OPSTATE_RECONCILE_MAX_PAGES": "0",
        "OPSTATE_RECONCILE_HTTP_TIMEOUT_SECONDS": "1",
    }
    started = time.monotonic()
    result = cli("reconcile", "--once", "--budget", "3", env=env)
    elapsed = time.monotonic() - started
    run = result.json()
    assert elapsed < 20, f"the pass took {elapsed:.1f} s with a 3 s budget"
    assert run["polled"] == 1 and run["throttled"] == 1 and run["stopped_early"] is True
    assert run["remaining_due"] == 2
    # Asked once; never waited the 40 s to ask again.
    assert sum(fake_gemini.hits(f"batches/slow-{n}") for n in (1, 2, 3)) == 1


@pytest.mark.parametrize("budget", ["0", "-5", "nan", "inf", "soon", "1"])
def test_reconcile_budget_must_exceed_one_request(cli, budget):
    env = {"GEMINI_API_KEY": "test-key", "OPSTATE_RECONCILE_HTTP_TIMEOUT_SECONDS": "5"}
    result = cli("reconcile", "--once", "--budget", budget, env=env)
    assert result.code == EXIT_USAGE, result.err
    assert "--budget" in result.err
