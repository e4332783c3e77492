"""Creating a planned child at most once (docs/retry.md, "At most one child per plan").

Gemini's ``batches.create`` takes no idempotency key, so the plan is written first (the child's
id, its input in the sink) and every create goes through this protocol:

1. claim: the entry becomes ``creating`` with ``claims + 1`` and a lease (``lease_s``), written
   under the root's revision, so two runners never create the same entry at once;
2. an entry claimed before (``claims`` was > 0: a runner may have created it, then died before
   writing its name) is first looked for: the listing's display names are searched for its id
   and each job found is read itself (never judged from the listing alone);
3. only when none is found: upload its input (Files API), ``batches.create`` with the id as its
   display name;
4. the child is tracked (ingested as an ordinary operation, its lineage beside it), then its
   name is written into the root's plan (``created``), which announces
   ``Operation Retry Submitted``. A runner that wrote the root's state meanwhile (one that
   found the claim held writes when to look again) does not stop this: the name is written
   on the new revision while the claim is still this one's.

A crash anywhere leaves the entry ``planned`` or ``creating``: the next claim searches before it
creates, so a plan yields at most one child. A create Gemini refuses for quota or billing stops
the whole lineage (``stopped``, counted in ``RetryStopped``, said once); any other failure leaves
the entry ``creating`` until its retry time, searched again before the next create.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

from opstate.domain.model import OpEvent, OpRecord
from opstate.domain.states import State
from opstate.domain.times import NS_PER_SECOND
from opstate.gemini.errors import GatewayError, classify
from opstate.gemini.submit import (
    SearchCutError,
    batch_model,
    cancel_batch,
    create_or_delete,
    find_by_display_id,
    is_quota_refusal,
    read_batch,
    upload_jsonl,
)
from opstate.ingest import ingest
from opstate.observability import count, log_fields, logger
from opstate.retry import lineage
from opstate.retry.passes import LostRace, Runner
from opstate.store.retry_state import RETRY_MEMBER, RetryState

MAX_ERROR_TEXT = 300
# Rewrites of a claimed entry's outcome when other runners keep moving the root's revision.
MAX_SETTLE_TRIES = 5


class Creator:
    """The create protocol of the module docstring, for one ``RetryRunner``."""

    def __init__(self, runner: Runner) -> None:
        self.runner = runner

    def create_planned(self, root: OpRecord, state: RetryState) -> RetryState:
        """Create every planned child whose claim is free; the root's state afterwards."""
        for entry in lineage.unfinished(state.doc):
            if lineage.mutable(state.doc).get("stopped"):
                break
            state = self._one(root, state, str(entry["id"]))
        return state

    def _one(self, root: OpRecord, state: RetryState, child: str) -> RetryState:
        runner = self.runner
        now = runner.clock_ns()
        doc = lineage.mutable(state.doc)
        entry = lineage.find_child(doc, child)
        if entry is None or entry.get("phase") not in (lineage.PLANNED, lineage.CREATING):
            return state
        if entry.get("phase") == lineage.CREATING and int(entry.get("claimUntilNs") or 0) > now:
            return state  # another runner holds it
        searched_before = int(entry.get("claims") or 0) > 0
        entry.update(
            phase=lineage.CREATING,
            claims=int(entry.get("claims") or 0) + 1,
            claimUntilNs=now + int(runner.config.lease_s * NS_PER_SECOND),
        )
        state = runner.write(root, state, doc)
        try:
            event = self._find(child) if searched_before else None
            if event is None:
                event = self._create(root, state.doc, entry)
        except GatewayError as exc:
            return self._refused(root, state, child, exc)
        self._track(root, event, entry)

        def created(doc: dict[str, Any], done: dict[str, Any]) -> None:
            done.update(phase=lineage.CREATED, name=event.name, error=None, claimUntilNs=0)

        state = self._settle(root, state, child, created)
        runner.result.submitted += 1
        count("RetrySubmitted")
        log_fields(
            logger.info,
            "retry submitted",
            {"name": root.name, "child": event.name, "id": child, "rows": entry.get("rows")},
        )
        return state

    def _find(self, child: str) -> OpEvent | None:
        """The child created under id ``child`` before a crash, read itself, or None."""
        client = self.runner.client
        try:
            found = find_by_display_id(client, child, time_left=self.runner.time_left)
        except SearchCutError as exc:  # fails closed: no create, the entry is due again
            count("RetrySearchCut")
            log_fields(logger.warning, "retry search cut", {"id": child, "why": exc.why})
            raise
        except GatewayError:
            raise
        except Exception as exc:
            raise classify(exc) from exc
        events = []
        for name in found:
            try:
                events.append(read_batch(client, name))
            except GatewayError as exc:
                if exc.status == 404:
                    continue
                raise
        if len(events) > 1:
            log_fields(
                logger.error,
                "several batches carry one retry id",
                {"id": child, "names": [e.name for e in events]},
            )
        return min(events, key=lambda e: e.name) if events else None

    def _create(self, root: OpRecord, doc: Mapping[str, Any], entry: Mapping[str, Any]) -> OpEvent:
        runner = self.runner
        location = str(entry["input"])
        model = doc.get("model")
        if not isinstance(model, str) or not model:
            model = batch_model(runner.client, root.name)
        size = entry.get("bytes")
        if not isinstance(size, int) or size <= 0:  # not recorded: what the sink holds
            stored = runner.sink.head(runner.sink.resolve(location))
            size = stored.size if stored is not None else None
        chunks: Iterable[bytes] = runner.sink.chunks(location)
        try:
            file_name = upload_jsonl(
                runner.client, chunks=chunks, size=size, display_name=str(entry["id"])
            )
            return create_or_delete(runner.client, model, file_name, str(entry["id"]))
        except GatewayError:
            raise
        except Exception as exc:
            raise classify(exc) from exc

    def _track(self, root: OpRecord, event: OpEvent, entry: Mapping[str, Any]) -> None:
        """The child as an ordinary tracked operation, its lineage beside it."""
        runner = self.runner
        decision = ingest(runner.store, event)
        record = decision.record or runner.store.get(event.name)
        if record is None:  # pragma: no cover - ingest always leaves a record
            raise RuntimeError(f"{event.name} was not stored")
        lineage_doc = {
            "lineage": {
                "root": root.name,
                "parent": entry.get("parent") or root.name,
                "attempt": entry.get("attempt"),
                "id": entry.get("id"),
            }
        }
        existing = runner.store.get_retry(record.name)
        if existing is None:
            member = RetryState(RETRY_MEMBER, created_ns=record.created_ns, doc=lineage_doc)
            runner.store.set_retry(record.name, 0, member)

    def _settle(
        self,
        root: OpRecord,
        state: RetryState,
        child: str,
        change: Callable[[dict[str, Any], dict[str, Any]], None],
    ) -> RetryState:
        """Write what became of the claimed entry ``child`` (``change(doc, entry)``). When
        another runner wrote the root's state meanwhile (one that found the claim held writes
        when to look again), read it again and write on the new revision while the entry is
        still this claim's: the child created here is named at once, not found again only
        after the lease. ``LostRace`` once the claim is someone else's."""
        runner = self.runner
        claim = lineage.find_child(state.doc, child)
        claims = int(claim.get("claims") or 0) if claim is not None else 0
        for _ in range(MAX_SETTLE_TRIES):
            doc = lineage.mutable(state.doc)
            entry = lineage.find_child(doc, child)
            if (
                entry is None
                or entry.get("phase") != lineage.CREATING
                or int(entry.get("claims") or 0) != claims
            ):
                raise LostRace(root.name)
            change(doc, entry)
            try:
                return runner.write(root, state, doc)
            except LostRace:
                fresh = runner.store.get_retry(root.name)
                if fresh is None or fresh.created_ns != root.created_ns:
                    raise
                state = fresh
        raise LostRace(root.name)

    def _refused(
        self, root: OpRecord, state: RetryState, child: str, exc: GatewayError
    ) -> RetryState:
        runner = self.runner
        text = exc.sentence[:MAX_ERROR_TEXT]
        if is_quota_refusal(exc):

            def stopped(doc: dict[str, Any], entry: dict[str, Any]) -> None:
                entry.update(phase=lineage.REFUSED, error=text, claimUntilNs=0)
                for other in lineage.unfinished(doc):
                    other.update(phase=lineage.REFUSED, error="the lineage stopped", claimUntilNs=0)
                doc["stopped"] = f"Gemini refused to create a retry batch: {text}"

            state = self._settle(root, state, child, stopped)  # counted once it is recorded
            runner.result.stopped += 1
            count("RetryStopped")
            log_fields(logger.error, "retry lineage stopped", {"name": root.name, "why": text})
            return state
        retry_at = runner.clock_ns() + int(runner.config.check_s * NS_PER_SECOND)

        def later(doc: dict[str, Any], entry: dict[str, Any]) -> None:
            entry.update(error=text, claimUntilNs=retry_at)

        state = self._settle(root, state, child, later)
        runner.result.errors += 1
        log_fields(
            logger.warning,
            "retry batch not created",
            {"name": root.name, "id": child, "error": text, "transient": exc.transient},
        )
        return state

    def cancel_if_pending(self, name: str) -> bool:
        """Read job ``name`` itself; cancel it (best effort) if it is still PENDING. True when
        a cancel was sent."""
        client = self.runner.client
        try:
            event = read_batch(client, name)
        except GatewayError as exc:
            log_fields(logger.warning, "pending job not read", {"name": name, "error": exc.message})
            return False
        if event.state is not State.PENDING:
            ingest(self.runner.store, event)
            return False
        try:
            cancel_batch(client, name)
        except GatewayError as exc:
            log_fields(logger.warning, "cancel refused", {"name": name, "error": exc.message})
            return False
        log_fields(logger.warning, "pending timeout: cancelled", {"name": name})
        return True
