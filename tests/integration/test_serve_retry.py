"""``opstate serve`` runs the retry pass after each archive pass (issue 33 §4): a batch submitted
with a retry policy that ends with failed rows gets its child without any other command, and a
waiter ``--until final`` on the root returns once the lineage's final result is written.

A real ``opstate serve`` process on its SQLite store, its reconciler every 0.3 s, the real
google-genai client talking to the fake Gemini server.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path

from tests.support.fake_gemini import FakeGemini
from tests.support.retry_rows import answered, failed, write_input
from tests.support.serve_process import run_cli, start_serve

MODEL = "gemini-2.5-flash"


def wait_until(check: Callable[[], bool], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.1)


def test_serve_retries_the_failed_rows_and_writes_the_final_result(
    tmp_path: Path, fake_gemini: FakeGemini
) -> None:
    store = f"sqlite:///{tmp_path / 'ops.db'}"
    env = {
        "GEMINI_API_KEY": "test-key",
        "GOOGLE_GEMINI_BASE_URL": fake_gemini.base_url,
        "OPSTATE_RECONCILE_MAX_PAGES": "0",
        "OPSTATE_RETRY_CHECK_SECONDS": "1",
    }
    keys = ["a", "b", "c", "d"]
    source = write_input(tmp_path / "in.jsonl", keys)
    submitted = run_cli(
        ["submit", str(source), "--model", MODEL, "--retry-attempts", "1", "--json"],
        cwd=tmp_path,
        env={**env, "OPSTATE_STORE": store},
    )
    assert submitted.returncode == 0, submitted.stderr
    root = json.loads(submitted.stdout)["name"]
    server = start_serve(["--store", store, "--reconcile-every", "0.3"], cwd=tmp_path, env=env)
    try:
        fake_gemini.run_batch(root, [failed("a", 503, "UNAVAILABLE"), *map(answered, keys[1:])])
        wait_until(lambda: len(fake_gemini.batches_created()) == 2)
        child = fake_gemini.batches_created()[1]
        assert [json.loads(x)["key"] for x in fake_gemini.batch_input(child).splitlines()] == ["a"]
        server.wait_for_line(r"archive: .*retry_submitted=1", 10)
        fake_gemini.run_batch(child, [answered("a")])
        waited = run_cli(
            ["wait", root, "--until", "final", "--timeout", "60", "--json"],
            cwd=tmp_path,
            env={**env, "OPSTATE_STORE": store},
            timeout=90,
        )
        assert waited.returncode == 0, waited.stderr
        results = run_cli(
            ["results", root, "--json"], cwd=tmp_path, env={**env, "OPSTATE_STORE": store}
        )
        final = json.loads(results.stdout)["final"]
        assert final["status"] == "final"
        assert final["rows"] == {"total": 4, "answered": 4, "blocked": 0, "failed": 0}
        assert len(fake_gemini.batches_created()) == 2
    finally:
        assert server.terminate() == 0
