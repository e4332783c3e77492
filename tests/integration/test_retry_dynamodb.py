"""Issue 33's done-when scenario on the AWS path's parts (moto, in process): a DynamoDB table
built from template.yaml, an S3 results bucket, the input under ``incoming/``, the real
google-genai client talking to the fake Gemini server.

The steps are what the deployed functions do, through the same wiring functions:
``submit_event`` (the archiver's ``{"submit": {...}}``), ``refresh_with`` (the reconciler's poll
of one record), then, for the terminal change the bus delivers, ``archive_from_settings`` over
the name it gives and ``retry_from_settings`` over ``roots_of`` that name (the archiver's
bus-trigger path). The table's stream goes through the real notifier onto the moto bus
(test_notify.py's rig), so the retry events are checked as a subscriber gets them.
"""

from __future__ import annotations

import json
from typing import Any

import boto3
import pytest

from opstate.config import Settings
from opstate.domain.states import is_terminal
from opstate.notify import RESULTS_FINAL_DETAIL_TYPE, RETRY_SUBMITTED_DETAIL_TYPE
from opstate.outcomes import s3_sink
from opstate.outcomes.wiring import archive_from_settings
from opstate.retry.passes import RetryResult
from opstate.retry.wiring import (
    SubmitRefusedError,
    retry_from_settings,
    roots_of,
    submit_event,
)
from opstate.store.retry_state import RETRY_ACTIVE, RETRY_DONE, RETRY_MEMBER
from opstate.wiring.reconcile import refresh_with
from tests.integration.test_notify import Rig, rig
from tests.integration.test_notify_retry import publish, subscribe_all
from tests.support.fake_gemini import FakeGemini
from tests.support.retry_rows import answered, blocked, failed, input_keys, request_line

__all__ = ["rig"]  # the fixture

MODEL = "gemini-2.5-flash"
BUCKET = "results"
INPUT_KEY = "incoming/in.jsonl"


@pytest.fixture
def aws(rig: Rig, fake_gemini: FakeGemini, monkeypatch: pytest.MonkeyPatch) -> tuple[Rig, Any]:
    """The rig's table and bus, a results bucket in the same moto, and the fake Gemini (the
    SDK reads its base URL from the environment)."""
    monkeypatch.setenv("GOOGLE_GEMINI_BASE_URL", fake_gemini.base_url)
    # One S3 client, made by opstate's own ``_make_client`` when a step first opens a results
    # sink, for every sink the test's steps open: each deployed step makes its own, a boto3
    # Session each (~0.2 CPU s under moto, 40-odd times in test_job_dynamodb.py; issue 49).
    made: list[Any] = []
    make = s3_sink._make_client

    def shared_client() -> Any:
        if not made:
            made.append(make())
        return made[0]

    monkeypatch.setattr(s3_sink, "_make_client", shared_client)
    s3 = boto3.client("s3", region_name="us-east-1")
    s3.create_bucket(Bucket=BUCKET)
    subscribe_all(rig)
    return rig, s3


def deployed(rig: Rig) -> Settings:
    return Settings.from_env(
        {
            "OPSTATE_STORE": f"dynamodb://{rig.table}",
            "OPSTATE_RESULTS_URL": f"s3://{BUCKET}/gemini",
            "GEMINI_API_KEY": "test-key",
            "OPSTATE_RECONCILE_MAX_PAGES": "0",
        }
    )


def put_input(s3: Any, keys: list[str]) -> bytes:
    data = "".join(json.dumps(request_line(k)) + "\n" for k in keys).encode()
    s3.put_object(Bucket=BUCKET, Key=INPUT_KEY, Body=data)
    return data


def terminal_change(rig: Rig, config: Settings, name: str) -> RetryResult:
    """The reconciler reads the finished batch; the bus's terminal change naming it reaches the
    archiver: archive that name, then one retry pass over the lineage it belongs to."""
    record = rig.store.get(name)
    assert record is not None
    refreshed = refresh_with(rig.store, config, record)
    assert refreshed.error is None, refreshed.error
    after = rig.store.get(name)
    assert after is not None and is_terminal(after.state)
    archived = archive_from_settings(config, store=rig.store, names=[name])
    assert archived.as_dict()["archived"] == 1, archived.as_dict()
    roots = roots_of(rig.store, [name])
    assert roots, f"{name} is not part of a lineage"
    return retry_from_settings(config, store=rig.store, names=roots)


def counts(result: RetryResult) -> tuple[int, int, int]:
    return result.planned, result.submitted, result.final


