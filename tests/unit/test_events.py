"""The normalisers: every source of truth becomes one OpEvent, or a refusal with a reason."""

from __future__ import annotations

import dataclasses
import warnings
from datetime import UTC, datetime
from types import SimpleNamespace
from typing import Any

import pytest

from opstate.domain.events import (
    INTERACTION_STATUSES,
    JOB_STATES,
    UNKNOWN_STATE,
    UNSUPPORTED_EVENT_TYPE,
    WEBHOOK_FAMILIES,
    WEBHOOK_TYPES,
    EventError,
    InvalidEventError,
    Source,
    UnsupportedEventError,
    from_batch_job,
    from_interaction,
    from_operation,
    from_report,
    from_webhook,
    webhook_kind_hint,
)
from opstate.domain.model import OpEvent
from opstate.domain.names import Kind
from opstate.domain.states import State
from opstate.domain.times import NS_PER_SECOND

T0 = 1_767_225_600 * NS_PER_SECOND  # 2026-01-01T00:00:00Z
TS = "2026-01-01T00:00:00Z"
VEO = "models/veo-3.1-generate-preview/operations/abc123"
VEO_KEY = "models/-/operations/abc123"  # the model is kept in details, not in the key
MODEL = {"model": "veo-3.1-generate-preview"}


def _body(event_type: str, **data: Any) -> dict[str, Any]:
    return {"type": event_type, "version": "v1", "timestamp": TS, "data": data}


# ---------------------------------------------------------------- webhooks


@pytest.mark.parametrize(
    ("event_type", "data_id", "name", "state", "kind", "extra"),
    [
        ("batch.succeeded", "batches/b1", "batches/b1", State.SUCCEEDED, Kind.BATCH, {}),
        ("batch.failed", "batches/b1", "batches/b1", State.FAILED, Kind.BATCH, {}),
        (
            "batch.expired",
            "batches/b1",
            "batches/b1",
            State.FAILED,
            Kind.BATCH,
            {"reason": "expired"},
        ),
        ("batch.cancelled", "batches/b1", "batches/b1", State.CANCELLED, Kind.BATCH, {}),
        ("video.generated", VEO, VEO_KEY, State.SUCCEEDED, Kind.VIDEO, MODEL),
        # Gemini's docs show bare ids: the same record as the full name
        ("video.generated", "abc123", VEO_KEY, State.SUCCEEDED, Kind.VIDEO, {}),
        (
            "interaction.completed",
            "int_1",
            "interactions/int_1",
            State.SUCCEEDED,
            Kind.INTERACTION,
            {},
        ),
        ("interaction.failed", "int_1", "interactions/int_1", State.FAILED, Kind.INTERACTION, {}),
        (
            "interaction.cancelled",
            "int_1",
            "interactions/int_1",
            State.CANCELLED,
            Kind.INTERACTION,
            {},
        ),
        (
            "interaction.requires_action",
            "interactions/int_1",
            "interactions/int_1",
            State.REQUIRES_ACTION,
            Kind.INTERACTION,
            {},
        ),
    ],
)
def test_every_webhook_type(
    event_type: str, data_id: str, name: str, state: State, kind: Kind, extra: dict[str, Any]
) -> None:
    event = from_webhook(_body(event_type, id=data_id))
    assert event == OpEvent(name, state, T0, Source.WEBHOOK, extra)
    assert event.kind is kind
    assert event.source == "webhook"


def test_the_webhook_table_is_exactly_the_documented_types() -> None:
    assert set(WEBHOOK_TYPES) == {
        "batch.succeeded",
        "batch.failed",
        "batch.expired",
        "batch.cancelled",
        "video.generated",
        "interaction.completed",
        "interaction.failed",
        "interaction.cancelled",
        "interaction.requires_action",
    }


@pytest.mark.parametrize(
    "data",
    [
        {"id": "batches/b1"},
        {"id": "b1"},
        {"name": "batches/b1"},
        {"name": "b1"},
        {"id": "https://generativelanguage.googleapis.com/v1beta/batches/b1"},
        {"name": "/v1beta/batches/b1:cancel"},
        # id wins over name when both are present; a null id falls back to name
        {"id": "b1", "name": "batches/other"},
        {"id": None, "name": "b1"},
    ],
)
def test_webhook_name_spellings(data: dict[str, Any]) -> None:
    assert from_webhook({"type": "batch.succeeded", "timestamp": TS, "data": data}).name == (
        "batches/b1"
    )


