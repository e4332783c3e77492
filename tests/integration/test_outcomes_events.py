"""Archive outcomes reach the bus through the outbox (moto, in process): the archiver's writes
to a ``DynamoDBStore`` (template table, stream on) go through the notifier to the custom bus
and a consumer queue, as in test_notify.py (whose harness this reuses). Every detail is valid
against its JSON Schema (``schemas/``), and a schema refuses what it should."""

from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from opstate.config import Settings
from opstate.domain.model import OpEvent
from opstate.domain.states import State
from opstate.domain.times import NS_PER_SECOND, format_time
from opstate.ingest import ingest
from opstate.notify import (
    RESULTS_ARCHIVED_DETAIL_TYPE,
    RESULTS_LOST_DETAIL_TYPE,
    SOURCE,
    Notifier,
)
from opstate.outcomes.genai_source import GenaiSource, make_client
from opstate.outcomes.run import archive_once
from opstate.outcomes.s3_sink import S3Sink
from tests.integration.test_notify import Rig, lambda_event, rig
from tests.support.fake_gemini import FakeGemini
from tests.support.outcomes import batch_output

__all__ = ["rig"]  # the fixture

SCHEMAS = Path(__file__).resolve().parents[2] / "schemas"
HOUR = 3600 * NS_PER_SECOND


def schema(name: str) -> dict[str, Any]:
    document: dict[str, Any] = json.loads((SCHEMAS / f"{name}.schema.json").read_text())
    jsonschema.Draft202012Validator.check_schema(document)
    return document


def validate(detail: dict[str, Any], name: str) -> None:
    jsonschema.Draft202012Validator(
        schema(name), format_checker=jsonschema.Draft202012Validator.FORMAT_CHECKER
    ).validate(detail)


def subscribe(rig: Rig) -> None:
    queue_arn = rig.sqs.get_queue_attributes(QueueUrl=rig.queue_url, AttributeNames=["QueueArn"])[
        "Attributes"
    ]["QueueArn"]
    rig.events.put_rule(
        Name="results",
        EventBusName=rig.bus,
        EventPattern=json.dumps(
            {
                "source": [SOURCE],
                "detail-type": [RESULTS_ARCHIVED_DETAIL_TYPE, RESULTS_LOST_DETAIL_TYPE],
            }
        ),
    )
    rig.events.put_targets(
        Rule="results", EventBusName=rig.bus, Targets=[{"Id": "results", "Arn": queue_arn}]
    )


def test_archived_and_lost_results_are_announced_once(
    rig: Rig, fake_gemini: FakeGemini, monkeypatch: pytest.MonkeyPatch
) -> None:
    import boto3

    subscribe(rig)
    monkeypatch.setenv("GOOGLE_GEMINI_BASE_URL", fake_gemini.base_url)
    source = GenaiSource(make_client(Settings(gemini_api_key="k", results_http_timeout_s=5)))
    s3 = boto3.client("s3", region_name="us-east-1")
    s3.create_bucket(Bucket="results")
    sink = S3Sink("results", "r", client=s3)
    now = time.time_ns()
    data, expected = batch_output(9, {8: 2}, blocked=2)
    file = fake_gemini.put_file("ok", body=data, expiration_time=format_time(now + 24 * HOUR))
    fake_gemini.put_batch("batches/ok", "SUCCEEDED", responses_file=file)
    fake_gemini.put_batch("batches/gone", "SUCCEEDED", responses_file="files/deleted")
    for name, t in (("batches/ok", now), ("batches/gone", now), ("batches/old", now - 72 * HOUR)):
        ingest(rig.store, OpEvent(name, State.SUCCEEDED, t, "poll", {}), clock_ns=lambda t=t: t)
    notifier = Notifier(rig.bus, rig.events)
    for _ in range(2):  # a second pass writes nothing new: nothing more announced
        result = archive_once(rig.store, source, sink, settings=Settings())
        records = rig.read_stream()
        if records:
            assert notifier.handle(lambda_event(records))["batchItemFailures"] == []
    source.close()
    assert result.archived == 0
    events = [e for e in rig.receive() if e["detail-type"] != "Operation State Changed"]
    assert sorted((e["detail-type"], e["detail"]["name"]) for e in events) == [
        (RESULTS_ARCHIVED_DETAIL_TYPE, "batches/ok"),
        (RESULTS_LOST_DETAIL_TYPE, "batches/gone"),
    ]  # batches/old (older than the retention, never waited for) is only marked expired
    archived = next(e["detail"] for e in events if e["detail-type"] == RESULTS_ARCHIVED_DETAIL_TYPE)
    validate(archived, "operation-results-archived")
    assert archived["rows"] == expected.rows and archived["errors"] == {"8": 2}
    assert archived["usage"] == expected.usage and archived["kind"] == "batch"
    assert archived["objects"][0]["sha256"] == hashlib.sha256(data).hexdigest()
    assert archived["location"].endswith("/summary.json")
    record = rig.store.get("batches/ok")
    assert record is not None
    assert archived["idempotencyKey"] == f"batches/ok@{record.created_ns}#results-archived"
    lost = next(e["detail"] for e in events if e["detail-type"] == RESULTS_LOST_DETAIL_TYPE)
    validate(lost, "operation-results-lost")
    assert lost["status"] == "expired" and "404" in lost["lastError"]
    # The schemas refuse what they should.
    with pytest.raises(jsonschema.ValidationError):
        validate({**archived, "status": "expired"}, "operation-results-archived")
    with pytest.raises(jsonschema.ValidationError):
        validate({k: v for k, v in lost.items() if k != "name"}, "operation-results-lost")
    with pytest.raises(jsonschema.ValidationError):
        validate(
            {**archived, "objects": [{"location": "x", "bytes": 1}]}, "operation-results-archived"
        )
