"""Who may make opstate act (issue 38, the surface half; docs/security.md "Acting").

Reporting and tracking stay what they were; attaching a retry policy (which makes opstate
upload inputs, create batches and cancel them with the user's key) is a right of its own:

- repro 1 (API half): a ``PUT /operations`` caller without the retry right who sends the
  attack body (a made-up name FAILED as expired, a model, ``"retry"`` with resubmits and an
  input) gets 403 ``retry-not-allowed`` and nothing is written, in the Lambda's app and in
  ``opstate serve`` (whose API token tracks, and whose retry token alone attaches);
- repro 5: over HTTP an input outside ``OPSTATE_RETRY_INPUT_PREFIXES`` is 400 "input unusable"
  and is never read (a recording S3 endpoint sees no request for it, while the pass does read
  an allowed one); the retry view's reason says "input unusable", never whether the object
  exists, its format or a key's text (those are in the log and the store);
- a policy attached over HTTP whose input is outside the prefixes the pass runs with (they
  were narrowed since) is never read;
- the previous release's policies (no provenance) keep their row retries, but neither cancel
  nor resubmit whole until an operator attaches them again (``opstate track``), tested on the
  previous release's SQLite file (tests/fixtures/previous_release/).

- repro 6: the submit path refuses an input outside ``incoming/`` of the results bucket (an
  object that exists and holds good requests) before anything is read, uploaded or created; the
  submit function's own role is checked in tests/e2e/test_template_roles.py and
  tests/e2e/test_template_contract.py, its request in tests/unit/test_retry_submit_request.py.
"""

from __future__ import annotations

import json
import shutil
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from opstate.api import create_app
from opstate.config import DEFAULT_RETRY_TRANSIENT, Settings, settings
from opstate.outcomes.wiring import sink_from_url
from opstate.retry import engine as engine_module
from opstate.retry.engine import retry_once
from opstate.retry.passes import RetryConfig
from opstate.retry.rules import parse_table
from opstate.signatures import StaticSecretsVerifier
from opstate.store.retry_state import RETRY_ACTIVE, RetryState
from opstate.store.sqlite import SQLiteStore
from tests.support.cli import Result, in_process
from tests.support.fake_gemini import FakeGemini
from tests.support.retry_rows import write_input
from tests.support.serve_process import TEST_API_TOKEN, http, start_serve
from tests.support.webhooks import (
    EVENT_TIMESTAMP,
    TEST_SECRET,
    compact,
    operation_event,
    signed_headers,
    webhook_event,
)

NOW = 1_780_000_000_000_000_000
RETRY_TOKEN = "opstate-test-retry-token-fedcba9876543210"
ALLOWED = "s3://in-bucket/incoming/"
# Issue 38, repro 1: a made-up name reported FAILED as expired, naming a model, with a policy
# that asks for ten whole resubmits of an input (on AWS any root's kept input would do).
ATTACK: dict[str, Any] = {
    "state": "FAILED",
    "details": {"reason": "expired", "model": "gemini-2.5-pro"},
    "retry": {"maxAttempts": 10, "resubmitExpired": True, "input": f"{ALLOWED}in.jsonl"},
}
FORBIDDEN = {"error": "retry-not-allowed"}


@pytest.fixture
def store(tmp_path: Path) -> Iterator[SQLiteStore]:
    opened = SQLiteStore(tmp_path / "ops.db")
    yield opened
    opened.close()


def lambda_app(store: SQLiteStore, config: Settings) -> Any:
    """The app the Lambda serves (IAM-checked operations routes), over ``store``."""
    return create_app(
        store=store,
        verifier=StaticSecretsVerifier([TEST_SECRET], clock_s=lambda: EVENT_TIMESTAMP),
        settings=config,
        clock_ns=lambda: NOW,
    )


def put(app: Any, name: str, body: Mapping[str, Any] | None) -> tuple[int, Any]:
    raw = b"" if body is None else json.dumps(body).encode()
    answer = app.resolve(operation_event("PUT", name, raw), None)
    return answer["statusCode"], json.loads(answer["body"])


def get(app: Any, name: str) -> tuple[int, Any]:
    answer = app.resolve(operation_event("GET", name), None)
    return answer["statusCode"], json.loads(answer["body"])