def test_webhook_keeps_the_documented_detail_fields_only() -> None:
    event = from_webhook(
        _body(
            "batch.failed",
            id="b1",
            output_file_uri="files/out-1",
            video_uri="https://example.invalid/v.mp4",
            error_code=13,
            error_message="internal",
            user_metadata={"team": "ml", "run": 7},
            secret_field="dropped",
            state="RUNNING",
            error_details=None,
        )
    )
    assert event.details == {
        "output_file_uri": "files/out-1",
        "video_uri": "https://example.invalid/v.mp4",
        "error_code": 13,
        "error_message": "internal",
        "user_metadata": {"team": "ml", "run": 7},
    }
    assert event.state is State.FAILED


def test_webhook_null_detail_fields_are_not_kept() -> None:
    event = from_webhook(_body("batch.succeeded", id="b1", output_file_uri=None))
    assert event.details == {}


def test_expired_reason_cannot_be_overridden_by_the_body() -> None:
    event = from_webhook(_body("batch.expired", id="b1", reason="other", error_code=4))
    assert event.details == {"error_code": 4, "reason": "expired"}


@pytest.mark.parametrize(
    ("timestamp", "expected"),
    [
        ("2026-01-01T00:00:00Z", T0),
        ("2026-01-01T00:00:00.5Z", T0 + 500_000_000),
        ("2026-01-01T09:00:00+09:00", T0),
        (None, 0),
    ],
)
def test_webhook_timestamp_is_the_event_time(timestamp: str | None, expected: int) -> None:
    body: dict[str, Any] = {"type": "batch.succeeded", "data": {"id": "b1"}}
    if timestamp is not None:
        body["timestamp"] = timestamp
    assert from_webhook(body).update_time_ns == expected


def test_webhook_without_timestamp_key_has_time_zero() -> None:
    assert from_webhook({"type": "batch.succeeded", "data": {"id": "b1"}}).update_time_ns == 0


@pytest.mark.parametrize(
    "body",
    [
        _body("batch.running", id="b1"),
        _body("batch.created", id="b1"),
        _body("video.failed", id=VEO),
        _body("interaction.created", id="int_1"),
        _body("Batch.Succeeded", id="b1"),
        _body("batch.succeeded ", id="b1"),
        # an unknown type is dropped whatever shape its body has (never a 400)
        {"type": "file_search.imported"},
        {"type": "new.thing", "data": "not an object"},
        {"type": "new.thing", "data": {}, "timestamp": "not a time"},
    ],
)
def test_unsupported_webhook_types_are_dropped(body: dict[str, Any]) -> None:
    with pytest.raises(UnsupportedEventError) as info:
        from_webhook(body)
    assert info.value.reason == UNSUPPORTED_EVENT_TYPE == "unsupported-event-type"
    assert info.value.code == info.value.reason
    assert repr(body["type"]) in str(info.value)


def test_webhook_kind_hints_come_from_the_type_table() -> None:
    # Every mapped type hints its own kind; its family is read off the same table.
    for event_type, (_, hint, _) in WEBHOOK_TYPES.items():
        assert webhook_kind_hint(event_type) is hint
        assert WEBHOOK_FAMILIES[event_type.partition(".")[0]] is hint
    assert WEBHOOK_FAMILIES == {
        "batch": Kind.BATCH,
        "video": Kind.VIDEO,
        "interaction": Kind.INTERACTION,
    }
    # A type not mapped yet still names its operation's kind when its family is known.
    assert webhook_kind_hint("batch.paused") is Kind.BATCH
    assert webhook_kind_hint("interaction.created") is Kind.INTERACTION
    assert webhook_kind_hint("video.failed") is Kind.VIDEO
    for unknown in ("file_search.imported", "new.thing", "Batch.Succeeded", "", None, 3):
        assert webhook_kind_hint(unknown) is None


