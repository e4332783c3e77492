"""Google Cloud (Vertex AI) names: full resource names are keys of their own, with their kind
and backend; a Cloud batch job without its project and location is refused; a location in any
case is one key; a project or location outside Google's alphabet is refused."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from opstate.domain.names import (
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
    parse_name,
)

JOB = "projects/p1/locations/us-central1/batchPredictionJobs/1234567890"
VEO = (
    "projects/p1/locations/us-central1/publishers/google/models/veo-3.0-generate-001/operations/op1"
)
HOST = "https://us-central1-aiplatform.googleapis.com"

segment = st.text(
    alphabet=st.sampled_from("abcdefghijklmnopqrstuvwxyz0123456789-_."), min_size=1, max_size=20
).filter(lambda s: s not in (".", ".."))
# Google's alphabet for project and location ids (a project number is digits).
cloud_id = st.text(
    alphabet=st.sampled_from("abcdefghijklmnopqrstuvwxyz0123456789-"), min_size=1, max_size=30
)
# Job, model and operation ids keep whatever case and characters a name may carry.
resource_id = st.text(
    alphabet=st.sampled_from("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_.~"),
    min_size=1,
    max_size=20,
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


@given(project=cloud_id, location=cloud_id, job=resource_id)
def test_every_cloud_batch_name_is_its_own_key(project: str, location: str, job: str) -> None:
    name = f"projects/{project}/locations/{location}/batchPredictionJobs/{job}"
    assert canonical_name(name) == name
    assert kind_of(name) is Kind.BATCH
    assert backend_of(name) == GOOGLE_CLOUD
    assert cloud_scope(name) == (project, location)


@given(project=cloud_id, location=cloud_id, model=resource_id, op=resource_id)
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


# --- one key per location, whatever its case; nothing outside Google's alphabet ------------------


def _recased(text: str, upper: list[bool]) -> str:
    return "".join(c.upper() if up else c for c, up in zip(text, upper, strict=False))


@given(
    project=cloud_id,
    location=cloud_id,
    job=resource_id,
    op=resource_id,
    upper=st.lists(st.booleans(), min_size=30, max_size=30),
)
def test_a_location_in_any_case_is_one_key(
    project: str, location: str, job: str, op: str, upper: list[bool]
) -> None:
    written = _recased(location, upper)
    for resource in (
        f"batchPredictionJobs/{job}",
        f"publishers/google/models/veo-3.0-generate-001/operations/{op}",
    ):
        key = f"projects/{project}/locations/{location}/{resource}"
        raw = f"projects/{project}/locations/{written}/{resource}"
        for spelling in (raw, f"{HOST}/v1/{raw}:cancel", f"/v1beta1/{raw}?alt=json"):
            parsed = parse_name(spelling)
            assert parsed.key == key
            # The key the previous release gave this spelling, for a lookup to fall back to.
            assert parsed.legacy == (() if written == location else (raw,))
        assert cloud_scope(key) == (project, location)


def test_the_issue_s_location_in_capitals_is_the_lowercase_key() -> None:
    parsed = parse_name(JOB.replace("us-central1", "US-CENTRAL1"))
    assert parsed.key == JOB
    assert parsed.legacy == (JOB.replace("us-central1", "US-CENTRAL1"),)
    assert parse_name(JOB).legacy == ()
    assert canonical_name(f"{HOST}/v1/{VEO.replace('us-central1', 'Us-Central1')}") == VEO


def test_only_the_location_changes_case() -> None:
    # Job, model, operation ids and the collection names keep their case.
    raw = "projects/p1/locations/EUROPE-WEST4/publishers/google/models/Veo-X/operations/OpAB"
    assert canonical_name(raw) == (
        "projects/p1/locations/europe-west4/publishers/google/models/Veo-X/operations/OpAB"
    )
    assert canonical_name("projects/123/locations/US/batchPredictionJobs/AbC") == (
        "projects/123/locations/us/batchPredictionJobs/AbC"
    )


_OUTSIDE = st.sampled_from("._~ABCZ")


@given(good=cloud_id, bad=_OUTSIDE, at=st.integers(min_value=0, max_value=30))
def test_a_project_outside_google_s_alphabet_is_refused(good: str, bad: str, at: int) -> None:
    project = good[:at] + bad + good[at:]
    for resource in ("batchPredictionJobs/1", "publishers/google/models/veo-3/operations/o"):
        with pytest.raises(InvalidNameError, match="project id is lowercase letters"):
            canonical_name(f"projects/{project}/locations/us-central1/{resource}")


@given(good=cloud_id, bad=st.sampled_from("._~"), at=st.integers(min_value=0, max_value=30))
def test_a_location_outside_google_s_alphabet_is_refused(good: str, bad: str, at: int) -> None:
    location = good[:at] + bad + good[at:]
    if location in (".", ".."):
        return  # refused earlier, as a path segment
    for resource in ("batchPredictionJobs/1", "publishers/google/models/veo-3/operations/o"):
        with pytest.raises(InvalidNameError, match="location is letters, digits and hyphens"):
            canonical_name(f"projects/p1/locations/{location}/{resource}")


@pytest.mark.parametrize(
    ("raw", "why"),
    [
        # The issue's spelling: the fragment cut the name to a location that is no location.
        (
            "projects/p1/locations/evil.example#/batchPredictionJobs/1",
            "location is letters, digits and hyphens",
        ),
        (
            f"{HOST}/v1/projects/p1/locations/evil.example#/batchPredictionJobs/1",
            "location is letters, digits and hyphens",
        ),
        # A valid location, but what is left names no resource.
        ("projects/p1/locations/us-central1#/batchPredictionJobs/1", "must be a batch job"),
        ("projects/p1/locations/us-central1?/batchPredictionJobs/1", "must be a batch job"),
        ("projects/p1/locations/us-central1/endpoints/e1", "must be a batch job"),
        ("projects/p1/locations/us-central1/operations/o1", "must be a batch job"),
        (
            "projects/p1/locations/us-central1/publishers/google/models/veo-3/operations",
            "must be a batch job",
        ),
        ("projects/p1", "starts 'projects/<project>/locations/<location>/'"),
        ("projects/p1/regions/us-central1/x/y", "starts 'projects/<project>/locations/"),
        ("projects/My-Project/locations/us-central1/batchPredictionJobs/1", "project id"),
        ("projects/p_1/locations/us-central1/batchPredictionJobs/1", "project id"),
        ("projects/p1/locations/us_central1/batchPredictionJobs/1", "location is"),
        ("projects/p1/locations/us~central1/batchPredictionJobs/1", "location is"),
    ],
)
def test_a_google_cloud_name_that_is_no_resource_is_refused(raw: str, why: str) -> None:
    with pytest.raises(InvalidNameError, match=why) as info:
        canonical_name(raw)
    assert str(info.value).startswith("invalid operation name")
    with pytest.raises(InvalidNameError):
        canonical_name(raw, Kind.BATCH)


@given(name=resource_id, upper=st.lists(st.booleans(), min_size=20, max_size=20))
def test_gemini_api_names_keep_their_case_and_have_no_legacy_key(
    name: str, upper: list[bool]
) -> None:
    written = _recased(name, upper)
    for raw in (f"batches/{written}", f"interactions/{written}", f"operations/{written}"):
        parsed = parse_name(raw)
        assert parsed.key == raw and parsed.legacy == ()
