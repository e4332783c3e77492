"""One retry pass: ``retry_once`` looks at every due root (``RetryingStore.iter_retry_due``) and
takes it one step further, by these rules (docs/retry.md):

1. the input: a root tracked with ``--input`` has it copied into the sink first (a bad input is
   ``unavailable``, with the line that is wrong), one created with keyed inlined requests has
   them read from the job itself; a root whose input opstate does not hold is ``unavailable``
   and nothing is ever resubmitted for it;
2. children planned but not known to exist are created (``opstate.retry.children``: claimed
   under the revision, found again by their id after a crash, at most one per plan);
3. a member still PENDING past ``pendingTimeoutHours`` is read (the job itself) and cancelled
   when opstate created it and Gemini's ``createTime`` is that long ago (at least an hour;
   ``opstate.retry.acting``), at most ``MAX_CANCELS_PER_LINEAGE`` times a lineage;
4. while any member is open, or terminal with its results not settled, the root waits
   (due again after ``check_s``);
5. when every member is settled, the next attempt is planned from the latest one: the
   transient failures (``opstate.retry.rules``) of each succeeded member, the whole input of an
   expired member (``resubmitExpired``), of one opstate cancelled, or of a retry child that
   FAILED as a whole (while attempts are left), each only when Gemini, read right then, says
   so too (a name Gemini answers 404 for makes retry ``unavailable``: nothing is planned, the
   final result is written with what is known), on the model Gemini says that batch runs on;
   the child inputs are cut from the kept input's verified bytes and written into the sink
   with their own sha256 before the plan, the plan before any create;
6. when nothing is left to plan (or the lineage stopped), ``final.jsonl`` and ``final.json``
   are written beside the root's results and the root is ``done``.

Every write is the root's retry state under its revision: a runner that loses a race leaves
the root to the one that won. A store fault ends the root's step (it is due again); any other
failure of one root is logged and counted, never the end of the pass.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import replace
from typing import Any

from opstate.domain.model import OpRecord
from opstate.domain.retry import RetryPolicy
from opstate.domain.states import State
from opstate.domain.times import NS_PER_SECOND
from opstate.gemini.errors import GatewayError
from opstate.gemini.port import GeminiClient
from opstate.gemini.submit import inlined_requests
from opstate.observability import count, log_fields, logger
from opstate.outcomes.sink import Sink, SinkError
from opstate.retry import child_room, evidence, job_step, lineage, solo_room, spend
from opstate.retry.authority import INPUT_UNUSABLE, NOT_UNDER, acting_policy, reads_input
from opstate.retry.children import Creator
from opstate.retry.cutting import retry_keys, write_inputs
from opstate.retry.finalize import chunks_of, output_location, write_final_of
from opstate.retry.inputs import (
    InputError,
    IntegrityError,
    keep_input,
    keys_cover,
    source_chunks,
    verified,
)
from opstate.retry.passes import LostRace, RetryConfig, RetryResult, said_stopped
from opstate.retry.selection import Selection
from opstate.retry.timeouts import pending_timeouts
from opstate.store.port import ArchiveState, RetryableError, RetryPassStore
from opstate.store.retry_state import RETRY_ACTIVE, RETRY_DONE, RetryState

MAX_ERROR_TEXT = 300
SETTLED = frozenset({"archived", "none", "expired"})
# The input source of a batch created with inlined requests (read from the job itself).
INLINED = "inlined"
# ``every``: a due time past any root's (``opstate retry --once`` looks at every active root).
EVERY_NS = 2**62


class RetryRunner:
    """One pass over the due roots (see the module docstring)."""

    def __init__(
        self,
        store: RetryPassStore,
        sink: Sink,
        client: GeminiClient,
        config: RetryConfig,
        clock_ns: Callable[[], int] = time.time_ns,
        on_final: Callable[[str], None] | None = None,
    ) -> None:
        self.store = store
        self.sink = sink
        self.client = client
        self.config = config
        self.clock_ns = clock_ns
        self.on_final = on_final
        self.result = RetryResult()
        self.time_left: Callable[[], float] | None = None
        self._redated: tuple[str, int] | None = None  # (root, due) the last re-date wrote
        self.creator = Creator(self)
        self.every = False  # an operator's pass: a create backing off is tried at once

    # -- the pass ----------------------------------------------------------------------------

    def run(
        self,
        remaining_s: Callable[[], float] | None = None,
        safety_s: float = 0.0,
        names: list[str] | None = None,
        every: bool = False,
    ) -> None:
        self.every = every
        if remaining_s is not None:
            left = remaining_s
            self.time_left = lambda: left() - safety_s
        try:
            entries: Iterator[tuple[OpRecord, RetryState]]
            if names is None:
                entries = self.store.iter_retry_due(EVERY_NS if every else self.clock_ns())
            else:
                entries = iter(self._named(names))
            for record, state in entries:
                if remaining_s is not None and remaining_s() < safety_s:
                    self.result.remaining = 1 + sum(1 for _ in entries)
                    break
                self._step(record, state)
        except RetryableError as exc:  # the listing itself: the next pass lists again
            self.result.errors += 1
            log_fields(logger.warning, "retry pass cut short", {"error": str(exc)[:MAX_ERROR_TEXT]})

    def _step(self, record: OpRecord, state: RetryState) -> None:
        """One root's step; its fault is counted and logged, never the end of the pass."""
        try:
            self.one(record, state)
        except LostRace:
            self.result.skipped += 1
        except RetryableError:
            self.result.errors += 1
            log_fields(logger.warning, "retry step left for the next pass", {"name": record.name})
        except Exception as exc:
            self.result.errors += 1
            log_fields(
                logger.error,
                "retry step failed",
                {"name": record.name, "error": _text(exc)[:MAX_ERROR_TEXT]},
            )

    def _named(self, names: list[str]) -> list[tuple[OpRecord, RetryState]]:
        found = []
        for name in dict.fromkeys(names):
            record = self.store.get(name)
            state = self.store.get_retry(name) if record is not None else None
            if record is not None and state is not None and state.status == RETRY_ACTIVE:
                found.append((record, state))
        return found

    def one(self, root: OpRecord, state: RetryState) -> None:
        if state.created_ns != root.created_ns or job_step.job_step(self, root, state):
            return  # an earlier incarnation's state (never acted on), or a job's step
        settled = solo_room.settle(self, root, state)  # a batch submitted alone: its room
        if settled is not None:
            self.lineage_step(root, settled)

    def lineage_step(self, root: OpRecord, state: RetryState) -> None:
        state = self._redate(root, state)
        ready = self._ready(root, state)
        if ready is None:
            return
        state = ready
        refs = lineage.members(root.name, state.doc)
        records = {ref.name: self.store.get(ref.name) for ref in refs}
        archives = {ref.name: self.store.get_archive(ref.name) for ref in refs}
        state = spend.charge(self, root, self._note_ended(root, state, records), archives)
        state = pending_timeouts(self, self.creator.cancel, root, state, refs, records)
        if any(not _settled(records[r.name], archives[r.name]) for r in refs):
            self.result.waiting += 1
            self._wait(root, state, self.clock_ns() + int(self.config.check_s * NS_PER_SECOND))
            return
        # ``unavailable`` on an active root: Gemini knew a member not (404); final follows.
        stopped = bool(state.doc.get("stopped") or state.doc.get("unavailable"))
        if not stopped and not state.doc.get("covered"):
            state = self._check_cover(root, state, archives)
            if state.status != RETRY_ACTIVE:
                return
        if not stopped:
            try:
                planned = self._plan(root, state, refs, records, archives)
            except evidence.Unknown as gone:
                planned = None
                state = evidence.mark_unknown(self, root, state, gone.name)
            except IntegrityError as exc:
                self.give_up(root, state, INPUT_UNUSABLE, str(exc))
                return
            if planned is not None:
                self.one(root, planned)  # create what was planned in the same pass
                return
        write_final_of(self, root, state, refs, archives)

    def _ready(self, root: OpRecord, state: RetryState) -> RetryState | None:
        """Steps 1 and 2: the input kept and the planned children created; None when the
        root cannot go further now (unavailable, or a child still to be created)."""
        if not lineage.input_of(state.doc).get("location"):
            state = self._take_input(root, state, lineage.mutable(state.doc))
            if state.status != RETRY_ACTIVE:
                return None
        if lineage.unfinished(state.doc) and not state.doc.get("stopped"):
            state = self.creator.create_planned(root, state)
            if lineage.unfinished(state.doc) and not state.doc.get("stopped"):
                self._wait(root, state, self._soonest_claim(state.doc, self.clock_ns()))
                return None
        return state

    def _note_ended(
        self, root: OpRecord, state: RetryState, records: Mapping[str, OpRecord | None]
    ) -> RetryState:
        """Ended children noted, their room in the queue freed (``child_room.ended``)."""
        return child_room.ended(self, root, state, records)

    # -- writes ------------------------------------------------------------------------------

    def write(
        self, root: OpRecord, state: RetryState, doc: Mapping[str, Any], **change: Any
    ) -> RetryState:
        """Write ``doc`` (and ``status`` / ``due_ns`` when given) under ``state``'s revision;
        ``LostRace`` when another writer was first."""
        written = replace(state, doc=dict(doc), **change)
        if not self.store.set_retry(root.name, state.rev, written):
            raise LostRace(root.name)
        return replace(written, rev=state.rev + 1)

    def _wait(self, root: OpRecord, state: RetryState, due_ns: int) -> None:
        """Look at ``root`` again at ``due_ns``: written only when the stored due time has
        passed or is later, so a pass over a root not yet due (``opstate retry --once``, a
        bus trigger) writes nothing; or when the stored due time is the one this pass re-dated
        it to (``_later``): then the step's own time replaces it, a backoff longer than
        ``check_s`` included."""
        redated = self._redated == (root.name, state.due_ns)
        if state.due_ns <= self.clock_ns() or due_ns < state.due_ns or redated:
            self.write(root, state, state.doc, due_ns=due_ns)

    def _redate(self, root: OpRecord, state: RetryState) -> RetryState:
        """A due root is first written due again after ``check_s``, before any heavy work
        (reading its input and outputs, writing children or the final result): a pass that
        dies on it (out of memory, out of time, killed) leaves it behind the roots due before,
        so the next pass takes those first. Whatever the step ends with writes its own due
        time over this one."""
        if state.due_ns > self.clock_ns():
            return state  # not due (a pass over every root, a bus trigger): left as it is
        return self._later(root, state, state.doc)

    def _later(
        self,
        root: OpRecord,
        state: RetryState,
        doc: Mapping[str, Any],
        then: Callable[[], None] | None = None,
    ) -> RetryState:
        """``doc`` written with ``root`` due again after ``check_s`` (the re-date), noted so
        that ``_wait`` may put the step's own due time over it; ``then`` runs once it is
        written (a stop is said and counted only when its write won)."""
        due_ns = self.clock_ns() + int(self.config.check_s * NS_PER_SECOND)
        written = self.write(root, state, doc, due_ns=due_ns)
        self._redated = (root.name, due_ns)
        if then is not None:
            then()
        return written

    def _soonest_claim(self, doc: Mapping[str, Any], now: int) -> int:
        later = [
            int(c.get("claimUntilNs") or 0)
            for c in lineage.unfinished(doc)
            if int(c.get("claimUntilNs") or 0) > now
        ]
        return min(later, default=now + int(self.config.check_s * NS_PER_SECOND))

    def give_up(self, root: OpRecord, state: RetryState, why: str, detail: str = "") -> RetryState:
        """Retry is unavailable for ``root`` (said with ``why``; ``detail`` only in the log and
        ``unavailableDetail``, never in a view): nothing is resubmitted."""
        doc = lineage.mutable(state.doc)
        doc["unavailable"] = why[:MAX_ERROR_TEXT]
        doc |= {"unavailableDetail": detail[:MAX_ERROR_TEXT]} if detail else {}
        self.result.unavailable += 1
        count("RetryUnavailable")
        said = f"{why}: {detail}" if detail else why
        log_fields(logger.warning, "retry unavailable", {"name": root.name, "why": said})
        return self.write(root, state, doc, status=RETRY_DONE, due_ns=0)

    # -- 1. the input ------------------------------------------------------------------------

    def _take_input(self, root: OpRecord, state: RetryState, doc: dict[str, Any]) -> RetryState:
        kept = dict(lineage.input_of(doc))
        source = kept.get("source")
        chunks: Callable[[], Iterable[bytes]]
        if isinstance(source, str) and source:
            if not reads_input(doc, source, self.config.input_prefixes):
                return self.give_up(root, state, INPUT_UNUSABLE, f"{source} {NOT_UNDER}")
            chunks = source_chunks(source)
        else:
            # Gemini gives a file input back never; inlined requests are in the job itself.
            try:
                inlined = inlined_requests(self.client, root.name)
            except GatewayError as exc:
                if exc.transient:
                    raise RetryableError(exc.message) from exc
                inlined = None
            if inlined is None:
                return self.give_up(root, state, "opstate does not hold this batch's input")
            source = INLINED
            data = b"".join(line + b"\n" for line in inlined)
            chunks = lambda: iter((data,))  # noqa: E731
        try:
            facts = keep_input(chunks, self.sink, self.config.max_line_bytes)
        except (InputError, ValueError) as exc:  # exists? its format, its keys: the log's only
            return self.give_up(root, state, INPUT_UNUSABLE, f"{source} cannot be used: {exc}")
        except SinkError as exc:
            if not exc.transient:
                return self.give_up(root, state, INPUT_UNUSABLE, f"{source} cannot be kept: {exc}")
            raise RetryableError(str(exc)) from exc
        kept.update(source=source, **facts.as_dict())
        doc["input"] = kept
        return self.write(root, state, doc)

    def _check_cover(
        self, root: OpRecord, state: RetryState, archives: Mapping[str, ArchiveState | None]
    ) -> RetryState:
        """Once, when the root's output is archived: its input must hold every output key."""
        doc = lineage.mutable(state.doc)
        output = output_location(archives.get(root.name))
        kept = lineage.input_of(doc)
        location, sha256 = kept.get("location"), kept.get("sha256")
        if output is not None and isinstance(location, str):
            held = verified(
                self.sink.chunks(location),
                sha256 if isinstance(sha256, str) else None,
                f"the kept input {location}",
            )
            try:
                missing = keys_cover(held, chunks_of(self.sink, output), self.config.max_line_bytes)
            except IntegrityError as exc:
                return self.give_up(root, state, INPUT_UNUSABLE, str(exc))
            if missing:
                return self.give_up(root, state, f"the input lacks {missing} of the output's keys")
        doc["covered"] = True
        return self.write(root, state, doc)

    # -- 5. planning -------------------------------------------------------------------------

    def _plan(
        self,
        root: OpRecord,
        state: RetryState,
        refs: list[lineage.MemberRef],
        records: Mapping[str, OpRecord | None],
        archives: Mapping[str, ArchiveState | None],
    ) -> RetryState | None:
        """Plan the next attempt (None: nothing to plan, the lineage is complete)."""
        doc = lineage.mutable(state.doc)
        policy = acting_policy(doc)  # a policy of unknown origin resubmits nothing whole
        max_attempts = policy.max_attempts
        latest = max(ref.attempt for ref in refs)
        if lineage.highest_attempt(doc) > latest:
            return None  # planned children all refused (the lineage stopped)
        attempt = latest + 1
        room = self.config.max_batches - len(lineage.children(doc))
        inputs: list[lineage.ChildInput] = []
        generation = [ref for ref in refs if ref.attempt == latest]
        earlier = [ref for ref in refs if ref.attempt < latest]
        gone = set(lineage.cancelled(doc))
        money: str | None = None  # a row refused for money (issue 39): the lineage stops
        for ref in generation:
            if room <= len(inputs):
                break
            record = records[ref.name]
            assert record is not None
            whole = _whole_case(record, ref, ref.name in gone, policy, attempt)
            if whole is not None:
                if whole and ref.input and ref.rows:
                    inputs.extend(
                        evidence.whole_input(
                            self,
                            root,
                            doc,
                            ref,
                            ref.name in gone,
                            policy,
                            attempt,
                            room,
                            len(inputs),
                        )
                    )
                continue
            output = output_location(archives.get(ref.name))
            if record.state is not State.SUCCEEDED or output is None:
                continue
            keys = retry_keys(self, doc, output, earlier, archives, attempt, max_attempts)
            money = money or keys.money
            if keys and money is None:
                inputs.extend(self._row_inputs(root, doc, keys, attempt, ref.name, room, inputs))
        if money is not None:  # the account cannot pay: a create would be refused the same way
            why = f"Gemini refused requests for money ({money}): add credits or raise the cap"
            doc["stopped"] = why  # its final result follows in this pass
            return self._later(root, state, doc, lambda: said_stopped(self, root, why))
        if not inputs:
            return None
        planned = lineage.plan_children(doc, attempt=attempt, inputs=inputs)
        self.result.planned += len(planned)
        log_fields(
            logger.info,
            "retry planned",
            {"name": root.name, "attempt": attempt, "children": [c["id"] for c in planned]},
        )
        allowed = spend.check(self, root, doc, refs, archives, planned)  # issue 41's budgets
        # due again later (re-dated, as ``_redate`` says): the create follows in this pass; a
        # lineage the budget stopped gets its final result in this pass instead, never a create
        said = None if allowed else lambda: spend.said(self, root, str(doc["stopped"]))
        return self._later(root, state, doc, said)

    def _row_inputs(
        self,
        root: OpRecord,
        doc: Mapping[str, Any],
        keys: Selection,
        attempt: int,
        parent: str,
        room: int,
        planned: list[lineage.ChildInput],
    ) -> list[lineage.ChildInput]:
        """The retry batches of ``keys`` from ``parent``'s output, once Gemini says ``parent``
        SUCCEEDED (``evidence``), on the model it names; none when it says otherwise."""
        job = evidence.read(self, parent)
        if job.state is not State.SUCCEEDED:
            evidence.not_said(self, root, job)
            return []
        return write_inputs(self, root, doc, keys, attempt, parent, room, len(planned), job.model)


