"""A job on the AWS path's parts (issue 46; moto, in process): a DynamoDB table built from
template.yaml, an S3 results bucket, the input under ``incoming/``, the real google-genai client
talking to the fake Gemini enforcing the Batch API's limits. The steps are the deployed
functions': ``submit_event`` (the submit function), then for each part's terminal change the
reconciler's poll (``refresh_with``), the archiver's bus-trigger path (``archive_from_settings``
over the name, ``retry_from_settings`` over ``roots_of`` it: the part's lineage and its job)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from opstate.config import Settings
from opstate.domain.states import State
from opstate.notify import JOB_PART_CREATED_DETAIL_TYPE, RESULTS_FINAL_DETAIL_TYPE, SOURCE
from opstate.outcomes.wiring import archive_from_settings
from opstate.retry import jobs
from opstate.retry.job_step import JOB
from opstate.retry.wiring import SubmitRefusedError, retry_from_settings, roots_of, submit_event
from opstate.wiring.reconcile import refresh_with
from tests.integration.test_job_feeding import CAP, big_input
from tests.integration.test_notify import Rig, rig
from tests.integration.test_notify_retry import publish
from tests.integration.test_retry_dynamodb import BUCKET, INPUT_KEY, aws
from tests.support.fake_gemini import FakeGemini
from tests.support.fake_gemini_limits import QueueLimits

__all__ = ["aws", "rig"]  # the fixtures


def subscribe_jobs(rig: Rig) -> None:
    """Forward the job events and the final results to the rig's queue too."""
    queue_arn = rig.sqs.get_queue_attributes(QueueUrl=rig.queue_url, AttributeNames=["QueueArn"])[
        "Attributes"
    ]["QueueArn"]
    rig.events.put_rule(
        Name="jobs",
        EventBusName=rig.bus,
        EventPattern=json.dumps(
            {"source": [SOURCE], "detail-type": [JOB_PART_CREATED_DETAIL_TYPE]}
        ),
    )
    rig.events.put_targets(
        Rule="jobs", EventBusName=rig.bus, Targets=[{"Id": "q", "Arn": queue_arn}]
    )


MODEL = "gemini-2.5-flash"
# 480 of big_input's lines are four parts of CAP (3.9 times it), the fewest these tests ask
# for: every step (a part's feeding, its lineage, its retry batch in the same queue) runs for
# each part alike, and the 600 lines they had were a fifth part through the same steps, each a
# dozen moto calls more (issue 49).
LINES = 480


def deployed(rig: Rig) -> Settings:
    return Settings.from_env(
        {
            "OPSTATE_STORE": f"dynamodb://{rig.table}",
            "OPSTATE_RESULTS_URL": f"s3://{BUCKET}/gemini",
            "GEMINI_API_KEY": "test-key",
            "OPSTATE_RECONCILE_MAX_PAGES": "0",
            "OPSTATE_SUBMIT_ENQUEUED_TOKENS": f"{MODEL}={CAP}",
        }
    )


def test_a_job_of_four_times_the_cap_on_dynamodb_and_s3(
    aws: tuple[Rig, Any], fake_gemini: FakeGemini
) -> None:
    rig, s3 = aws
    config = deployed(rig)
    data = big_input(LINES)
    s3.put_object(Bucket=BUCKET, Key=INPUT_KEY, Body=data)
    fake_gemini.limits = QueueLimits(enqueued_tokens={MODEL: CAP}, max_open=100)
    subscribe_jobs(rig)
    submitted = submit_event(
        config, {"input": f"s3://{BUCKET}/{INPUT_KEY}", "model": MODEL, "retry": {"maxAttempts": 1}}
    )
    name = submitted["name"]
    assert name.startswith("jobs/") and submitted["parts"] >= 4
    # The submit function makes the job (its role reads no kept input); the archiver's pass,
    # the reconciler's re-drive of a due job, feeds it: what fits, created at once.
    assert fake_gemini.batches_created() == []
    retry_from_settings(config, store=rig.store, names=[name])
    seen = publish(rig)
    assert len(fake_gemini.batches_created()) == 1
    for _ in range(20):
        for batch in fake_gemini.batches_created():
            if (fake_gemini.resource(batch) or {}).get("done"):
                continue
            keys = [json.loads(line)["key"] for line in fake_gemini.batch_input(batch).splitlines()]
            fake_gemini.run_batch(batch, [{"key": k, "response": {"candidates": []}} for k in keys])
            record = rig.store.get(batch)
            assert record is not None
            assert refresh_with(rig.store, config, record).error is None
            archive_from_settings(config, store=rig.store, names=[batch])
            roots = roots_of(rig.store, [batch])
            assert roots == [batch, name]  # the part's lineage, then its job
            retry_from_settings(config, store=rig.store, names=roots)
        seen += publish(rig)
        state = rig.store.get_retry(name)
        assert state is not None
        if state.doc.get("final"):
            break
    else:
        raise AssertionError(rig.store.get_retry(name))
    plan = state.doc[JOB]
    assert jobs.finished(plan)
    sent = b"".join(fake_gemini.batch_input(p["batch"]) for p in plan["parts"])
    assert sent == data  # every line once, byte for byte
    assert len(fake_gemini.limits.refusals) <= 2
    assert fake_gemini.limits.peak_tokens[MODEL] <= CAP
    location = state.doc["final"]["location"]
    final = s3.get_object(Bucket=BUCKET, Key=location.removeprefix(f"s3://{BUCKET}/"))
    lines = final["Body"].read().splitlines()
    assert [json.loads(x)["key"] for x in lines] == [
        json.loads(x)["key"] for x in data.splitlines()
    ]
    job = rig.store.get(name)
    assert job is not None and job.state is State.SUCCEEDED
    # Announced: each part created once, the job's final result once (schemas checked).
    parts = [d for t, d in seen if t == JOB_PART_CREATED_DETAIL_TYPE]
    assert sorted(d["batch"] for d in parts) == sorted(p["batch"] for p in plan["parts"])
    assert all(d["job"] == name for d in parts)
    finals = [d for t, d in seen if t == RESULTS_FINAL_DETAIL_TYPE and d["root"] == name]
    assert len(finals) == 1 and finals[0]["rows"]["total"] == LINES
    assert all(nonce not in json.dumps(seen) for nonce in (p["nonce"] for p in plan["parts"]))
    assert rig.store.get_counter("job-enqueued:gemini-2.5-flash:reserved") == rig.store.get_counter(
        "job-enqueued:gemini-2.5-flash:freed"
    )