def test_the_done_when_scenario_on_dynamodb_and_s3(
    aws: tuple[Rig, Any], fake_gemini: FakeGemini
) -> None:
    rig, s3 = aws
    config = deployed(rig)
    keys = [f"k{i:03d}" for i in range(100)]
    source = put_input(s3, keys)
    submitted = submit_event(
        config,
        {
            "input": f"s3://{BUCKET}/{INPUT_KEY}",
            "model": MODEL,
            "displayName": "done-when",
            "retry": {"maxAttempts": 2},
        },
    )
    root = submitted["name"]
    assert submitted["retry"]["maxAttempts"] == 2
    assert fake_gemini.batches_created() == [root]
    assert fake_gemini.batch_input(root) == source
    state = rig.store.get_retry(root)
    assert state is not None and state.status == RETRY_ACTIVE
    assert state.doc["input"]["rows"] == 100
    kept = state.doc["input"]["location"]
    assert kept.startswith(f"s3://{BUCKET}/")
    kept_key = kept.removeprefix(f"s3://{BUCKET}/")
    assert s3.get_object(Bucket=BUCKET, Key=kept_key)["Body"].read() == source

    transient, permanent, no_answer = keys[:10], keys[10:15], keys[15:18]
    fake_gemini.run_batch(
        root,
        [failed(k, 503, "UNAVAILABLE") for k in transient]
        + [failed(k, 400, "INVALID_ARGUMENT") for k in permanent]
        + [blocked(k) for k in no_answer]
        + [answered(k) for k in keys[18:]],
    )
    assert counts(terminal_change(rig, config, root)) == (1, 1, 0)
    created = fake_gemini.batches_created()
    assert len(created) == 2
    child = created[1]
    original = {json.loads(line)["key"]: line for line in source.splitlines()}
    assert fake_gemini.batch_input(child).splitlines() == [original[k] for k in transient]
    # A pass over the root again while the child runs creates nothing.
    assert retry_from_settings(config, store=rig.store, names=[root]).submitted == 0
    assert len(fake_gemini.batches_created()) == 2

    fake_gemini.run_batch(
        child,
        [failed(k, 503, "UNAVAILABLE") for k in reversed(transient[8:])]
        + [answered(k) for k in reversed(transient[:8])],  # not in the input's order
    )
    assert counts(terminal_change(rig, config, child)) == (1, 1, 0)
    grandchild = fake_gemini.batches_created()[2]
    assert input_keys(fake_gemini.batch_input(grandchild)) == transient[8:]

    fake_gemini.run_batch(grandchild, [answered(k) for k in transient[8:]])
    assert counts(terminal_change(rig, config, grandchild)) == (0, 0, 1)
    assert len(fake_gemini.batches_created()) == 3

    done = rig.store.get_retry(root)
    assert done is not None and done.status == RETRY_DONE
    final = done.doc["final"]
    assert final["status"] == "final"
    assert final["rows"] == {"total": 100, "answered": 95, "blocked": 3, "failed": 5}
    assert final["errors"] == {"400": 5}
    assert final["attempts"] == 3
    assert final["location"].startswith(f"s3://{BUCKET}/gemini/")
    final_key = final["location"].removeprefix(f"s3://{BUCKET}/")
    lines = s3.get_object(Bucket=BUCKET, Key=final_key)["Body"].read().splitlines()
    assert len(lines) == 100
    # in the input's order, whichever attempt answered (issues 40, 46)
    assert [json.loads(line)["key"] for line in lines] == keys
    by_key = {json.loads(line)["key"]: json.loads(line) for line in lines}
    assert set(by_key) == set(keys)
    assert by_key[transient[9]]["attempt"] == 2 and "response" in by_key[transient[9]]
    assert by_key[permanent[0]]["error"]["code"] == 400
    ledger_key = final_key.removesuffix(".jsonl") + ".json"
    assert s3.head_object(Bucket=BUCKET, Key=ledger_key)["ContentLength"] > 0

    for name, parent, attempt in ((child, root, 1), (grandchild, child, 2)):
        member = rig.store.get_retry(name)
        assert member is not None and member.status == RETRY_MEMBER
        lineage = member.doc["lineage"]
        assert (lineage["root"], lineage["parent"], lineage["attempt"]) == (root, parent, attempt)

    # What a subscriber of the bus saw: one 'Retry Submitted' per child, one 'Results Final'.
    seen = publish(rig)
    retries = [d for t, d in seen if t == RETRY_SUBMITTED_DETAIL_TYPE]
    assert [(d["child"], d["parent"], d["attempt"], d["rows"]) for d in retries] == [
        (child, root, 1, 10),
        (grandchild, child, 2, 2),
    ]
    finals = [d for t, d in seen if t == RESULTS_FINAL_DETAIL_TYPE]
    assert len(finals) == 1
    assert finals[0]["root"] == root
    assert finals[0]["rows"] == final["rows"] and finals[0]["errors"] == {"400": 5}
    assert finals[0]["location"] == final["location"]

    # Once final, a further trigger does nothing and announces nothing.
    again = retry_from_settings(config, store=rig.store, names=[root])
    assert counts(again) == (0, 0, 0)
    assert len(fake_gemini.batches_created()) == 3
    assert [t for t, _ in publish(rig) if t != "Operation State Changed"] == []


