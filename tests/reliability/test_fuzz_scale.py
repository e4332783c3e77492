"""Bad input at scale: near-valid and garbage inputs through the normalisers and through the
API app's webhook and report routes. Never a 5xx, never a write on a 4xx, never a crash.

(The API's own tests hold a smaller fuzz of bodies and headers; this one is about volume and
about inputs that pass the signature check and reach the normalisers.)
"""

from __future__ import annotations

import base64
import importlib.util
import json
from collections.abc import Mapping
from typing import Any
from urllib.parse import quote

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from opstate.domain.events import (
    InvalidEventError,
    UnsupportedEventError,
    from_batch_job,
    from_interaction,
    from_operation,
    from_report,
    from_webhook,
)
from opstate.domain.model import OpEvent, OpRecord
from opstate.domain.names import canonical_name
from opstate.domain.states import State
from opstate.domain.times import MAX_NS
from opstate.local.apigw import LocalLambdaContext
from opstate.store import MemoryStore
from opstate.store.port import WriteOutcome
from tests.reliability.support import SECRET, live_headers
from tests.support.webhooks import http_event

HAVE_API = importlib.util.find_spec("opstate.api") is not None
SCALE = settings(
    max_examples=250,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats()
    | st.text(max_size=20),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4)
    ),
    max_leaves=12,
)

TIMES = st.one_of(
    st.sampled_from(
        [
            "2026-06-01T08:00:00Z",
            "2026-06-01T08:00:00.5Z",
            "2026-06-01T17:00:00.123456789+09:00",
            "2026-06-01t08:00:00z",
            "2026-06-01T08:00:00.1234567890Z",
            "2026-02-30T00:00:00Z",
            "1969-12-31T23:59:59Z",
            "9999-12-31T23:59:59.999999999Z",
            "9999-12-31T23:59:59.999999999-23:59",
            "2026-06-01T08:00:00+24:00",
            "2026-06-01 08:00:00Z",
            "",
            "now",
        ]
    ),
    st.text(max_size=30),
    JSON,
)
NAMES = st.one_of(
    st.sampled_from(
        [
            "batches/abc",
            "abc",
            "https://generativelanguage.googleapis.com/v1beta/batches/x?alt=json",
            "v1/batches/x:cancel",
            "models/veo-3.1-generate-preview/operations/op1",
            "fileSearchStores/s/operations/o",
            "batches/../x",
            "batches//x",
            "/",
            "batches/" + "x" * 600,
            "batches/é",
            "batches/x y",
        ]
    ),
    st.text(max_size=40),
    JSON,
)
TYPES = st.one_of(
    st.sampled_from(
        [
            "batch.succeeded",
            "batch.failed",
            "batch.expired",
            "batch.cancelled",
            "video.generated",
            "interaction.completed",
            "interaction.requires_action",
            "batch.paused",
            "",
        ]
    ),
    JSON,
)
STATES = st.one_of(
    st.sampled_from(
        [
            "JOB_STATE_RUNNING",
            "JOB_STATE_SUCCEEDED",
            "BATCH_STATE_PENDING",
            "JOB_STATE_PAUSED",
            "JOB_STATE_UNSPECIFIED",
            "JOB_STATE_NEW_THING",
            "running",
            "SUCCEEDED",
            "completed",
            "in_progress",
            "requires_action",
            "weird",
        ]
    ),
    JSON,
)


@st.composite
def mutated(draw: st.DrawFn, base: Mapping[str, st.SearchStrategy[Any]]) -> dict[str, Any]:
    """A near-valid object: each field drawn from its strategy, some dropped, some extra."""
    out: dict[str, Any] = {}
    for key, strategy in base.items():
        if draw(st.integers(0, 9)) > 0:
            out[key] = draw(strategy)
    out.update(draw(st.dictionaries(st.text(max_size=8), JSON, max_size=2)))
    return out


DATA = mutated(
    {"id": NAMES, "name": NAMES, "output_file_uri": JSON, "error_code": JSON, "user_metadata": JSON}
)
WEBHOOK_BODIES = st.one_of(
    mutated({"type": TYPES, "version": JSON, "timestamp": TIMES, "data": DATA | JSON}),
    JSON,
)
BATCH_JOBS = mutated(
    {
        "name": NAMES,
        "state": STATES,
        "update_time": TIMES,
        "updateTime": TIMES,
        "error": JSON,
        "dest": JSON,
        "display_name": JSON,
    }
)
OPERATIONS = mutated(
    {
        "name": NAMES,
        "done": JSON,
        "error": JSON,
        "response": JSON,
        "metadata": mutated({"updateTime": TIMES}) | JSON,
    }
)
INTERACTIONS = mutated({"id": NAMES, "name": NAMES, "status": STATES, "updated": TIMES})
REPORTS = st.one_of(st.none(), mutated({"state": STATES, "updateTime": TIMES, "details": JSON}))


def assert_sane(event: OpEvent) -> None:
    assert isinstance(event.state, State)
    assert canonical_name(event.name) == event.name
    assert isinstance(event.update_time_ns, int) and 0 <= event.update_time_ns <= MAX_NS
    assert isinstance(event.details, Mapping)


