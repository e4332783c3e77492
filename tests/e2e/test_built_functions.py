"""The ``sam build`` output, run through the real Lambda runtime interface (no Docker).

Each function runs from ``.aws-sam/build`` behind aws-lambda-rie + awslambdaric (see
``harness.py``), against a moto server on 127.0.0.1, with the environment of the built template.
The chains tested are the deployed ones:

- a signed Gemini webhook (``events/``) -> 200 and a record in the table -> the table's stream
  records -> the built notifier -> one event on the bus -> (a consumer's rule) -> SQS;
- a scheduled event -> the built reconciler reads its API key from Secrets Manager, polls a fake
  Gemini server through the real google-genai client of its own build, and ingests.

Test-only environment overrides, on top of the built template's variables:
``OPSTATE_WEBHOOK_TOLERANCE_SECONDS`` (the sample events carry a fixed 2026-05-10 timestamp) and
``GOOGLE_GEMINI_BASE_URL`` (the fake Gemini server). The Google Cloud test also puts a folder of
its own first on ``PYTHONPATH``: a ``sitecustomize`` that turns on the credentials policy's
loopback switch for its fake STS (``loopback_sitecustomize``), test code the built artifact does
not contain. Nothing else is changed.
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from opstate.domain.model import OpEvent
from opstate.domain.states import State
from opstate.ingest import ingest
from opstate.store.dynamodb import DynamoDBStore
from tests.e2e.conftest import GEMINI_TEST_KEY, STACK_NAME, Stack, StartFunction
from tests.e2e.harness import (
    RIE_PYTHON,
    BuiltTemplate,
    json_objects,
    lambda_environment,
    load_event,
    subscribe,
)
from tests.support.fake_gemini import FakeGemini
from tests.support.fake_google_cloud import TOKEN_EXCHANGE, GoogleCloudSide, cloud_batch_resource
from tests.support.streams import lambda_stream_records
from tests.support.template import load_template
from tests.support.webhooks import SAMPLE_NAME

pytestmark = pytest.mark.e2e

# The sample events are signed at a fixed instant (events/README.md): widen the window.
WEBHOOK_OVERRIDES = {"OPSTATE_WEBHOOK_TOLERANCE_SECONDS": "2000000000"}
DETAIL_TYPE = "Operation State Changed"


# --- helpers -------------------------------------------------------------------------------------


def get_item(stack: Stack, name: str) -> dict[str, Any] | None:
    item: dict[str, Any] | None = (
        stack.client("dynamodb")
        .get_item(TableName=stack.table, Key={"name": {"S": name}}, ConsistentRead=True)
        .get("Item")
    )
    return item


def stream_records(stack: Stack) -> list[dict[str, Any]]:
    """Every record on the table's stream, shaped as Lambda hands them to the notifier."""
    return lambda_stream_records(
        stack.client("dynamodb"), stack.client("dynamodbstreams"), stack.table
    )


def receive_all(stack: Stack) -> list[dict[str, Any]]:
    sqs = stack.client("sqs")
    got: list[dict[str, Any]] = []
    while True:
        page = sqs.receive_message(
            QueueUrl=stack.queue_url, MaxNumberOfMessages=10, WaitTimeSeconds=0
        )
        messages = page.get("Messages", [])
        if not messages:
            return got
        for message in messages:
            got.append(json.loads(message["Body"]))
            sqs.delete_message(QueueUrl=stack.queue_url, ReceiptHandle=message["ReceiptHandle"])


def emf_metrics(log_text: str) -> list[tuple[str, str, dict[str, str]]]:
    """(namespace, metric name, dimensions) of every EMF blob a function printed."""
    found: list[tuple[str, str, dict[str, str]]] = []
    for blob in json_objects(log_text, '{"_aws"'):
        for directive in blob["_aws"]["CloudWatchMetrics"]:
            for dimension_set in directive["Dimensions"]:
                dims = {key: str(blob[key]) for key in dimension_set}
                for metric in directive["Metrics"]:
                    found.append((directive["Namespace"], metric["Name"], dims))
    return found


