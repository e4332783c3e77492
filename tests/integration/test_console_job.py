"""A job on the operations page's route and the API's GET (issue 46, docs/jobs.md), on SQLite
and on DynamoDB (moto): the job is submitted through the real path (``submit_from_settings``:
kept, split, its first part created at once against the fake Gemini enforcing a small
enqueued-token cap), then ``/ui/api/operation?name=jobs/ID`` and ``GET /operations/jobs/ID``
answer it: its parts per phase, the tokens it holds enqueued against the cap, what it waits
for, and (the page's route) each part in input order with its batch, never a part's nonce or
upload. A plan holding markup and wrong types is answered as data, not trusted."""

from __future__ import annotations

import io
import json
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from opstate.api import create_app
from opstate.api_token import bearer_token_ok
from opstate.config import Settings
from opstate.domain.retry import RetryPolicy
from opstate.local.console import Console, DecisionLog
from opstate.outcomes.wiring import archive_from_settings
from opstate.retry.job_step import JOB
from opstate.retry.wiring import retry_from_settings, roots_of, submit_from_settings
from opstate.signatures import StaticSecretsVerifier
from opstate.store.retry_state import RetryState
from opstate.wiring.reconcile import refresh_with
from tests.integration.test_job_feeding import CAP, big_input
from tests.support.fake_gemini import FakeGemini
from tests.support.fake_gemini_limits import QueueLimits
from tests.support.stores import Harness, harness_of
from tests.support.webhooks import TEST_SECRET, operation_event

MODEL = "gemini-2.5-flash"
TOKEN = "console-job-token-0123456789abcdef"
MARKUP = '<img src=x onerror="window.pwned=1"><b>bold</b>'


@pytest.fixture(params=["sqlite", "dynamodb-mock"])
def harness(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Harness]:
    with harness_of(request, tmp_path) as h:
        yield h


def submitted(harness: Harness, fake: FakeGemini, tmp_path: Path, mp: pytest.MonkeyPatch) -> str:
    fake.api_key = "test-key"
    fake.limits = QueueLimits(enqueued_tokens={MODEL: CAP})
    mp.setenv("GOOGLE_GEMINI_BASE_URL", fake.base_url)
    config = Settings.from_env(
        {
            "GEMINI_API_KEY": "test-key",
            "OPSTATE_RESULTS_URL": (tmp_path / "results").as_uri(),
            "OPSTATE_SUBMIT_ENQUEUED_TOKENS": f"{MODEL}={CAP}",
        }
    )
    source = tmp_path / "big.jsonl"
    source.write_bytes(big_input(600))
    job = submit_from_settings(
        config,
        source=source.as_uri(),
        model=MODEL,
        policy=RetryPolicy(max_attempts=1),
        store=harness.store,
    )
    assert job.name.startswith("jobs/")
    assert len(fake.batches_created()) == 1  # what fit was created at once
    return job.name


def page_get(store: Any, name: str) -> tuple[int, dict[str, Any]]:
    console = Console(
        lambda environ, start: [],
        store=store,
        decisions=DecisionLog(),
        authorized=lambda headers: bearer_token_ok(headers.get("authorization"), TOKEN),
    )
    seen: dict[str, Any] = {}

    def start_response(status: str, headers: list[tuple[str, str]]) -> None:
        seen["status"] = int(status.split()[0])

    environ = {
        "REQUEST_METHOD": "GET",
        "PATH_INFO": "/ui/api/operation",
        "QUERY_STRING": f"name={name}",
        "HTTP_AUTHORIZATION": f"Bearer {TOKEN}",
        "wsgi.input": io.BytesIO(b""),
    }
    body = b"".join(console(environ, start_response))
    return seen["status"], json.loads(body)


def api_get(store: Any, name: str) -> tuple[int, dict[str, Any]]:
    app = create_app(
        store=store, verifier=StaticSecretsVerifier((TEST_SECRET,)), settings=Settings()
    )
    response = app.resolve(operation_event("GET", name), None)  # type: ignore[arg-type]
    return response["statusCode"], json.loads(response["body"])