# -- repro 1: the retry right -------------------------------------------------------------------


@pytest.mark.parametrize("retry", [ATTACK["retry"], {}, {"maxAttempts": 0}, "not even valid"])
def test_repro1_a_put_caller_without_the_retry_right_gets_403_and_nothing_is_written(
    store: SQLiteStore, retry: Any
) -> None:
    app = lambda_app(store, Settings(retry_input_prefixes=(ALLOWED,)))  # OPSTATE_RETRY_OVER_API off
    for n in range(3):  # every new made-up name: no fresh budget, nothing at all
        name = f"batches/made-up-{n}"
        status, body = put(app, name, {**ATTACK, "retry": retry})
        assert status == 403 and body["error"] == FORBIDDEN["error"], body
        assert "retry policy" in body["message"]
        assert store.get(name) is None and store.get_retry(name) is None
    # A record already tracked keeps its version and state, and gets no policy.
    assert put(app, "batches/tracked", None)[0] == 200
    before = store.get("batches/tracked")
    assert put(app, "batches/tracked", {**ATTACK, "retry": retry})[0] == 403
    assert store.get("batches/tracked") == before and store.get_retry("batches/tracked") is None
    # Reporting and tracking stay what they were.
    status, body = put(app, "batches/made-up-0", {k: v for k, v in ATTACK.items() if k != "retry"})
    assert (status, body["applied"]) == (200, True)
    assert store.get_retry("batches/made-up-0") is None


# Issue 47: checked raw, read decoded. Each names a key under ``incoming/`` as given, and a kept
# prompt (``results/inputs/...``) or a key with an empty segment once percent-decoded, which
# is how ``source_chunks`` reads it.
ESCAPED = [
    f"{ALLOWED}%2e%2e/results/inputs/{'ab' * 32}/input.jsonl",
    f"{ALLOWED}%2E%2e/results/inputs/kept.jsonl",
    f"{ALLOWED}..%2Fresults/inputs/kept.jsonl",
    f"{ALLOWED}.%2e/results/inputs/kept.jsonl",
    f"{ALLOWED}%2Fresults/inputs/kept.jsonl",
    f"{ALLOWED}x/%2E/y.jsonl",
]


@pytest.mark.parametrize("uri", ESCAPED)
def test_an_escaped_dot_segment_over_http_is_input_unusable_and_nothing_is_written(
    store: SQLiteStore, uri: str
) -> None:
    app = lambda_app(store, Settings(retry_over_api=True, retry_input_prefixes=(ALLOWED,)))
    status, body = put(app, "batches/escaped", {"retry": {"maxAttempts": 2, "input": uri}})
    assert (status, body) == (400, {"error": "input-unusable", "message": "input unusable"})
    assert store.get("batches/escaped") is None and store.get_retry("batches/escaped") is None
    # The same input written plainly, and one that only looks escaped, are still allowed.
    fine = f"{ALLOWED}in%20put.jsonl"
    assert put(app, "batches/fine", {"retry": {"maxAttempts": 2, "input": fine}})[0] == 200


def test_repro1_the_operator_setting_grants_the_right_and_the_policy_says_so(
    store: SQLiteStore,
) -> None:
    app = lambda_app(store, Settings(retry_over_api=True, retry_input_prefixes=(ALLOWED,)))
    status, body = put(app, "batches/granted", ATTACK)
    assert status == 200 and body["retry"]["policy"]["maxAttempts"] == 10
    state = store.get_retry("batches/granted")
    assert state is not None and state.doc["via"] == "api"  # the engine can tell its origin


def test_a_signed_webhook_never_attaches_a_policy_even_where_put_may(store: SQLiteStore) -> None:
    """Actor b): a delivery (signed, or a sender's guess at one) carries no right at all: the
    fields a PUT would use are ignored, whatever the deployment grants PUT callers."""
    app = lambda_app(store, Settings(retry_over_api=True, retry_input_prefixes=(ALLOWED,)))
    body = compact(
        {
            "type": "batch.expired",
            "version": "v1",
            "timestamp": "2026-05-10T09:59:58Z",
            "data": {"id": "batches/pushed", **ATTACK, "user_metadata": {"retry": ATTACK["retry"]}},
            "retry": ATTACK["retry"],
        }
    )
    answer = app.resolve(webhook_event(body, signed_headers(body)), None)
    assert answer["statusCode"] == 200, answer["body"]
    assert store.get("batches/pushed") is not None  # the report is kept, as ever
    assert store.get_retry("batches/pushed") is None  # but no policy