def assert_metrics_as_catalogued(emitted: list[tuple[str, str, dict[str, str]]]) -> None:
    """Every custom metric a built function printed is in ``METRICS`` (the dashboard's source)
    with exactly its dimensions, ``service`` being the stack name."""
    from opstate.observability import METRICS

    namespace = load_template()["Mappings"]["Observability"]["Metrics"]["Namespace"]
    custom = [(name, dims) for ns, name, dims in emitted if ns == namespace]
    assert custom
    for name, dims in custom:
        assert name in METRICS, name
        assert set(dims) == {"service", *METRICS[name].dimensions}, (name, dims)
        assert dims["service"] == STACK_NAME


def alarm_metric(alarm: str) -> tuple[str, str, dict[str, str]]:
    """(namespace, metric, dimensions) an alarm of template.yaml watches, resolved for the e2e
    stack (the dimension values are Refs to the stack name)."""
    data = load_template()
    props = data["Resources"][alarm]["Properties"]
    namespace = data["Mappings"]["Observability"]["Metrics"]["Namespace"]
    assert props["Namespace"] == {"Fn::FindInMap": ["Observability", "Metrics", "Namespace"]}
    dims: dict[str, str] = {}
    for dim in props["Dimensions"]:
        assert dim["Value"] == {"Ref": "AWS::StackName"}, dim
        dims[dim["Name"]] = STACK_NAME
    return namespace, props["MetricName"], dims


def response_body(response: dict[str, Any]) -> dict[str, Any]:
    body: dict[str, Any] = json.loads(response["body"])
    return body


# --- the environment the functions run in ----------------------------------------------------


