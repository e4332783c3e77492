"""Wiring of the reconciler: API key sources, ``run_from_settings`` and the Lambda entry."""

from __future__ import annotations

import importlib.util
import json
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from opstate import config
from opstate.config import ConfigError, Settings
from opstate.domain.events import from_report
from opstate.domain.model import OpEvent
from opstate.domain.states import State
from opstate.domain.times import parse_time
from opstate.gemini import api_key, make_client
from opstate.ingest import ingest
from opstate.local.apigw import LocalLambdaContext
from opstate.observability import metrics
from opstate.store.sqlite import SQLiteStore
from opstate.wiring.reconcile import run_from_settings
from tests.support.fake_gemini import FakeGemini

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def fresh_metrics() -> Iterator[None]:
    metrics.clear_metrics()
    yield
    metrics.clear_metrics()


def test_api_key_from_secrets_manager_plain_and_json(aws_secrets: Any) -> None:
    plain = aws_secrets.create_secret(Name="opstate/gemini-plain", SecretString=" k-plain \n")
    as_json = aws_secrets.create_secret(
        Name="opstate/gemini-json", SecretString=json.dumps({"GEMINI_API_KEY": "k-json"})
    )
    assert api_key(Settings(gemini_api_key_secret_arn=plain["ARN"], gemini_api_key="env")) == (
        "k-plain"
    )
    assert api_key(Settings(gemini_api_key_secret_arn=as_json["ARN"])) == "k-json"


def test_api_key_errors_name_the_variables(aws_secrets: Any) -> None:
    with pytest.raises(ConfigError, match="GEMINI_API_KEY"):
        api_key(Settings())
    missing = "arn:aws:secretsmanager:us-east-1:123456789012:secret:nope"
    with pytest.raises(ConfigError, match="could not read"):
        api_key(Settings(gemini_api_key_secret_arn=missing))
    bad = aws_secrets.create_secret(Name="opstate/gemini-bad", SecretString='{"other": "x"}')
    with pytest.raises(ConfigError, match="JSON"):
        api_key(Settings(gemini_api_key_secret_arn=bad["ARN"]))


def test_make_client_uses_the_secret_and_the_base_url_env(
    aws_secrets: Any, fake_gemini: FakeGemini, monkeypatch: pytest.MonkeyPatch
) -> None:
    arn = aws_secrets.create_secret(Name="opstate/gemini-key", SecretString="k-secret")["ARN"]
    fake_gemini.api_key = "k-secret"
    fake_gemini.put_batch("batches/a", "BATCH_STATE_RUNNING")
    monkeypatch.setenv("GOOGLE_GEMINI_BASE_URL", fake_gemini.base_url)

    client = make_client(Settings(gemini_api_key_secret_arn=arn))
    try:
        job = client.batches.get(name="batches/a")
    finally:
        client.close()

    assert job.name == "batches/a"
    (request,) = fake_gemini.requests
    assert request.headers["x-goog-api-key"] == "k-secret"
    assert request.path == "/v1/batches/a"


def seed_sqlite(path: Path) -> None:
    store = SQLiteStore(path)
    try:
        now = parse_time("2026-05-02T00:00:00Z")
        for name in ("batches/tracked", "models/veo-3.1-generate-preview/operations/v"):
            ingest(store, from_report(name, {"updateTime": "2026-05-01T09:00:00Z"}, now_ns=now))
    finally:
        store.close()


def program(fake: FakeGemini) -> None:
    fake.api_key = "k-local"
    fake.put_batch("batches/tracked", "BATCH_STATE_SUCCEEDED", update_time="2026-05-01T11:00:00Z")
    fake.put_batch("batches/other", "BATCH_STATE_RUNNING", update_time="2026-05-01T11:00:00Z")
    fake.put_video(
        "models/veo-3.1-generate-preview/operations/v", done=True, video_uri="https://x/v.mp4"
    )
    fake.put_webhook("w1", name="prod", state="enabled")


def states_of(path: Path) -> dict[str, State]:
    store = SQLiteStore(path)
    try:
        return {r.name: r.state for r in store.iter_all()}
    finally:
        store.close()


