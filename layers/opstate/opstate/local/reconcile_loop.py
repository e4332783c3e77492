"""The reconciler inside ``opstate serve``: a timer thread and the store wrapper that prints
the state changes a poll makes."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from opstate.config import Settings
from opstate.times import format_time


class ReconcileLoop:
    """Runs one reconciler pass now and then every ``every_s`` seconds until stopped.

    ``request_stop`` (the server's SIGINT/SIGTERM) ends the running pass's time budget at once:
    requests to Gemini already in flight finish and their results are written, nothing new
    starts, and no further pass begins. ``stop`` then waits for the thread.
    """

    def __init__(
        self,
        run_once: Callable[[], Mapping[str, Any]],
        every_s: float,
        say: Callable[[str], None],
        stop_event: threading.Event | None = None,
    ) -> None:
        self._run_once = run_once
        self._every_s = every_s
        self._say = say
        # Shared with the pass's time budget (``start_reconciler``): set = no budget left.
        self._stop = stop_event if stop_event is not None else threading.Event()
        self._in_pass = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="opstate-reconcile", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.is_set():
            self._in_pass.set()
            try:
                result = self._run_once()
            except Exception as exc:
                self._say(f"reconcile: pass failed: {type(exc).__name__}: {exc}")
            else:
                summary = " ".join(f"{k}={v}" for k, v in result.items())
                self._say(f"reconcile: {summary}")
            finally:
                self._in_pass.clear()
            if self._stop.wait(self._every_s):
                return

    def request_stop(self) -> None:
        """End the current pass's budget and start no other pass (returns at once)."""
        self._stop.set()

    def stop(self, timeout_s: float | None = None) -> None:
        self._stop.set()
        if self._in_pass.is_set():
            self._say("stopping: waiting for the reconciler pass to finish")
        if self._thread.is_alive():
            self._thread.join(timeout_s)


class AnnouncingStore:
    """A store wrapper that reports every successful write as a state change line.

    The reconciler has no decision hook; it ingests through this wrapper instead. ``ingest``
    reads (or is handed, on a lost race) the record it then replaces, in the same thread, so the
    last record seen per thread is the previous record of a successful replace.
    """

    def __init__(self, inner: Any, on_write: Callable[[Any, Any, bool], None]) -> None:
        self._inner = inner
        self._on_write = on_write
        self._seen = threading.local()

    def _remember(self, record: Any) -> None:
        self._seen.record = record

    def _previous(self, name: str, version: int) -> Any:
        record = getattr(self._seen, "record", None)
        if record is not None and record.name == name and record.version == version:
            return record
        return None

    def get(self, name: str) -> Any:
        record = self._inner.get(name)
        self._remember(record)
        return record

    def put_if_absent(self, record: Any) -> Any:
        outcome = self._inner.put_if_absent(record)
        if outcome.ok:
            self._on_write(None, record, True)
        else:
            self._remember(outcome.current)
        return outcome

    def replace_if_version(self, record: Any, expected_version: int) -> Any:
        previous = self._previous(record.name, expected_version)
        outcome = self._inner.replace_if_version(record, expected_version)
        if outcome.ok:
            self._on_write(previous, record, False)
        else:
            self._remember(outcome.current)
        return outcome

    def list_open(self, limit: int = 100) -> Any:
        return self._inner.list_open(limit)

    def iter_all(self) -> Any:
        return self._inner.iter_all()

    def close(self) -> None:
        self._inner.close()


def start_reconciler(
    store: Any, settings: Settings, every_s: float, say: Callable[[str], None]
) -> ReconcileLoop:
    from opstate import reconcile

    # Each pass gets a bounded budget (no Lambda deadline here): the reconciler stops starting
    # work once less than its safety margin is left, so the budget must exceed the margin.
    budget_s = settings.reconcile_safety_margin_s + max(every_s, 30.0)
    memory = reconcile.PollMemory()
    client_box: list[Any] = []

    def on_write(previous: Any, record: Any, created: bool) -> None:
        if previous is not None and previous.state == record.state:
            return  # a refresh, not a state change
        if created:
            before = "(new)"
        elif previous is None:
            before = "?"
        else:
            before = str(previous.state)
        stamp = format_time(time.time_ns())[:19] + "Z"
        say(f"{stamp}  {record.name}  {before} -> {record.state}  v{record.version}  (poll)")

    announcing = AnnouncingStore(store, on_write)

    stop_requested = threading.Event()

    def run_once() -> Mapping[str, Any]:
        if not client_box:
            client_box.append(reconcile.make_client(settings))
        deadline = time.monotonic() + budget_s

        def remaining_ms() -> int:
            # A stop request ends the budget: no new request starts, those in flight finish.
            if stop_requested.is_set():
                return 0
            return int((deadline - time.monotonic()) * 1000)

        result = reconcile.reconcile_once(
            announcing, client_box[0], settings=settings, remaining_ms=remaining_ms, memory=memory
        )
        summary: Mapping[str, Any] = result.as_dict()
        return summary

    loop = ReconcileLoop(run_once, every_s, say, stop_event=stop_requested)
    loop.start()
    say(f"reconciler: every {every_s:g} s")
    return loop