@pytest.mark.parametrize(
    ("body", "code"),
    [
        (None, "invalid-body"),
        ([], "invalid-body"),
        ("batch.succeeded", "invalid-body"),
        (b"{}", "invalid-body"),
        ({}, "missing-field"),
        ({"data": {"id": "b1"}}, "missing-field"),
        ({"type": "", "data": {"id": "b1"}}, "missing-field"),
        ({"type": 5, "data": {"id": "b1"}}, "missing-field"),
        ({"type": ["batch.succeeded"], "data": {"id": "b1"}}, "missing-field"),
        ({"type": "batch.succeeded", "timestamp": TS}, "missing-field"),
        ({"type": "batch.succeeded", "data": None}, "missing-field"),
        ({"type": "batch.succeeded", "data": ["b1"]}, "missing-field"),
        ({"type": "batch.succeeded", "data": {}}, "missing-field"),
        ({"type": "batch.succeeded", "data": {"id": None, "name": None}}, "missing-field"),
        ({"type": "batch.succeeded", "data": {"id": ""}}, "invalid-name"),
        ({"type": "batch.succeeded", "data": {"id": "batches/../x"}}, "invalid-name"),
        ({"type": "batch.succeeded", "data": {"id": "b 1"}}, "invalid-name"),
        ({"type": "batch.succeeded", "data": {"id": 42}}, "invalid-name"),
        (
            {"type": "batch.succeeded", "timestamp": "yesterday", "data": {"id": "b1"}},
            "invalid-time",
        ),
        (
            {"type": "batch.succeeded", "timestamp": "2026-01-01T00:00:00", "data": {"id": "b1"}},
            "invalid-time",
        ),
        (
            {"type": "batch.succeeded", "timestamp": 1767225600, "data": {"id": "b1"}},
            "invalid-time",
        ),
        ({"type": "batch.succeeded", "timestamp": "", "data": {"id": "b1"}}, "invalid-time"),
    ],
)
def test_malformed_webhook_bodies(body: object, code: str) -> None:
    with pytest.raises(InvalidEventError) as info:
        from_webhook(body)
    assert info.value.code == code
    assert info.value.message == str(info.value)


# ---------------------------------------------------------------- batch jobs (google-genai)

JOB_TABLE: list[tuple[str, State | None, dict[str, Any]]] = [
    ("QUEUED", State.PENDING, {}),
    ("PENDING", State.PENDING, {}),
    ("RUNNING", State.RUNNING, {"paused": False, "cancelling": False}),
    ("UPDATING", State.RUNNING, {"paused": False, "cancelling": False}),
    ("PAUSED", State.RUNNING, {"paused": True, "cancelling": False}),
    ("CANCELLING", State.RUNNING, {"paused": False, "cancelling": True}),
    ("SUCCEEDED", State.SUCCEEDED, {}),
    ("PARTIALLY_SUCCEEDED", State.SUCCEEDED, {"partial": True}),
    ("FAILED", State.FAILED, {}),
    ("EXPIRED", State.FAILED, {"reason": "expired"}),
    ("CANCELLED", State.CANCELLED, {}),
    ("UNSPECIFIED", None, {}),
]


def test_the_job_state_table_covers_every_google_genai_job_state() -> None:
    from google.genai import types

    values = {s.value.removeprefix("JOB_STATE_") for s in types.JobState}
    assert values == set(JOB_STATES) == {suffix for suffix, _, _ in JOB_TABLE}


@pytest.mark.parametrize("prefix", ["JOB_STATE_", "BATCH_STATE_"])
@pytest.mark.parametrize(("suffix", "state", "extra"), JOB_TABLE)
def test_job_state_mapping(
    prefix: str, suffix: str, state: State | None, extra: dict[str, Any]
) -> None:
    job = {"name": "batches/b1", "state": prefix + suffix, "updateTime": TS}
    if state is None:
        with pytest.raises(UnsupportedEventError) as info:
            from_batch_job(job)
        assert info.value.reason == UNKNOWN_STATE == "unknown-state"
        return
    event = from_batch_job(job)
    assert event == OpEvent("batches/b1", state, T0, Source.POLL, extra)
    assert event.source == "poll"


@pytest.mark.parametrize(("suffix", "state", "extra"), JOB_TABLE)
def test_google_genai_batch_job_objects(
    suffix: str, state: State | None, extra: dict[str, Any]
) -> None:
    from google.genai import types

    job = types.BatchJob(
        name="batches/b1",
        state=types.JobState("JOB_STATE_" + suffix),
        update_time=datetime(2026, 1, 1, tzinfo=UTC),
    )
    if state is None:
        with pytest.raises(UnsupportedEventError) as info:
            from_batch_job(job)
        assert info.value.reason == UNKNOWN_STATE
        return
    assert from_batch_job(job) == OpEvent("batches/b1", state, T0, Source.POLL, extra)


