"""The submit function making a job on AWS (issue 46, docs/jobs.md "On AWS"; moto in process):
what its role lets it read, and what is left when it is killed part way (its 15 minutes ran
out) and invoked again.

Its role (template.yaml ``SubmitFunctionRole``, ``tests/e2e/test_template_roles.py``) reads
``incoming/*``, its submit markers and its own temporary upload, never a kept input
(``results/inputs/*/input.jsonl``, issue 47): moto enforces no IAM, so every S3 call the
function's clients make is recorded here and checked against that role. A kill is played by
an exception no handler of opstate catches (``Killed``, a ``BaseException`` like the runtime's
end of the process) raised after the copy or after the job's record."""

from __future__ import annotations

import dataclasses
import fnmatch
import json
from collections.abc import Iterator
from typing import Any

import boto3
import pytest

from opstate.config import Settings
from opstate.retry import job_submit
from opstate.retry.job_step import JOB
from opstate.retry.wiring import retry_from_settings, submit_event, submit_request
from tests.integration.test_job_dynamodb import MODEL
from tests.integration.test_job_feeding import CAP, big_input
from tests.integration.test_notify import Rig, rig
from tests.integration.test_retry_dynamodb import BUCKET, INPUT_KEY, aws
from tests.support.fake_gemini import FakeGemini
from tests.support.fake_gemini_limits import QueueLimits

__all__ = ["aws", "rig"]  # the fixtures

# What SubmitFunctionRole may read (s3:GetObject, which HeadObject needs too), as its
# resources name them under the results bucket.
SUBMIT_READS = ("incoming/*", "gemini/inputs/*/submit-*.json", "gemini/.incoming/*")


class Killed(BaseException):
    """The runtime ending the invocation (a timeout): nothing of opstate catches it."""


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


@pytest.fixture
def reads(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[tuple[str, str]]]:
    """Every GetObject / HeadObject (operation, key) an S3 client made during the test sends."""
    seen: list[tuple[str, str]] = []
    real = boto3.session.Session.client

    def record(params: dict[str, Any], model: Any, **_: Any) -> None:
        if model.name in ("GetObject", "HeadObject"):
            seen.append((model.name, str(params.get("Key"))))

    def client(self: Any, *args: Any, **kwargs: Any) -> Any:
        made = real(self, *args, **kwargs)
        if (args[0] if args else kwargs.get("service_name")) == "s3":
            made.meta.events.register("before-parameter-build.s3", record)
        return made

    monkeypatch.setattr(boto3.session.Session, "client", client)
    yield seen


def submit(config: Settings) -> dict[str, Any]:
    request = {"input": f"s3://{BUCKET}/{INPUT_KEY}", "model": MODEL, "retry": {"maxAttempts": 1}}
    return submit_event(config, request)


def job_names(rig: Rig) -> list[str]:
    return [r.name for r in rig.store.iter_all() if r.name.startswith("jobs/")]


def test_the_submit_function_reads_only_what_its_role_allows(
    aws: tuple[Rig, Any], fake_gemini: FakeGemini, reads: list[tuple[str, str]]
) -> None:
    rig, s3 = aws
    s3.put_object(Bucket=BUCKET, Key=INPUT_KEY, Body=big_input(600))
    fake_gemini.limits = QueueLimits(enqueued_tokens={MODEL: CAP})
    submitted = submit(deployed(rig))
    assert submitted["name"].startswith("jobs/") and submitted["parts"] >= 4
    denied = [
        (op, key) for op, key in reads if not any(fnmatch.fnmatch(key, p) for p in SUBMIT_READS)
    ]
    assert reads and not denied, denied
    # It makes the job; the archiver's pass (the reconciler's re-drive of a due job), whose
    # role reads kept inputs, feeds it.
    assert fake_gemini.batches_created() == []
    state = rig.store.get_retry(submitted["name"])
    assert state is not None and state.active
    retry_from_settings(deployed(rig), store=rig.store, names=[submitted["name"]])
    assert len(fake_gemini.batches_created()) == 1


