"""The operations page shows a job (issue 46, docs/jobs.md) in Chromium: a job submitted through
the real path (``submit_from_settings``, what ``opstate submit`` and the submit function call)
against the fake Gemini enforcing a small enqueued-token cap, its first part's batch finished and
the job fed on by the retry pass, as the archiver does. The page shows its parts per phase (a
created part's batch state among them), the tokens enqueued against the cap, what it waits for,
each part with its batch (a name that opens its own view) and its final result pending; a job
whose plan holds markup shows it as text."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from opstate.config import Settings
from opstate.domain.retry import RetryPolicy
from opstate.outcomes.wiring import archive_from_settings
from opstate.retry.job_step import JOB
from opstate.retry.wiring import retry_from_settings, roots_of, submit_from_settings
from opstate.store.retry_state import RetryState
from opstate.store.sqlite import SQLiteStore
from opstate.wiring.reconcile import refresh_with
from tests.browser.conftest import ARTIFACTS, missing
from tests.support.fake_gemini import FakeGemini
from tests.support.fake_gemini_limits import QueueLimits
from tests.support.prerequisites import in_ci
from tests.support.serve_process import TEST_API_TOKEN, ServeProcess, start_serve

# One line for the whole module when the browser or playwright is missing; an error under CI.
_LACKING = missing()
if _LACKING is not None:
    if in_ci():
        pytest.fail(f"browser tests under CI need {_LACKING}", pytrace=False)
    pytest.skip(f"browser tests need {_LACKING}", allow_module_level=True)

MODEL = "gemini-2.5-flash"
CAP = 20_000  # opstate's estimate: half a line's bytes; 600 lines of ~300 bytes is 4-5 parts
MARKUP = '<img src=x onerror="window.pwned=1"><b>bold</b>'


def big_input(lines: int) -> bytes:
    rows = (
        {"key": f"k{i}", "request": {"contents": [{"parts": [{"text": f"q {i} " + "ab " * 80}]}]}}
        for i in range(lines)
    )
    return b"".join(json.dumps(row).encode() + b"\n" for row in rows)


@pytest.fixture(scope="module")
def jobs(
    tmp_path_factory: pytest.TempPathFactory, chromium: Any
) -> Iterator[tuple[ServeProcess, str, str, str, list[str]]]:
    home = tmp_path_factory.mktemp("serve-job")
    db = home / "ops.db"
    with FakeGemini() as fake, pytest.MonkeyPatch.context() as mp:
        fake.api_key = "test-key"
        fake.limits = QueueLimits(enqueued_tokens={MODEL: CAP})
        mp.setenv("GOOGLE_GEMINI_BASE_URL", fake.base_url)
        config = Settings.from_env(
            {
                "OPSTATE_STORE": f"sqlite:///{db}",
                "GEMINI_API_KEY": "test-key",
                "OPSTATE_RESULTS_URL": (home / "results").as_uri(),
                "OPSTATE_RECONCILE_MAX_PAGES": "0",
                "OPSTATE_SUBMIT_ENQUEUED_TOKENS": f"{MODEL}={CAP}",
            }
        )
        source = home / "big.jsonl"
        source.write_bytes(big_input(600))
        policy = RetryPolicy(max_attempts=1)
        job = submit_from_settings(config, source=source.as_uri(), model=MODEL, policy=policy)
        hostile, done = (
            submit_from_settings(
                config, source=source.as_uri(), model=MODEL, policy=policy, display_name=shown
            )
            for shown in ("other", "done")
        )
        store = SQLiteStore(db)
        try:
            # Gemini finishes the first part; the reconciler's poll, the archive and the retry
            # pass over its roots (the archiver's trigger path) end it and feed the next part.
            first = fake.batches_created()[0]
            keys = [json.loads(line)["key"] for line in fake.batch_input(first).splitlines()]
            fake.run_batch(first, [{"key": k, "response": {"candidates": []}} for k in keys])
            record = store.get(first)
            assert record is not None
            assert refresh_with(store, config, record).error is None
            archive_from_settings(config, store=store, names=[first])
            retry_from_settings(config, store=store, names=roots_of(store, [first]))
            # The other job's plan as a broken or hostile writer could leave it.
            state = store.get_retry(hostile.name)
            assert state is not None
            plan = dict(state.doc[JOB])
            parts = [dict(p) for p in plan["parts"]]
            parts[0] |= {"batch": f"batches/{MARKUP}"}
            plan |= {"model": MARKUP, "parts": parts, "stopped": True, "stoppedWhy": MARKUP}
            changed = RetryState(
                state.status,
                created_ns=state.created_ns,
                due_ns=state.due_ns,
                doc=dict(state.doc) | {JOB: plan},
            )
            assert store.set_retry(hostile.name, state.rev, changed)
            # A third job's final result, as its pass writes it (the engine's tests run one).
            state = store.get_retry(done.name)
            assert state is not None
            final = {
                "status": "final",
                "location": f"file:///r/{done.name}/final.jsonl",
                "rows": {"total": 600, "answered": 590, "blocked": 0, "failed": 10},
                "errors": {"NOT_SUBMITTED": 10},
                "attempts": 5,
            }
            changed = RetryState(
                state.status,
                created_ns=state.created_ns,
                due_ns=state.due_ns,
                doc=dict(state.doc) | {"final": final},
            )
            assert store.set_retry(done.name, state.rev, changed)
        finally:
            store.close()
        created = fake.batches_created()
    server = start_serve(["--store", f"sqlite:///{db}"], cwd=home, env={})
    try:
        yield server, job.name, hostile.name, done.name, created
    finally:
        server.terminate()


def open_detail(page: Any, server: ServeProcess, name: str) -> Any:
    page.goto(f"{server.url}/#token={TEST_API_TOKEN}")
    page.wait_for_selector("#status:has-text('Live')")
    page.locator("#rows").get_by_role("button", name=f"Show {name}").click()
    page.wait_for_selector(f"#detail-title:has-text('{name}')")
    fields = page.locator("#detail-fields")
    fields.locator("#job-parts").wait_for()
    return fields


def test_a_job_shows_its_parts_tokens_and_what_it_waits_for(
    page: Any, jobs: tuple[ServeProcess, str, str, str, list[str]]
) -> None:
    server, name, _, _, created = jobs
    fields = open_detail(page, server, name)
    text = fields.inner_text()
    parts = page.locator("#job-parts li")
    count = parts.count()
    assert count >= 4
    # Both batches created are this job's: the other job waits for room (the shared count).
    first, second = created
    phases = page.locator("#job-phases").inner_text()
    assert phases == f"held {count - 2} · creating 0 · created 1 (1 pending) · ended 1"
    assert page.locator("#job-status .badge").inner_text() == "active"
    assert "Model\ngemini-2.5-flash" in text and "Rows\n600" in text
    assert f" of {CAP} (the model's cap)" in text
    assert "Waiting for\nroom in the model's queue" in text
    assert "1 retries per key" in text
    assert "Final result\npending" in text
    assert parts.nth(0).inner_text().startswith(f"part 0 · {first} · ended · lines 1-")
    assert parts.nth(1).inner_text().startswith(f"part 1 · {second} · created PENDING · lines ")
    assert parts.nth(2).inner_text().startswith("part 2 · (no batch yet) · held · lines ")
    assert "nonce" not in page.content()
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.locator("#detail").screenshot(path=str(ARTIFACTS / "job.png"))
    # A part's batch opens its own view: attempt 0 of its own lineage, under the job's policy.
    fields.get_by_role("button", name=f"Show {first}").click()
    page.wait_for_selector(f"#detail-title:has-text('{first}')")
    fields.locator("text=Retry batches").wait_for()
    assert "1 retries per key" in fields.inner_text()


def test_a_job_whose_plan_holds_markup_shows_it_as_text(
    page: Any, jobs: tuple[ServeProcess, str, str, str, list[str]]
) -> None:
    server, _, hostile, _, _ = jobs
    fields = open_detail(page, server, hostile)
    text = fields.inner_text()
    assert page.locator("#job-status .badge").inner_text() == "stopped"
    assert f"Model\n{MARKUP}" in text
    assert f"Stopped\n{MARKUP}" in text
    assert f"part 0 · batches/{MARKUP} · " in text
    assert page.locator("#detail img, #detail b").count() == 0
    assert page.evaluate("window.pwned") is None


def test_a_final_job_shows_its_counts_and_where_final_jsonl_is(
    page: Any, jobs: tuple[ServeProcess, str, str, str, list[str]]
) -> None:
    server, _, _, done, _ = jobs
    fields = open_detail(page, server, done)
    text = fields.inner_text()
    assert page.locator("#job-status .badge").inner_text() == "final"
    assert "600 total: 590 answered (0 blocked), 10 failed" in text
    assert "NOT_SUBMITTED: 10" in text and "Attempts\n5" in text
    assert "Job cost\nunknown: written by an earlier release" in text
    assert f"Final result\nfile:///r/{done}/final.jsonl" in text