def serve_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    return {"OPSTATE_STORE": f"sqlite:///{tmp_path / 'ops.db'}", **extra}


def test_repro1_serve_the_api_token_tracks_and_only_the_retry_token_attaches(
    tmp_path: Path,
) -> None:
    name = "batches/served"
    env = serve_env(
        tmp_path,
        OPSTATE_RETRY_API_TOKEN=RETRY_TOKEN,
        OPSTATE_RETRY_INPUT_PREFIXES=ALLOWED,
    )
    server = start_serve([], cwd=tmp_path, env=env)
    try:
        url = f"{server.url}/operations/{name}"
        body = json.dumps(ATTACK).encode()
        status, _, answer = http("PUT", url, body)  # the API token
        assert (status, answer["error"]) == (403, "retry-not-allowed")
        assert http("GET", url)[0] == 404  # nothing was written
        status, _, answer = http("PUT", url, json.dumps({"state": "RUNNING"}).encode())
        assert status == 200  # the API token still reports and tracks
        status, _, answer = http("PUT", url, body, token=RETRY_TOKEN)
        assert status == 200 and answer["retry"]["policy"]["maxAttempts"] == 10
        status, _, view = http("GET", url, token=RETRY_TOKEN)  # it reads as well
        assert status == 200 and view["retry"]["policy"]["resubmitExpired"] is True
        assert http("GET", url, token="not-" + RETRY_TOKEN)[0] == 401
    finally:
        assert server.terminate() == 0
    assert RETRY_TOKEN not in server.output()  # never echoed nor logged
    opened = SQLiteStore(tmp_path / "ops.db")
    try:
        state = opened.get_retry(name)
        assert state is not None and state.doc["via"] == "api"
    finally:
        opened.close()


def test_serve_without_a_retry_token_lets_no_http_caller_attach_a_policy(tmp_path: Path) -> None:
    server = start_serve([], cwd=tmp_path, env=serve_env(tmp_path))
    try:
        url = f"{server.url}/operations/batches/x"
        status, _, answer = http("PUT", url, json.dumps({"retry": {}}).encode())
        assert (status, answer["error"]) == (403, "retry-not-allowed")
        assert http("GET", url)[0] == 404
    finally:
        assert server.terminate() == 0


def test_serve_refuses_a_retry_token_equal_to_the_api_token(tmp_path: Path) -> None:
    from tests.support.serve_process import run_cli

    done = run_cli(
        ["serve", "--port", "0"],
        cwd=tmp_path,
        env=serve_env(tmp_path, OPSTATE_RETRY_API_TOKEN=TEST_API_TOKEN),
    )
    assert done.returncode != 0
    assert "OPSTATE_RETRY_API_TOKEN must differ from OPSTATE_API_TOKEN" in done.stderr + done.stdout
    assert TEST_API_TOKEN not in done.stderr + done.stdout


# -- repro 5: inputs over HTTP -----------------------------------------------------------------


class RecordingS3:
    """An S3 endpoint that answers every request 404 NoSuchKey and records its path."""

    def __init__(self) -> None:
        self.paths: list[str] = []
        recorded = self.paths

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                recorded.append(f"{self.headers.get('Host')} {self.path}")
                body = b"<Error><Code>NoSuchKey</Code><Message>no such key</Message></Error>"
                self.send_response(404)
                self.send_header("Content-Type", "application/xml")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            do_HEAD = do_GET

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def wait_until(check: Callable[[], bool], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.1)


