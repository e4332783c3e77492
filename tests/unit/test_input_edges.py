"""Issue 24 item 4: input the system used to get wrong.

- an event time far ahead of the receiver's clock froze a record (reports, webhooks, polls);
- a REST API (payload 1.0) event made the webhook Lambda raise ``KeyError: 'http'`` (a 502);
- a naive ``update_time`` from the SDK was refused;
- a Veo operation whose videos were all filtered became SUCCEEDED with nothing recorded;
- ``error.code == 0`` (google.rpc OK) on a finished operation was FAILED.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from datetime import UTC, datetime
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from opstate.config import DEFAULT_MAX_FUTURE_SKEW_S, ConfigError, Settings
from opstate.domain.events import (
    RAI_FILTERED_COUNT,
    RAI_FILTERED_REASONS,
    InvalidEventError,
    Source,
    check_future_skew,
    from_batch_job,
    from_interaction,
    from_operation,
    from_report,
)
from opstate.domain.model import OpEvent, OpRecord
from opstate.domain.states import State
from opstate.domain.times import MAX_EVENT_NS, NS_PER_SECOND, parse_time
from opstate.ingest import ingest
from opstate.notify.entries import event_detail
from opstate.quarantine import MemoryQuarantine
from opstate.reconcile.gateway import Listed, WebhookInfo
from opstate.reconcile.pacing import Backoff
from opstate.reconcile.run import reconcile_once
from opstate.store import MemoryStore
from tests.support.webhooks import (
    EVENT_TIMESTAMP,
    TEST_SECRET,
    compact,
    http_event,
    operation_event,
    signed_headers,
    webhook_event,
)

VEO = "models/veo-3.1-generate-preview/operations/op1"
NOW_NS = EVENT_TIMESTAMP * NS_PER_SECOND  # 2026-05-10T10:00:00Z
FROZEN_FUTURE = "9999-12-31T23:59:58Z"
HOUR_NS = 3600 * NS_PER_SECOND
T_NAIVE = "2026-05-01T10:00:00"  # a REST time without an offset


# --- the future-skew bound (pure) -------------------------------------------------------------


@given(
    now=st.integers(min_value=0, max_value=MAX_EVENT_NS // 2),
    ahead=st.integers(min_value=-(10**18), max_value=10**18),
    skew_s=st.integers(min_value=1, max_value=7 * 86400),
)
def test_an_event_passes_exactly_when_it_is_within_the_skew(
    now: int, ahead: int, skew_s: int
) -> None:
    at = min(max(0, now + ahead), MAX_EVENT_NS)
    event = OpEvent("batches/b", State.RUNNING, at, Source.POLL, {})
    if at <= now + skew_s * NS_PER_SECOND:
        assert check_future_skew(event, now_ns=now, max_skew_s=skew_s) is event
    else:
        with pytest.raises(InvalidEventError) as info:
            check_future_skew(event, now_ns=now, max_skew_s=skew_s)
        assert info.value.code == "invalid-time"
        assert "ahead of this receiver's clock" in info.value.message


def test_the_skew_setting_defaults_to_an_hour_and_is_checked() -> None:
    assert DEFAULT_MAX_FUTURE_SKEW_S == 3600.0
    assert Settings().max_future_skew_s == 3600.0
    assert Settings.from_env({"OPSTATE_MAX_FUTURE_SKEW_SECONDS": "60"}).max_future_skew_s == 60.0
    for bad in ("0", "soon", "inf", str(8 * 86400)):
        with pytest.raises(ConfigError, match="OPSTATE_MAX_FUTURE_SKEW_SECONDS"):
            Settings.from_env({"OPSTATE_MAX_FUTURE_SKEW_SECONDS": bad})


def test_a_report_beyond_the_skew_is_invalid_time() -> None:
    body = {"state": "RUNNING", "updateTime": FROZEN_FUTURE}
    with pytest.raises(InvalidEventError) as info:
        from_report("batches/b", body, now_ns=NOW_NS, max_future_skew_s=3600)
    assert info.value.code == "invalid-time"
    within = {"state": "RUNNING", "updateTime": "2026-05-10T10:59:59Z"}
    assert from_report("batches/b", within, now_ns=NOW_NS, max_future_skew_s=3600).state is (
        State.RUNNING
    )


# --- the same bound on every input path ---------------------------------------------------------


def _app(store: MemoryStore, quarantine: MemoryQuarantine) -> Any:
    from opstate.api import create_app
    from opstate.signatures import StaticSecretsVerifier

    return create_app(
        store=store,
        verifier=StaticSecretsVerifier([TEST_SECRET], clock_s=lambda: EVENT_TIMESTAMP),
        settings=Settings(),
        clock_ns=lambda: NOW_NS,
        quarantine=quarantine,
        operations_auth=lambda event: None,
    )


def _webhook(app: Any, body: dict[str, Any], msg_id: str) -> dict[str, Any]:
    raw = compact(body)
    answer: dict[str, Any] = app.resolve(
        webhook_event(raw, signed_headers(raw, msg_id=msg_id)), None
    )
    return answer


def test_a_far_future_report_is_400_and_writes_nothing() -> None:
    store, quarantine = MemoryStore(), MemoryQuarantine()
    app = _app(store, quarantine)
    body = compact({"state": "RUNNING", "updateTime": FROZEN_FUTURE})
    answer = app.resolve(operation_event("PUT", "batches/frozen", body), None)
    assert answer["statusCode"] == 400
    assert json.loads(answer["body"])["error"] == "invalid-time"
    assert store.get("batches/frozen") is None


def test_a_far_future_webhook_is_quarantined_and_later_observations_still_apply() -> None:
    store, quarantine = MemoryStore(), MemoryQuarantine()
    app = _app(store, quarantine)
    name = "interactions/i-frozen"
    assert ingest(store, from_report(name, {"state": "RUNNING"}, now_ns=NOW_NS - HOUR_NS)).applied
    future = {
        "type": "interaction.completed",
        "timestamp": FROZEN_FUTURE,
        "data": {"id": name},
    }
    answer = _webhook(app, future, "msg_future")
    assert answer["statusCode"] == 200  # signed: never a 4xx
    assert json.loads(answer["body"])["reason"] == "quarantined"
    assert [(d.webhook_id, d.reason) for d in quarantine.all()] == [("msg_future", "invalid-time")]
    record = store.get(name)
    assert record is not None and record.state is State.RUNNING
    # Gemini's requires_action, stamped now, is not dropped as stale.
    now = {
        "type": "interaction.requires_action",
        "timestamp": "2026-05-10T10:00:00Z",
        "data": {"id": name},
    }
    assert json.loads(_webhook(app, now, "msg_now")["body"])["applied"] is True
    record = store.get(name)
    assert record is not None and record.state is State.REQUIRES_ACTION


def test_a_far_future_webhook_stays_quarantined_on_replay_until_the_clocks_agree() -> None:
    from opstate.replay import replay

    store, quarantine = MemoryStore(), MemoryQuarantine()
    app = _app(store, quarantine)
    body = {"type": "batch.cancelled", "timestamp": FROZEN_FUTURE, "data": {"id": "batches/f"}}
    assert json.loads(_webhook(app, body, "msg_far")["body"])["reason"] == "quarantined"
    from opstate.signatures import StaticSecretsVerifier

    again = StaticSecretsVerifier([TEST_SECRET], None)  # a replay checks no timestamp tolerance
    result = replay(quarantine, store, verifier=again, clock_ns=lambda: NOW_NS)
    assert (result.applied, result.unreadable) == (0, 1)
    assert [p[1] for p in result.problems] == ["invalid-time"]
    assert store.get("batches/f") is None and len(quarantine.all()) == 1
    # The same delivery once our clock has caught up with it: applied.
    later = replay(quarantine, store, verifier=again, clock_ns=lambda: parse_time(FROZEN_FUTURE))
    assert later.applied == 1 and quarantine.all() == []


class _Gateway:
    """Answers every poll with ``answer`` and lists ``listed`` as one page of batch jobs."""

    def __init__(self, answer: OpEvent, listed: Sequence[Listed] = ()) -> None:
        self.answer = answer
        self.listed = list(listed)
        self.fetches = 0

    def webhooks(self) -> Sequence[WebhookInfo]:
        return []

    def batch_pages(self, page_size: int) -> Iterator[Sequence[Listed]]:
        if self.listed:
            yield self.listed

    def fetch(self, record: OpRecord) -> OpEvent:
        self.fetches += 1
        return self.answer

    def close(self) -> None:
        return None


class _FixedClock:
    def now_ns(self) -> int:
        return NOW_NS

    def monotonic(self) -> float:
        return 0.0

    def sleep(self, seconds: float) -> None:
        return None


def test_a_far_future_poll_is_logged_and_skipped(caplog: pytest.LogCaptureFixture) -> None:
    store = MemoryStore()
    name = "batches/polled"
    assert ingest(store, from_report(name, {"state": "RUNNING"}, now_ns=NOW_NS - HOUR_NS)).applied
    future = OpEvent(name, State.SUCCEEDED, parse_time(FROZEN_FUTURE), Source.POLL, {})
    listed_future = OpEvent("batches/listed", State.RUNNING, future.update_time_ns, Source.POLL, {})
    gateway = _Gateway(future, [("batches/listed", listed_future)])
    result = reconcile_once(
        store,
        gateway,
        settings=Settings(store_url="memory://", reconcile_safety_margin_s=0.0),
        clock=_FixedClock(),
        backoff=Backoff(base_s=0.0, max_s=0.0),
    )
    assert gateway.fetches == 1
    assert result.applied == 0 and result.errors == 2
    record = store.get(name)
    assert record is not None and (record.state, record.version) == (State.RUNNING, 1)
    assert store.get("batches/listed") is None
    refused = [r for r in caplog.records if getattr(r, "code", None) == "invalid-time"]
    assert [r.getMessage() for r in refused] == ["batch job refused", "answer refused"]


# --- a REST API (payload 1.0) event ---------------------------------------------------------


def test_a_rest_api_payload_v1_event_is_a_json_400_naming_the_fix() -> None:
    from opstate.api import lambda_entry

    v1 = {
        "resource": "/gemini/webhook",
        "path": "/gemini/webhook",
        "httpMethod": "POST",
        "headers": {"content-type": "application/json"},
        "requestContext": {"requestId": "r1", "stage": "prod", "httpMethod": "POST"},
        "body": "{}",
        "isBase64Encoded": False,
    }
    for event in (v1, {}, {"requestContext": "x"}):
        answer = lambda_entry.handle(event, None)  # type: ignore[arg-type]
        assert answer["statusCode"] == 400
        assert answer["headers"]["Content-Type"] == "application/json"
        body = json.loads(answer["body"])
        assert body["error"] == "unsupported-payload"
        assert "HTTP API (payload 2.0)" in body["message"]
    assert lambda_entry.is_http_api_v2(http_event("GET", "/operations/batches/x"))


# --- times from the SDK --------------------------------------------------------------------------


def test_a_naive_sdk_time_is_utc() -> None:
    from google.genai import types

    job = types.BatchJob.model_validate(
        {"name": "batches/naive", "state": "JOB_STATE_RUNNING", "update_time": T_NAIVE}
    )
    assert job.update_time is not None and job.update_time.tzinfo is None  # what the SDK gives
    assert from_batch_job(job).update_time_ns == parse_time("2026-05-01T10:00:00Z")
    naive = datetime(2026, 5, 1, 10, 0, 0)  # the SDK's naive time
    aware = datetime(2026, 5, 1, 10, 0, 0, tzinfo=UTC)
    assert (
        from_interaction({"id": "i1", "status": "in_progress", "updated": naive}).update_time_ns
        == from_interaction({"id": "i1", "status": "in_progress", "updated": aware}).update_time_ns
    )
    op = {"name": VEO, "metadata": {"update_time": naive}}
    assert from_operation(op).update_time_ns == parse_time("2026-05-01T10:00:00Z")


def test_naive_iso_text_off_a_rest_resource_is_utc() -> None:
    """The REST form (a mapping, before the SDK parses it): naive ISO text with a time of day is
    UTC, whichever case its ``T``; a date alone is no time at all."""
    for text in (T_NAIVE, T_NAIVE.replace("T", "t")):
        job = {"name": "batches/naive", "state": "BATCH_STATE_RUNNING", "updateTime": text}
        assert from_batch_job(job).update_time_ns == parse_time("2026-05-01T10:00:00Z")
    with pytest.raises(InvalidEventError) as info:
        from_batch_job({"name": "batches/naive", "state": "RUNNING", "updateTime": "2026-05-01"})
    assert info.value.code == "invalid-time"


def test_a_naive_time_is_still_refused_in_a_report() -> None:
    with pytest.raises(InvalidEventError) as info:
        from_report("batches/b", {"updateTime": "2026-05-01T10:00:00"}, now_ns=NOW_NS)
    assert info.value.code == "invalid-time"


# --- Veo: filtered videos, error code 0 -----------------------------------------------------

FILTERED_REST = {
    "name": VEO,
    "done": True,
    "response": {
        "generateVideoResponse": {
            "raiMediaFilteredCount": 2,
            "raiMediaFilteredReasons": ["unsafe content", "celebrity likeness"],
        },
    },
}


def test_an_all_filtered_video_keeps_the_count_and_reasons() -> None:
    from google.genai import types

    expected = {
        RAI_FILTERED_COUNT: 2,
        RAI_FILTERED_REASONS: ["unsafe content", "celebrity likeness"],
    }
    assert (RAI_FILTERED_COUNT, RAI_FILTERED_REASONS) == (
        "rai_media_filtered_count",
        "rai_media_filtered_reasons",
    )
    rest = from_operation(FILTERED_REST)
    assert rest.state is State.SUCCEEDED
    assert {k: rest.details[k] for k in expected} == expected
    assert "video_uri" not in rest.details
    sdk = types.GenerateVideosOperation.model_validate(
        {
            "name": VEO,
            "done": True,
            "response": {
                "generated_videos": [],
                "rai_media_filtered_count": 2,
                "rai_media_filtered_reasons": ["unsafe content", "celebrity likeness"],
            },
        }
    )
    from_sdk = from_operation(sdk)
    assert {k: from_sdk.details[k] for k in expected} == expected
    # ... and in the event announced for the record.
    store = MemoryStore()
    decision = ingest(store, from_sdk)
    assert decision.record is not None
    detail = event_detail(decision.record, None)
    assert {k: detail["details"][k] for k in expected} == expected


def test_a_partly_filtered_video_keeps_its_uri_and_the_count() -> None:
    op = {
        "name": VEO,
        "done": True,
        "response": {
            "generateVideoResponse": {
                "generatedSamples": [{"video": {"uri": "files/v1"}}],
                "raiMediaFilteredCount": 1,
            }
        },
    }
    details = from_operation(op).details
    assert details["video_uri"] == "files/v1"
    assert details[RAI_FILTERED_COUNT] == 1
    assert RAI_FILTERED_REASONS not in details


@pytest.mark.parametrize("error", [{"code": 0}, {"code": 0, "message": ""}])
def test_error_code_zero_on_a_finished_operation_is_ok(error: dict[str, Any]) -> None:
    from google.genai import types

    response = {"generatedVideos": [{"video": {"uri": "files/v"}}]}
    for op in (
        {"name": VEO, "done": True, "error": error, "response": response},
        types.GenerateVideosOperation.model_validate({"name": VEO, "done": True, "error": error}),
    ):
        event = from_operation(op)
        assert event.state is State.SUCCEEDED
        assert "error_code" not in event.details
    assert from_operation({"name": VEO, "done": True, "error": {"code": 2}}).state is State.FAILED
