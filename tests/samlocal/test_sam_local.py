"""``sam local`` itself on the built app, in Docker (marker ``samlocal``, part of ``make test``).

- every file in ``events/`` through ``sam local invoke`` (``--env-vars events/env.json``, the
  file docs/deploy.md shows), with exactly the answers events/README.md promises, in its order;
- ``sam local start-api --warm-containers EAGER``: signed webhook, redelivery, forged, oversized,
  GET; then the table's stream (read from moto) is handed to the built notifier through
  ``sam local invoke NotifyFunction`` and lands once on the bus -> rule -> SQS;
- ``sam local invoke ReconcileFunction -e events/schedule.json`` against the fake Gemini server.

See harness.py for the network (the Docker bridge's gateway) and the prerequisites.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from opstate.ingest import ingest
from opstate.model import OpEvent
from opstate.states import State
from opstate.store.dynamodb import DynamoDBStore
from tests.samlocal.conftest import LocalStack, record_invocation, record_timing
from tests.samlocal.harness import (
    EVENTS_DIR,
    missing_prerequisite,
    sam_invoke,
    start_api,
)
from tests.samlocal.test_local_config import PROMISED, SAMPLE_UPDATE_TIME, SCHEDULE, readme_order
from tests.support.fake_gemini import FakeGemini
from tests.support.motoserver import free_port
from tests.support.prerequisites import in_ci
from tests.support.webhooks import LOCAL_GEMINI_API_KEY, SAMPLE_NAME

pytestmark = pytest.mark.samlocal

# Outside CI, one line says why nothing here runs; under CI=true each test fails instead (the
# fixtures' require()), without stopping the rest of the suite.
_MISSING = missing_prerequisite()
if _MISSING is not None and not in_ci():
    pytest.skip(f"sam local tests skipped: {_MISSING}", allow_module_level=True)


def body_of(response: dict[str, Any]) -> Any:
    return json.loads(response["body"])


def test_every_event_through_sam_local_invoke_in_readme_order(
    local_stack: LocalStack,
) -> None:
    env = local_stack.sam_env()
    for name in readme_order():
        if name == SCHEDULE:
            continue  # the reconciler's event: test_reconcile_... below
        invocation = sam_invoke("WebhookFunction", EVENTS_DIR / name, env)
        record_invocation(invocation)
        status, fields = PROMISED[name]
        response = invocation.result
        assert response["statusCode"] == status, (name, response, invocation.logs[-3000:])
        body = body_of(response)
        assert {k: body.get(k) for k in fields} == fields, (name, body)
        if name == "report-track.json":
            assert body["applied"] is True
        if name == "webhook-malformed-json.json":
            # No queue locally (events/env.json): the delivery is logged whole, recoverable.
            assert "webhook quarantined" in invocation.logs, invocation.logs[-3000:]
    item = local_stack.get_item(SAMPLE_NAME)
    assert item is not None
    assert (item["state"], item["version"]) == ({"S": "SUCCEEDED"}, {"N": "1"})


def test_start_api_then_the_stream_drives_the_built_notifier(
    local_stack: LocalStack, tmp_path: Path
) -> None:
    signed = json.loads((EVENTS_DIR / "webhook-batch-succeeded.json").read_text())
    forged = json.loads((EVENTS_DIR / "webhook-bad-signature.json").read_text())
    oversized = json.loads((EVENTS_DIR / "webhook-oversized.json").read_text())
    env = local_stack.sam_env()
    api = start_api(env, free_port(), tmp_path / "start-api.log")
    record_timing("sam local start-api --warm-containers EAGER: until it answers", api.started_s)
    try:
        record_path = f"/operations/{SAMPLE_NAME}"
        status, _ = api.request("GET", record_path)
        assert status == 404  # nothing yet

        def post(event: dict[str, Any]) -> tuple[int, Any]:
            return api.request(
                "POST", "/gemini/webhook", event["body"].encode(), headers=event["headers"]
            )

        status, body = post(signed)
        assert (status, body["applied"], body["reason"]) == (200, True, "created"), body
        assert (body["state"], body["version"]) == ("SUCCEEDED", 1)
        status, body = post(signed)  # Gemini redelivers the same message
        assert (status, body["applied"], body["reason"]) == (
            200,
            False,
            "stale-or-equal-update-time",
        )
        status, body = post(forged)
        assert (status, body) == (
            401,
            {"error": "invalid-signature", "message": "invalid signature"},
        )
        status, body = post(oversized)
        assert (status, body["error"]) == (413, "payload-too-large")
        status, record = api.request("GET", record_path)
        assert status == 200, record
        assert (record["name"], record["state"], record["version"]) == (SAMPLE_NAME, "SUCCEEDED", 1)
        assert record["updateTime"] == SAMPLE_UPDATE_TIME
    finally:
        api.stop()
    record_timing("sam local start-api: the whole run (start, 6 requests, stop)", api.run_s)

    # The table is the outbox: its stream holds one INSERT (the redelivery wrote nothing).
    stream_event = local_stack.stream_event()
    assert [
        (r["eventName"], r["dynamodb"]["Keys"]["name"]["S"]) for r in stream_event["Records"]
    ] == [("INSERT", SAMPLE_NAME)]
    event_file = tmp_path / "stream.json"
    event_file.write_text(json.dumps(stream_event))
    invocation = sam_invoke("NotifyFunction", event_file, env)
    record_invocation(invocation)
    assert invocation.result == {"batchItemFailures": []}
    announced = local_stack.received()
    assert len(announced) == 1, announced
    assert announced[0]["source"] == "gemini-opstate"
    assert announced[0]["detail-type"] == "Operation State Changed"
    detail = announced[0]["detail"]
    assert (detail["name"], detail["state"], detail["previousState"], detail["version"]) == (
        SAMPLE_NAME,
        "SUCCEEDED",
        None,
        1,
    )
    item = local_stack.get_item(SAMPLE_NAME)
    assert item is not None
    # <name>@<created_ns>#<version>: the incarnation's creation time, read from the table.
    assert detail["idempotencyKey"] == f"{SAMPLE_NAME}@{item['created_ns']['N']}#1"
    assert detail["updateTime"] == SAMPLE_UPDATE_TIME


def test_reconcile_schedule_against_the_fake_gemini(local_stack: LocalStack) -> None:
    tracked = "models/veo-3.1-generate-preview/operations/local-video"
    store = DynamoDBStore(local_stack.table, client=local_stack.client("dynamodb"))
    try:
        assert ingest(store, OpEvent(tracked, State.PENDING, 0, "test", {})).applied
    finally:
        store.close()

    with FakeGemini(host=local_stack.gateway) as fake:
        # Any other key gets 401: success proves events/env.json's key reached the function.
        fake.api_key = LOCAL_GEMINI_API_KEY
        fake.put_batch(
            "batches/local-running", "BATCH_STATE_RUNNING", update_time="2026-05-10T09:00:00Z"
        )
        fake.put_batch(
            "batches/local-done", "BATCH_STATE_SUCCEEDED", update_time="2026-05-10T09:30:00Z"
        )
        fake.put_video(tracked, done=True, video_uri="https://example.invalid/local.mp4")
        fake.put_webhook("wh-local", name="local", state="disabled_due_to_failed_deliveries")
        invocation = sam_invoke(
            "ReconcileFunction",
            EVENTS_DIR / SCHEDULE,
            local_stack.sam_env(GOOGLE_GEMINI_BASE_URL=fake.base_url),
        )
        record_invocation(invocation)
        assert fake.hits("webhooks") >= 1
        assert fake.hits(tracked) >= 1

    result = invocation.result
    assert result["errors"] == 0, invocation.logs[-3000:]
    assert result["discovered"] == 2
    assert result["applied"] >= 3
    states = {
        name: (local_stack.get_item(name) or {}).get("state", {}).get("S")
        for name in ("batches/local-running", "batches/local-done", tracked)
    }
    assert states == {
        "batches/local-running": "RUNNING",
        "batches/local-done": "SUCCEEDED",
        tracked: "SUCCEEDED",
    }
    assert "disabled_due_to_failed_deliveries" in invocation.logs
