"""Retries through the BUILT submit and archiver functions (issues 33 and 38), on the Lambda
runtime interface emulator against the moto server and the fake Gemini server (``harness.py``).

The chain is the deployed one: a direct invoke of the submit function ``{"submit": {...}}``
naming an object under ``incoming/`` of the results bucket keeps the input, creates the batch
on Gemini and tracks it with its retry state (the archiver refuses the same request: it
submits nothing since issue 38); each member is made terminal by an ingested event (what the
reconciler or a webhook does); the bus's terminal change naming it reaches the archiver, which
archives it and takes its lineage one step further (one child from the transient failures, then
final.jsonl).
The table's stream through the built notifier announces the child and the final result.

Test-only environment override: ``GOOGLE_GEMINI_BASE_URL`` (the fake Gemini server). The API key
is read from the stack's Secrets Manager secret, as deployed.
"""

from __future__ import annotations

import json
import time
from typing import Any

import pytest

from opstate.domain.model import OpEvent
from opstate.domain.states import State
from opstate.ingest import ingest
from opstate.store.dynamodb import DynamoDBStore
from tests.e2e.conftest import GEMINI_TEST_KEY, Stack, StartFunction
from tests.e2e.harness import InvokeError, LambdaProcess, subscribe
from tests.e2e.test_built_functions import receive_all, stream_records
from tests.support.fake_gemini import FakeGemini
from tests.support.retry_rows import answered, failed, request_bytes

pytestmark = pytest.mark.e2e

MODEL = "gemini-2.5-flash"
INPUT_KEY = "incoming/e2e-in.jsonl"
DETAIL_TYPE = "Operation State Changed"
RETRY_SUBMITTED = "Operation Retry Submitted"
RESULTS_FINAL = "Operation Results Final"


def item(stack: Stack, name: str) -> dict[str, Any] | None:
    found: dict[str, Any] | None = (
        stack.client("dynamodb")
        .get_item(TableName=stack.table, Key={"name": {"S": name}}, ConsistentRead=True)
        .get("Item")
    )
    return found


def retry_status(stack: Stack, name: str) -> str | None:
    found = item(stack, name)
    if found is None or "retry_status" not in found:
        return None
    return str(found["retry_status"]["S"])


def finish(stack: Stack, name: str) -> None:
    """The member's terminal change, ingested into the table as the reconciler would."""
    now_ns = time.time_ns()
    store = DynamoDBStore(stack.table, client=stack.client("dynamodb"))
    try:
        assert ingest(
            store, OpEvent(name, State.SUCCEEDED, now_ns, "test", {}), clock_ns=lambda: now_ns
        ).applied
    finally:
        store.close()


def on_terminal(archiver: LambdaProcess, name: str) -> dict[str, Any]:
    """The bus's terminal change naming ``name``, handed to the archiver."""
    trigger = {
        "source": "gemini-opstate",
        "detail-type": DETAIL_TYPE,
        "detail": {"name": name, "state": "SUCCEEDED"},
    }
    result: dict[str, Any] = archiver.invoke(trigger)
    assert (result["archived"], result["failed"], result["errors"]) == (1, 0, 0), (
        archiver.log_tail()
    )
    return result


def s3_keys(stack: Stack) -> list[str]:
    listed = stack.client("s3").list_objects_v2(Bucket=stack.results_bucket)
    return [o["Key"] for o in listed.get("Contents", [])]


