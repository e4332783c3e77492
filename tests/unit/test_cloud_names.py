"""Google Cloud (Vertex AI) names: full resource names are keys of their own, with their kind
and backend; a Cloud batch job without its project and location is refused."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from opstate.names import (
    GEMINI_API,
    GOOGLE_CLOUD,
    InvalidNameError,
    Kind,
    api_name,
    backend_of,
    canonical_name,
    cloud_scope,
    kind_of,
    legacy_names,
)

JOB = "projects/p1/locations/us-central1/batchPredictionJobs/1234567890"
VEO = (
    "projects/p1/locations/us-central1/publishers/google/models/veo-3.0-generate-001/operations/op1"
)
HOST = "https://us-central1-aiplatform.googleapis.com"

segment = st.text(
    alphabet=st.sampled_from("abcdefghijklmnopqrstuvwxyz0123456789-_."), min_size=1, max_size=20
).filter(lambda s: s not in (".", ".."))


@pytest.mark.parametrize(
    ("raw", "key", "kind"),
    [
        (JOB, JOB, Kind.BATCH),
        (f"{HOST}/v1/{JOB}", JOB, Kind.BATCH),
        (f"{HOST}/v1beta1/{JOB}:cancel", JOB, Kind.BATCH),
        (f"/v1/{JOB}?alt=json", JOB, Kind.BATCH),
        (VEO, VEO, Kind.VIDEO),
        (f"{HOST}/v1beta1/{VEO}", VEO, Kind.VIDEO),
    ],
)
def test_cloud_spellings_meet_on_the_full_name(raw: str, key: str, kind: Kind) -> None:
    assert canonical_name(raw) == key
    assert canonical_name(raw, Kind.BATCH if kind is Kind.BATCH else Kind.VIDEO) == key
    assert kind_of(key) is kind
    assert backend_of(key) == GOOGLE_CLOUD
    assert cloud_scope(key) == ("p1", "us-central1")


def test_a_cloud_video_key_keeps_its_model_and_is_polled_by_it() -> None:
    # Unlike the Gemini API's models/-/operations/<id>, the model is part of the Cloud key.
    assert api_name(VEO, {}) == VEO
    assert legacy_names(VEO, {"model": "veo-3.0-generate-001"}) == ()


@pytest.mark.parametrize(
    "raw",
    [
        "batchPredictionJobs/1234567890",
        "locations/us-central1/batchPredictionJobs/1",
        "projects/p1/batchPredictionJobs/1",
        "projects/p1/locations/us-central1/batchPredictionJobs",
        f"{HOST}/v1/batchPredictionJobs/1",
        "projects/p1/locations/l/batchPredictionJobs/1/extra",
    ],
)
def test_a_cloud_batch_job_without_its_project_and_location_is_refused(raw: str) -> None:
    with pytest.raises(InvalidNameError, match="ambiguous across projects"):
        canonical_name(raw, Kind.BATCH)


@pytest.mark.parametrize(
    "name",
    [
        "batches/x",
        "batches/1234567890",
        "models/-/operations/x",
        "interactions/i",
        "fileSearchStores/s/operations/o",
        "operations/o",
    ],
)
def test_gemini_api_names_are_gemini_api(name: str) -> None:
    assert backend_of(name) == GEMINI_API
    assert cloud_scope(name) is None


@given(project=segment, location=segment, job=segment)
def test_every_cloud_batch_name_is_its_own_key(project: str, location: str, job: str) -> None:
    name = f"projects/{project}/locations/{location}/batchPredictionJobs/{job}"
    assert canonical_name(name) == name
    assert kind_of(name) is Kind.BATCH
    assert backend_of(name) == GOOGLE_CLOUD
    assert cloud_scope(name) == (project, location)


@given(project=segment, location=segment, model=segment, op=segment)
def test_every_cloud_video_name_is_its_own_key(
    project: str, location: str, model: str, op: str
) -> None:
    name = (
        f"projects/{project}/locations/{location}/publishers/google/models/{model}/operations/{op}"
    )
    assert canonical_name(name) == name
    assert canonical_name(name, Kind.VIDEO) == name
    assert kind_of(name) is Kind.VIDEO
    assert backend_of(name) == GOOGLE_CLOUD