def test_the_page_and_the_api_answer_a_job_on_both_stores(
    harness: Harness, fake_gemini: FakeGemini, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    name = submitted(harness, fake_gemini, tmp_path, monkeypatch)
    plan = harness.store.get_retry(name).doc[JOB]  # type: ignore[attr-defined]
    status, body = page_get(harness.store, name)
    assert status == 200, body
    job = body["record"]["retry"]["job"]
    total = len(plan["parts"])
    assert total >= 4
    assert job["parts"] == {"held": total - 1, "creating": 0, "created": 1, "ended": 0}
    assert job["rows"] == 600 and job["model"] == MODEL and job["cap"] == CAP
    assert 0 < job["enqueuedTokens"] == plan["parts"][0]["tokens"] <= CAP
    assert job["waitingFor"] == "room in the model's queue"
    assert body["record"]["retry"]["policy"]["maxAttempts"] == 1
    assert body["final"]["status"] == "pending"
    # Each part in input order; the created one with its batch and the batch's stored state.
    parts = body["parts"]
    assert [p["n"] for p in parts] == [p["n"] for p in plan["parts"]]
    assert [p["first"] for p in parts] == [p["first"] for p in plan["parts"]]
    assert sum(p["rows"] for p in parts) == 600
    first = parts[0]
    assert first["phase"] == "created" and first["batch"] == fake_gemini.batches_created()[0]
    assert first["state"] == "PENDING"
    assert all(p["phase"] == "held" and p["batch"] is None for p in parts[1:])
    # Never a part's nonce nor its upload: the page publishes what the API does.
    text = json.dumps(body)
    for part in plan["parts"]:
        assert part["nonce"] not in text
        assert "file" not in part or part["file"] not in text
    # The API's GET answers the same job (its view; the parts list is the page's).
    status, view = api_get(harness.store, name)
    assert status == 200, view
    assert view["retry"]["job"] == job
    assert all(part["nonce"] not in json.dumps(view) for part in plan["parts"])


def hostile_plan(plan: Mapping[str, Any]) -> dict[str, Any]:
    parts = [dict(p) for p in plan["parts"]]
    parts[0]["batch"] = f"batches/{MARKUP}"
    # Types the job's own view (domain.parts.job_view) reads too stay countable; the page's
    # list takes only what has its type.
    parts[1] |= {"first": "1", "tokens": True, "n": None, "dueNs": 2**70, "refusals": 3}
    parts.append("not a part")
    return dict(plan) | {
        "model": MARKUP,
        "parts": parts,
        "stopped": True,
        "stoppedWhy": f"create refused: {MARKUP}",
        "learnedCap": 1234,
    }


def test_a_plan_with_markup_and_wrong_types_is_answered_as_data(
    harness: Harness, fake_gemini: FakeGemini, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    name = submitted(harness, fake_gemini, tmp_path, monkeypatch)
    store: Any = harness.store
    state = store.get_retry(name)
    doc = dict(state.doc) | {JOB: hostile_plan(state.doc[JOB])}
    kept = RetryState(state.status, created_ns=state.created_ns, due_ns=state.due_ns, doc=doc)
    assert store.set_retry(name, state.rev, kept)
    status, body = page_get(store, name)
    assert status == 200, body
    job = body["record"]["retry"]["job"]
    assert job["model"] == MARKUP and job["stopped"] == f"create refused: {MARKUP}"
    assert job["learnedCap"] == 1234 and job["cap"] == 1234
    assert job["waitingFor"] == "created parts to end"  # stopped: no part will be created
    parts = body["parts"]
    assert len(parts) == len(doc[JOB]["parts"]) - 1  # the entry that is no part is left out
    assert parts[0]["batch"] == f"batches/{MARKUP}"
    assert parts[0]["state"] is None  # no such record: no state invented
    assert parts[1] == {
        "n": None,
        "first": None,
        "rows": doc[JOB]["parts"][1]["rows"],
        "tokens": None,
        "phase": "held",
        "refusals": 3,
        "batch": None,
        "state": None,
        "dueAt": None,  # past int64: not a time
    }


def test_a_finished_job_shows_its_final_result_on_both_stores(
    harness: Harness, fake_gemini: FakeGemini, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    name = submitted(harness, fake_gemini, tmp_path, monkeypatch)
    config = Settings.from_env(
        {
            "GEMINI_API_KEY": "test-key",
            "OPSTATE_RESULTS_URL": (tmp_path / "results").as_uri(),
            "OPSTATE_SUBMIT_ENQUEUED_TOKENS": f"{MODEL}={CAP}",
            "OPSTATE_RECONCILE_MAX_PAGES": "0",
        }
    )
    store: Any = harness.store
    for _ in range(20):  # Gemini answers each part; the archiver's trigger path moves the job
        for batch in fake_gemini.batches_created():
            if (fake_gemini.resource(batch) or {}).get("done"):
                continue
            keys = [json.loads(x)["key"] for x in fake_gemini.batch_input(batch).splitlines()]
            fake_gemini.run_batch(batch, [{"key": k, "response": {"candidates": []}} for k in keys])
            record = store.get(batch)
            assert refresh_with(store, config, record).error is None
            archive_from_settings(config, store=store, names=[batch])
            retry_from_settings(config, store=store, names=roots_of(store, [batch]))
        if store.get_retry(name).doc.get("final"):
            break
    status, body = page_get(store, name)
    assert status == 200, body
    job = body["record"]["retry"]["job"]
    assert job["waitingFor"] == "nothing" and job["enqueuedTokens"] == 0
    assert job["parts"]["ended"] == len(body["parts"]) >= 4
    assert all(p["phase"] == "ended" and p["batch"] for p in body["parts"])
    final = body["final"]
    assert final["status"] == "final" and final["location"].endswith("/final.jsonl")
    assert final["rows"]["total"] == 600 and final["rows"]["answered"] == 600
    assert final["cost"]["usd"] is None and "unknown" in final["cost"]["reason"]
