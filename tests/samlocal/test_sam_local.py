"""``sam local`` itself on the built app, in Docker (marker ``samlocal``, part of ``make test``).

- every API event in ``events/`` (``--env-vars events/env.json``, the file docs/deploy.md
  shows), with exactly the answers events/README.md promises, in its order, through one ``sam
  local start-lambda --warm-containers LAZY`` (the conftest's ``local_lambda``: one warm
  container per function for the whole module, where each ``sam local invoke`` starts a new
  one and SAM rebuilds its invoke image for it);
- ``sam local start-api --warm-containers LAZY``: signed webhook, redelivery, forged, oversized,
  GET; then the table's stream (read from moto) is handed to the built notifier (start-lambda)
  and lands once on the bus -> rule -> SQS;
- ``sam local invoke ReconcileFunction -e events/schedule.json`` (the command docs/deploy.md
  shows a user) against the fake Gemini server;
- ``ArchiverFunction`` on a terminal change (issue 21): the fake Gemini serves the batch's
  output file, the built archiver copies it into moto S3 and summarises it.

See harness.py for the network (the Docker bridge's gateway) and the prerequisites.
"""

from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path
from typing import Any

import pytest

from opstate.domain.model import OpEvent
from opstate.domain.states import State
from opstate.domain.times import format_time
from opstate.ingest import ingest
from opstate.outcomes.results import results_json
from opstate.store.dynamodb import DynamoDBStore
from tests.samlocal.conftest import LocalGemini, LocalStack, record_invocation, record_timing
from tests.samlocal.harness import (
    EVENTS_DIR,
    LocalLambda,
    missing_prerequisite,
    sam_invoke,
    start_api,
)
from tests.samlocal.test_local_config import PROMISED, SAMPLE_UPDATE_TIME, SCHEDULE, readme_order
from tests.support.motoserver import free_port
from tests.support.prerequisites import in_ci
from tests.support.webhooks import LOCAL_RESULTS_URL, SAMPLE_NAME

pytestmark = pytest.mark.samlocal

# Outside CI, one line says why nothing here runs; under CI=true each test fails instead (the
# fixtures' require()), without stopping the rest of the suite.
_MISSING = missing_prerequisite()
if _MISSING is not None and not in_ci():
    pytest.skip(f"sam local tests skipped: {_MISSING}", allow_module_level=True)


def body_of(response: dict[str, Any]) -> Any:
    return json.loads(response["body"])


def test_every_event_through_sam_local_start_lambda_in_readme_order(
    local_stack: LocalStack, local_lambda: LocalLambda
) -> None:
    for name in readme_order():
        if name == SCHEDULE:
            continue  # the reconciler's event: test_reconcile_... below
        quarantined = "webhook quarantined" if name == "webhook-malformed-json.json" else ""
        invocation = local_lambda.invoke("WebhookFunction", EVENTS_DIR / name, quarantined)
        record_invocation(invocation, "start-lambda Invoke")
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
    local_stack: LocalStack, local_lambda: LocalLambda, tmp_path: Path
) -> None:
    signed = json.loads((EVENTS_DIR / "webhook-batch-succeeded.json").read_text())
    forged = json.loads((EVENTS_DIR / "webhook-bad-signature.json").read_text())
    oversized = json.loads((EVENTS_DIR / "webhook-oversized.json").read_text())
    env = local_stack.sam_env()
    api = start_api(env, free_port(), tmp_path / "start-api.log")
    record_timing("sam local start-api --warm-containers LAZY: until it answers", api.started_s)
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
    invocation = local_lambda.invoke("NotifyFunction", event_file)
    record_invocation(invocation, "start-lambda Invoke")
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


def test_reconcile_schedule_against_the_fake_gemini(
    local_stack: LocalStack, local_gemini: LocalGemini
) -> None:
    tracked = "models/veo-3.1-generate-preview/operations/local-video"
    store = DynamoDBStore(local_stack.table, client=local_stack.client("dynamodb"))
    try:
        assert ingest(store, OpEvent(tracked, State.PENDING, 0, "test", {})).applied
    finally:
        store.close()

    # The fake answers only events/env.json's key: success proves it reached the function.
    fake = local_gemini
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
        # Discovery of every batch the key lists (the stack's default is `tracked`, issue 48):
        # this test holds what a run discovers.
        local_stack.sam_env(GOOGLE_GEMINI_BASE_URL=fake.base_url, OPSTATE_DISCOVER="all"),
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