def test_a_submit_with_a_line_without_key_creates_nothing(
    aws: tuple[Rig, Any], fake_gemini: FakeGemini
) -> None:
    rig, s3 = aws
    config = deployed(rig)
    good = json.dumps(request_line("a"))
    s3.put_object(
        Bucket=BUCKET,
        Key=INPUT_KEY,
        Body=f"{good}\n{json.dumps({'request': {'contents': []}})}\n".encode(),
    )
    request = {"input": f"s3://{BUCKET}/{INPUT_KEY}", "model": MODEL, "retry": {"maxAttempts": 1}}
    with pytest.raises(SubmitRefusedError, match="line 2"):
        submit_event(config, request)
    assert fake_gemini.batches_created() == []
    assert list(rig.store.iter_all()) == []
    listed = s3.list_objects_v2(Bucket=BUCKET).get("Contents", [])
    assert [o["Key"] for o in listed] == [INPUT_KEY]


def test_a_batch_another_producer_made_with_a_childs_id_is_never_adopted_on_dynamodb(
    aws: tuple[Rig, Any], fake_gemini: FakeGemini
) -> None:
    """Issue 47 on the AWS path: the child's create answers 503; another key of the project
    creates a batch carrying the child's id (worst case: it learned it) with answers of its
    own. The next pass creates the real child on the upload it recorded in the table; the
    forged rows never reach final.jsonl."""
    import time

    from tests.integration.test_retry_forgery import FORGED, forge

    rig, s3 = aws
    config = Settings.from_env(
        {
            "OPSTATE_STORE": f"dynamodb://{rig.table}",
            "OPSTATE_RESULTS_URL": f"s3://{BUCKET}/gemini",
            "GEMINI_API_KEY": "test-key",
            "OPSTATE_RECONCILE_MAX_PAGES": "0",
            "OPSTATE_RETRY_CHECK_SECONDS": "1",
        }
    )
    keys = ["a", "b", "c"]
    put_input(s3, keys)
    request = {"input": f"s3://{BUCKET}/{INPUT_KEY}", "model": MODEL, "retry": {"maxAttempts": 2}}
    root = submit_event(config, request)["name"]
    fake_gemini.run_batch(root, [failed(k, 503, "UNAVAILABLE") for k in keys])
    fake_gemini.fail_create(503, "The service is currently unavailable.", times=1)
    assert counts(terminal_change(rig, config, root)) == (1, 0, 0)
    state = rig.store.get_retry(root)
    assert state is not None
    (entry,) = state.doc["children"]
    assert entry["upload"]["file"] in fake_gemini.files_held()  # recorded in the table
    forged = forge(fake_gemini, entry["id"], keys)
    time.sleep(1.2)  # past the entry's retry time (OPSTATE_RETRY_CHECK_SECONDS)
    assert retry_from_settings(config, store=rig.store, names=[root]).submitted == 1
    state = rig.store.get_retry(root)
    assert state is not None
    (entry,) = state.doc["children"]
    child = entry["name"]
    assert child != forged and fake_gemini.batches_created() == [root, forged, child]
    fake_gemini.run_batch(child, [answered(k) for k in keys])
    assert counts(terminal_change(rig, config, child)) == (0, 0, 1)
    done = rig.store.get_retry(root)
    assert done is not None and done.status == RETRY_DONE
    final_key = done.doc["final"]["location"].removeprefix(f"s3://{BUCKET}/")
    data = s3.get_object(Bucket=BUCKET, Key=final_key)["Body"].read()
    assert FORGED.encode() not in data and len(data.splitlines()) == 3
    assert forged.encode() not in json.dumps(done.doc).encode()