def normalise(fn: Any, *args: Any, **kwargs: Any) -> None:
    try:
        event = fn(*args, **kwargs)
    except (InvalidEventError, UnsupportedEventError) as exc:
        assert exc.code
        return
    assert_sane(event)


@SCALE
@given(body=WEBHOOK_BODIES)
def test_from_webhook_only_returns_sane_events_or_refuses(body: Any) -> None:
    normalise(from_webhook, body)


@SCALE
@given(job=BATCH_JOBS)
def test_from_batch_job_only_returns_sane_events_or_refuses(job: Any) -> None:
    normalise(from_batch_job, job)


@SCALE
@given(op=OPERATIONS)
def test_from_operation_only_returns_sane_events_or_refuses(op: Any) -> None:
    normalise(from_operation, op)


@SCALE
@given(obj=INTERACTIONS)
def test_from_interaction_only_returns_sane_events_or_refuses(obj: Any) -> None:
    normalise(from_interaction, obj)


@SCALE
@given(name=NAMES, body=REPORTS)
def test_from_report_only_returns_sane_events_or_refuses(name: Any, body: Any) -> None:
    normalise(from_report, name, body, now_ns=1_780_000_000_000_000_000)


# -- through the API app -------------------------------------------------------------------


class WriteCountingStore(MemoryStore):
    def __init__(self) -> None:
        super().__init__()
        self.writes = 0

    def put_if_absent(self, record: OpRecord) -> WriteOutcome:
        self.writes += 1
        return super().put_if_absent(record)

    def replace_if_version(self, record: OpRecord, expected_version: int) -> WriteOutcome:
        self.writes += 1
        return super().replace_if_version(record, expected_version)


@pytest.fixture(scope="module")
def app_and_store() -> tuple[Any, WriteCountingStore]:
    if not HAVE_API:
        pytest.skip("opstate.api is not built yet")
    from opstate.api import create_app
    from opstate.config import Settings
    from opstate.signatures import StaticSecretsVerifier

    store = WriteCountingStore()
    app = create_app(
        store=store,
        verifier=StaticSecretsVerifier([SECRET]),
        settings=Settings(webhook_secrets=(SECRET,)),
    )
    return app, store


def call(app: Any, event: dict[str, Any]) -> tuple[int, Any]:
    result = app.resolve(event, LocalLambdaContext())
    raw = result.get("body") or ""
    if result.get("isBase64Encoded"):
        raw = base64.b64decode(raw).decode()
    return int(result["statusCode"]), (json.loads(raw) if raw else None)


def check_answer(status: int, answer: Any, writes_before: int, store: WriteCountingStore) -> None:
    assert status < 500, (status, answer)
    if 400 <= status < 500:
        assert store.writes == writes_before, "a 4xx answer wrote to the store"
        assert isinstance(answer, dict) and isinstance(answer.get("error"), str)
    else:
        assert status == 200, (status, answer)
        assert isinstance(answer, dict)
        assert isinstance(answer["applied"], bool) and isinstance(answer["reason"], str)
        if not answer["applied"]:
            assert store.writes == writes_before


def _dumps(value: Any) -> str:
    return json.dumps(value, allow_nan=True)


@SCALE
@given(body=WEBHOOK_BODIES, encode=st.booleans())
def test_signed_fuzzed_webhooks_never_5xx_never_write_on_4xx(
    app_and_store: tuple[Any, WriteCountingStore], body: Any, encode: bool
) -> None:
    app, store = app_and_store
    raw = _dumps(body).encode()
    event = http_event(
        "POST", "/gemini/webhook", body=raw, headers=live_headers(raw), base64_encoded=encode
    )
    before = store.writes
    status, answer = call(app, event)
    check_answer(status, answer, before, store)


@SCALE
@given(raw=st.binary(max_size=300) | st.text(max_size=300).map(str.encode), signed=st.booleans())
def test_garbage_bytes_on_the_webhook_never_5xx(
    app_and_store: tuple[Any, WriteCountingStore], raw: bytes, signed: bool
) -> None:
    app, store = app_and_store
    try:
        raw.decode()
        headers = live_headers(raw) if signed else {"content-type": "application/json"}
        event = http_event("POST", "/gemini/webhook", body=raw, headers=headers)
    except UnicodeDecodeError:  # not UTF-8: API Gateway hands such bodies over base64-encoded
        event = http_event("POST", "/gemini/webhook", body=raw, base64_encoded=True)
    before = store.writes
    status, answer = call(app, event)
    check_answer(status, answer, before, store)
    if not signed:
        assert status in (401, 413)


@SCALE
@given(name=NAMES, body=REPORTS)
def test_fuzzed_reports_never_5xx_never_write_on_4xx(
    app_and_store: tuple[Any, WriteCountingStore], name: Any, body: Any
) -> None:
    app, store = app_and_store
    path_name = name if isinstance(name, str) else _dumps(name)
    path = "/operations/" + quote(path_name, safe="/")
    raw = None if body is None else _dumps(body).encode()
    before = store.writes
    event = http_event(
        "PUT", path, body=raw, headers={"content-type": "application/json"}, iam=True
    )
    status, answer = call(app, event)
    if status == 404 or status == 405:  # a path the router does not know (e.g. empty name)
        assert store.writes == before
        return
    check_answer(status, answer, before, store)