def test_google_genai_batch_job_details() -> None:
    from google.genai import types

    # what the SDK parses out of a REST answer
    job = types.BatchJob.model_validate(
        {
            "name": "batches/b1",
            "display_name": "nightly",
            "state": "JOB_STATE_FAILED",
            "error": {"code": 3, "message": "bad input"},
            "dest": {"file_name": "files/out-1"},
            "update_time": "2026-01-01T00:00:00.5Z",
        }
    )
    event = from_batch_job(job)
    assert event.state is State.FAILED
    assert event.update_time_ns == T0 + 500_000_000
    assert event.details == {
        "error_code": 3,
        "error_message": "bad input",
        "output_file_uri": "files/out-1",
        "display_name": "nightly",
    }


def test_batch_job_mapping_form_details() -> None:
    job = {
        "name": "b1",
        "displayName": "nightly",
        "state": "BATCH_STATE_SUCCEEDED",
        "dest": {"fileName": "files/out-1"},
        "updateTime": "2026-01-01T09:00:00+09:00",
    }
    assert from_batch_job(job) == OpEvent(
        "batches/b1",
        State.SUCCEEDED,
        T0,
        Source.POLL,
        {"output_file_uri": "files/out-1", "display_name": "nightly"},
    )


def test_batch_job_without_update_time_has_time_zero() -> None:
    assert from_batch_job({"name": "batches/b1", "state": "JOB_STATE_RUNNING"}).update_time_ns == 0


def test_batch_job_state_text_is_case_insensitive() -> None:
    assert from_batch_job({"name": "b1", "state": "job_state_running"}).state is State.RUNNING


@pytest.mark.parametrize(
    "job",
    [
        {"name": "batches/b1"},
        {"name": "batches/b1", "state": None},
        {"name": "batches/b1", "state": "JOB_STATE_NEWTHING"},
        {"name": "batches/b1", "state": "RUNNING_SOMEHOW"},
        {"name": "batches/b1", "state": ""},
        SimpleNamespace(name="batches/b1", state="JOB_STATE_UNSPECIFIED", update_time=None),
    ],
)
def test_batch_job_unknown_states_are_dropped(job: Any) -> None:
    with pytest.raises(UnsupportedEventError) as info:
        from_batch_job(job)
    assert info.value.reason == UNKNOWN_STATE


def test_google_genai_unknown_job_state_is_dropped() -> None:
    from google.genai import types

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        future = types.JobState("JOB_STATE_SOMETHING_NEW")
    with pytest.raises(UnsupportedEventError) as info:
        from_batch_job(SimpleNamespace(name="batches/b1", state=future))
    assert info.value.reason == UNKNOWN_STATE
    assert "JOB_STATE_SOMETHING_NEW" in str(info.value)


@pytest.mark.parametrize(
    ("job", "code"),
    [
        ({"state": "JOB_STATE_RUNNING"}, "missing-field"),
        ({"name": None, "state": "JOB_STATE_RUNNING"}, "missing-field"),
        ({"name": "batches//b1", "state": "JOB_STATE_RUNNING"}, "invalid-name"),
        ({"name": "", "state": "JOB_STATE_RUNNING"}, "invalid-name"),
        ({"name": "b1", "state": "JOB_STATE_RUNNING", "updateTime": "soon"}, "invalid-time"),
        # (A naive datetime from the SDK is UTC since issue 24: tests/unit/test_input_edges.py.)
        ({"name": "b1", "state": "JOB_STATE_RUNNING", "updateTime": 17}, "invalid-time"),
    ],
)
def test_malformed_batch_jobs(job: dict[str, Any], code: str) -> None:
    with pytest.raises(InvalidEventError) as info:
        from_batch_job(job)
    assert info.value.code == code


# ---------------------------------------------------------------- long-running operations


