"""A batch submitted alone in the project's queue on the AWS path (issue 46; docs/jobs.md, "A
batch submitted alone"; moto, in process): the submit function's one-part input takes its room
in the DynamoDB counters the job's parts take, is held as a job of one part when the queue is
full by a running job, and is created by the archiver's pass when room frees; a one-part batch
submitted with room is the batch itself and gives its room back when it ends. The fake Gemini
enforces the Batch API's limits, counting tokens as opstate estimates them."""

from __future__ import annotations

import json
from typing import Any

from opstate.config import Settings
from opstate.outcomes.wiring import archive_from_settings
from opstate.retry.job_step import JOB
from opstate.retry.solo_room import RESERVED
from opstate.retry.wiring import retry_from_settings, roots_of, submit_event
from opstate.store.retry_state import RETRY_DONE
from opstate.wiring.reconcile import refresh_with
from tests.integration.test_job_feeding import CAP, big_input
from tests.integration.test_job_retry_room import half_bytes
from tests.integration.test_notify import Rig, rig
from tests.integration.test_retry_dynamodb import BUCKET, INPUT_KEY, aws
from tests.support.fake_gemini import FakeGemini
from tests.support.fake_gemini_limits import QueueLimits
from tests.support.retry_rows import request_bytes

__all__ = ["aws", "rig"]  # the fixtures

MODEL = "gemini-2.5-flash"
SMALL_KEY = "incoming/small.jsonl"
SMALL = b"".join(request_bytes(f"small-{i}-" + "y" * 100) for i in range(5))


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


def counted(rig: Rig) -> tuple[int, int]:
    get = rig.store.get_counter
    return (
        get(f"job-enqueued:{MODEL}:reserved") - get(f"job-enqueued:{MODEL}:freed"),
        get("job-batches:reserved") - get("job-batches:freed"),
    )


def end_open(rig: Rig, config: Settings, fake: FakeGemini) -> None:
    """Every open batch ends answered; the reconciler's poll, the archiver's bus-trigger pass."""
    for batch in fake.batches_created():
        if (fake.resource(batch) or {}).get("done"):
            continue
        keys = [json.loads(line)["key"] for line in fake.batch_input(batch).splitlines()]
        fake.run_batch(batch, [{"key": k, "response": {"candidates": []}} for k in keys])
        record = rig.store.get(batch)
        assert record is not None
        assert refresh_with(rig.store, config, record).error is None
        archive_from_settings(config, store=rig.store, names=[batch])
        retry_from_settings(config, store=rig.store, names=roots_of(rig.store, [batch]))


def test_a_one_part_submit_beside_a_job_filling_the_queue_is_held_then_fed(
    aws: tuple[Rig, Any], fake_gemini: FakeGemini
) -> None:
    rig, s3 = aws
    config = deployed(rig)
    # 200 lines (about 1.5 times the cap): the first part fills the cap to within a line, as
    # 600 did; the other parts were only more batches to end before the test could.
    s3.put_object(Bucket=BUCKET, Key=INPUT_KEY, Body=big_input(200))
    s3.put_object(Bucket=BUCKET, Key=SMALL_KEY, Body=SMALL)
    fake_gemini.limits = QueueLimits(count_tokens=half_bytes)
    submitted = submit_event(config, {"input": f"s3://{BUCKET}/{INPUT_KEY}", "model": MODEL})
    job = submitted["name"]
    assert submitted["parts"] >= 2  # more than the cap
    retry_from_settings(config, store=rig.store, names=[job])
    assert len(fake_gemini.batches_created()) == 1  # the job's first part: near the whole cap
    fake_gemini.limits.enqueued_tokens[MODEL] = CAP
    small = submit_event(config, {"input": f"s3://{BUCKET}/{SMALL_KEY}", "model": MODEL})
    name = small["name"]
    assert name.startswith("jobs/") and small["parts"] == 1  # held, not refused
    assert len(fake_gemini.batches_created()) == 1 and fake_gemini.limits.refusals == []
    for _ in range(30):
        end_open(rig, config, fake_gemini)
        retry_from_settings(config, store=rig.store, every=True)  # the schedule's pass
        assert counted(rig)[0] <= CAP
        states = [rig.store.get_retry(n) for n in (job, name)]
        if all(s is not None and (s.doc.get("final") or {}).get("status") for s in states):
            break
    else:
        raise AssertionError(rig.store.get_retry(name))
    assert fake_gemini.limits.refusals == []
    assert fake_gemini.limits.peak_tokens[MODEL] <= CAP
    held = rig.store.get_retry(name)
    assert held is not None
    (part,) = held.doc[JOB]["parts"]
    assert fake_gemini.batch_input(part["batch"]) == SMALL
    assert counted(rig) == (0, 0)


def test_a_one_part_submit_with_room_is_the_batch_and_frees_its_room_when_it_ends(
    aws: tuple[Rig, Any], fake_gemini: FakeGemini
) -> None:
    rig, s3 = aws
    config = deployed(rig)
    s3.put_object(Bucket=BUCKET, Key=SMALL_KEY, Body=SMALL)
    fake_gemini.limits = QueueLimits(enqueued_tokens={MODEL: CAP}, count_tokens=half_bytes)
    name = submit_event(config, {"input": f"s3://{BUCKET}/{SMALL_KEY}", "model": MODEL})["name"]
    assert name.startswith("batches/")
    state = rig.store.get_retry(name)
    assert state is not None
    tokens = state.doc[RESERVED]["tokens"]
    assert counted(rig) == (tokens, 1)
    end_open(rig, config, fake_gemini)
    state = rig.store.get_retry(name)
    assert state is not None and state.status == RETRY_DONE
    assert state.doc[RESERVED] == {"model": MODEL, "tokens": tokens, "freed": True}
    assert counted(rig) == (0, 0)
