"""A refused create, by what Gemini really answers (issue 39): a rate limit or a full batch
queue backs off (Gemini's retryDelay when it gives one, else a bounded exponential wait) and
never stops the lineage; a per-day quota waits for midnight Pacific time; an operator's pass
(``opstate retry --once``) tries a backing-off create at once; a money refusal stops the lineage
once, its final result written. The bodies are the real ones of tests/fixtures/gemini_errors.

The rig is ``test_retry_engine``'s (SQLite store, results folder, the real google-genai client
talking to the fake Gemini, a clock the test sets). A scheduled pass is ``every=False``.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import pytest

from opstate.retry import children as children_module
from opstate.retry import lineage
from opstate.retry import passes as passes_module
from opstate.retry.passes import RetryResult
from opstate.store.retry_state import RETRY_ACTIVE, RETRY_DONE
from tests.integration.test_retry_engine import CREATE_VERB, Rig, make_rig
from tests.support.fake_gemini import FakeGemini, Request
from tests.support.retry_rows import answered

S = 1_000_000_000
FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "gemini_errors"


@pytest.fixture
def rig(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: Any, fake_gemini: FakeGemini
) -> Iterator[Rig]:
    yield from make_rig(monkeypatch, tmp_path, capsys, fake_gemini)


def body(name: str) -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads((FIXTURES / f"{name}.json").read_text())["body"]
    return loaded


def error_row(key: str, name: str) -> dict[str, Any]:
    """A failed output row carrying the real error of fixture ``name``."""
    return {"key": key, "error": body(name)["error"]}


def creates(requests: list[Request]) -> list[Request]:
    return [r for r in requests if r.method == "POST" and r.verb == CREATE_VERB]


def test_a_per_minute_429_row_is_retried_and_the_create_honours_gemini_s_delay(
    rig: Rig,
) -> None:
    keys = ["minute", "fine"]
    root = rig.submit(keys, "--retry-attempts", "2")
    rows = [
        error_row("minute", "per_minute_429"),  # QuotaFailure ...PerMinute..., RetryInfo 26s
        answered("fine"),
    ]
    rig.finish(root, rows)
    rig.fake.fail_create(429, body=body("per_minute_429"), times=1)
    now = time.time_ns()
    first = rig.run(now, every=False)
    assert (first.planned, first.submitted, first.stopped, first.waiting) == (1, 0, 0, 1)
    state = rig.state(root)
    assert state.status == RETRY_ACTIVE and not state.doc.get("stopped")
    (entry,) = state.doc["children"]
    assert entry["phase"] == lineage.CREATING and entry["refusals"] == 1
    assert entry["claimUntilNs"] == entry["backoffUntilNs"] == now + 26 * S
    assert "You exceeded your current quota" in entry["error"]
    assert state.due_ns == now + 26 * S  # the root is looked at again when Gemini said
    rig.fake.reset_requests()
    assert rig.run(now + 26 * S - 1, every=False).submitted == 0
    assert creates(rig.requests()) == []
    assert rig.run(now + 26 * S, every=False).submitted == 1
    child = rig.fake.batches_created()[1]
    assert rig.child_keys(child) == ["minute"]
    rig.finish(child, [answered("minute")])
    assert rig.run(every=True).final == 1
    final, by_key = rig.final(root)
    assert final["rows"] == {"total": 2, "answered": 2, "blocked": 0, "failed": 0}
    assert by_key["fine"]["attempt"] == 0 and by_key["minute"]["attempt"] == 1


def test_a_row_refused_for_money_stops_the_lineage_before_any_create(rig: Rig) -> None:
    # Issue 39: "prepay depleted, 402, a spending cap, billing disabled -> a money refusal:
    # rows permanent, the lineage stops, said once and alarmed". The per-minute row beside it
    # would be retried, but a create now would be refused for the same money: nothing is made.
    keys = ["minute", "money", "fine"]
    root = rig.submit(keys, "--retry-attempts", "2")
    rows = [
        error_row("minute", "per_minute_429"),
        error_row("money", "prepay_depleted_429"),  # "Your prepayment credits are depleted."
        answered("fine"),
    ]
    rig.finish(root, rows)
    rig.fake.reset_requests()
    result = rig.run(every=False)
    assert (result.planned, result.submitted, result.stopped, result.final) == (0, 0, 1, 1)
    assert creates(rig.requests()) == []
    state = rig.state(root)
    assert state.status == RETRY_DONE
    assert "refused requests for money" in state.doc["stopped"]
    assert "prepayment credits are depleted" in state.doc["stopped"]
    assert state.doc.get("children", []) == []
    final, by_key = rig.final(root)
    assert final["rows"] == {"total": 3, "answered": 1, "blocked": 0, "failed": 2}
    assert final["errors"] == {"429": 2}
    location = Path(str(final["location"]).removeprefix("file://"))
    summary = json.loads(location.with_name("final.json").read_text())
    assert summary["stopped"] == state.doc["stopped"]
    assert by_key["money"]["attempt"] == 0 and by_key["minute"]["attempt"] == 0
    rig.fake.reset_requests()
    again = rig.run(every=True)  # said once: a later pass finds nothing to do
    assert (again.stopped, again.final) == (0, 0)
    assert creates(rig.requests()) == []


def test_a_full_batch_queue_backs_off_then_the_child_is_created_when_there_is_room(
    rig: Rig,
) -> None:
    keys = ["a", "b"]
    root = rig.submit(keys, "--retry-attempts", "2")
    rig.finish(root, [error_row("a", "queue_full_create_429"), answered("b")])
    rig.fake.fail_create(429, body=body("queue_full_create_429"), times=2)
    now = time.time_ns()
    assert rig.run(now, every=False).waiting == 1
    (entry,) = rig.state(root).doc["children"]
    assert entry["claimUntilNs"] == now + 60 * S  # no delay given: one minute, then doubled
    rig.fake.reset_requests()
    assert rig.run(now + 59 * S, every=False).as_dict() == RetryResult().as_dict()
    assert creates(rig.requests()) == []
    again = rig.run(now + 60 * S, every=False)
    assert (again.submitted, again.stopped, again.waiting) == (0, 0, 1)
    (entry,) = rig.state(root).doc["children"]
    assert entry["refusals"] == 2 and entry["claimUntilNs"] == now + 180 * S
    assert rig.state(root).status == RETRY_ACTIVE
    # The queue has room now; an operator's pass does not wait out the backoff.
    assert rig.run(now + 61 * S, every=True).submitted == 1
    child = rig.fake.batches_created()[1]
    assert rig.child_keys(child) == ["a"]
    rig.finish(child, [answered("a")])
    assert rig.run(every=True).final == 1
    final, _by_key = rig.final(root)
    assert final["rows"] == {"total": 2, "answered": 2, "blocked": 0, "failed": 0}


def test_an_operator_pass_does_not_break_another_runner_s_claim(rig: Rig) -> None:
    """``every`` skips a backoff only: a claim another runner holds (a lease) stays held."""
    keys = ["a", "b"]
    root = rig.submit(keys, "--retry-attempts", "2")
    rig.finish(root, [error_row("a", "queue_full_create_429"), answered("b")])
    rig.fake.fail_create(503, "The service is currently unavailable.", times=1)
    now = time.time_ns()
    assert rig.run(now, every=False).errors == 1
    (entry,) = rig.state(root).doc["children"]
    assert entry["claimUntilNs"] > now and "backoffUntilNs" not in entry
    rig.fake.reset_requests()
    assert rig.run(now + S, every=True).submitted == 0
    assert creates(rig.requests()) == []


def test_a_per_day_quota_waits_for_midnight_pacific(rig: Rig) -> None:
    keys = ["a", "b"]
    root = rig.submit(keys, "--retry-attempts", "2")
    rig.finish(root, [error_row("a", "per_day_429"), answered("b")])
    rig.fake.fail_create(429, body=body("per_day_429"), times=1)
    now = time.time_ns()
    assert rig.run(now, every=False).waiting == 1
    pacific = datetime.fromtimestamp(now / S, ZoneInfo("America/Los_Angeles"))
    midnight = (pacific + timedelta(days=1)).replace(hour=0, minute=0, second=0, microsecond=0)
    (entry,) = rig.state(root).doc["children"]
    assert entry["claimUntilNs"] == int(midnight.timestamp()) * S
    assert not rig.state(root).doc.get("stopped")
    assert rig.run(int(midnight.timestamp()) * S, every=False).submitted == 1


def test_a_backoff_longer_than_the_re_date_makes_the_root_due_when_it_ends(rig: Rig) -> None:
    """A due root is re-dated ``check_s`` ahead before its heavy work (issue 39's bounded
    passes); a create that then backs off for longer (a per-day quota: until midnight
    Pacific; a full queue's doubled wait) writes the root due when the backoff ends, so the
    scheduled passes between do not take it again every ``check_s``."""
    keys = ["a", "b"]
    root = rig.submit(keys, "--retry-attempts", "2")
    rig.finish(root, [error_row("a", "per_day_429"), answered("b")])
    rig.fake.fail_create(429, body=body("per_day_429"), times=1)
    now = time.time_ns()
    if datetime.fromtimestamp(now / S, ZoneInfo("America/Los_Angeles")).hour >= 22:
        now += 3 * 3600 * S  # the day's quota resets at midnight Pacific: keep clear of it
    assert rig.run(now, every=False).waiting == 1
    (entry,) = rig.state(root).doc["children"]
    assert entry["claimUntilNs"] - now > 60 * S  # longer than the re-date's check_s
    assert rig.state(root).due_ns == entry["claimUntilNs"]
    # a scheduled pass before then does not take the root (nothing due, nothing written)
    rev = rig.state(root).rev
    assert rig.run(now + 61 * S, every=False).as_dict() == RetryResult().as_dict()
    assert rig.state(root).rev == rev
    assert rig.run(entry["claimUntilNs"], every=False).submitted == 1


@pytest.mark.parametrize(
    ("fixture", "status"), [("prepay_depleted_402", 402), ("billing_disabled_403", 403)]
)
def test_a_money_refusal_stops_the_lineage_once_with_its_final_result(
    rig: Rig, monkeypatch: pytest.MonkeyPatch, fixture: str, status: int
) -> None:
    counted: list[str] = []
    monkeypatch.setattr(children_module, "count", lambda name, *a, **k: counted.append(name))
    monkeypatch.setattr(passes_module, "count", lambda name, *a, **k: counted.append(name))
    keys = ["a", "b"]
    root = rig.submit(keys, "--retry-attempts", "2")
    rig.finish(root, [error_row("a", "per_minute_429"), answered("b")])
    rig.fake.fail_create(status, body=body(fixture), times=None)
    now = time.time_ns()
    first = rig.run(now, every=False)
    assert (first.stopped, first.final, first.submitted) == (1, 1, 0)
    assert counted == ["RetryStopped"]
    state = rig.state(root)
    assert state.status == RETRY_DONE
    assert body(fixture)["error"]["message"][:40] in state.doc["stopped"]
    for later in (now + 3600 * S, now + 48 * 3600 * S):
        assert rig.run(later, every=True).as_dict() == RetryResult().as_dict()
    assert counted == ["RetryStopped"]
    final, by_key = rig.final(root)
    assert final["rows"] == {"total": 2, "answered": 1, "blocked": 0, "failed": 1}
    assert by_key["a"]["error"]["code"] == 429