@pytest.mark.parametrize(
    ("op", "state", "details"),
    [
        ({"name": VEO}, State.RUNNING, {}),
        ({"name": VEO, "done": False}, State.RUNNING, {}),
        ({"name": VEO, "done": None}, State.RUNNING, {}),
        (
            {"name": VEO, "done": True, "error": {"code": 1, "message": "cancelled by user"}},
            State.CANCELLED,
            {"error_code": 1, "error_message": "cancelled by user"},
        ),
        (
            {"name": VEO, "done": True, "error": {"code": 13, "message": "internal"}},
            State.FAILED,
            {"error_code": 13, "error_message": "internal"},
        ),
        (
            {"name": VEO, "done": True, "error": {"code": 3}},
            State.FAILED,
            {"error_code": 3},
        ),
        (
            {"name": VEO, "done": True, "error": {"message": "?"}},
            State.FAILED,
            {"error_message": "?"},
        ),
        (
            {
                "name": VEO,
                "done": True,
                "response": {
                    "generateVideoResponse": {
                        "generatedSamples": [{"video": {"uri": "https://example.invalid/v.mp4"}}]
                    }
                },
            },
            State.SUCCEEDED,
            {"video_uri": "https://example.invalid/v.mp4"},
        ),
        (
            {
                "name": VEO,
                "done": True,
                "response": {"generated_videos": [{"video": {"uri": "files/v1"}}]},
            },
            State.SUCCEEDED,
            {"video_uri": "files/v1"},
        ),
        ({"name": VEO, "done": True, "response": {}}, State.SUCCEEDED, {}),
        ({"name": VEO, "done": True}, State.SUCCEEDED, {}),
        # an error wins over a response
        (
            {"name": VEO, "done": True, "error": {"code": 1}, "response": {}},
            State.CANCELLED,
            {"error_code": 1},
        ),
        # a running operation's error is not read
        ({"name": VEO, "done": False, "error": {"code": 13}}, State.RUNNING, {}),
    ],
)
def test_operation_mapping(op: dict[str, Any], state: State, details: dict[str, Any]) -> None:
    event = from_operation(op)
    assert event == OpEvent(VEO_KEY, state, 0, Source.POLL, {**MODEL, **details})
    assert event.kind is Kind.VIDEO


def test_operation_update_time_comes_from_metadata() -> None:
    op = {"name": "fileSearchStores/s/operations/o", "metadata": {"updateTime": TS}}
    event = from_operation(op)
    assert event.update_time_ns == T0
    assert event.kind is Kind.FILE_SEARCH_IMPORT
    assert from_operation({"name": VEO, "metadata": {"update_time": TS}}).update_time_ns == T0
    assert from_operation({"name": VEO, "metadata": {"other": 1}}).update_time_ns == 0


def test_operation_name_spellings() -> None:
    url = f"https://generativelanguage.googleapis.com/v1beta/{VEO}?alt=json"
    assert from_operation({"name": url}).name == VEO_KEY


def test_google_genai_generate_videos_operation() -> None:
    from google.genai import types

    ops = types.GenerateVideosOperation
    running = ops.model_validate({"name": VEO})
    assert from_operation(running) == OpEvent(VEO_KEY, State.RUNNING, 0, Source.POLL, MODEL)
    done = ops.model_validate(
        {
            "name": VEO,
            "done": True,
            "response": {"generated_videos": [{"video": {"uri": "files/video-1"}}]},
        }
    )
    assert isinstance(done.response, types.GenerateVideosResponse)
    assert from_operation(done) == OpEvent(
        VEO_KEY, State.SUCCEEDED, 0, Source.POLL, {**MODEL, "video_uri": "files/video-1"}
    )
    cancelled = ops.model_validate(
        {"name": VEO, "done": True, "error": {"code": 1, "message": "CANCELLED"}}
    )
    assert from_operation(cancelled).state is State.CANCELLED
    failed = ops.model_validate({"name": VEO, "done": True, "error": {"code": 8}})
    assert from_operation(failed).state is State.FAILED


@pytest.mark.parametrize(
    ("op", "code"),
    [
        ({"done": True}, "missing-field"),
        ({"name": "abc123", "done": True}, "invalid-name"),
        ({"name": VEO, "metadata": {"updateTime": "later"}}, "invalid-time"),
    ],
)
def test_malformed_operations(op: dict[str, Any], code: str) -> None:
    with pytest.raises(InvalidEventError) as info:
        from_operation(op)
    assert info.value.code == code


# ---------------------------------------------------------------- interactions