def test_built_submit_function_submits_the_archiver_retries_a_child_and_writes_final(
    start: StartFunction, stack: Stack
) -> None:
    keys = [f"k{i:02d}" for i in range(20)]
    source = b"".join(request_bytes(k) for k in keys)
    s3 = stack.client("s3")
    s3.put_object(Bucket=stack.results_bucket, Key=INPUT_KEY, Body=source)
    subscribe(
        stack.clients,
        bus=stack.bus,
        queue_url=stack.queue_url,
        rule="e2e-retries",
        detail_types=[RETRY_SUBMITTED, RESULTS_FINAL],
    )
    with FakeGemini() as fake:
        fake.api_key = GEMINI_TEST_KEY  # the built function reads the key from Secrets Manager
        archiver = start("ArchiverFunction", overrides={"GOOGLE_GEMINI_BASE_URL": fake.base_url})
        request = {
            "submit": {
                "input": f"s3://{stack.results_bucket}/{INPUT_KEY}",
                "model": MODEL,
                "displayName": "e2e retry",
                "retry": {"maxAttempts": 1},
            }
        }
        with pytest.raises(InvokeError, match="SubmitRefusedError") as refused:
            archiver.invoke(request)
        assert "SubmitFunctionName" in str(refused.value)
        assert fake.batches_created() == []
        submit = start("SubmitFunction", overrides={"GOOGLE_GEMINI_BASE_URL": fake.base_url})
        answer = submit.invoke(request)
        submitted = answer["submitted"]
        root = submitted["name"]
        assert submitted["created"] is True and submitted["retry"]["maxAttempts"] == 1
        assert fake.batches_created() == [root]
        assert fake.batch_input(root) == source
        assert retry_status(stack, root) == "active"
        kept = submitted["input"]["location"]
        assert kept.startswith(f"s3://{stack.results_bucket}/results/inputs/")

        transient = keys[:3]
        fake.run_batch(
            root,
            [failed(k, 503, "UNAVAILABLE") for k in transient] + [answered(k) for k in keys[3:]],
        )
        finish(stack, root)
        first = on_terminal(archiver, root)["retry"]
        assert (first["planned"], first["submitted"], first["final"]) == (1, 1, 0), (
            archiver.log_tail()
        )
        created = fake.batches_created()
        assert len(created) == 2
        child = created[1]
        child_lines = fake.batch_input(child).splitlines(keepends=True)
        assert child_lines == [request_bytes(k) for k in transient]  # the original lines
        assert retry_status(stack, child) == "member"

        fake.run_batch(child, [answered(k) for k in transient])
        finish(stack, child)
        second = on_terminal(archiver, child)["retry"]
        assert (second["planned"], second["submitted"], second["final"]) == (0, 0, 1), (
            archiver.log_tail()
        )
        assert len(fake.batches_created()) == 2

    assert retry_status(stack, root) == "done"
    final_key = next(k for k in s3_keys(stack) if k.endswith("/final.jsonl"))
    assert final_key.startswith(f"results/{root}/")
    body = s3.get_object(Bucket=stack.results_bucket, Key=final_key)["Body"].read()
    rows = [json.loads(line) for line in body.splitlines()]
    assert sorted(r["key"] for r in rows) == keys
    assert all("response" in r for r in rows)
    assert {r["key"]: r["attempt"] for r in rows if r["key"] in transient} == dict.fromkeys(
        transient, 1
    )

    notify = start("NotifyFunction")
    assert notify.invoke({"Records": stream_records(stack)}) == {"batchItemFailures": []}
    events = [e for e in receive_all(stack) if e["detail-type"] != DETAIL_TYPE]
    assert [e["detail-type"] for e in events] == [RETRY_SUBMITTED, RESULTS_FINAL]
    retried, final = (e["detail"] for e in events)
    assert (retried["root"], retried["parent"], retried["child"]) == (root, root, child)
    assert retried["rows"] == 3 and retried["attempt"] == 1
    assert final["root"] == root and final["location"] == f"s3://{stack.results_bucket}/{final_key}"
    assert final["rows"] == {"total": 20, "answered": 20, "blocked": 0, "failed": 0}


def test_built_submit_function_refuses_a_line_without_key_and_an_input_outside_incoming(
    start: StartFunction, stack: Stack
) -> None:
    bad = request_bytes("a") + json.dumps({"request": {"contents": []}}).encode() + b"\n"
    stack.client("s3").put_object(Bucket=stack.results_bucket, Key=INPUT_KEY, Body=bad)
    kept = "results/inputs/" + "ab" * 32 + "/input.jsonl"  # someone's kept prompts
    stack.client("s3").put_object(Bucket=stack.results_bucket, Key=kept, Body=request_bytes("a"))
    with FakeGemini() as fake:
        fake.api_key = GEMINI_TEST_KEY
        submit = start("SubmitFunction", overrides={"GOOGLE_GEMINI_BASE_URL": fake.base_url})
        request = {
            "input": f"s3://{stack.results_bucket}/{INPUT_KEY}",
            "model": MODEL,
            "retry": {"maxAttempts": 1},
        }
        with pytest.raises(InvokeError, match="SubmitRefusedError") as refused:
            submit.invoke({"submit": request})
        assert "line 2" in str(refused.value).splitlines()[0]
        # Issue 38, repro 6: checked in code as well as by the role (moto enforces no IAM).
        outside = {**request, "input": f"s3://{stack.results_bucket}/{kept}"}
        with pytest.raises(InvokeError, match="SubmitRefusedError") as refused:
            submit.invoke({"submit": outside})
        assert f"under s3://{stack.results_bucket}/incoming/" in str(refused.value)
        assert fake.batches_created() == []
    scanned = stack.client("dynamodb").scan(TableName=stack.table, Select="COUNT")
    assert scanned["Count"] == 0
    assert sorted(s3_keys(stack)) == sorted([INPUT_KEY, kept])
