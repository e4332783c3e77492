"""A delivery that passed the signature check is never refused with a 4xx (except 413, decided
before any signature work): whatever its body, it is applied, dropped or quarantined."""

from __future__ import annotations

import json
import uuid
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from opstate.api import create_app
from opstate.config import Settings
from opstate.domain.times import parse_time
from opstate.quarantine import MemoryQuarantine
from opstate.signatures import StaticSecretsVerifier
from opstate.store import MemoryStore
from tests.support.webhooks import EVENT_TIMESTAMP, TEST_SECRET, http_event, sign

NOW_NS = parse_time("2026-05-10T10:00:00Z")
QUARANTINE = MemoryQuarantine()
APP = create_app(
    store=MemoryStore(),
    verifier=StaticSecretsVerifier([TEST_SECRET], clock_s=lambda: EVENT_TIMESTAMP),
    settings=Settings(max_body_bytes=4096),
    clock_ns=lambda: NOW_NS,
    quarantine=QUARANTINE,
)

scalars = st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8)
values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner),
    max_leaves=10,
)
data = st.fixed_dictionaries(
    {},
    optional={
        "id": st.text(max_size=20) | scalars,
        "name": st.text(max_size=20),
        "user_metadata": values,
        "output_file_uri": values,
    },
)
documents = st.fixed_dictionaries(
    {},
    optional={
        "type": st.sampled_from(["batch.succeeded", "video.generated", "interaction.failed"])
        | st.text(max_size=10)
        | scalars,
        "timestamp": st.sampled_from(["2026-05-10T09:00:00Z", "9999-12-31T23:59:59Z", "x"])
        | scalars,
        "data": data | values,
    },
)
bodies = (
    documents.map(lambda d: json.dumps(d).encode())
    | values.map(lambda v: json.dumps(v).encode())
    | st.binary(max_size=200).map(lambda b: b.decode("utf-8", "replace").encode())
    | st.integers(1, 2000).map(lambda n: b"[" * n + b"]" * n)
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(body=bodies, b64=st.booleans())
def test_a_signed_delivery_is_never_refused(body: bytes, b64: bool) -> None:
    msg_id = f"msg_fuzz_{uuid.uuid4().hex}"  # the quarantine keeps one entry per webhook-id
    headers = {
        "webhook-id": msg_id,
        "webhook-timestamp": str(EVENT_TIMESTAMP),
        "webhook-signature": sign(TEST_SECRET, msg_id, EVENT_TIMESTAMP, body),
    }
    event: dict[str, Any] = http_event(
        "POST", "/gemini/webhook", body=body, headers=headers, base64_encoded=b64
    )
    before = len(QUARANTINE.all())
    response = APP.resolve(event, None)  # type: ignore[arg-type]
    answer = json.loads(response["body"])
    assert response["statusCode"] == 200, answer
    if answer["reason"] == "quarantined":
        assert len(QUARANTINE.all()) == before + 1
        assert any(d.body == body for d in QUARANTINE.all())
