"""The reconciler inside ``opstate serve``: a timer thread, and the run's ``on_decision`` hook
printing the state changes (and lost / overdue marks) a poll makes; after each pass, the
archive pass (``local_archiver``: results into ``.opstate/results`` beside the SQLite store,
or ``OPSTATE_RESULTS_URL``)."""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from opstate.config import Settings
from opstate.domain.times import format_time
from opstate.reconcile.run import MarkDecision, RunDecision


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


def decision_line(decision: RunDecision, stamp_ns: int) -> str | None:
    """The line ``opstate serve`` prints for a reconciler decision, None for no change.

    State changes (created / advanced) and the lost / overdue marks are printed; refreshes and
    drops are not.
    """
    stamp = format_time(stamp_ns)[:19] + "Z"
    if isinstance(decision, MarkDecision):
        record = decision.record
        return (
            f"{stamp}  {record.name}  {decision.mark} ({record.state})  v{record.version}  (poll)"
        )
    if not decision.state_changed or decision.record is None:
        return None
    record = decision.record
    before = "(new)" if decision.previous is None else str(decision.previous.state)
    return f"{stamp}  {record.name}  {before} -> {record.state}  v{record.version}  (poll)"


def local_archiver(
    store: Any,
    settings: Settings,
    say: Callable[[str], None],
    on_final: Callable[[str], None] | None = None,
) -> Callable[[Callable[[], float]], dict[str, int]] | None:
    """The archive pass ``opstate serve`` runs after each reconciler pass, then the retry
    pass (``opstate.retry``: failed rows retried, final results written; ``on_final(root)``
    after a root's final result) within what is left (None: no results location, e.g. a
    DynamoDB store without ``OPSTATE_RESULTS_URL``)."""
    from opstate.config import ConfigError
    from opstate.outcomes.genai_source import GenaiSource, make_client
    from opstate.outcomes.run import archive_once
    from opstate.outcomes.wiring import archiving, results_url_for, sink_from_url
    from opstate.retry.engine import retry_once
    from opstate.retry.wiring import config_from
    from opstate.wiring.lineages import read_members

    try:
        url = results_url_for(settings)
        sink = sink_from_url(url, settings)
    except (ConfigError, ValueError) as exc:
        say(f"archiver: off ({exc})")
        return None
    source_box: list[GenaiSource] = []
    say(f"archiver: results go to {url}")

    def archive(remaining_s: Callable[[], float]) -> dict[str, int]:
        if not source_box:
            source_box.append(GenaiSource(make_client(settings)))
        # The open batches of every active lineage, read now (not when their poll is due),
        # so that a lineage moves one step a pass; the archive pass below takes those ended.
        members = read_members(store, settings, remaining_s=remaining_s, archive=False)
        result = archive_once(
            archiving(store),
            source_box[0],
            sink,
            settings=settings,
            remaining_s=remaining_s,
            safety_s=settings.reconcile_safety_margin_s,
        )
        view = result.as_dict()
        counts = {k: view[k] for k in ("archived", "failed", "expired", "none", "bytes")}
        retried = retry_once(
            store,
            sink,
            source_box[0].client,
            config_from(settings),
            remaining_s=remaining_s,
            safety_s=settings.reconcile_safety_margin_s,
            on_final=on_final,
        ).as_dict()
        counts.update({f"retry_{k}": retried[k] for k in ("planned", "submitted", "final")})
        counts["retry_read"] = members.changed
        return counts

    return archive


def _archive_pass(
    archive: Callable[[Callable[[], float]], dict[str, int]],
    remaining_s: Callable[[], float],
    say: Callable[[str], None],
) -> None:
    """One archive pass after a reconcile pass; its counts printed when it did anything."""
    archived = archive(remaining_s)
    if any(archived.values()):
        say("archive: " + " ".join(f"{k}={v}" for k, v in archived.items()))


def start_reconciler(
    store: Any,
    settings: Settings,
    every_s: float,
    say: Callable[[str], None],
    also: Callable[[RunDecision], None] | None = None,
    on_final: Callable[[str], None] | None = None,
) -> ReconcileLoop:
    """Start the timer thread; every decision of a pass is printed (``decision_line``) and
    handed to ``also`` (the operations page's decision log)."""
    from opstate.reconcile.genai_gateway import GenaiGateway, make_client
    from opstate.reconcile.run import reconcile_once, schedule_from_settings

    # Each pass gets a bounded budget (no Lambda deadline here): the reconciler stops starting
    # work once less than its safety margin is left, so the budget must exceed the margin.
    budget_s = settings.reconcile_safety_margin_s + max(every_s, 30.0)
    gateway_box: list[GenaiGateway] = []

    def on_decision(decision: RunDecision) -> None:
        if also is not None:
            also(decision)
        line = decision_line(decision, time.time_ns())
        if line is not None:
            say(line)

    stop_requested = threading.Event()
    archive = local_archiver(store, settings, say, on_final)
    # The loop's own period: a poll due again before the next pass is not written.
    schedule = dataclasses.replace(schedule_from_settings(settings), run_every_s=every_s)

    def run_once() -> Mapping[str, Any]:
        if not gateway_box:
            gateway_box.append(GenaiGateway(make_client(settings)))
        deadline = time.monotonic() + budget_s

        def remaining_ms() -> int:
            # A stop request ends the budget: no new request starts, those in flight finish.
            if stop_requested.is_set():
                return 0
            return int((deadline - time.monotonic()) * 1000)

        result = reconcile_once(
            store,
            gateway_box[0],
            settings=settings,
            remaining_ms=remaining_ms,
            on_decision=on_decision,
            schedule=schedule,
        )
        if result.first_error is not None:
            say(f"reconcile: {result.errors} error(s); the first: {result.first_error}")
        summary: Mapping[str, Any] = result.as_dict()
        if archive is not None:  # then every due result is archived, within what is left
            _archive_pass(archive, lambda: remaining_ms() / 1000.0, say)
        return summary

    loop = ReconcileLoop(run_once, every_s, say, stop_event=stop_requested)
    loop.start()
    say(f"reconciler: every {every_s:g} s")
    from opstate.reconcile.discovery import discovery_sentence

    say(discovery_sentence(settings))
    return loop
