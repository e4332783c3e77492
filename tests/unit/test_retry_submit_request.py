"""The submit function's request (``{"submit": {...}}``, docs/retry.md): every malformed
request is refused with a sentence before anything is read, uploaded or written; an input
outside ``incoming/`` of the results bucket too (issue 38, repro 6: checked in code as well as
in the function's role, tests/e2e/test_template_roles.py)."""

from __future__ import annotations

import re
from typing import Any

import pytest

from opstate.config import Settings
from opstate.retry import wiring
from opstate.retry.wiring import SubmitRefusedError, submit_event, submit_request

GOOD = {"input": "s3://results/incoming/in.jsonl", "model": "gemini-2.5-flash"}
# What the template gives the submit function: the results bucket's results/ prefix.
DEPLOYED = Settings(results_url="s3://results/results")


@pytest.mark.parametrize(
    ("request_", "message"),
    [
        ("s3://results/incoming/in.jsonl", "'submit' must be a JSON object"),
        (None, "'submit' must be a JSON object"),
        ([GOOD], "'submit' must be a JSON object"),
        ({**GOOD, "src": "x"}, "unknown keys ['src']"),
        ({"model": "m"}, "'submit.input' must be an s3://"),
        ({**GOOD, "input": "file:///etc/passwd"}, "'submit.input' must be an s3://"),
        ({**GOOD, "input": 7}, "'submit.input' must be an s3://"),
        ({**GOOD, "input": "s3://results"}, "invalid input URI"),
        ({**GOOD, "input": "s3:///key"}, "invalid input URI"),
        ({"input": GOOD["input"]}, "'submit.model' must name a model"),
        ({**GOOD, "model": "  "}, "'submit.model' must name a model"),
        ({**GOOD, "displayName": ["x"]}, "'submit.displayName' must be text"),
        ({**GOOD, "retry": {"maxAttempts": 11}}, "between 0 and 10"),
        ({**GOOD, "retry": "yes"}, "'retry' must be a JSON object"),
        ({**GOOD, "retry": {"maxAttempts": True}}, "must be an integer"),
        # repro 6: anything but an object under incoming/ of the results bucket
        (
            {**GOOD, "input": "s3://results/results/inputs/ab/input.jsonl"},
            "under s3://results/incoming/",
        ),
        (
            {**GOOD, "input": "s3://results/results/batches/x/1/output.jsonl"},
            "under s3://results/incoming/",
        ),
        (
            {**GOOD, "input": "s3://results/incoming/../results/x.jsonl"},
            "under s3://results/incoming/",
        ),
        ({**GOOD, "input": "s3://results/incoming-x/in.jsonl"}, "under s3://results/incoming/"),
        ({**GOOD, "input": "s3://other-bucket/incoming/in.jsonl"}, "under s3://results/incoming/"),
    ],
)
def test_a_malformed_request_is_refused_before_anything_happens(
    monkeypatch: pytest.MonkeyPatch, request_: Any, message: str
) -> None:
    def never(*_: Any, **__: Any) -> Any:
        raise AssertionError("nothing may be submitted")

    monkeypatch.setattr(wiring, "submit_from_settings", never)
    with pytest.raises(SubmitRefusedError) as refused:
        submit_event(DEPLOYED, request_)
    assert message in str(refused.value)


@pytest.mark.parametrize("event", [GOOD, {"submit": GOOD, "x": 1}, [GOOD], {"archive": GOOD}])
def test_the_submit_function_takes_only_a_submit_request(
    monkeypatch: pytest.MonkeyPatch, event: Any
) -> None:
    monkeypatch.setattr(wiring, "submit_from_settings", lambda *_, **__: pytest.fail("submitted"))
    with pytest.raises(SubmitRefusedError, match=re.escape('takes {"submit"')):
        submit_request(DEPLOYED, event)


def test_without_results_in_s3_nothing_is_submitted(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(wiring, "submit_from_settings", lambda *_, **__: pytest.fail("submitted"))
    for results in (None, "file:///tmp/results"):
        with pytest.raises(SubmitRefusedError, match="keeps inputs in S3"):
            submit_event(Settings(results_url=results), GOOD)


def test_a_request_without_retry_takes_the_default_as_it_is(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    seen: dict[str, Any] = {}

    class Done:
        def as_dict(self) -> dict[str, Any]:
            return {"name": "batches/x"}

    def submitted(_: Settings, **kwargs: Any) -> Done:
        seen.update(kwargs)
        return Done()

    monkeypatch.setattr(wiring, "submit_from_settings", submitted)
    answer = submit_event(DEPLOYED, GOOD)
    assert answer["retry"]["maxAttempts"] == 0 and seen["policy"].max_attempts == 0
    answer = submit_request(DEPLOYED, {"submit": {**GOOD, "retry": {}}})
    assert answer["retry"]["maxAttempts"] == 2  # a retry object is the opt-in
