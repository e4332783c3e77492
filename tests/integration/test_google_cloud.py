"""Google Cloud (Vertex AI) through the real google-genai client in enterprise mode, against
the fake's Cloud endpoints, with google-auth really signing and exchanging credentials."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from opstate.config import Settings
from opstate.domain.events import COMPLETION_STATS, OUTPUT_LOCATION, from_report
from opstate.domain.model import OpRecord
from opstate.domain.names import Kind
from opstate.domain.states import State
from opstate.domain.times import parse_time
from opstate.domain.views import record_to_json
from opstate.gemini.client import make_client
from opstate.ingest import ingest
from opstate.observability import metrics
from opstate.reconcile.cloud_credentials import CredentialsError, load_credentials
from opstate.reconcile.cloud_gateway import GoogleCloudGateway
from opstate.reconcile.gateway import AuthError
from opstate.reconcile.genai_gateway import GenaiGateway
from opstate.reconcile.pacing import SYSTEM_CLOCK, Backoff, Clock, SystemClock
from opstate.reconcile.run import reconcile_once
from opstate.store import MemoryStore
from tests.support.fake_gemini import FakeGemini, operation_resource
from tests.support.fake_google_cloud import (
    JWT_BEARER,
    TOKEN_EXCHANGE,
    GoogleCloudSide,
    cloud_batch_resource,
    cloud_video_response,
    loopback_allowed,
)

SCOPE = ("p1", "us-central1")
JOBS = "projects/p1/locations/us-central1/batchPredictionJobs"
VEO = (
    "projects/p1/locations/us-central1/publishers/google/models/veo-3.0-generate-001/operations/op1"
)
FAST = Backoff(base_s=0.01, max_s=0.05, trip_after=24)
T0 = "2026-05-01T09:30:00Z"
NOW_NS = parse_time("2026-05-02T00:00:00Z")


@pytest.fixture
def cloud(fake_gemini: FakeGemini, monkeypatch: pytest.MonkeyPatch) -> GoogleCloudSide:
    # The SDK reads both base URLs itself; neither client is given one.
    monkeypatch.setenv("GOOGLE_VERTEX_BASE_URL", fake_gemini.base_url)
    monkeypatch.setenv("GOOGLE_GEMINI_BASE_URL", fake_gemini.base_url)
    for name in ("GOOGLE_API_KEY", "GOOGLE_CLOUD_PROJECT", "GOOGLE_CLOUD_LOCATION"):
        monkeypatch.delenv(name, raising=False)
    return GoogleCloudSide(fake_gemini)


@pytest.fixture
def key_file(cloud: GoogleCloudSide, tmp_path: Path) -> Path:
    path = tmp_path / "sa.json"
    path.write_text(json.dumps(cloud.service_account_info()))
    return path


@pytest.fixture(autouse=True)
def fresh_metrics() -> Iterator[None]:
    metrics.clear_metrics()
    yield
    metrics.clear_metrics()


def settings(**overrides: Any) -> Settings:
    base = Settings(
        store_url="memory://",
        gemini_api_key="test-key",
        reconcile_workers=4,
        reconcile_max_pages=0,
        reconcile_http_timeout_s=2.0,
    )
    return replace(base, **overrides)


class _Later(SystemClock):
    """The real clock, a day ahead on the wall (the next runs' view of what is due)."""

    def now_ns(self) -> int:
        return time.time_ns() + 86_400 * 10**9


def run(
    store: MemoryStore, s: Settings, cloud: GoogleCloudGateway | None, clock: Clock = SYSTEM_CLOCK
) -> Any:
    gemini = GenaiGateway(make_client(s))
    try:
        return reconcile_once(store, gemini, settings=s, backoff=FAST, cloud=cloud, clock=clock)
    finally:
        gemini.close()
        if cloud is not None:
            cloud.close()


def track(store: MemoryStore, name: str) -> OpRecord:
    decision = ingest(store, from_report(name, {"updateTime": T0}, now_ns=NOW_NS))
    assert decision.applied and decision.record is not None
    return decision.record


def metric_values(name: str) -> list[float]:
    entry = metrics.metric_set.get(name)
    return list(entry["Value"]) if entry else []


def cloud_hits(fake: FakeGemini) -> list[str]:
    return [r.name for r in fake.requests if r.name.startswith("projects/")]


CLOUD_STATES = [
    ("JOB_STATE_QUEUED", State.PENDING, {}),
    ("JOB_STATE_PENDING", State.PENDING, {}),
    ("JOB_STATE_RUNNING", State.RUNNING, {"paused": False, "cancelling": False}),
    ("JOB_STATE_UPDATING", State.RUNNING, {"paused": False, "cancelling": False}),
    ("JOB_STATE_PAUSED", State.RUNNING, {"paused": True, "cancelling": False}),
    ("JOB_STATE_CANCELLING", State.RUNNING, {"paused": False, "cancelling": True}),
    ("JOB_STATE_SUCCEEDED", State.SUCCEEDED, {}),
    ("JOB_STATE_PARTIALLY_SUCCEEDED", State.SUCCEEDED, {"partial": True}),
    ("JOB_STATE_FAILED", State.FAILED, {}),
    ("JOB_STATE_EXPIRED", State.FAILED, {"reason": "expired"}),
    ("JOB_STATE_CANCELLED", State.CANCELLED, {}),
]


@pytest.mark.parametrize(("cloud_state", "state", "flags"), CLOUD_STATES)
def test_a_tracked_cloud_job_is_recorded_as_the_fake_says(
    fake_gemini: FakeGemini,
    cloud: GoogleCloudSide,
    key_file: Path,
    cloud_state: str,
    state: State,
    flags: dict[str, Any],
) -> None:
    name = f"{JOBS}/42"
    fake_gemini.put(
        name,
        cloud_batch_resource(
            name,
            cloud_state,
            update_time="2026-05-01T10:00:00Z",
            gcs_output_directory="gs://out/prediction-2026",
            completion_stats={"successfulCount": 8, "failedCount": 1, "incompleteCount": 1},
        ),
    )
    store = MemoryStore()
    track(store, name)
    s = settings(google_application_credentials=str(key_file))
    result = run(store, s, GoogleCloudGateway(s))
    assert result.polled == 1 and result.errors == 0
    stored = store.get(name)
    assert stored is not None
    view = record_to_json(stored)
    assert (view["state"], view["kind"], view["backend"]) == (str(state), "batch", "google-cloud")
    assert view["updateTime"] == "2026-05-01T10:00:00.000000000Z"
    assert view["details"] == {
        **flags,
        OUTPUT_LOCATION: "gs://out/prediction-2026",
        COMPLETION_STATS: {"successful_count": 8, "failed_count": 1, "incomplete_count": 1},
    }
    # google-auth signed a JWT with the key and exchanged it once; every call carried it.
    assert cloud.token_requests == [JWT_BEARER]
    assert cloud_hits(fake_gemini) == [name]


def test_discovery_lists_each_configured_scope_a_bounded_number_of_pages(
    fake_gemini: FakeGemini, cloud: GoogleCloudSide, key_file: Path
) -> None:
    for n in range(250):
        fake_gemini.put(f"{JOBS}/{n:04d}", cloud_batch_resource(f"{JOBS}/{n:04d}", "RUNNING"))
    other = "projects/p2/locations/europe-west4/batchPredictionJobs/7"
    fake_gemini.put(other, cloud_batch_resource(other, "SUCCEEDED", bigquery_output_table="bq://t"))
    store = MemoryStore()
    s = settings(
        google_application_credentials=str(key_file),
        google_cloud_scopes=(SCOPE, ("p2", "europe-west4")),
        reconcile_max_pages=2,
    )
    result = run(store, s, GoogleCloudGateway(s))
    # Two pages of 100 in p1 (newest first as the fake lists them), then p2's one job.
    assert result.discovered == 201
    assert store.get(f"{JOBS}/0249") is not None and store.get(f"{JOBS}/0049") is None
    found = store.get(other)
    assert found is not None and found.state is State.SUCCEEDED
    assert found.details[OUTPUT_LOCATION] == "bq://t"
    assert found.kind is Kind.BATCH


def test_a_veo_cloud_operation_is_followed_to_succeeded_by_polling(
    fake_gemini: FakeGemini, cloud: GoogleCloudSide, key_file: Path
) -> None:
    store = MemoryStore()
    track(store, VEO)
    s = settings(google_application_credentials=str(key_file))
    fake_gemini.put(VEO, operation_resource(VEO))
    assert run(store, s, GoogleCloudGateway(s)).polled == 1
    running = store.get(VEO)
    assert running is not None and running.state is State.RUNNING
    done = operation_resource(VEO, done=True, response=cloud_video_response("gs://v/out.mp4"))
    fake_gemini.put(VEO, done)
    # The next run, once the record is due again (a day later on the wall clock).
    assert run(store, s, GoogleCloudGateway(s), clock=_Later()).polled == 1
    final = store.get(VEO)
    assert final is not None and final.state is State.SUCCEEDED
    assert final.kind is Kind.VIDEO and final.details["video_uri"] == "gs://v/out.mp4"
    posts = [r for r in fake_gemini.requests if r.verb == "fetchPredictOperation"]
    assert posts and all(r.body == {"operationName": VEO} for r in posts)
    assert {r.name for r in posts} == {VEO.rpartition("/operations/")[0]}


def test_a_refused_credential_is_one_error_and_one_metric_and_the_gemini_api_goes_on(
    fake_gemini: FakeGemini,
    cloud: GoogleCloudSide,
    key_file: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    cloud.refuse = True
    store = MemoryStore()
    for n in range(5):
        track(store, f"{JOBS}/{n}")
        fake_gemini.put(f"{JOBS}/{n}", cloud_batch_resource(f"{JOBS}/{n}", "SUCCEEDED"))
    track(store, "batches/g1")
    fake_gemini.put_batch("batches/g1", "BATCH_STATE_SUCCEEDED")
    s = settings(google_application_credentials=str(key_file), google_cloud_scopes=(SCOPE,))
    with caplog.at_level(logging.ERROR):
        result = run(store, s, GoogleCloudGateway(s))
    refusals = [r for r in caplog.records if "credentials refused" in r.getMessage()]
    assert len(refusals) == 1
    assert metric_values("GoogleCloudAuthFailed") == [1.0]
    assert cloud.token_requests == [JWT_BEARER]  # asked once, never in a loop
    assert cloud_hits(fake_gemini) == []
    gemini = store.get("batches/g1")
    assert gemini is not None and gemini.state is State.SUCCEEDED
    for n in range(5):
        still = store.get(f"{JOBS}/{n}")
        assert still is not None and still.state is State.PENDING
    assert result.errors >= 1
    text = "\n".join(r.getMessage() + str(r.__dict__) for r in caplog.records)
    assert "PRIVATE KEY" not in text


def test_without_cloud_configuration_no_cloud_request_is_made(
    fake_gemini: FakeGemini, cloud: GoogleCloudSide, caplog: pytest.LogCaptureFixture
) -> None:
    store = MemoryStore()
    track(store, f"{JOBS}/1")
    track(store, "batches/g1")
    fake_gemini.put_batch("batches/g1", "BATCH_STATE_RUNNING")
    s = settings()
    assert not s.google_cloud_configured
    with caplog.at_level(logging.ERROR):
        run(store, s, None)
    assert cloud_hits(fake_gemini) == [] and cloud.token_requests == []
    assert any("not configured" in r.getMessage() + str(r.__dict__) for r in caplog.records)
    gemini = store.get("batches/g1")
    assert gemini is not None and gemini.state is State.RUNNING


def test_workload_identity_federation_from_aws(
    fake_gemini: FakeGemini,
    cloud: GoogleCloudSide,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """google-auth signs GetCallerIdentity with the role's AWS credentials (Lambda's env) and
    exchanges it at STS, then impersonates the service account: no Google key anywhere. The
    fake's STS is on 127.0.0.1, admitted only by the tests' loopback switch."""
    monkeypatch.setenv("AWS_REGION", "eu-west-1")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "ASIATESTTESTTESTTEST")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "test-secret-key")
    monkeypatch.setenv("AWS_SESSION_TOKEN", "test-session-token")
    path = tmp_path / "wif.json"
    path.write_text(json.dumps(cloud.external_account_info("opstate@p1.iam.gserviceaccount.com")))
    name = f"{JOBS}/9"
    fake_gemini.put(name, cloud_batch_resource(name, "SUCCEEDED"))
    store = MemoryStore()
    track(store, name)
    s = settings(google_application_credentials=str(path))
    with loopback_allowed(fake_gemini):
        assert run(store, s, GoogleCloudGateway(s)).errors == 0
    found = store.get(name)
    assert found is not None and found.state is State.SUCCEEDED
    assert cloud.token_requests == [TOKEN_EXCHANGE]
    impersonations = [r for r in fake_gemini.requests if r.verb == "generateAccessToken"]
    assert len(impersonations) == 1


def test_credentials_from_secrets_manager(
    cloud: GoogleCloudSide, monkeypatch: pytest.MonkeyPatch
) -> None:
    import boto3
    from moto import mock_aws

    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    with mock_aws():
        sm = boto3.client("secretsmanager", region_name="us-east-1")
        empty = sm.create_secret(Name="google-empty")["ARN"]  # as the template creates it
        full = sm.create_secret(
            Name="google-sa", SecretString=json.dumps(cloud.service_account_info())
        )["ARN"]
        with pytest.raises(CredentialsError, match="no value until you put-secret-value") as info:
            load_credentials(settings(google_credentials_secret_arn=empty, secrets_cache_s=0))
        assert "PRIVATE KEY" not in str(info.value)
        credentials = load_credentials(settings(google_credentials_secret_arn=full))
        assert credentials.service_account_email == "opstate@p1.iam.gserviceaccount.com"
        gateway = GoogleCloudGateway(settings(google_credentials_secret_arn=empty))
        with pytest.raises(AuthError):
            gateway.fetch(track(MemoryStore(), f"{JOBS}/1"))
        gateway.close()


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("", "is empty"),
        ("not json", "is not JSON"),
        ("[1]", "not a JSON object"),
        ('{"type": "authorized_user"}', "has type 'authorized_user'"),
        ('{"type": "service_account"}', "is not usable credentials"),
    ],
)
def test_unusable_credential_files_are_one_clear_error(
    tmp_path: Path, text: str, match: str
) -> None:
    path = tmp_path / "creds.json"
    path.write_text(text)
    with pytest.raises(CredentialsError, match=match):
        load_credentials(settings(google_application_credentials=str(path)))


