"""Fuzzing the API: whatever the body and headers, never a 5xx, and never a write on a 4xx."""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import quote

from hypothesis import HealthCheck, given, settings
from hypothesis import event as label
from hypothesis import strategies as st

from opstate.api import create_app
from opstate.config import Settings
from opstate.domain.events import WEBHOOK_TYPES
from opstate.domain.times import parse_time
from opstate.signatures import StaticSecretsVerifier
from opstate.store import MemoryStore
from tests.support.webhooks import (
    EVENT_TIMESTAMP,
    TEST_SECRET,
    http_event,
    operation_event,
    sign,
)

NOW_NS = parse_time("2026-05-10T10:00:00Z")
STORE = MemoryStore()
APP = create_app(
    store=STORE,
    verifier=StaticSecretsVerifier([TEST_SECRET], clock_s=lambda: EVENT_TIMESTAMP),
    settings=Settings(max_body_bytes=4096),
    clock_ns=lambda: NOW_NS,
)
FUZZ = settings(
    max_examples=200,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)

json_scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20)
)
json_values = st.recursive(
    json_scalars,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)
names = st.sampled_from(
    [
        "batches/f1",
        "f2",
        "v1beta/batches/f3",
        "https://generativelanguage.googleapis.com/v1beta/batches/f4",
        "models/veo-3.1-generate-preview/operations/f5",
        "interactions/f6",
        "batches/..",
        "",
        "batches/a b",
    ]
) | st.text(max_size=30)
times = (
    st.sampled_from(
        [
            "2026-05-10T09:00:00Z",
            "2026-05-10T09:00:00.123456789+09:00",
            "2026-13-01T00:00:00Z",
            "now",
        ]
    )
    | json_scalars
)
webhook_docs = st.fixed_dictionaries(
    {},
    optional={
        "type": st.sampled_from([*WEBHOOK_TYPES, "batch.paused", ""]) | json_scalars,
        "version": st.just("v1"),
        "timestamp": times,
        "data": st.fixed_dictionaries(
            {},
            optional={
                "id": names | json_scalars,
                "name": names,
                "output_file_uri": json_values,
                "error_code": json_values,
                "user_metadata": json_values,
            },
        )
        | json_values,
    },
)
well_formed_webhooks = st.fixed_dictionaries(
    {
        "type": st.sampled_from([*WEBHOOK_TYPES, "batch.paused"]),
        "data": st.fixed_dictionaries(
            {"id": names},
            optional={"output_file_uri": json_values, "user_metadata": json_values},
        ),
    },
    optional={"timestamp": times},
)
report_docs = st.fixed_dictionaries(
    {},
    optional={
        "state": st.sampled_from(["PENDING", "running", "SUCCEEDED", "FAILED", "nope"])
        | json_scalars,
        "updateTime": times,
        "details": json_values,
    },
)


def encoded(doc: Any) -> bytes:
    return json.dumps(doc).encode()


bodies = (
    webhook_docs.map(encoded)
    | json_values.map(encoded)
    | st.binary(max_size=300)
    | st.text(max_size=300).map(str.encode)
    | st.just(b"x" * 5000)
)


def snapshot() -> list[Any]:
    return STORE.all()


def resolve(event: dict[str, Any]) -> int:
    before = snapshot()
    response = APP.resolve(event, None)  # type: ignore[arg-type]
    status: int = response["statusCode"]
    label(f"status {status}")
    assert status < 500, response
    body = json.loads(response["body"])
    if status >= 400:
        assert snapshot() == before, (status, body)
        assert set(body) == {"error", "message"}
    else:
        assert set(body) >= {"applied", "reason", "name", "state", "version"} or "kind" in body
    return status


@st.composite
def webhook_events(draw: st.DrawFn) -> dict[str, Any]:
    mode = draw(st.sampled_from(["valid", "valid", "signed", "random", "none", "mixed"]))
    raw = draw(well_formed_webhooks.map(encoded) if mode == "valid" else bodies)
    b64 = draw(st.booleans())
    if not b64:
        raw = raw.decode("utf-8", "replace").encode()
    if mode == "valid":
        msg_id, timestamp, mode = "msg_1", str(EVENT_TIMESTAMP), "signed"
    else:
        msg_id = draw(st.sampled_from(["msg_1", "", "x" * 300]) | st.text(max_size=10))
        timestamp = draw(
            st.sampled_from([str(EVENT_TIMESTAMP), str(EVENT_TIMESTAMP - 301), "", "1e9", "nan"])
        )
    headers: dict[str, str] = {}
    if mode in ("signed", "mixed"):
        signature = sign(TEST_SECRET, msg_id, timestamp, raw)
        if mode == "mixed":
            signature = f"v1a,{signature[3:]} v1,{draw(st.text(max_size=20))} {signature}"
        headers = {
            "webhook-id": msg_id,
            "webhook-timestamp": timestamp,
            "webhook-signature": signature,
        }
    elif mode == "random":
        headers = draw(
            st.dictionaries(
                st.sampled_from(["webhook-id", "webhook-timestamp", "webhook-signature", "x"]),
                st.text(max_size=40),
            )
        )
    return http_event("POST", "/gemini/webhook", body=raw, headers=headers, base64_encoded=b64)


@FUZZ
@given(webhook_events())
def test_webhook_fuzz_never_5xx_never_writes_on_4xx(request: dict[str, Any]) -> None:
    status = resolve(request)
    assert status in (200, 400, 401, 413)


@FUZZ
@given(
    method=st.sampled_from(["GET", "PUT", "POST", "DELETE"]),
    name=names,
    quoted=st.booleans(),
    body=st.none() | report_docs.map(encoded) | bodies,
)
def test_operations_fuzz_never_5xx_never_writes_on_4xx(
    method: str, name: str, quoted: bool, body: bytes | None
) -> None:
    path_name = quote(name, safe="") if quoted else name
    if body is not None:
        body = body.decode("utf-8", "replace").encode()
    status = resolve(operation_event(method, path_name, body))
    assert status in (200, 400, 404, 413)
