"""Google Cloud batch prediction jobs and Veo operations through the same normalisers: states
exactly as the Gemini API's, the results pointer and completion counts kept in details.

The jobs are what google-genai 3.6.1 itself makes of the REST answers in enterprise mode
(``_BatchJob_from_vertex`` then ``BatchJob._from_response``), and the mapping forms."""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from opstate.domain.events import (
    COMPLETION_STATS,
    OUTPUT_LOCATION,
    InvalidEventError,
    Source,
    UnsupportedEventError,
    from_batch_job,
    from_operation,
    from_pubsub,
)
from opstate.domain.names import Kind, kind_of
from opstate.domain.states import State
from opstate.domain.times import parse_time
from tests.support.fake_gemini import operation_resource
from tests.support.fake_google_cloud import cloud_batch_resource, cloud_video_response
from tests.unit.test_events import JOB_TABLE

JOB = "projects/p1/locations/us-central1/batchPredictionJobs/123"
VEO = (
    "projects/p1/locations/us-central1/publishers/google/models/veo-3.0-generate-001/operations/o1"
)
TS = "2026-05-01T10:00:00Z"


def sdk_job(body: dict[str, Any]) -> Any:
    from google.genai import batches, types

    return types.BatchJob._from_response(response=batches._BatchJob_from_vertex(body), kwargs={})


def sdk_video(body: dict[str, Any]) -> Any:
    from google.genai import types

    return types.GenerateVideosOperation(name=VEO).from_api_response(body, is_vertex_ai=True)


@pytest.mark.parametrize(("suffix", "state", "extra"), JOB_TABLE)
@pytest.mark.parametrize("form", ["sdk", "mapping"])
def test_cloud_job_states_map_exactly_as_the_gemini_api_s(
    suffix: str, state: State | None, extra: dict[str, Any], form: str
) -> None:
    body = cloud_batch_resource(JOB, suffix, update_time=TS)
    job = sdk_job(body) if form == "sdk" else body
    gemini = {"name": "batches/b1", "state": f"JOB_STATE_{suffix}", "updateTime": TS}
    if state is None:
        with pytest.raises(UnsupportedEventError):
            from_batch_job(job)
        return
    event = from_batch_job(job)
    twin = from_batch_job(gemini)
    assert (event.name, event.state, event.update_time_ns, event.source) == (
        JOB,
        state,
        parse_time(TS),
        Source.POLL,
    )
    assert dict(event.details) == dict(twin.details) == extra
    assert kind_of(event.name) is Kind.BATCH


@pytest.mark.parametrize("form", ["sdk", "mapping"])
def test_partially_succeeded_is_terminal_with_partial_and_keeps_location_and_counts(
    form: str,
) -> None:
    body = cloud_batch_resource(
        JOB,
        "PARTIALLY_SUCCEEDED",
        gcs_output_directory="gs://bucket/out/prediction-model-2026",
        completion_stats={"successfulCount": 7, "failedCount": 2, "incompleteCount": 1},
        display_name="nightly",
    )
    event = from_batch_job(sdk_job(body) if form == "sdk" else body)
    assert event.state is State.SUCCEEDED
    assert dict(event.details) == {
        "partial": True,
        "display_name": "nightly",
        OUTPUT_LOCATION: "gs://bucket/out/prediction-model-2026",
        COMPLETION_STATS: {"successful_count": 7, "failed_count": 2, "incomplete_count": 1},
    }


@pytest.mark.parametrize("form", ["sdk", "mapping"])
def test_a_bigquery_output_table_is_the_output_location(form: str) -> None:
    table = "bq://proj.dataset.predictions_2026_05_01T10_00_00_000Z"
    body = cloud_batch_resource(JOB, "SUCCEEDED", bigquery_output_table=table)
    event = from_batch_job(sdk_job(body) if form == "sdk" else body)
    assert event.details[OUTPUT_LOCATION] == table
    assert COMPLETION_STATS not in event.details


def test_a_failed_cloud_job_keeps_its_error() -> None:
    body = cloud_batch_resource(JOB, "FAILED", error={"code": 3, "message": "bad input"})
    event = from_batch_job(sdk_job(body))
    assert (event.state, event.details["error_code"], event.details["error_message"]) == (
        State.FAILED,
        3,
        "bad input",
    )


@pytest.mark.parametrize(
    "stats", [{"successfulCount": "x"}, {"successfulCount": True}, {"successfulCount": "-1"}, {}]
)
def test_unusable_counts_are_left_out(stats: dict[str, Any]) -> None:
    body = cloud_batch_resource(JOB, "RUNNING")
    body["completionStats"] = stats
    assert COMPLETION_STATS not in from_batch_job(body).details


def test_gemini_api_jobs_carry_no_cloud_details() -> None:
    event = from_batch_job({"name": "batches/b", "state": "JOB_STATE_SUCCEEDED"})
    assert OUTPUT_LOCATION not in event.details and COMPLETION_STATS not in event.details


@pytest.mark.parametrize(
    ("body", "state", "details"),
    [
        (operation_resource(VEO), State.RUNNING, {}),
        (
            operation_resource(VEO, done=True, response=cloud_video_response("gs://b/v.mp4")),
            State.SUCCEEDED,
            {"video_uri": "gs://b/v.mp4"},
        ),
        (
            operation_resource(VEO, done=True, error_code=1, error_message="cancelled"),
            State.CANCELLED,
            {"error_code": 1, "error_message": "cancelled"},
        ),
        (
            operation_resource(VEO, done=True, error_code=3, error_message="blocked"),
            State.FAILED,
            {"error_code": 3, "error_message": "blocked"},
        ),
    ],
)
@pytest.mark.parametrize("form", ["sdk", "mapping"])
def test_cloud_veo_operations(
    body: dict[str, Any], state: State, details: dict[str, Any], form: str
) -> None:
    event = from_operation(sdk_video(body) if form == "sdk" else body)
    assert (event.name, event.state, dict(event.details)) == (VEO, state, details)
    assert kind_of(event.name) is Kind.VIDEO


@given(data=st.binary(max_size=200), publish=st.one_of(st.none(), st.text(max_size=30)))
def test_any_pubsub_data_is_an_operation_or_one_clear_refusal(
    data: bytes, publish: str | None
) -> None:
    envelope = {"message": {"data": base64.b64encode(data).decode(), "publishTime": publish}}
    try:
        event = from_pubsub(envelope)
    except InvalidEventError as exc:
        assert exc.code in {"invalid-body", "invalid-name", "missing-field", "invalid-time"}
    else:  # pragma: no cover - random bytes are almost never an operation
        assert kind_of(event.name) is Kind.VIDEO


def test_a_pubsub_operation_takes_the_publish_time_when_it_has_none() -> None:
    op = json.dumps({"name": VEO, "done": True, "response": cloud_video_response("gs://a")})
    envelope = {
        "message": {"data": base64.b64encode(op.encode()).decode(), "publishTime": TS},
        "subscription": "projects/p1/subscriptions/s",
    }
    event = from_pubsub(envelope)
    assert (event.name, event.state, event.update_time_ns, event.source) == (
        VEO,
        State.SUCCEEDED,
        parse_time(TS),
        Source.WEBHOOK,
    )
    assert event.details == {"video_uri": "gs://a"}