def test_repro5_serve_an_input_outside_the_prefixes_is_input_unusable_and_never_read(
    tmp_path: Path, fake_gemini: FakeGemini
) -> None:
    s3 = RecordingS3()
    env = serve_env(
        tmp_path,
        OPSTATE_RETRY_API_TOKEN=RETRY_TOKEN,
        OPSTATE_RETRY_INPUT_PREFIXES=ALLOWED,
        GEMINI_API_KEY="test-key",
        GOOGLE_GEMINI_BASE_URL=fake_gemini.base_url,
        OPSTATE_RECONCILE_MAX_PAGES="0",
        OPSTATE_RETRY_CHECK_SECONDS="1",
        # The host user's credentials, as `opstate serve` would use them: here a recorder.
        AWS_ENDPOINT_URL=s3.url,
        AWS_ACCESS_KEY_ID="testing",
        AWS_SECRET_ACCESS_KEY="testing",
        AWS_DEFAULT_REGION="us-east-1",
    )
    fake_gemini.put_batch("batches/outside", "BATCH_STATE_RUNNING")
    fake_gemini.put_batch("batches/inside", "BATCH_STATE_RUNNING")
    server = start_serve(["--reconcile-every", "0.3"], cwd=tmp_path, env=env)
    try:
        outside = f"{server.url}/operations/batches/outside"
        policy = {"retry": {"maxAttempts": 2, "input": "s3://private-bucket/prompts/secret.jsonl"}}
        status, _, answer = http("PUT", outside, json.dumps(policy).encode(), token=RETRY_TOKEN)
        assert (status, answer) == (400, {"error": "input-unusable", "message": "input unusable"})
        assert http("GET", outside, token=RETRY_TOKEN)[0] == 404  # nothing written
        # An allowed input is read by the pass (the recorder works); it is not there, and the
        # view says only that the input is unusable.
        inside = f"{server.url}/operations/batches/inside"
        policy = {"retry": {"maxAttempts": 2, "input": f"{ALLOWED}missing.jsonl"}}
        status, _, answer = http("PUT", inside, json.dumps(policy).encode(), token=RETRY_TOKEN)
        assert status == 200
        wait_until(lambda: any("missing.jsonl" in path for path in s3.paths))

        def shown() -> dict[str, Any]:
            view: dict[str, Any] = http("GET", inside, token=RETRY_TOKEN)[2]
            return view

        wait_until(lambda: shown()["retry"]["status"] == "unavailable")
        view = shown()
        assert view["retry"]["reason"] == "input unusable"
        assert "NoSuchKey" not in json.dumps(view) and "missing.jsonl" not in json.dumps(view)
    finally:
        assert server.terminate() == 0
        s3.close()
    assert not any("secret.jsonl" in path or "private-bucket" in path for path in s3.paths)
    # The operator's log has the detail of both.
    assert "s3://private-bucket/prompts/secret.jsonl" in server.output()
    assert "NoSuchKey" in server.output()


