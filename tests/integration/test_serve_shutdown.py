"""``opstate serve`` stops on SIGTERM in the middle of a reconciler pass.

A slow fake Gemini holds the first polls open. SIGTERM arrives while they are in flight: the
pass's time budget ends at the stop request, the polls in flight finish (and are written),
no further poll starts, and the process exits 0. Counts, not clocks, decide the test.
"""

from __future__ import annotations

import signal
import threading
from pathlib import Path

from opstate.domain.model import OpRecord
from opstate.domain.states import State
from opstate.store.sqlite import SQLiteStore
from tests.support.fake_gemini import FakeGemini, Request
from tests.support.serve_process import start_serve

OPEN = 20
WORKERS = 2


def test_sigterm_ends_a_reconciler_pass_after_the_polls_in_flight(
    tmp_path: Path, fake_gemini: FakeGemini
) -> None:
    db = tmp_path / "ops.db"
    store = SQLiteStore(db)
    names = [f"batches/slow{i:02d}" for i in range(OPEN)]
    try:
        for name in names:
            store.put_if_absent(OpRecord(name, State.PENDING, 1, 1, "report"))
    finally:
        store.close()

    arrived = threading.Semaphore(0)
    release = threading.Event()

    def hold(request: Request) -> None:  # a slow Gemini: answers only once released
        arrived.release()
        release.wait(60)

    for name in names:
        fake_gemini.put_batch(name, "BATCH_STATE_RUNNING", update_time="2026-05-01T10:00:00Z")
        fake_gemini.on_request(name, hold)

    server = start_serve(
        ["--store", f"sqlite:///{db}", "--reconcile-every", "300"],
        cwd=tmp_path,
        env={
            "GEMINI_API_KEY": "test-key",
            "GOOGLE_GEMINI_BASE_URL": fake_gemini.base_url,
            "OPSTATE_WEBHOOK_SECRETS": "whsec_" + "A" * 32,
            "OPSTATE_RECONCILE_WORKERS": str(WORKERS),
            "OPSTATE_RECONCILE_MAX_PAGES": "0",
            "OPSTATE_RECONCILE_HTTP_TIMEOUT_SECONDS": "120",
        },
    )
    try:
        for _ in range(WORKERS):  # both workers are waiting on Gemini
            assert arrived.acquire(timeout=60), server.output()
        server.send_signal(signal.SIGTERM)
        # Printed once the stop request reached the reconciler.
        server.wait_for_line(r"stopping: finishing in-flight requests", 30)
        release.set()
        code = server.terminate(timeout=60)
    finally:
        release.set()
        server.kill()

    assert code == 0, server.output()
    output = server.output()
    assert "stopped" in output
    assert "stopped_early=True" in output, output
    polled = [name for name in names if fake_gemini.hits(name)]
    assert len(polled) == WORKERS, (polled, output)  # nothing new started after the signal

    store = SQLiteStore(db)
    try:
        states = {name: store.get(name) for name in names}
    finally:
        store.close()
    running = sorted(n for n, r in states.items() if r is not None and r.state is State.RUNNING)
    assert running == sorted(polled)  # the polls in flight finished and were written