@pytest.mark.parametrize(
    ("status", "state"),
    [
        ("queued", State.PENDING),
        ("in_progress", State.RUNNING),
        ("requires_action", State.REQUIRES_ACTION),
        ("completed", State.SUCCEEDED),
        ("failed", State.FAILED),
        ("cancelled", State.CANCELLED),
        ("COMPLETED", State.SUCCEEDED),
    ],
)
def test_interaction_statuses(status: str, state: State) -> None:
    event = from_interaction({"id": "int_1", "status": status, "updated": TS})
    assert event == OpEvent("interactions/int_1", state, T0, Source.POLL, {})
    assert event.kind is Kind.INTERACTION


@pytest.mark.parametrize(
    ("status", "state"),
    [
        ("idle", State.REQUIRES_ACTION),
        ("requires_continuation", State.REQUIRES_ACTION),
        ("incomplete", State.FAILED),
        ("budget_exceeded", State.FAILED),
    ],
)
def test_interaction_statuses_that_keep_their_reason(status: str, state: State) -> None:
    event = from_interaction({"id": "int_1", "status": status, "updated": TS})
    assert event == OpEvent("interactions/int_1", state, T0, Source.POLL, {"reason": status})
    assert event.kind is Kind.INTERACTION


def test_interaction_table() -> None:
    assert INTERACTION_STATUSES == {
        "queued": State.PENDING,
        "in_progress": State.RUNNING,
        "requires_action": State.REQUIRES_ACTION,
        "idle": State.REQUIRES_ACTION,
        "requires_continuation": State.REQUIRES_ACTION,
        "completed": State.SUCCEEDED,
        "failed": State.FAILED,
        "incomplete": State.FAILED,
        "budget_exceeded": State.FAILED,
        "cancelled": State.CANCELLED,
    }


def test_interaction_object_form() -> None:
    obj = SimpleNamespace(id="interactions/int_1", status="in_progress", updated=None)
    assert from_interaction(obj) == OpEvent("interactions/int_1", State.RUNNING, 0, Source.POLL, {})
    obj2 = SimpleNamespace(id="int_1", status="completed", updated=datetime(2026, 1, 1, tzinfo=UTC))
    assert from_interaction(obj2).update_time_ns == T0


@pytest.mark.parametrize(
    "obj",
    [
        {"id": "int_1", "status": "interaction_status_unspecified"},
        {"id": "int_1", "status": "done"},
        {"id": "int_1", "status": ""},
        {"id": "int_1"},
    ],
)
def test_interaction_unknown_statuses_are_dropped(obj: dict[str, Any]) -> None:
    with pytest.raises(UnsupportedEventError) as info:
        from_interaction(obj)
    assert info.value.reason == UNKNOWN_STATE


@pytest.mark.parametrize(
    ("obj", "code"),
    [
        ({"status": "completed"}, "missing-field"),
        ({"id": "a/../b", "status": "completed"}, "invalid-name"),
        ({"id": "int_1", "status": "completed", "updated": "2026-02-30T00:00:00Z"}, "invalid-time"),
    ],
)
def test_malformed_interactions(obj: dict[str, Any], code: str) -> None:
    with pytest.raises(InvalidEventError) as info:
        from_interaction(obj)
    assert info.value.code == code


# ---------------------------------------------------------------- reports


NOW = T0 + 42


@pytest.mark.parametrize("body", [None, {}, {"details": None}])
def test_report_without_state_means_track_this_job(body: dict[str, Any] | None) -> None:
    assert from_report("batches/b1", body, now_ns=NOW) == OpEvent(
        "batches/b1", State.PENDING, NOW, Source.REPORT, {}
    )


@pytest.mark.parametrize(
    ("body", "state", "time_ns", "details"),
    [
        ({"state": "RUNNING"}, State.RUNNING, NOW, {}),
        ({"state": "succeeded", "updateTime": TS}, State.SUCCEEDED, T0, {}),
        (
            {"state": "REQUIRES_ACTION", "updateTime": "2026-01-01T09:00:00.5+09:00"},
            State.REQUIRES_ACTION,
            T0 + 500_000_000,
            {},
        ),
        (
            {"state": "FAILED", "details": {"why": "oom", "n": [1, 2]}},
            State.FAILED,
            NOW,
            {"why": "oom", "n": [1, 2]},
        ),
        ({"updateTime": TS}, State.PENDING, T0, {}),
        ({"state": "CANCELLED", "extra": "ignored"}, State.CANCELLED, NOW, {}),
    ],
)
def test_report_bodies(
    body: dict[str, Any], state: State, time_ns: int, details: dict[str, Any]
) -> None:
    event = from_report("batches/b1", body, now_ns=NOW)
    assert event == OpEvent("batches/b1", state, time_ns, Source.REPORT, details)
    assert event.source == "report"