def test_rie_virtualenv_holds_only_the_runtime_interface_client(
    built_template: BuiltTemplate,
) -> None:
    """Nothing but awslambdaric comes from .rie-venv: a dependency missing from the build or
    the layer cannot be papered over by the test environment."""
    probe = (
        "import importlib.util, json; "
        "print(json.dumps({m: importlib.util.find_spec(m) is not None for m in "
        "['awslambdaric', 'boto3', 'botocore', 'aws_lambda_powertools', 'opstate', "
        "'standardwebhooks', 'jwt', 'google', 'aws_xray_sdk']}))"
    )
    out = subprocess.run(
        [str(RIE_PYTHON), "-c", probe],
        env={"PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    found = json.loads(out.stdout)
    assert found.pop("awslambdaric") is True
    assert found == dict.fromkeys(found, False)


def test_each_function_gets_only_its_own_configuration(
    built_template: BuiltTemplate, stack: Stack
) -> None:
    envs = {
        fn: lambda_environment(
            built_template, fn, refs=stack.refs, aws_endpoint=stack.endpoint, overrides=None
        )
        for fn in ("WebhookFunction", "ReconcileFunction", "NotifyFunction")
    }
    for env in envs.values():
        assert env["OPSTATE_TABLE_NAME"] == stack.table
        assert env["POWERTOOLS_SERVICE_NAME"] == STACK_NAME
        assert env["POWERTOOLS_METRICS_NAMESPACE"] == "GeminiOpstate"
        assert env["POWERTOOLS_LOG_LEVEL"] == "INFO"
        assert env["OPSTATE_OPEN_INDEX_SHARDS"] == "4"
        assert env["OPSTATE_RETENTION_DAYS"] == "90"
    assert envs["WebhookFunction"]["OPSTATE_WEBHOOK_SECRET_ARN"] == stack.webhook_secret_arn
    assert envs["ReconcileFunction"]["OPSTATE_GEMINI_API_KEY_SECRET_ARN"] == (
        stack.gemini_key_secret_arn
    )
    assert envs["NotifyFunction"]["OPSTATE_EVENT_BUS_NAME"] == stack.bus
    # Least privilege shows in the configuration too: no function is told another's secret.
    assert "OPSTATE_GEMINI_API_KEY_SECRET_ARN" not in envs["WebhookFunction"]
    assert "OPSTATE_WEBHOOK_SECRET_ARN" not in envs["ReconcileFunction"]
    assert envs["ReconcileFunction"]["OPSTATE_GOOGLE_CREDENTIALS_SECRET_ARN"] == (
        stack.google_credentials_secret_arn
    )
    assert "OPSTATE_GOOGLE_CREDENTIALS_SECRET_ARN" not in envs["WebhookFunction"]
    assert "OPSTATE_GOOGLE_CREDENTIALS_SECRET_ARN" not in envs["NotifyFunction"]
    assert "OPSTATE_WEBHOOK_SECRET_ARN" not in envs["NotifyFunction"]
    assert "OPSTATE_EVENT_BUS_NAME" not in envs["WebhookFunction"]


# --- webhook -> table -> stream -> notifier -> bus -> SQS ------------------------------------


def test_signed_webhook_is_stored_then_announced_once_on_the_bus(
    start: StartFunction, stack: Stack
) -> None:
    webhook = start("WebhookFunction", overrides=WEBHOOK_OVERRIDES)

    # Not there yet: GET answers 404 (the IAM-authorised route, through the same function).
    assert webhook.invoke(load_event("get-operation.json"))["statusCode"] == 404

    response = webhook.invoke(load_event("webhook-batch-succeeded.json"))
    assert response["statusCode"] == 200, response
    assert response_body(response) | {"name": SAMPLE_NAME} == {
        "applied": True,
        "reason": "created",
        "name": SAMPLE_NAME,
        "state": "SUCCEEDED",
        "version": 1,
    }
    item = get_item(stack, SAMPLE_NAME)
    assert item is not None
    assert item["state"] == {"S": "SUCCEEDED"}
    assert item["version"] == {"N": "1"}
    assert "open_shard" not in item  # terminal: off the open index
    assert "expires_at" in item  # terminal: TTL set

    # The same delivery again (base64 body, as API Gateway may send it): acknowledged, no write.
    redelivery = webhook.invoke(load_event("webhook-batch-succeeded-base64.json"))
    assert redelivery["statusCode"] == 200
    assert response_body(redelivery)["applied"] is False
    # A forged signature: 401, nothing written.
    forged = webhook.invoke(load_event("webhook-bad-signature.json"))
    assert forged["statusCode"] == 401
    # Signed but not JSON: 200 quarantined, the exact bytes kept on the stack's SQS queue.
    malformed_event = load_event("webhook-malformed-json.json")
    malformed = webhook.invoke(malformed_event)
    assert malformed["statusCode"] == 200, malformed
    assert response_body(malformed)["reason"] == "quarantined"
    kept = stack.client("sqs").receive_message(
        QueueUrl=stack.quarantine_queue_url, MaxNumberOfMessages=10
    )["Messages"]
    assert [json.loads(m["Body"])["body"] for m in kept] == [
        base64.b64encode(malformed_event["body"].encode()).decode()
    ]
    # ... with the signature headers that proved it, for the replay to verify again (issue 24).
    sent = {k.lower(): v for k, v in malformed_event["headers"].items()}
    assert json.loads(kept[0]["Body"])["headers"] == {
        name: sent[name] for name in ("webhook-id", "webhook-timestamp", "webhook-signature")
    }
    # A stale poll result reported through PUT cannot move the record back.
    stale = webhook.invoke(load_event("report-stale.json"))
    assert stale["statusCode"] == 200
    assert response_body(stale)["applied"] is False
    assert get_item(stack, SAMPLE_NAME) == item

    got = webhook.invoke(load_event("get-operation.json"))
    assert got["statusCode"] == 200
    assert response_body(got)["state"] == "SUCCEEDED"

    # The alarms watch exactly the metrics the built function emits.
    emitted = emf_metrics(webhook.log_text())
    assert alarm_metric("SignatureRejectedAlarm") in emitted
    assert alarm_metric("WebhooksQuarantinedAlarm") in emitted
    # ... and the dashboard's: each metric with the dimensions METRICS (its source) names.
    assert_metrics_as_catalogued(emitted)
    outcomes = {d.get("outcome") for _, m, d in emitted if m == "WebhookDeliveries"}
    assert {"applied", "dropped", "rejected", "quarantined"} <= outcomes

    # The stream holds one record: the INSERT (redelivery and the stale report wrote nothing).
    records = stream_records(stack)
    assert [(r["eventName"], r["dynamodb"]["Keys"]["name"]["S"]) for r in records] == [
        ("INSERT", SAMPLE_NAME)
    ]

    notify = start("NotifyFunction")
    assert notify.invoke({"Records": records}) == {"batchItemFailures": []}

    events = receive_all(stack)
    assert len(events) == 1, events
    event = events[0]
    assert event["source"] == "gemini-opstate"
    assert event["detail-type"] == DETAIL_TYPE
    detail = event["detail"]
    assert detail["name"] == SAMPLE_NAME
    assert detail["state"] == "SUCCEEDED"
    assert detail["previousState"] is None
    assert detail["version"] == 1
    # <name>@<created_ns>#<version>: the incarnation's creation time, read from the table.
    assert detail["idempotencyKey"] == f"{SAMPLE_NAME}@{item['created_ns']['N']}#1"
    assert detail["updateTime"] == "2026-05-10T09:59:58.123456789Z"


# --- schedule -> reconciler -> fake Gemini -> table ------------------------------------------


def test_scheduled_reconcile_polls_gemini_with_the_secret_key_and_ingests(
    start: StartFunction, stack: Stack
) -> None:
    tracked = "models/veo-3.1-generate-preview/operations/e2e-video"
    store = DynamoDBStore(stack.table, client=stack.client("dynamodb"))
    try:
        created = ingest(store, OpEvent(tracked, State.PENDING, 0, "test", {}))
        assert created.applied
    finally:
        store.close()

    with FakeGemini() as fake:
        # Any other key is answered 401: success proves the built function read the key from
        # Secrets Manager (OPSTATE_GEMINI_API_KEY_SECRET_ARN of the built template).
        fake.api_key = GEMINI_TEST_KEY
        fake.put_batch(
            "batches/e2e-running", "BATCH_STATE_RUNNING", update_time="2026-05-10T09:00:00Z"
        )
        fake.put_batch(
            "batches/e2e-done", "BATCH_STATE_SUCCEEDED", update_time="2026-05-10T09:30:00Z"
        )
        fake.put_video(tracked, done=True, video_uri="https://example.invalid/e2e.mp4")
        fake.put_webhook("wh-e2e", name="e2e", state="disabled_due_to_failed_deliveries")

        reconcile = start("ReconcileFunction", overrides={"GOOGLE_GEMINI_BASE_URL": fake.base_url})
        result = reconcile.invoke(load_event("schedule.json"))

        assert fake.hits("webhooks") >= 1
        assert fake.hits(tracked) >= 1

    assert result["errors"] == 0, reconcile.log_tail()
    assert result["discovered"] == 2
    assert result["stopped_early"] is False
    assert result["applied"] >= 3
    states = {
        name: (get_item(stack, name) or {}).get("state", {}).get("S")
        for name in ("batches/e2e-running", "batches/e2e-done", tracked)
    }
    assert states == {
        "batches/e2e-running": "RUNNING",
        "batches/e2e-done": "SUCCEEDED",
        tracked: "SUCCEEDED",
    }
    # The disabled webhook is reported in the metric the WebhooksDisabled alarm watches.
    assert alarm_metric("WebhooksDisabledAlarm") in emf_metrics(reconcile.log_text())
    assert_metrics_as_catalogued(emf_metrics(reconcile.log_text()))
    assert "disabled_due_to_failed_deliveries" in reconcile.log_text()


# --- Pub/Sub push (Veo on Google Cloud) -> the built webhook function -> table ---------------


def test_a_signed_pubsub_push_reaches_the_table_through_the_built_webhook(
    start: StartFunction, stack: Stack
) -> None:
    from tests.integration.test_pubsub_push import AUDIENCE, EMAIL, VEO, envelope, operation
    from tests.integration.test_pubsub_push import token as pubsub_token
    from tests.support.fake_google_cloud import cloud_video_response
    from tests.support.webhooks import http_event
    from tests.unit.test_signatures import JwksServer, Signer

    signer = Signer("google-e2e")
    jwks = JwksServer()
    jwks.keys = [signer.jwk()]
    try:
        webhook = start(
            "WebhookFunction",
            overrides={
                # The template's parameters, as a deployment sets them; Google's JWKS is a test's.
                "OPSTATE_PUBSUB_AUDIENCE": AUDIENCE,
                "OPSTATE_PUBSUB_EMAIL": EMAIL,
                "OPSTATE_PUBSUB_JWKS_URL": jwks.url,
            },
        )
        body = envelope(operation(done=True, response=cloud_video_response("gs://e2e/v.mp4")))

        def push(bearer: str) -> dict[str, Any]:
            headers = {"content-type": "application/json", "authorization": f"Bearer {bearer}"}
            event = http_event("POST", "/google-cloud/pubsub", body=body, headers=headers)
            response: dict[str, Any] = webhook.invoke(event)
            return response

        forged = push(Signer("google-e2e").token(aud=AUDIENCE, iss="https://accounts.google.com"))
        assert forged["statusCode"] == 401
        assert get_item(stack, VEO) is None
        accepted = push(pubsub_token(signer))
        assert accepted["statusCode"] == 200, webhook.log_tail()
        assert response_body(accepted)["state"] == "SUCCEEDED"
    finally:
        jwks.stop()
    item = get_item(stack, VEO) or {}
    assert item["state"] == {"S": "SUCCEEDED"}
    assert item["kind"] == {"S": "video"}


# --- schedule -> reconciler -> Google Cloud (federated credentials) -> table -----------------


def loopback_sitecustomize(folder: Path, fake_base_url: str) -> Path:
    """A folder whose ``sitecustomize`` (run at the interpreter's start) turns on
    ``allow_loopback_for_tests`` for the fake in the built reconciler's process. Only code can
    turn the switch on: the built artifact has none that does, and no variable or secret can."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "sitecustomize.py").write_text(
        "from opstate.reconcile.cloud_credentials_policy import allow_loopback_for_tests\n"
        f"allow_loopback_for_tests({fake_base_url!r})\n",
        encoding="utf-8",
    )
    return folder


def test_scheduled_reconcile_polls_a_google_cloud_job_with_federated_credentials(
    start: StartFunction, stack: Stack, built_template: BuiltTemplate, tmp_path: Path
) -> None:
    """The built reconciler reads an external_account JSON from the stack's (template-created)
    Google credentials secret, signs GetCallerIdentity with its own AWS credentials, exchanges
    it at the fake STS, impersonates the service account, and polls a Cloud job and a Cloud
    scope through its own google-genai build in enterprise mode. The fake STS is on 127.0.0.1,
    which the credentials policy admits only through the tests' loopback switch."""
    job = "projects/p1/locations/us-central1/batchPredictionJobs/e2e1"
    untracked = "projects/p1/locations/us-central1/batchPredictionJobs/e2e2"
    store = DynamoDBStore(stack.table, client=stack.client("dynamodb"))
    try:
        assert ingest(store, OpEvent(job, State.PENDING, 0, "test", {})).applied
    finally:
        store.close()
    with FakeGemini() as fake:
        cloud = GoogleCloudSide(fake)
        stack.client("secretsmanager").put_secret_value(
            SecretId=stack.google_credentials_secret_arn,
            SecretString=json.dumps(
                cloud.external_account_info("opstate@p1.iam.gserviceaccount.com")
            ),
        )
        fake.put(
            job,
            cloud_batch_resource(
                job,
                "PARTIALLY_SUCCEEDED",
                gcs_output_directory="gs://e2e/out",
                completion_stats={"successfulCount": 3, "failedCount": 1, "incompleteCount": 0},
            ),
        )
        fake.put(untracked, cloud_batch_resource(untracked, "RUNNING"))
        python_path = lambda_environment(
            built_template,
            "ReconcileFunction",
            refs=stack.refs,
            aws_endpoint=stack.endpoint,
        )["PYTHONPATH"]
        switch = loopback_sitecustomize(tmp_path / "loopback-switch", fake.base_url)
        reconcile = start(
            "ReconcileFunction",
            overrides={
                "GOOGLE_GEMINI_BASE_URL": fake.base_url,
                "GOOGLE_VERTEX_BASE_URL": fake.base_url,
                "OPSTATE_GOOGLE_CLOUD_SCOPES": "p1/us-central1",
                "PYTHONPATH": os.pathsep.join([str(switch), python_path]),
            },
        )
        result = reconcile.invoke(load_event("schedule.json"))
        assert cloud.token_requests == [TOKEN_EXCHANGE], reconcile.log_tail()
    assert result["errors"] == 0, reconcile.log_tail()
    item = get_item(stack, job) or {}
    assert item["state"]["S"] == "SUCCEEDED"
    store = DynamoDBStore(stack.table, client=stack.client("dynamodb"))
    try:
        record = store.get(job)
        found = store.get(untracked)
    finally:
        store.close()
    assert record is not None and found is not None
    assert record.details["partial"] is True
    assert record.details["output_location"] == "gs://e2e/out"
    assert record.details["completion_stats"] == {
        "successful_count": 3,
        "failed_count": 1,
        "incomplete_count": 0,
    }
    assert found.state is State.RUNNING
    assert "PRIVATE KEY" not in reconcile.log_text()
    assert "testing" not in reconcile.log_text()  # the AWS secret key the request was signed with


# --- schedule -> reconciler -> lost / overdue marks -> stream -> notifier -> bus ---------------


def test_built_reconciler_announces_lost_and_overdue_operations_on_the_bus(
    start: StartFunction, stack: Stack
) -> None:
    import time

    from opstate.store import PollState

    hour_ns = 3600 * 1_000_000_000
    now_ns = time.time_ns()
    slow, gone = "batches/e2e-slow", "batches/e2e-gone"
    store = DynamoDBStore(stack.table, client=stack.client("dynamodb"))
    try:
        # A batch registered 25 hours ago and still running: overdue (batch threshold 24 h).
        began = now_ns - 25 * hour_ns
        assert ingest(
            store, OpEvent(slow, State.RUNNING, began, "test", {}), clock_ns=lambda: began
        ).applied
        # A batch Gemini has answered 404 for in two earlier runs, the first 25 hours ago: the
        # next 404 is the third, spanning more than a day, so it is lost.
        assert ingest(store, OpEvent(gone, State.PENDING, now_ns - hour_ns, "test", {})).applied
        before = PollState(due_ns=0, misses=2, missing_since_ns=now_ns - 25 * hour_ns)
        assert store.set_poll(gone, 1, before)
    finally:
        store.close()
    # A consumer subscribed to the marks.
    subscribe(
        stack.clients,
        bus=stack.bus,
        queue_url=stack.queue_url,
        rule="e2e-marks",
        detail_types=["Operation Lost", "Operation Overdue"],
    )

    with FakeGemini() as fake:
        fake.api_key = GEMINI_TEST_KEY
        fake.put_batch(slow, "BATCH_STATE_RUNNING", update_time="2026-05-10T09:00:00Z")
        reconcile = start("ReconcileFunction", overrides={"GOOGLE_GEMINI_BASE_URL": fake.base_url})
        result = reconcile.invoke(load_event("schedule.json"))
        assert fake.hits(gone) == 1

    assert (result["lost"], result["overdue"], result["errors"]) == (1, 1, 0), reconcile.log_tail()
    emitted = emf_metrics(reconcile.log_text())
    assert alarm_metric("OperationsLostAlarm") in emitted
    assert alarm_metric("OperationsOverdueAlarm") in emitted
    item = get_item(stack, gone)
    assert item is not None and item["state"] == {"S": "PENDING"}  # last known state kept
    assert "open_shard" not in item and "lost_ns" in item  # out of the polling set

    records = stream_records(stack)
    notify = start("NotifyFunction")
    assert notify.invoke({"Records": records}) == {"batchItemFailures": []}
    marks = sorted(
        (e["detail-type"], e["detail"]["name"], e["detail"]["idempotencyKey"])
        for e in receive_all(stack)
        if e["detail-type"] != DETAIL_TYPE
    )
    assert [m[:2] for m in marks] == [("Operation Lost", gone), ("Operation Overdue", slow)]
    assert marks[0][2].startswith(f"{gone}#lost#")
    assert marks[1][2] == f"{slow}#overdue"


# --- terminal change on the bus -> archiver -> S3 -> stream -> notifier -> bus ---------------


def test_built_archiver_copies_a_batch_output_to_s3_and_it_is_announced(
    start: StartFunction, stack: Stack
) -> None:
    import hashlib
    import time

    from opstate.domain.times import format_time

    name = "batches/e2e-archived"
    now_ns = time.time_ns()
    store = DynamoDBStore(stack.table, client=stack.client("dynamodb"))
    try:
        assert ingest(
            store, OpEvent(name, State.SUCCEEDED, now_ns, "test", {}), clock_ns=lambda: now_ns
        ).applied
    finally:
        store.close()
    subscribe(
        stack.clients,
        bus=stack.bus,
        queue_url=stack.queue_url,
        rule="e2e-results",
        detail_types=["Operation Results Archived"],
    )
    data = (
        b"".join(
            json.dumps(
                {
                    "key": f"k{i}",
                    "response": {
                        # the first 5 stopped for safety: no answer (blocked)
                        "candidates": [{"finishReason": "SAFETY" if i < 5 else "STOP"}],
                        "usageMetadata": {"totalTokenCount": 3},
                    },
                }
            ).encode()
            + b"\n"
            for i in range(500)
        )
        + b'{"key": "bad", "status": {"code": 8, "message": "quota"}}\n'
    )
    with FakeGemini() as fake:
        fake.api_key = GEMINI_TEST_KEY  # the built function read the key from Secrets Manager
        file = fake.put_file(
            "e2e-out", body=data, expiration_time=format_time(now_ns + 3600 * 10**9)
        )
        fake.put_batch(name, "BATCH_STATE_SUCCEEDED", responses_file=file)
        archiver = start("ArchiverFunction", overrides={"GOOGLE_GEMINI_BASE_URL": fake.base_url})
        trigger = {
            "source": "gemini-opstate",
            "detail-type": DETAIL_TYPE,
            "detail": {"name": name, "state": "SUCCEEDED"},
        }
        result = archiver.invoke(trigger)
    assert (result["archived"], result["failed"], result["errors"]) == (1, 0, 0), (
        archiver.log_tail()
    )
    s3 = stack.client("s3")
    keys = [o["Key"] for o in s3.list_objects_v2(Bucket=stack.results_bucket)["Contents"]]
    output = next(k for k in keys if k.endswith("/output.jsonl"))
    assert output.startswith(f"results/{name}/") and any(k.endswith("/summary.json") for k in keys)
    head = s3.head_object(Bucket=stack.results_bucket, Key=output)
    assert head["Metadata"]["sha256"] == hashlib.sha256(data).hexdigest()
    assert head["Metadata"]["opstate-name"] == name
    assert_metrics_as_catalogued(emf_metrics(archiver.log_text()))

    notify = start("NotifyFunction")
    assert notify.invoke({"Records": stream_records(stack)}) == {"batchItemFailures": []}
    (event,) = [e for e in receive_all(stack) if e["detail-type"] != DETAIL_TYPE]
    detail = event["detail"]
    assert detail["name"] == name and detail["status"] == "archived"
    assert detail["rows"] == {
        "total": 501,
        "succeeded": 500,
        "blocked": 5,
        "failed": 1,
        "unreadable": 0,
    }
    assert detail["errors"] == {"8": 1} and detail["usage"]["totalTokenCount"] == 1500


# --- a waiter: registered through the built API, resumed by the built resumer ----------------


def test_a_waiter_registered_through_the_api_is_resumed_by_the_built_resumer(
    start: StartFunction, stack: Stack
) -> None:
    name = "batches/e2e-waiter"
    token = "e2e-task-token-" + "t" * 40
    # The stack's WaiterStateMachineArns parameter, as the template passes it (default: off).
    waiters_on = {"OPSTATE_WAITER_STATE_MACHINE_ARNS": "arn:aws:states:us-east-1:1:stateMachine:e"}
    webhook = start("WebhookFunction", overrides={**WEBHOOK_OVERRIDES, **waiters_on})
    put = load_event("report-stale.json")
    put["rawPath"] = f"/operations/{name}"
    put["pathParameters"] = {"name": name}
    put["isBase64Encoded"] = False
    put["requestContext"]["http"]["path"] = f"/operations/{name}"
    put["headers"].pop("content-length", None)
    put["body"] = json.dumps({"state": "RUNNING", "waiter": {"stepFunctionsTaskToken": token}})
    answer = webhook.invoke(put)
    assert answer["statusCode"] == 200, answer
    assert response_body(answer)["waiter"]["added"] is True
    assert token not in answer["body"] and token not in webhook.log_text()
    ddb = stack.client("dynamodb")
    kept = ddb.query(
        TableName=stack.waiters_table,
        KeyConditionExpression="#n = :n",
        ExpressionAttributeNames={"#n": "name"},
        ExpressionAttributeValues={":n": {"S": name}},
    )["Items"]
    assert sorted(i["waiter_id"]["S"] for i in kept)[0] == "#count" and len(kept) == 2
    record_before = get_item(stack, name)

    resumer = start("WaiterResumerFunction", overrides=waiters_on)
    # The registration's stream record: the job still runs, nothing to resume yet.
    inserts = lambda_stream_records(ddb, stack.client("dynamodbstreams"), stack.waiters_table)
    assert {r["eventName"] for r in inserts} == {"INSERT"}
    assert resumer.invoke({"Records": inserts})["pending"] == 1
    assert get_item(stack, name) == record_before  # the record is never written

    # The job ends; the bus event reaches the resumer, which answers the token (moto's Step
    # Functions accepts any token outside its interpreter) and removes the waiter.
    done = dict(put, body=json.dumps({"state": "SUCCEEDED", "updateTime": "2026-06-01T00:00:00Z"}))
    assert webhook.invoke(done)["statusCode"] == 200
    event = {
        "version": "0",
        "source": "gemini-opstate",
        "detail-type": DETAIL_TYPE,
        "detail": {"name": name, "state": "SUCCEEDED"},
    }
    totals = resumer.invoke(event)
    assert (totals["succeeded"], totals["gone"], totals["retry-later"]) == (1, 0, 0), totals
    left = ddb.query(
        TableName=stack.waiters_table,
        KeyConditionExpression="#n = :n",
        ExpressionAttributeNames={"#n": "name"},
        ExpressionAttributeValues={":n": {"S": name}},
    )["Items"]
    assert [i["waiter_id"]["S"] for i in left] == ["#count"]
    assert token not in resumer.log_text()
    emitted = emf_metrics(resumer.log_text())
    assert_metrics_as_catalogued(emitted)
    assert {d.get("outcome") for _, m, d in emitted if m == "WaitersResumed"} == {"succeeded"}
