"""Reconciler pieces without a run: imports, the adapter's error classification, backoff."""

from __future__ import annotations

import subprocess
import sys

from opstate.gemini.errors import classify
from opstate.reconcile.pacing import Backoff
from opstate.reconcile.run import RunResult


def test_importing_the_package_and_the_run_does_not_import_google_genai() -> None:
    code = (
        "import sys, opstate.reconcile, opstate.reconcile.run, opstate.reconcile.schedule; "
        "import opstate.gemini, opstate.gemini.batches, opstate.gemini.client; "
        "import opstate.gemini.errors, opstate.reconcile.genai_gateway; "
        "print('google.genai' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_classify_sdk_failures() -> None:
    import httpx2
    from google.genai import errors
    from google.genai._interactions import APITimeoutError, NotFoundError, RateLimitError

    def status_error(cls: type, status: int) -> BaseException:
        request = httpx2.Request("GET", "http://127.0.0.1/v1/interactions/x")
        return cls("boom", response=httpx2.Response(status, request=request), body=None)

    cases = {
        errors.ClientError(404, {"error": {"message": "nope"}}): (404, False, True),
        errors.ClientError(429, {}): (429, True, False),
        errors.ClientError(403, {}): (403, False, False),
        errors.ServerError(500, {}): (500, True, False),
        errors.ServerError(503, {}): (503, True, False),
        httpx2.ReadTimeout("slow"): (None, True, False),
        httpx2.ConnectError("refused"): (None, True, False),
        status_error(NotFoundError, 404): (404, False, True),
        status_error(RateLimitError, 429): (429, True, False),
        APITimeoutError(request=httpx2.Request("GET", "http://127.0.0.1/")): (None, True, False),
        ValueError("something else"): (None, False, False),
    }
    for exc, (status, transient, not_found) in cases.items():
        failure = classify(exc)
        assert (failure.status, failure.transient, failure.not_found) == (
            status,
            transient,
            not_found,
        ), exc


def test_backoff_is_exponential_and_capped() -> None:
    backoff = Backoff(base_s=0.5, max_s=5.0, trip_after=10)
    assert [backoff.delay(n) for n in range(6)] == [0.0, 0.5, 1.0, 2.0, 4.0, 5.0]
    assert backoff.delay(10_000) == 5.0


def test_run_result_dict_has_exactly_the_documented_fields() -> None:
    result = RunResult(1, 2, 3, 4, 5, 6, 7, 8, 9, 10, True)
    assert result.as_dict() == {
        "discovered": 1,
        "polled": 2,
        "applied": 3,
        "dropped": 4,
        "not_found": 5,
        "lost": 6,
        "overdue": 7,
        "errors": 8,
        "throttled": 9,
        "remaining_due": 10,
        "stopped_early": True,
    }


def test_a_run_failed_only_when_errors_left_it_nothing_done() -> None:
    from hypothesis import given
    from hypothesis import strategies as st

    counts = st.integers(min_value=0, max_value=3)

    @given(
        st.tuples(counts, counts, counts, counts, counts, counts, counts, counts, counts, counts)
    )
    def check(values: tuple[int, ...]) -> None:
        result = RunResult(*values)
        done = result.applied + result.dropped + result.not_found + result.lost + result.overdue
        assert result.failed == (result.errors > 0 and done == 0)
        assert "first_error" not in result.as_dict()  # not a metric, not in the JSON

    check()
    assert RunResult(discovered=5, polled=5, errors=5).failed  # listed jobs it could not store
    assert not RunResult(polled=5, errors=4, not_found=1).failed
    assert not RunResult().failed  # nothing due, no error: nothing to fail


def test_the_tally_keeps_the_first_error_sentence() -> None:
    from opstate.reconcile.tally import Tally

    tally = Tally()
    tally.error("poll failed for batches/a (HTTP 403): PERMISSION_DENIED: no", throttled=0)
    tally.error("poll failed for batches/b (HTTP 429): slow down", throttled=1)
    assert tally.result.errors == 2 and tally.result.throttled == 1
    assert tally.result.first_error == "poll failed for batches/a (HTTP 403): PERMISSION_DENIED: no"


def test_classify_keeps_what_the_server_said_for_the_sentence() -> None:
    from google.genai import errors

    failure = classify(
        errors.ClientError(
            403, {"error": {"message": "API key not valid", "status": "PERMISSION_DENIED"}}
        )
    )
    assert failure.sentence == "PERMISSION_DENIED: API key not valid"
    assert failure.message.startswith("ClientError: 403")  # the logged text is unchanged


class _Answer:
    def __init__(self, body: str) -> None:
        self.body = body


class _ListingClient:
    """A client whose ``_api_client.request`` answers the Gemini API's listing from bodies."""

    def __init__(self, *bodies: str) -> None:
        self.bodies = list(bodies)
        self.paths: list[str] = []
        self._api_client = self

    def request(self, method: str, path: str, body: object) -> _Answer:
        assert (method, body) == ("get", {})
        self.paths.append(path)
        return _Answer(self.bodies.pop(0))


def test_the_rest_listing_pages_and_keeps_progress_and_refusals_in_place() -> None:
    import json

    import pytest

    from opstate.domain.events import EventError
    from opstate.gemini.batches import rest_batch_pages
    from opstate.reconcile.gateway import GatewayError

    running = {
        "name": "batches/a",
        "metadata": {
            "state": "BATCH_STATE_RUNNING",
            "updateTime": "2026-05-01T10:00:00Z",
            "batchStats": {"requestCount": "3", "pendingRequestCount": "2"},
        },
    }
    client = _ListingClient(
        json.dumps({"operations": [running, "not a batch"], "nextPageToken": "t/2"}),
        json.dumps({"operations": [{"name": "batches/b"}]}),
    )
    pages = list(rest_batch_pages(client, 2))
    assert client.paths == ["batches?pageSize=2", "batches?pageSize=2&pageToken=t%2F2"]
    (name, event), (bad_name, bad) = pages[0]
    assert name == "batches/a" and not isinstance(event, EventError)
    assert event.details["batch_stats"] == {"requestCount": 3, "pendingRequestCount": 2}
    assert bad_name == "None" and isinstance(bad, EventError)
    ((b_name, no_state),) = pages[1]
    assert b_name == "batches/b" and isinstance(no_state, EventError)
    # An empty or odd body is an empty last page; a body that is no JSON is a GatewayError.
    assert list(rest_batch_pages(_ListingClient(""), 5)) == [[]]
    assert list(rest_batch_pages(_ListingClient("[1]"), 5)) == [[]]
    with pytest.raises(GatewayError):
        list(rest_batch_pages(_ListingClient("{not json"), 5))