def batch_output() -> bytes:
    """A batch's JSONL output: 400 answered rows (tokens), 3 failed (two codes), 1 unreadable."""
    usage = {"promptTokenCount": 2, "candidatesTokenCount": 3, "totalTokenCount": 5}
    answer = {"candidates": [{"finishReason": "STOP"}], "usageMetadata": usage}
    rows = [json.dumps({"key": f"k{i}", "response": answer}) for i in range(400)]
    rows += [
        json.dumps({"key": "q1", "status": {"code": 8, "message": "quota"}}),
        json.dumps({"key": "q2", "status": {"code": 8, "message": "quota"}}),
        json.dumps({"key": "bad", "error": {"code": 3, "message": "invalid argument"}}),
        "not json",
    ]
    return "".join(row + "\n" for row in rows).encode()


def test_the_built_archiver_copies_a_batch_output_to_s3(
    local_stack: LocalStack, local_lambda: LocalLambda, local_gemini: LocalGemini, tmp_path: Path
) -> None:
    name = "batches/local-archived"
    now_ns = time.time_ns()
    store = DynamoDBStore(local_stack.table, client=local_stack.client("dynamodb"))
    try:
        done = OpEvent(name, State.SUCCEEDED, now_ns, "test", {})
        assert ingest(store, done, clock_ns=lambda: now_ns).applied
    finally:
        store.close()
    data = batch_output()
    # The terminal change as the bus rule delivers it to the archiver.
    trigger = {
        "version": "0",
        "source": "gemini-opstate",
        "detail-type": "Operation State Changed",
        "detail": {"name": name, "state": "SUCCEEDED"},
    }
    event_file = tmp_path / "terminal-change.json"
    event_file.write_text(json.dumps(trigger))

    # The fake answers only events/env.json's key: success proves it reached the function.
    fake = local_gemini
    file = fake.put_file("local-out", body=data, expiration_time=format_time(now_ns + 3600 * 10**9))
    fake.put_batch(name, "BATCH_STATE_SUCCEEDED", responses_file=file)
    invocation = local_lambda.invoke("ArchiverFunction", event_file)
    record_invocation(invocation, "start-lambda Invoke")
    downloads = [r for r in fake.requests if r.name == file and r.verb == "download"]
    assert len(downloads) == 1, fake.requests

    result = invocation.result
    counts = (result["archived"], result["failed"], result["errors"])
    assert counts == (1, 0, 0), invocation.logs[-3000:]
    assert result["bytes"] == len(data)
    s3 = local_stack.client("s3")
    bucket = local_stack.results_bucket
    assert f"s3://{bucket}/results" == LOCAL_RESULTS_URL  # events/env.json's URL
    keys = sorted(o["Key"] for o in s3.list_objects_v2(Bucket=bucket)["Contents"])
    (output,) = [k for k in keys if k.endswith("/output.jsonl")]
    prefix = output.removesuffix("output.jsonl")
    assert prefix.startswith(f"results/{name}/")
    assert keys == [output, prefix + "summary.json"]  # nothing left under .incoming/
    sha256 = hashlib.sha256(data).hexdigest()
    body = s3.get_object(Bucket=bucket, Key=output)
    assert body["Body"].read() == data  # byte for byte
    assert body["Metadata"]["sha256"] == sha256
    assert body["Metadata"]["opstate-name"] == name

    rows = {"total": 404, "succeeded": 400, "blocked": 0, "failed": 3, "unreadable": 1}
    errors = {"8": 2, "3": 1}
    usage = {
        "promptTokenCount": 800,
        "candidatesTokenCount": 1200,
        "thoughtsTokenCount": 0,
        "cachedContentTokenCount": 0,
        "toolUsePromptTokenCount": 0,
        "totalTokenCount": 2000,
    }
    summary = json.loads(s3.get_object(Bucket=bucket, Key=prefix + "summary.json")["Body"].read())
    assert (summary["name"], summary["rows"], summary["errors"], summary["usage"]) == (
        name,
        rows,
        errors,
        usage,
    )
    # The record's archive status (what `opstate results --json` prints), read from the table.
    store = DynamoDBStore(local_stack.table, client=local_stack.client("dynamodb"))
    try:
        view = results_json(store, name)
    finally:
        store.close()
    assert view is not None
    assert (view["status"], view["rows"], view["errors"], view["usage"]) == (
        "archived",
        rows,
        errors,
        usage,
    )
    assert view["objects"] == [
        {"location": f"s3://{bucket}/{output}", "bytes": len(data), "sha256": sha256}
    ]
    item = local_stack.get_item(name)
    assert item is not None and item["state"] == {"S": "SUCCEEDED"}  # archiving changes no state
