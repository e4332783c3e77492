"""``opstate track projects/...`` then ``opstate reconcile --once``, as a user runs them: the
CLI processes, the real google-genai client in enterprise mode and google-auth against the
fake's Cloud endpoints, the embedded SQLite store."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from tests.integration.test_google_cloud import CLOUD_STATES, JOBS, VEO
from tests.support.fake_gemini import FakeGemini, operation_resource
from tests.support.fake_google_cloud import (
    JWT_BEARER,
    GoogleCloudSide,
    cloud_batch_resource,
    cloud_video_response,
)
from tests.support.serve_process import run_cli


@pytest.fixture
def env(fake_gemini: FakeGemini, tmp_path: Path) -> dict[str, str | None]:
    cloud = GoogleCloudSide(fake_gemini)
    key = tmp_path / "sa.json"
    key.write_text(json.dumps(cloud.service_account_info()))
    fake_gemini.cloud = cloud  # type: ignore[attr-defined]
    return {
        "GEMINI_API_KEY": "test-key",
        "GOOGLE_GEMINI_BASE_URL": fake_gemini.base_url,
        "GOOGLE_VERTEX_BASE_URL": fake_gemini.base_url,
        "GOOGLE_APPLICATION_CREDENTIALS": str(key),
        "GOOGLE_CLOUD_PROJECT": None,
        "GOOGLE_CLOUD_LOCATION": None,
        "GOOGLE_API_KEY": None,
        "OPSTATE_GOOGLE_CLOUD_SCOPES": "p1/us-central1",
        "OPSTATE_RECONCILE_MAX_PAGES": "1",
    }


def cli(args: list[str], cwd: Path, env: dict[str, str | None]) -> str:
    done = run_cli(args, cwd=cwd, env=env, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_track_then_reconcile_records_every_cloud_state(
    fake_gemini: FakeGemini, env: dict[str, str | None], tmp_path: Path
) -> None:
    # Stamped after the track (which records PENDING at the time of the command).
    later = (datetime.now(UTC) + timedelta(minutes=5)).strftime("%Y-%m-%dT%H:%M:%SZ")
    expected = {}
    for n, (cloud_state, state, flags) in enumerate(CLOUD_STATES):
        name = f"{JOBS}/{100 + n}"
        fake_gemini.put(
            name,
            cloud_batch_resource(
                name,
                cloud_state,
                update_time=later,
                gcs_output_directory=f"gs://out/{n}",
                completion_stats={"successfulCount": n, "failedCount": 1},
            ),
        )
        cli(["track", name], tmp_path, env)
        expected[name] = (str(state), flags, f"gs://out/{n}", n)
    untracked = f"{JOBS}/999"  # only discovery can find it
    fake_gemini.put(untracked, cloud_batch_resource(untracked, "SUCCEEDED"))
    # Gemini API records are untouched by all this.
    fake_gemini.put_batch("batches/g1", "BATCH_STATE_RUNNING")
    cli(["track", "batches/g1"], tmp_path, env)

    result = json.loads(cli(["reconcile", "--once"], tmp_path, env))
    assert result["errors"] == 0

    records = {r["name"]: r for r in json.loads(cli(["list", "--json"], tmp_path, env))}
    for name, (state, flags, location, successful) in expected.items():
        view = records[name]
        assert (view["state"], view["kind"], view["backend"]) == (state, "batch", "google-cloud")
        assert view["details"] == {
            **flags,
            "output_location": location,
            "completion_stats": {"successful_count": successful, "failed_count": 1},
        }
    assert records[untracked]["state"] == "SUCCEEDED"
    gemini = records["batches/g1"]
    assert (gemini["state"], gemini["backend"], gemini["kind"]) == (
        "RUNNING",
        "gemini-api",
        "batch",
    )
    assert fake_gemini.cloud.token_requests == [JWT_BEARER]  # type: ignore[attr-defined]


def test_track_then_reconcile_follows_a_veo_cloud_operation(
    fake_gemini: FakeGemini, env: dict[str, str | None], tmp_path: Path
) -> None:
    fake_gemini.put(
        VEO, operation_resource(VEO, done=True, response=cloud_video_response("gs://v/a.mp4"))
    )
    cli(["track", VEO], tmp_path, env)
    cli(["reconcile", "--once"], tmp_path, env)
    view = json.loads(cli(["get", VEO, "--json"], tmp_path, env))
    assert (view["state"], view["kind"], view["backend"]) == ("SUCCEEDED", "video", "google-cloud")
    assert view["details"]["video_uri"] == "gs://v/a.mp4"


def test_a_bare_cloud_job_number_is_refused(env: dict[str, str | None], tmp_path: Path) -> None:
    done = run_cli(["track", "batchPredictionJobs/123"], cwd=tmp_path, env=env)
    assert done.returncode != 0
    assert "ambiguous across projects" in done.stderr
