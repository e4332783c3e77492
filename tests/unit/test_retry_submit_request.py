"""The submit function's request (the archiver's ``{"submit": {...}}``, docs/retry.md): every
malformed request is refused with a sentence before anything is read, uploaded or written."""

from __future__ import annotations

from typing import Any

import pytest

from opstate.config import Settings
from opstate.retry import wiring
from opstate.retry.wiring import SubmitRefusedError, submit_event

GOOD = {"input": "s3://results/incoming/in.jsonl", "model": "gemini-2.5-flash"}


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
    ],
)
def test_a_malformed_request_is_refused_before_anything_happens(
    monkeypatch: pytest.MonkeyPatch, request_: Any, message: str
) -> None:
    def never(*_: Any, **__: Any) -> Any:
        raise AssertionError("nothing may be submitted")

    monkeypatch.setattr(wiring, "submit_from_settings", never)
    with pytest.raises(SubmitRefusedError) as refused:
        submit_event(Settings(), request_)
    assert message in str(refused.value)


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
    answer = submit_event(Settings(), GOOD)
    assert answer["retry"]["maxAttempts"] == 0 and seen["policy"].max_attempts == 0
    answer = submit_event(Settings(), {**GOOD, "retry": {}})
    assert answer["retry"]["maxAttempts"] == 2  # a retry object is the opt-in