def test_report_names_and_kind_hint() -> None:
    assert from_report("/v1beta/batches/b1:cancel", None, now_ns=NOW).name == "batches/b1"
    assert from_report("b1", None, now_ns=NOW, kind_hint=Kind.BATCH).name == "batches/b1"
    assert from_report(VEO, None, now_ns=NOW).kind is Kind.VIDEO


def test_report_details_are_copied() -> None:
    details = {"a": 1}
    event = from_report("batches/b1", {"details": details}, now_ns=NOW)
    details["a"] = 2
    assert event.details == {"a": 1}


@pytest.mark.parametrize("state", ["DONE", "JOB_STATE_RUNNING", "canceled", ""])
def test_report_unknown_state_is_dropped(state: str) -> None:
    with pytest.raises(UnsupportedEventError) as info:
        from_report("batches/b1", {"state": state}, now_ns=NOW)
    assert info.value.reason == UNKNOWN_STATE


@pytest.mark.parametrize(
    ("name", "body", "code"),
    [
        ("batches/b1", ["RUNNING"], "invalid-body"),
        ("batches/b1", "RUNNING", "invalid-body"),
        ("batches/b1", {"state": 1}, "invalid-state"),
        ("batches/b1", {"state": ["RUNNING"]}, "invalid-state"),
        ("batches/b1", {"details": "x"}, "invalid-details"),
        ("batches/b1", {"details": [1]}, "invalid-details"),
        ("batches/b1", {"updateTime": "now"}, "invalid-time"),
        ("batches/b1", {"updateTime": 0}, "invalid-time"),
        ("b1", None, "invalid-name"),
        ("batches/b 1", None, "invalid-name"),
        ("", None, "invalid-name"),
    ],
)
def test_malformed_reports(name: str, body: Any, code: str) -> None:
    with pytest.raises(InvalidEventError) as info:
        from_report(name, body, now_ns=NOW)
    assert info.value.code == code


# ---------------------------------------------------------------- the event and its errors


def test_op_event_is_frozen_and_knows_its_kind() -> None:
    event = OpEvent("batches/b1", State.RUNNING, 1, Source.POLL)
    assert event.details == {}
    assert event.kind is Kind.BATCH
    with pytest.raises(dataclasses.FrozenInstanceError):
        event.state = State.FAILED  # type: ignore[misc]


def test_error_hierarchy() -> None:
    assert issubclass(InvalidEventError, EventError)
    assert issubclass(UnsupportedEventError, EventError)
    assert issubclass(EventError, ValueError)
    assert not issubclass(UnsupportedEventError, InvalidEventError)
    assert not issubclass(InvalidEventError, UnsupportedEventError)
    assert {s.value for s in Source} == {"webhook", "poll", "report"}


# ---------------------------------------------------------------- pinned spellings (mutation)


@pytest.mark.parametrize(
    "response",
    [
        {"generatedVideos": [{"video": {"uri": "files/v"}}]},
        {"generatedSamples": [{"video": {"uri": "files/v"}}]},
        {"generated_videos": [{"video": {"uri": "files/v"}}]},
        {"generateVideoResponse": {"generatedSamples": [{"video": {"uri": "files/v"}}]}},
    ],
)
def test_every_spelling_of_a_video_response_gives_its_uri(response: dict[str, Any]) -> None:
    for key in ("response", "result"):  # an operation may carry `result` instead
        event = from_operation({"name": VEO, "done": True, key: response})
        assert event.state is State.SUCCEEDED
        assert event.details == {**MODEL, "video_uri": "files/v"}


@pytest.mark.parametrize("uri", [42, None, ["files/v"], {"u": 1}])
def test_a_video_uri_that_is_not_text_is_not_kept(uri: object) -> None:
    response = {"generatedVideos": [{"video": {"uri": uri}}]}
    assert from_operation({"name": VEO, "done": True, "response": response}).details == MODEL


def test_an_empty_or_videoless_response_has_no_uri() -> None:
    for response in ({"generatedVideos": []}, {"generatedVideos": [{"video": None}]}, {}):
        assert (
            "video_uri"
            not in from_operation({"name": VEO, "done": True, "response": response}).details
        )


