"""``final.jsonl`` in the input's order through the retry engine (issues 40 and 46): a retried
lineage on SQLite and a results folder, and a job one of whose parts was retried (its final is
the parts' finals in part order, so the whole is in input order only when each part's is). The
fake Gemini answers in a shuffled order (Gemini does not keep the input's order:
tests/unit/test_retry_final_order.py quotes the reports). The DynamoDB + S3 lineage is
``test_retry_dynamodb.test_the_done_when_scenario_on_dynamodb_and_s3``."""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from opstate.domain.retry import RetryPolicy
from opstate.retry.job_step import JOB
from tests.integration.test_job_engine import submit
from tests.integration.test_job_feeding import CAP, big_input
from tests.integration.test_retry_engine import Rig, make_rig
from tests.support.fake_gemini import FakeGemini
from tests.support.fake_gemini_limits import QueueLimits
from tests.support.retry_rows import answered, failed

MODEL = "gemini-2.5-flash"


@pytest.fixture
def rig(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: Any, fake_gemini: FakeGemini
) -> Iterator[Rig]:
    yield from make_rig(monkeypatch, tmp_path, capsys, fake_gemini)


def final_lines(location: str) -> list[dict[str, Any]]:
    data = Path(location.removeprefix("file://")).read_bytes()
    return [json.loads(line) for line in data.splitlines()]


def test_a_retried_lineage_writes_its_final_in_input_order_on_sqlite(rig: Rig) -> None:
    keys = [f"k{i:02d}" for i in range(30)]
    shuffle = random.Random(46).shuffle
    root = rig.submit(keys, "--retry-attempts", "2")
    transient = set(keys[3::4])  # spread over the input
    rows = [failed(k, 503, "UNAVAILABLE") if k in transient else answered(k) for k in keys]
    rows = [r for r in rows if r["key"] != "k29"]  # a key the root's output lacks
    shuffle(rows)
    rig.finish(root, rows)
    assert rig.run().submitted == 1
    child = rig.fake.batches_created()[1]
    again = sorted(transient)[:2]  # answered by attempt 2
    child_rows = [failed(k, 503, "UNAVAILABLE") if k in again else answered(k) for k in transient]
    shuffle(child_rows)
    rig.finish(child, child_rows)
    assert rig.run().submitted == 1
    grandchild = rig.fake.batches_created()[2]
    rig.finish(grandchild, [answered(k) for k in reversed(again)])
    assert rig.run().final == 1
    final, _by_key = rig.final(root)
    lines = final_lines(final["location"])
    assert [line["key"] for line in lines] == keys
    attempts = {k: 2 if k in again else 1 if k in transient else 0 for k in keys}
    assert [line["attempt"] for line in lines] == [attempts[k] for k in keys]
    assert lines[-1]["error"]["code"] == "missing"
    assert final["rows"] == {"total": 30, "answered": 29, "blocked": 0, "failed": 1}


def test_a_job_with_a_retried_part_writes_its_final_in_input_order(rig: Rig) -> None:
    data = big_input(600)
    keys = [json.loads(line)["key"] for line in data.splitlines()]
    rig.fake.limits = QueueLimits(enqueued_tokens={MODEL: CAP}, max_open=100)
    name = submit(rig, data, RetryPolicy(max_attempts=1))
    shuffle = random.Random(40).shuffle
    retried: set[str] = set()

    def answer_open(rig: Rig) -> None:
        # every part's output shuffled; the first part fails every 7th row once (503)
        for batch in rig.fake.batches_created():
            if (rig.fake.resource(batch) or {}).get("done"):
                continue
            sent = [json.loads(x)["key"] for x in rig.fake.batch_input(batch).splitlines()]
            first = not retried and batch == rig.fake.batches_created()[0]
            rows = [
                failed(k, 503, "UNAVAILABLE") if first and i % 7 == 3 else answered(k)
                for i, k in enumerate(sent)
            ]
            retried.update(r["key"] for r in rows if "error" in r)
            shuffle(rows)
            rig.finish(batch, rows)

    doc: dict[str, Any] = {}
    for _ in range(40):
        rig.run()
        doc = dict(rig.state(name).doc)
        if doc.get("final"):
            break
        answer_open(rig)
    assert doc.get("final"), doc[JOB]
    assert retried, "no part was retried"
    plan = doc[JOB]
    parts = {p["batch"] for p in plan["parts"]}
    assert len(rig.fake.batches_created()) > len(parts)  # a retry batch of the first part
    lines = final_lines(doc["final"]["location"])
    assert [line["key"] for line in lines] == keys
    assert all("response" in line for line in lines)
    assert {line["key"] for line in lines if line["attempt"] == 1} == retried
    assert doc["final"]["rows"]["answered"] == 600