def test_a_huge_line_is_refused_before_anything_is_created(
    aws: tuple[Rig, Any], fake_gemini: FakeGemini
) -> None:
    rig, s3 = aws
    config = deployed(rig)
    line = {"key": "huge", "request": {"contents": [{"parts": [{"text": "y" * (2 * CAP + 10)}]}]}}
    data = big_input(10) + json.dumps(line).encode() + b"\n"
    s3.put_object(Bucket=BUCKET, Key=INPUT_KEY, Body=data)
    with pytest.raises(SubmitRefusedError, match=r"line 11: about \d+ tokens"):
        submit_event(config, {"input": f"s3://{BUCKET}/{INPUT_KEY}", "model": MODEL})
    assert fake_gemini.batches_created() == [] and fake_gemini.files_held() == []
    assert not any(r.name.startswith("jobs/") for r in rig.store.iter_all())


def test_a_parts_retry_batches_share_the_queue_with_the_parts_on_dynamodb(
    aws: tuple[Rig, Any], fake_gemini: FakeGemini
) -> None:
    # Each part fails three rows for a passing reason: its lineage's retry batch takes its
    # tokens and a slot from the same DynamoDB counters as the parts (opstate.retry.child_room),
    # so with two batches open at most and the fake counting tokens as opstate does, nothing
    # is refused and no limit is passed; every reservation is given back at the end.
    from tests.integration.test_job_retry_room import half_bytes
    from tests.support.retry_rows import failed

    rig, s3 = aws
    config = Settings.from_env(
        {
            "OPSTATE_STORE": f"dynamodb://{rig.table}",
            "OPSTATE_RESULTS_URL": f"s3://{BUCKET}/gemini",
            "GEMINI_API_KEY": "test-key",
            "OPSTATE_RECONCILE_MAX_PAGES": "0",
            "OPSTATE_SUBMIT_ENQUEUED_TOKENS": f"{MODEL}={CAP}",
            "OPSTATE_SUBMIT_MAX_BATCHES": "2",
        }
    )
    data = big_input(LINES)
    s3.put_object(Bucket=BUCKET, Key=INPUT_KEY, Body=data)
    limits = QueueLimits(enqueued_tokens={MODEL: CAP}, max_open=2, count_tokens=half_bytes)
    fake_gemini.limits = limits
    submitted = submit_event(
        config, {"input": f"s3://{BUCKET}/{INPUT_KEY}", "model": MODEL, "retry": {"maxAttempts": 1}}
    )
    name = submitted["name"]
    parts: set[str] = set()
    for _ in range(40):
        state = rig.store.get_retry(name)
        assert state is not None
        parts |= {p["batch"] for p in state.doc[JOB]["parts"] if p.get("batch")}
        for batch in fake_gemini.batches_created():
            if (fake_gemini.resource(batch) or {}).get("done"):
                continue
            keys = [json.loads(line)["key"] for line in fake_gemini.batch_input(batch).splitlines()]
            rows = [{"key": k, "response": {"candidates": []}} for k in keys]
            if batch in parts:
                rows[:3] = [failed(k, 503, "UNAVAILABLE") for k in keys[:3]]
            fake_gemini.run_batch(batch, rows)
            record = rig.store.get(batch)
            assert record is not None
            assert refresh_with(rig.store, config, record).error is None
            archive_from_settings(config, store=rig.store, names=[batch])
            retry_from_settings(config, store=rig.store, names=roots_of(rig.store, [batch]))
        retry_from_settings(config, store=rig.store, every=True)  # the schedule's pass
        reserved = rig.store.get_counter(f"job-enqueued:{MODEL}:reserved")
        assert reserved - rig.store.get_counter(f"job-enqueued:{MODEL}:freed") <= CAP
        slots = rig.store.get_counter("job-batches:reserved")
        assert slots - rig.store.get_counter("job-batches:freed") <= 2
        state = rig.store.get_retry(name)
        assert state is not None
        if (state.doc.get("final") or {}).get("status") == "final":
            break
    else:
        raise AssertionError(rig.store.get_retry(name))
    final = state.doc["final"]
    assert final["rows"]["total"] == LINES and final["rows"]["failed"] == 0
    children = [
        child
        for part in parts
        for child in (rig.store.get_retry(part) or state).doc.get("children", [])
    ]
    assert len(children) == len(parts) >= 4
    assert all(c["reserved"]["freed"] is True for c in children)
    assert limits.refusals == [] and limits.peak_tokens[MODEL] <= CAP and limits.peak_open <= 2
    for counter in (f"job-enqueued:{MODEL}", "job-batches"):
        assert rig.store.get_counter(f"{counter}:reserved") == rig.store.get_counter(
            f"{counter}:freed"
        )