def test_a_cloud_only_deployment_needs_no_gemini_api_key(
    fake_gemini: FakeGemini,
    cloud: GoogleCloudSide,
    key_file: Path,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    from opstate.config import ConfigError
    from opstate.store.sqlite import SQLiteStore
    from opstate.wiring.reconcile import run_from_settings

    name = f"{JOBS}/5"
    fake_gemini.put(name, cloud_batch_resource(name, "SUCCEEDED"))
    db = tmp_path / "ops.db"
    s = settings(
        store_url=f"sqlite:///{db}",
        gemini_api_key=None,
        google_application_credentials=str(key_file),
        google_cloud_scopes=(SCOPE,),
        reconcile_max_pages=1,
    )
    with caplog.at_level(logging.ERROR):
        result = run_from_settings(s)
    assert result.discovered == 1 and result.errors == 0
    assert any("follows Google Cloud only" in r.getMessage() for r in caplog.records)
    assert [r.name for r in fake_gemini.requests if not r.name.startswith("projects/")] == ["token"]
    store = SQLiteStore(str(db))
    try:
        found = store.get(name)
    finally:
        store.close()
    assert found is not None and found.state is State.SUCCEEDED
    # Without Cloud scopes a missing key still fails the run, as it always did.
    with pytest.raises(ConfigError, match="no Gemini API key"):
        run_from_settings(replace(s, google_cloud_scopes=()))