def test_run_from_settings_on_sqlite(
    fake_gemini: FakeGemini, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    program(fake_gemini)
    monkeypatch.setenv("GOOGLE_GEMINI_BASE_URL", fake_gemini.base_url)
    db = tmp_path / "ops.db"
    seed_sqlite(db)
    settings = Settings.from_env({"OPSTATE_STORE": f"sqlite:///{db}", "GEMINI_API_KEY": "k-local"})

    result = run_from_settings(settings, remaining_ms=lambda: 60_000)

    assert result.as_dict() == {
        "discovered": 2,
        "polled": 1,
        "applied": 3,
        "dropped": 0,
        "not_found": 0,
        "lost": 0,
        "overdue": 0,
        "errors": 0,
        "throttled": 0,
        "remaining_due": 0,
        "stopped_early": False,
    }
    assert states_of(db) == {
        "batches/other": State.RUNNING,
        "batches/tracked": State.SUCCEEDED,
        "models/-/operations/v": State.SUCCEEDED,  # a video key has no model
    }


def test_warm_runs_share_one_google_genai_client(
    fake_gemini: FakeGemini, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Issue 48: building a google-genai client loads the CA bundle twice (about 50 ms of CPU,
    half a warm run's on the cost benchmark) and opens new connections; a warm container's
    runs share one, never closed by a run; a changed key makes a new one and closes the old."""
    from opstate.gemini import client as client_module

    program(fake_gemini)
    monkeypatch.setenv("GOOGLE_GEMINI_BASE_URL", fake_gemini.base_url)
    monkeypatch.setattr(client_module, "_warm", {})
    made: list[object] = []
    closed: list[object] = []
    real = client_module.make_client

    def counting(settings: Settings, *, timeout_s: float | None = None) -> object:
        client = real(settings, timeout_s=timeout_s)
        made.append(client)
        real_close = client.close

        def close() -> None:
            closed.append(client)
            real_close()

        client.close = close  # type: ignore[method-assign]
        return client

    monkeypatch.setattr(client_module, "make_client", counting)
    db = tmp_path / "ops.db"
    seed_sqlite(db)
    env = {"OPSTATE_STORE": f"sqlite:///{db}", "GEMINI_API_KEY": "k-local"}
    for _ in range(3):
        run_from_settings(Settings.from_env(env), remaining_ms=lambda: 60_000)
    assert len(made) == 1 and closed == []
    assert states_of(db)["batches/tracked"] is State.SUCCEEDED
    run_from_settings(Settings.from_env({**env, "GEMINI_API_KEY": "k-rotated"}))
    assert len(made) == 2 and closed == [made[0]]


def test_a_container_keeps_the_final_records_its_listings_found(
    fake_gemini: FakeGemini, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Issue 48: the AWS wiring hands every run the container's ``DISCOVERY_SETTLED``; the
    final job its listing found is kept (not read again by the next listing), the job still
    running is not; a new container starts with none."""
    from opstate.wiring import reconcile as wiring

    program(fake_gemini)
    monkeypatch.setenv("GOOGLE_GEMINI_BASE_URL", fake_gemini.base_url)
    db = tmp_path / "ops.db"
    seed_sqlite(db)
    env = {"OPSTATE_STORE": f"sqlite:///{db}", "GEMINI_API_KEY": "k-local"}
    wiring.new_container()
    settled = wiring.DISCOVERY_SETTLED
    run_from_settings(Settings.from_env(env), remaining_ms=lambda: 60_000)
    assert len(settled) == 1
    listed = OpEvent("batches/tracked", State.SUCCEEDED, parse_time("2026-05-01T11:00:00Z"), "poll")
    assert settled.dropping(listed, listed.update_time_ns) is not None
    running = OpEvent("batches/other", State.RUNNING, parse_time("2026-05-01T11:00:00Z"), "poll")
    assert settled.dropping(running, running.update_time_ns) is None
    wiring.new_container()
    assert wiring.DISCOVERY_SETTLED is not settled and len(wiring.DISCOVERY_SETTLED) == 0


def load_entry() -> ModuleType:
    path = ROOT / "functions" / "reconcile" / "app.py"
    spec = importlib.util.spec_from_file_location("reconcile_function_app", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_lambda_entry_runs_one_pass_within_the_context_budget(
    fake_gemini: FakeGemini, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    program(fake_gemini)
    db = tmp_path / "ops.db"
    seed_sqlite(db)
    for key, value in {
        "GOOGLE_GEMINI_BASE_URL": fake_gemini.base_url,
        "OPSTATE_STORE": f"sqlite:///{db}",
        "GEMINI_API_KEY": "k-local",
    }.items():
        monkeypatch.setenv(key, value)
    config.settings.cache_clear()
    try:
        entry = load_entry()
        answer = entry.lambda_handler(
            {"source": "aws.scheduler"}, LocalLambdaContext(remaining_ms=60_000)
        )
        # Less time left than the safety margin: nothing starts, everything is left open.
        seed_sqlite(db)
        late = entry.lambda_handler({}, LocalLambdaContext(remaining_ms=5_000))
    finally:
        config.settings.cache_clear()

    assert answer["polled"] == 1 and answer["discovered"] == 2 and answer["errors"] == 0
    assert late["stopped_early"] is True and late["polled"] == 0
    assert states_of(db)["batches/tracked"] is State.SUCCEEDED