def test_the_submit_function_hands_a_new_job_to_the_archiver_at_once(
    aws: tuple[Rig, Any], fake_gemini: FakeGemini
) -> None:
    """The archiver's pass creates a job's parts; the re-drive looks every 15 minutes when
    nothing was due (issue 48), so the submit function invokes the archiver itself, naming the
    job. A batch that fits one part needs no nudge (created by the submit itself)."""
    rig, s3 = aws
    s3.put_object(Bucket=BUCKET, Key=INPUT_KEY, Body=big_input(600))
    fake_gemini.limits = QueueLimits(enqueued_tokens={MODEL: CAP})
    archiver = "arn:aws:lambda:us-east-1:123456789012:function:archiver"
    config = dataclasses.replace(deployed(rig), archiver_function=archiver)
    calls: list[tuple[str, bytes]] = []
    request = {"input": f"s3://{BUCKET}/{INPUT_KEY}", "model": MODEL, "retry": {"maxAttempts": 1}}
    submitted = submit_request(
        config, {"submit": request}, invoke=lambda f, p: calls.append((f, p))
    )
    assert submitted["name"].startswith("jobs/")
    assert [(f, json.loads(p)["first"]) for f, p in calls] == [(archiver, submitted["name"])]
    s3.put_object(Bucket=BUCKET, Key="incoming/small.jsonl", Body=big_input(2))
    small = {"input": f"s3://{BUCKET}/incoming/small.jsonl", "model": MODEL}
    one = submit_request(config, {"submit": small}, invoke=lambda f, p: calls.append((f, p)))
    assert one["name"].startswith("batches/") and len(calls) == 1


@pytest.mark.parametrize("where", ["after-copy", "after-record"])
def test_a_submit_killed_part_way_and_invoked_again_makes_one_job(
    aws: tuple[Rig, Any],
    fake_gemini: FakeGemini,
    monkeypatch: pytest.MonkeyPatch,
    where: str,
) -> None:
    rig, s3 = aws
    data = big_input(600)
    s3.put_object(Bucket=BUCKET, Key=INPUT_KEY, Body=data)
    fake_gemini.limits = QueueLimits(enqueued_tokens={MODEL: CAP})
    config = deployed(rig)

    def killed(*_: Any, **__: Any) -> Any:
        raise Killed(where)

    with monkeypatch.context() as patched:
        if where == "after-copy":  # the check and the copy done, the split under way
            patched.setattr(job_submit, "split_hashed", killed)
        else:  # the job's record written, its plan not yet
            patched.setattr(job_submit, "RetryState", killed)
        with pytest.raises(Killed):
            submit(config)
    # Nothing half-done: the kept copy whole, no temporary upload left, no batch, no file.
    listed = s3.list_objects_v2(Bucket=BUCKET, Prefix="gemini/")
    keys = [o["Key"] for o in listed.get("Contents", [])]
    assert [k for k in keys if k.endswith("/input.jsonl")] != []
    assert not [k for k in keys if k.startswith("gemini/.incoming/")]
    assert s3.list_multipart_uploads(Bucket=BUCKET).get("Uploads", []) == []
    assert fake_gemini.batches_created() == [] and fake_gemini.files_held() == []
    assert job_names(rig) == ([] if where == "after-copy" else [job_names(rig)[0]])
    # Invoked again: one job, with its plan; fed by the pass, every line once.
    again = submit(config)
    assert job_names(rig) == [again["name"]]
    state = rig.store.get_retry(again["name"])
    assert state is not None and len(state.doc[JOB]["parts"]) == again["parts"] >= 4
    retry_from_settings(config, store=rig.store, names=[again["name"]])
    created = fake_gemini.batches_created()
    assert len(created) == 1
    assert fake_gemini.batch_input(created[0]) == data[: len(fake_gemini.batch_input(created[0]))]
    assert json.loads(data.splitlines()[0])["key"] == "k0"


def test_an_input_changed_before_its_split_is_refused_and_makes_no_job(tmp_path: Any) -> None:
    """The split reads the input a third time (never the kept copy): through the sha256 its
    check found, so bytes changed since (a writer of incoming/) make no job."""
    from opstate.config import SubmitSettings
    from opstate.domain.retry import RetryPolicy
    from opstate.outcomes.file_sink import FileSink
    from opstate.retry.inputs import IntegrityError
    from opstate.store import MemoryStore

    data = big_input(600)
    swapped = data.replace(b"question 599", b"question 5!9")
    reads: list[bytes] = []

    def source() -> Iterator[bytes]:
        reads.append(b"")
        yield data if len(reads) <= 2 else swapped  # the check, the copy, then the split

    store = MemoryStore()
    with pytest.raises(IntegrityError, match="no longer has its recorded sha256"):
        job_submit.submit_job(
            store,
            FileSink(tmp_path / "results"),
            source,
            model=MODEL,
            policy=RetryPolicy(),
            limits=SubmitSettings(submit_enqueued_tokens=((MODEL, CAP),)),
        )
    assert len(reads) == 3
    assert not [r for r in store.iter_all() if r.name.startswith("jobs/")]