@pytest.fixture
def aws(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    from moto import mock_aws

    for key in ("AWS_ENDPOINT_URL", "AWS_PROFILE"):
        monkeypatch.delenv(key, raising=False)
    for key, value in {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
    }.items():
        monkeypatch.setenv(key, value)
    with mock_aws():
        import boto3

        client = boto3.client("s3", region_name="us-east-1")
        client.create_bucket(Bucket="in-bucket")
        yield client


def one_pass(store: SQLiteStore, tmp_path: Path, prefixes: tuple[str, ...]) -> Any:
    config = RetryConfig(table=parse_table(DEFAULT_RETRY_TRANSIENT), input_prefixes=prefixes)
    sink = sink_from_url((tmp_path / "results").as_uri())
    return retry_once(store, sink, None, config, clock_ns=lambda: NOW + 1)


@pytest.mark.parametrize(
    ("key", "content", "hidden"),
    [
        ("incoming/absent.jsonl", None, "NoSuchKey"),
        ("incoming/not-jsonl.bin", b"\xff\xfe binary", "UTF-8"),
        (
            "incoming/dup.jsonl",
            b'{"key": "patient-4711-secret", "request": {}}\n'
            b'{"key": "patient-4711-secret", "request": {}}\n',
            "patient-4711-secret",
        ),
    ],
)
def test_repro5_the_retry_view_never_says_whether_an_input_exists_or_what_it_holds(
    store: SQLiteStore, tmp_path: Path, aws: Any, key: str, content: bytes | None, hidden: str
) -> None:
    if content is not None:
        aws.put_object(Bucket="in-bucket", Key=key, Body=content)
    app = lambda_app(store, Settings(retry_over_api=True, retry_input_prefixes=(ALLOWED,)))
    name = "batches/leaky"
    status, _ = put(app, name, {"retry": {"maxAttempts": 1, "input": f"s3://in-bucket/{key}"}})
    assert status == 200
    assert one_pass(store, tmp_path, (ALLOWED,)).unavailable == 1
    status, view = get(app, name)
    assert status == 200 and view["retry"]["status"] == "unavailable"
    assert view["retry"]["reason"] == "input unusable"
    assert hidden not in json.dumps(view) and key not in json.dumps(view)
    state = store.get_retry(name)
    assert state is not None and hidden in state.doc["unavailableDetail"]  # the operator's


@pytest.mark.parametrize(
    ("via", "source"),
    [
        ("api", "s3://bucket/results/inputs/ab/input.jsonl"),
        (None, "s3://bucket/results/inputs/ab/input.jsonl"),
        ("api", "s3://bucket/incoming/%2e%2e/results/inputs/ab/input.jsonl"),  # issue 47
        (None, "s3://bucket/incoming/..%2Fresults/inputs/ab/input.jsonl"),
    ],
)
def test_an_input_the_pass_may_not_read_is_never_read(
    store: SQLiteStore,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    via: str | None,
    source: str,
) -> None:
    """Attached over HTTP under prefixes since narrowed, or by the previous release (no
    provenance): the pass reads neither, and says only "input unusable"."""
    app = lambda_app(store, Settings())
    assert put(app, "batches/narrowed", None)[0] == 200
    record = store.get("batches/narrowed")
    assert record is not None
    doc: dict[str, Any] = {
        "policy": {"maxAttempts": 2, "resubmitExpired": False, "pendingTimeoutHours": None},
        "input": {"source": source, "location": None},
        "children": [],
        "final": {"status": "pending"},
    } | ({"via": via} if via is not None else {})
    state = RetryState(RETRY_ACTIVE, created_ns=record.created_ns, due_ns=NOW, doc=doc)
    assert store.set_retry(record.name, 0, state)

    def never(uri: str, **_: Any) -> Any:
        raise AssertionError(f"{uri} may not be read")

    monkeypatch.setattr(engine_module, "source_chunks", never)
    assert one_pass(store, tmp_path, ("s3://bucket/incoming/",)).unavailable == 1
    kept = store.get_retry(record.name)
    assert kept is not None and kept.doc["unavailable"] == "input unusable"
    assert "OPSTATE_RETRY_INPUT_PREFIXES" in kept.doc["unavailableDetail"]


# -- the previous release's policies -----------------------------------------------------------

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "previous_release"
PENDING = "batches/fixture-pending"  # tracked PENDING by the previous release, long ago


@pytest.fixture
def old_cli(
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    fake_gemini: FakeGemini,
) -> Iterator[Callable[..., Result]]:
    shutil.copyfile(FIXTURE / "ops.db", tmp_path / "ops.db")
    monkeypatch.chdir(tmp_path)
    for key in ("OPSTATE_TABLE_NAME", "OPSTATE_RETRY_MAX_ATTEMPTS", "OPSTATE_RETRY_INPUT_PREFIXES"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("OPSTATE_STORE", f"sqlite:///{tmp_path / 'ops.db'}")
    monkeypatch.setenv("OPSTATE_RESULTS_URL", (tmp_path / "results").as_uri())
    monkeypatch.setenv("OPSTATE_RECONCILE_MAX_PAGES", "0")
    monkeypatch.setenv("GEMINI_API_KEY", "test-key")
    monkeypatch.setenv("GOOGLE_GEMINI_BASE_URL", fake_gemini.base_url)
    fake_gemini.api_key = "test-key"
    settings.cache_clear()
    yield in_process(monkeypatch, capsys)
    settings.cache_clear()


def test_a_policy_the_previous_release_kept_retries_rows_but_never_cancels_or_resubmits(
    old_cli: Callable[..., Result], tmp_path: Path, fake_gemini: FakeGemini
) -> None:
    """A policy attached by a PUT before this release has no provenance: any caller could have
    attached it. It keeps its row retries (its input is kept, its lineage stays active), but
    its pending timeout cancels nothing and its resubmitExpired resubmits nothing (docs/
    security.md, "Acting")."""
    source = write_input(tmp_path / "in.jsonl", ["k0", "k1", "k2"])
    db = SQLiteStore(tmp_path / "ops.db")
    try:
        record = db.get(PENDING)
        assert record is not None and str(record.state) == "PENDING"
        # What a PUT of the previous release kept: the policy, the input named, no "via".
        doc = {
            "policy": {"maxAttempts": 2, "resubmitExpired": True, "pendingTimeoutHours": 1.0},
            "model": "models/gemini-2.5-flash",
            "input": {"source": source.as_uri(), "location": None, "sha256": None, "rows": None},
            "unavailable": None,
            "stopped": None,
            "children": [],
            "cancelled": [],
            "final": {"status": "pending", "location": None, "retried": 0, "attempts": 1},
        }
        assert db.set_retry(PENDING, 0, RetryState(RETRY_ACTIVE, record.created_ns, 0, NOW, doc))
    finally:
        db.close()
    # Gemini still has it pending, far past the hour the policy gives it.
    fake_gemini.put_batch(PENDING, "BATCH_STATE_PENDING", model="models/gemini-2.5-flash")
    fake_gemini.reset_requests()
    first = old_cli("retry", "--once")
    assert first.code == 0, first.err
    assert first.json()["cancelled"] == 0
    assert not [r for r in fake_gemini.requests if r.verb == "cancel"]
    db = SQLiteStore(tmp_path / "ops.db")
    try:
        kept = db.get_retry(PENDING)
        assert kept is not None and kept.status == RETRY_ACTIVE  # still retrying rows
        assert kept.doc["input"]["location"]  # its input kept for them
        assert kept.doc["cancelled"] == []
    finally:
        db.close()
    # It expires: the previous release's policy resubmits nothing whole.
    fake_gemini.put_batch(PENDING, "BATCH_STATE_EXPIRED", model="models/gemini-2.5-flash")
    fake_gemini.reset_requests()
    second = old_cli("retry", "--once")
    assert second.code == 0, second.err
    assert second.json()["submitted"] == 0
    assert fake_gemini.batches_created() == []
    view = old_cli("get", PENDING, "--json").json()
    assert view["state"] == "FAILED" and view["retry"]["children"] == []


# -- repro 6: the submit function's inputs ------------------------------------------------------


@pytest.mark.parametrize(
    "key",
    [
        "results/inputs/" + "ab" * 32 + "/input.jsonl",  # someone's kept prompts
        "results/batches/x/1/output.jsonl",
        "incoming/../results/inputs/kept.jsonl",
        "incoming-other/in.jsonl",
        # Issue 47: the reader percent-decodes the key; the check reads it the same way.
        "incoming/%2e%2e/results/inputs/kept.jsonl",
        "incoming/%2E%2E/results/inputs/kept.jsonl",
        "incoming/..%2Fresults/inputs/kept.jsonl",
        "incoming/%2fresults/inputs/kept.jsonl",
    ],
)
def test_repro6_the_submit_path_refuses_an_input_outside_incoming(
    tmp_path: Path,
    aws: Any,
    fake_gemini: FakeGemini,
    monkeypatch: pytest.MonkeyPatch,
    key: str,
) -> None:
    """Checked in code as well as in the submit function's role: an object that exists and
    holds good requests, anywhere but under incoming/ of the results bucket, is never read,
    uploaded or created."""
    from opstate.retry.wiring import SubmitRefusedError, submit_event

    aws.put_object(Bucket="in-bucket", Key=key, Body=b'{"key": "a", "request": {}}\n')
    monkeypatch.setenv("GOOGLE_GEMINI_BASE_URL", fake_gemini.base_url)
    fake_gemini.api_key = "test-key"
    config = Settings.from_env(
        {
            "OPSTATE_STORE": f"sqlite:///{tmp_path / 'ops.db'}",
            "OPSTATE_RESULTS_URL": "s3://in-bucket/results",
            "GEMINI_API_KEY": "test-key",
        }
    )
    request = {"input": f"s3://in-bucket/{key}", "model": "gemini-2.5-flash"}
    with pytest.raises(SubmitRefusedError, match="under s3://in-bucket/incoming/"):
        submit_event(config, request)
    assert fake_gemini.batches_created() == [] and fake_gemini.requests == []
    listed = aws.list_objects_v2(Bucket="in-bucket").get("Contents", [])
    assert [o["Key"] for o in listed] == [key]  # nothing kept