def _whole_resubmit(record: OpRecord, cancelled_by_us: bool, resubmit_expired: bool) -> bool:
    """An expired batch (``resubmitExpired``), or one opstate cancelled for its pending
    timeout that ended CANCELLED or EXPIRED, is resubmitted whole."""
    expired = _expired(record)
    if cancelled_by_us:
        return record.state is State.CANCELLED or expired
    return expired and resubmit_expired


def _whole_case(
    record: OpRecord,
    ref: lineage.MemberRef,
    cancelled_by_us: bool,
    policy: RetryPolicy,
    attempt: int,
) -> bool | None:
    """None when ``ref``'s batch is not resubmitted whole; else whether attempt ``attempt``
    may resubmit it: an expired or cancelled one (``_whole_resubmit``) while the attempt is
    at most ``max(maxAttempts, 1)``; a retry batch that FAILED as a whole while it is at most
    ``maxAttempts``: every key it was given failed for a passing reason (its input is a
    subset of one Gemini took; a root that fails whole is not retried: its input is suspect)."""
    if _whole_resubmit(record, cancelled_by_us, policy.resubmit_expired):
        return attempt <= max(policy.max_attempts, 1)
    if ref.attempt >= 1 and record.state is State.FAILED and not _expired(record):
        return attempt <= policy.max_attempts
    return None


def _expired(record: OpRecord) -> bool:
    return record.state is State.FAILED and record.details.get("reason") == "expired"


def _settled(record: OpRecord | None, archive: ArchiveState | None) -> bool:
    """Terminal, and its results archived or known absent (nothing more will come)."""
    if record is None or not record.terminal:
        return False
    return archive is not None and archive.status in SETTLED


def _text(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


def retry_once(
    store: RetryPassStore,
    sink: Sink,
    client: GeminiClient,
    config: RetryConfig,
    *,
    clock_ns: Callable[[], int] = time.time_ns,
    remaining_s: Callable[[], float] | None = None,
    safety_s: float = 0.0,
    names: list[str] | None = None,
    on_final: Callable[[str], None] | None = None,
    every: bool = False,
) -> RetryResult:
    """One pass (see the module docstring); returns what it did. ``every``: every active
    root, due or not (``opstate retry --once``: an operator asks for it now)."""
    runner = RetryRunner(store, sink, client, config, clock_ns, on_final)
    runner.run(remaining_s, safety_s, names, every)
    log_fields(logger.info, "retry pass", runner.result.as_dict())
    return runner.result