@pytest.mark.parametrize("key", ["updated", "update_time", "updateTime"])
def test_interaction_times_under_every_key(key: str) -> None:
    event = from_interaction({"id": "i1", "status": "in_progress", key: TS})
    assert event.update_time_ns == T0


def test_an_interaction_is_identified_by_name_before_id() -> None:
    assert from_interaction({"name": "interactions/n1", "status": "completed"}).name == (
        "interactions/n1"
    )
    assert from_interaction({"name": "n2", "id": "i2", "status": "completed"}).name == (
        "interactions/n2"
    )
    assert from_interaction({"id": "i3", "status": "completed"}).name == "interactions/i3"


# ---------------------------------------------------------------- messages users see in 400s


@pytest.mark.parametrize(
    ("call", "code", "message"),
    [
        (lambda: from_webhook([]), "invalid-body", "the webhook body must be a JSON object"),
        (lambda: from_webhook({}), "missing-field", "the webhook body has no 'type' string"),
        (
            lambda: from_webhook({"type": "batch.succeeded"}),
            "missing-field",
            "the webhook body has no 'data' object",
        ),
        (
            lambda: from_webhook({"type": "batch.succeeded", "data": {}}),
            "missing-field",
            "the webhook 'data' has no 'id' or 'name'",
        ),
        (
            lambda: from_webhook({"type": "batch.succeeded", "timestamp": 5, "data": {"id": "b"}}),
            "invalid-time",
            "invalid time 5: expected RFC3339 text",
        ),
        (
            lambda: from_webhook(
                {"type": "batch.succeeded", "timestamp": "soon", "data": {"id": "b"}}
            ),
            "invalid-time",
            "invalid time 'soon': not an RFC3339 date-time (YYYY-MM-DDTHH:MM:SS[.f]Z|±HH:MM)",
        ),
        (
            lambda: from_batch_job({"state": "JOB_STATE_RUNNING"}),
            "missing-field",
            "no operation name ('name' or 'id')",
        ),
        (
            lambda: from_report("batches/b", {"state": 3}, now_ns=NOW),
            "invalid-state",
            "'state' must be a string, not 3",
        ),
        (
            lambda: from_report("batches/b", {"details": []}, now_ns=NOW),
            "invalid-details",
            "'details' must be a JSON object",
        ),
        (
            lambda: from_report("batches/b", {"details": {"n": 1e300}}, now_ns=NOW),
            "invalid-details",
            "invalid details: $.n: magnitude outside 1e-130 .. 9.99e125",
        ),
        (
            lambda: from_report("batches/b", [], now_ns=NOW),  # type: ignore[arg-type]
            "invalid-body",
            "the report body must be a JSON object",
        ),
    ],
)
def test_refusal_messages(call: Any, code: str, message: str) -> None:
    with pytest.raises(InvalidEventError) as info:
        call()
    assert (info.value.code, info.value.message, str(info.value)) == (code, message, message)


def test_unsupported_messages() -> None:
    with pytest.raises(UnsupportedEventError) as info:
        from_webhook({"type": "batch.paused"})
    assert info.value.reason == "unsupported-event-type"
    assert str(info.value) == "webhook event type 'batch.paused' is not supported"
    with pytest.raises(UnsupportedEventError) as info:
        from_batch_job({"name": "batches/b", "state": "JOB_STATE_UNSPECIFIED"})
    assert str(info.value) == "batch batches/b has unknown state 'JOB_STATE_UNSPECIFIED'"
    with pytest.raises(UnsupportedEventError) as info:
        from_interaction({"id": "i", "status": "dreaming"})
    assert str(info.value) == "interaction interactions/i has unknown status 'dreaming'"


def test_a_batch_without_a_state_says_so() -> None:
    with pytest.raises(UnsupportedEventError) as info:
        from_batch_job({"name": "batches/b"})
    assert (info.value.reason, str(info.value)) == ("unknown-state", "batch batches/b has no state")


def test_an_event_is_an_immutable_value() -> None:
    event = OpEvent("batches/b", State.RUNNING, 1, Source.POLL)
    with pytest.raises(dataclasses.FrozenInstanceError):
        event.state = State.FAILED  # type: ignore[misc]
    assert not hasattr(event, "__dict__")
