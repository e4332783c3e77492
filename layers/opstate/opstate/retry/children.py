"""Creating a planned child at most once (docs/retry.md, "At most one child per plan").

Gemini's ``batches.create`` takes no idempotency key, so the plan is written first (the child's
id, its input in the sink) and every create goes through this protocol:

1. claim: the entry becomes ``creating`` with ``claims + 1`` and a lease (``lease_s``), written
   under the root's revision, so two runners never create the same entry at once;
   An entry of a plan the previous release wrote (its id derived from the root, guessable;
   no ``nonce``) gets a nonce id in the same write, its old id kept as ``legacyId``;
2. an entry claimed before (``claims`` was > 0: a runner may have created it, then died before
   writing its name) is first looked for: the listing is searched for batches whose input is
   the upload the claim recorded (``upload``), and each job found is read itself. One is
   adopted only on the evidence of ``opstate.retry.adoption`` (its input is that upload, the
   planned model, Gemini's ``createTime`` after that claim: never a display name, which every
   key of the project can read and copy), when it has no retry state of its own in the store
   (but the one this lineage gave it) and it is the only one: several make the lineage stop,
   none adopted. An entry the previous release claimed (no ``upload``) is searched by its id
   (and its ``legacyId``) in display names, and a job found so is adopted only when its input
   file's own sha256 is the planned input's. The search is bounded (a page cap, a repeated
   next-page token, the pass's ``time_left``): one cut short fails closed
   (``SearchCutError``, counted in ``RetrySearchCut``): nothing is created, the entry is due again;
3. only when none is found, and the deployment's budget allows (``opstate.retry.budget``):
   upload its input (Files API, display name ``lineage.public_name``: no part of the id),
   streamed from the sink through its sha256 check (a changed input stops the lineage before
   the upload finalizes); record the upload (``upload``: file, model, the claim's time) under
   the root's revision, deleting the one an earlier claim recorded; then ``batches.create``
   (the same public display name), on the model Gemini said the batch it comes from runs on;
4. the child is tracked (ingested as an ordinary operation, its lineage beside it), then its
   name is written into the root's plan (``created``), which announces
   ``Operation Retry Submitted``. A runner that wrote the root's state meanwhile (one that
   found the claim held writes when to look again) does not stop this: the name is written
   on the new revision while the claim is still this one's.

A crash anywhere leaves the entry ``planned`` or ``creating``: the next claim searches before it
creates, so a plan yields at most one child. What a refused create means comes from Gemini's
answer (``opstate.gemini.submit.create_refusal``, docs/retry.md "Refusals"):

- money (HTTP 402, depleted prepayment credits, a spending cap, billing disabled) stops the
  whole lineage (``stopped``, counted in ``RetryStopped``, said once);
- passing (a rate limit, a full batch queue) backs off: the entry stays ``creating``, tried
  again after Gemini's ``retryDelay`` when it gave one, else after a bounded exponential wait
  (``refusals`` in a row: 1 min, 2, 4, ... at most 1 h); daily (a per-day quota) after the next
  midnight Pacific time. The lineage never stops for it; an operator's pass (``opstate retry
  --once``) tries it again at once;
- a 404 (Gemini knows no such model or batch: asked again, the same answer) stops it too;
- any other failure leaves the entry ``creating`` until its retry time (``check_s``), searched
  again before the next create.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

from opstate.domain.model import OpEvent, OpRecord
from opstate.domain.refusals import DAILY, MONEY, PASSING, backoff_s, next_pacific_midnight_s
from opstate.domain.times import NS_PER_SECOND
from opstate.gemini.errors import GatewayError, classify
from opstate.gemini.port import GeminiClient
from opstate.gemini.submit import (
    SearchCutError,
    batch_model,
    cancel_batch,
    create_or_delete,
    create_refusal,
    delete_file,
    find_by_display_id,
    find_by_input_file,
    upload_jsonl,
)
from opstate.ingest import ingest
from opstate.observability import count, log_fields, logger
from opstate.retry import acting, adoption, child_room, lineage
from opstate.retry.budget import Budget
from opstate.retry.inputs import IntegrityError, verified
from opstate.retry.passes import LostRace, Runner, said_stopped
from opstate.store.retry_state import RETRY_MEMBER, RetryState

MAX_ERROR_TEXT = 300
# Rewrites of a claimed entry's outcome when other runners keep moving the root's revision.
MAX_SETTLE_TRIES = 5


class Creator:
    """The create protocol of the module docstring, for one ``RetryRunner``."""

    def __init__(self, runner: Runner) -> None:
        self.runner = runner
        self.budget = Budget(runner)

    def create_planned(self, root: OpRecord, state: RetryState) -> RetryState:
        """Create every planned child whose claim is free; the root's state afterwards."""
        state = child_room.free_ended(self.runner, root, state)  # room its ended ones held
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
        claim_until = int(entry.get("claimUntilNs") or 0)
        if entry.get("phase") == lineage.CREATING and claim_until > now:
            backing_off = claim_until == int(entry.get("backoffUntilNs") or 0)
            if not (backing_off and runner.every):
                return state  # another runner holds it, or Gemini asked to wait
        searched_before = int(entry.get("claims") or 0) > 0
        allowed = self.budget.allows(root)
        held = child_room.hold(runner, entry) if searched_before or allowed else None
        if held is None:  # over the deployment's budget (still planned, the root waits), or
            return state  # the project's queue full by opstate's count: nothing spent
        child = _with_nonce(entry)
        before = entry.get("claimedNs")  # the claim before this one (when it was recorded)
        entry.update(
            phase=lineage.CREATING,
            claims=int(entry.get("claims") or 0) + 1,
            claimUntilNs=now + int(runner.config.lease_s * NS_PER_SECOND),
            claimedNs=now,
        )
        state = child_room.claim(runner, (root, state), doc, entry, held)
        try:
            event = self._find(root, entry, before) if searched_before else None
            if event is None:
                if not allowed:
                    return self._later(root, state, child, "over the retry budget", none=True)
                state, event = self._create(root, state, child)
                self.budget.spent(root)
        except (_Ambiguous, IntegrityError) as exc:
            return self._stop(root, state, child, str(exc))
        except GatewayError as exc:
            return self._refused(root, state, child, exc)
        self._track(root, event, entry)

        def created(doc: dict[str, Any], done: dict[str, Any]) -> None:
            done.update(
                phase=lineage.CREATED,
                name=event.name,
                error=None,
                claimUntilNs=0,
                createdNs=runner.clock_ns(),
            )

        state = self._settle(root, state, child, created)
        runner.result.submitted += 1
        count("RetrySubmitted")
        log_fields(
            logger.info,
            "retry submitted",
            {"name": root.name, "child": event.name, "id": child, "rows": entry.get("rows")},
        )
        return state

    def _find(self, root: OpRecord, entry: Mapping[str, Any], before: object) -> OpEvent | None:
        """The child an earlier claim of ``entry`` created before a crash, adopted only on the
        evidence of ``opstate.retry.adoption`` (module doc), or None. ``_Ambiguous`` when more
        than one job passes. ``before``: the earlier claim's time, for an entry the previous
        release claimed (it recorded no upload)."""
        client = self.runner.client
        claim, searches = self._searches(entry, before)
        adopted: dict[str, OpEvent] = {}
        for marker, search in searches:
            try:
                found = search()
            except SearchCutError as exc:  # fails closed: no create, the entry is due again
                count("RetrySearchCut")
                log_fields(logger.warning, "retry search cut", {"id": marker, "why": exc.why})
                raise
            except GatewayError:
                raise
            except Exception as exc:
                raise classify(exc) from exc
            for name in dict.fromkeys(found):
                job = acting.read_job(client, name)
                if job.event is None or (claim.file is None and not job.carries(marker)):
                    continue  # gone, or the listing named a job that is not the one carrying it
                why = adoption.refusal(client, job, claim)
                if why is None and not self._adoptable(root, job.event.name, str(entry["id"])):
                    why = "it has a retry state of its own"
                if why is not None:
                    log_fields(
                        logger.error,
                        "a batch found for a retry child is not adopted",
                        {"id": entry["id"], "name": job.event.name, "root": root.name, "why": why},
                    )
                    continue
                adopted[job.event.name] = job.event
        if len(adopted) > 1:
            raise _Ambiguous(
                f"several batches pass for the retry child {entry['id']} "
                f"({', '.join(sorted(adopted))}): none is adopted and the lineage creates nothing"
                " more"
            )
        return next(iter(adopted.values()), None)

    def _searches(
        self, entry: Mapping[str, Any], before: object
    ) -> tuple[adoption.Claim, list[tuple[str, Callable[[], list[str]]]]]:
        """What an earlier claim of ``entry`` recorded, and the searches that may find its job:
        by the upload it recorded; for a claim of the previous release (no upload recorded),
        by its id and ``legacyId`` in display names (a hint: the evidence is its input's
        sha256)."""
        client, left = self.runner.client, self.runner.time_left
        recorded = entry.get("upload")
        upload = lineage.upload_of(entry)
        if upload is not None and isinstance(recorded, Mapping):
            claim = adoption.Claim(
                upload, _text(recorded.get("model")), _ns(recorded.get("claimedNs"))
            )
            return claim, [(upload, lambda: find_by_input_file(client, upload, time_left=left))]
        sha256 = _text(entry.get("sha256"))
        claim = adoption.Claim(None, _text(entry.get("model")), _ns(before), sha256)
        markers = [str(entry["id"])]
        legacy = entry.get("legacyId")
        if isinstance(legacy, str) and legacy:
            markers.append(legacy)
        return claim, [(m, _by_display(client, m, left)) for m in markers]

    def _adoptable(self, root: OpRecord, name: str, marker: str) -> bool:
        """Whether job ``name`` has no retry state of its own, but the member state this
        lineage gave it (a runner that tracked it, then died before naming it)."""
        state = self.runner.store.get_retry(name)
        if state is None:
            return True
        found = state.doc.get("lineage") if state.status == RETRY_MEMBER else None
        return (
            isinstance(found, Mapping)
            and found.get("root") == root.name
            and found.get("id") in (marker, None)
        )

    def _create(self, root: OpRecord, state: RetryState, child: str) -> tuple[RetryState, OpEvent]:
        """Upload the claimed entry ``child``'s input, record the upload under the root's
        revision (the evidence a later claim adopts by), then create the batch on it."""
        runner = self.runner
        entry = lineage.find_child(state.doc, child) or {}
        model = entry.get("model")
        if not isinstance(model, str) or not model:  # a plan of the previous release
            parent = entry.get("parent")
            model = batch_model(runner.client, parent if isinstance(parent, str) else root.name)
        shown = lineage.public_name(child)
        file_name = self._upload(entry, child, shown)
        earlier = lineage.upload_of(entry)
        upload = {"file": file_name, "model": model, "claimedNs": entry.get("claimedNs")}

        def recorded(doc: dict[str, Any], claimed: dict[str, Any]) -> None:
            claimed["upload"] = upload

        try:
            state = self._settle(root, state, child, recorded)
        except LostRace:
            delete_file(runner.client, file_name)  # never recorded: nobody may adopt by it
            raise
        if earlier is not None and earlier != file_name:
            delete_file(runner.client, earlier)  # nothing was found on it: never adopted now
        try:
            return state, create_or_delete(runner.client, model, file_name, shown)
        except GatewayError:
            raise
        except Exception as exc:
            raise classify(exc) from exc

    def _upload(self, entry: Mapping[str, Any], child: str, shown: str) -> str:
        """Upload ``entry``'s input from the sink through its sha256 check; its file name."""
        runner = self.runner
        location = str(entry["input"])
        size = entry.get("bytes")
        if not isinstance(size, int) or size <= 0:  # not recorded: what the sink holds
            stored = runner.sink.head(runner.sink.resolve(location))
            size = stored.size if stored is not None else None
        sha256 = entry.get("sha256")
        chunks: Iterable[bytes] = verified(
            runner.sink.chunks(location),
            sha256 if isinstance(sha256, str) and sha256 else None,
            f"the input of retry batch {child} ({location})",
        )
        try:
            return upload_jsonl(runner.client, chunks=chunks, size=size, display_name=shown)
        except (GatewayError, IntegrityError):
            raise
        except ValueError as exc:  # more or fewer bytes than recorded: the input changed
            raise IntegrityError(
                f"the input of retry batch {child} ({location}) changed: {exc}; "
                "nothing is sent from it"
            ) from None
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
        text = exc.sentence[:MAX_ERROR_TEXT]
        verdict = create_refusal(exc)
        if verdict.kind == MONEY:
            return self._stop(root, state, child, f"Gemini refused to create a retry batch: {text}")
        if exc.status == 404:  # no such model or batch: asked again, the same answer
            return self._stop(root, state, child, f"Gemini answered 404 for a retry batch: {text}")
        if verdict.kind in (PASSING, DAILY):
            return self._back_off(root, state, child, text, verdict.kind, verdict.delay_s)
        self.runner.result.errors += 1
        log_fields(
            logger.warning,
            "retry batch not created",
            {"name": root.name, "id": child, "error": text, "transient": exc.transient},
        )
        return self._later(root, state, child, text)

    def _later(
        self, root: OpRecord, state: RetryState, child: str, text: str, none: bool = False
    ) -> RetryState:
        """The claimed entry ``child`` stays ``creating``, tried again after ``check_s``
        (``none``: no batch was made, its room is given back)."""
        retry_at = self.runner.clock_ns() + int(self.runner.config.check_s * NS_PER_SECOND)
        freed: list[Mapping[str, Any]] = []

        def later(doc: dict[str, Any], entry: dict[str, Any]) -> None:
            entry.update(error=text, claimUntilNs=retry_at, refusals=0)
            freed[:] = child_room.drop(entry) if none else []

        state = self._settle(root, state, child, later)
        child_room.give_back(self.runner, freed)
        return state

    def _stop(self, root: OpRecord, state: RetryState, child: str, why: str) -> RetryState:
        """The lineage stops at the claimed entry ``child``: it and every unfinished entry are
        ``refused``, nothing more is created; said once, counted in ``RetryStopped``."""
        runner = self.runner
        text = why[:MAX_ERROR_TEXT]

        freed: list[Mapping[str, Any]] = []

        def stopped(doc: dict[str, Any], entry: dict[str, Any]) -> None:
            entry.update(phase=lineage.REFUSED, error=text, claimUntilNs=0)
            freed[:] = child_room.drop(entry)
            for other in lineage.unfinished(doc):
                other.update(phase=lineage.REFUSED, error="the lineage stopped", claimUntilNs=0)
                freed.extend(child_room.drop(other))
            doc["stopped"] = text

        state = self._settle(root, state, child, stopped)  # counted once it is recorded
        child_room.give_back(runner, freed)
        said_stopped(runner, root, text)
        return state

    def _back_off(
        self,
        root: OpRecord,
        state: RetryState,
        child: str,
        text: str,
        kind: str,
        delay_s: float | None,
    ) -> RetryState:
        """A create refused as passing (or daily): tried again after the wait, never stopped."""
        runner = self.runner
        now = runner.clock_ns()
        entry = lineage.find_child(state.doc, child) or {}
        refusals = int(entry.get("refusals") or 0) + 1
        if kind == DAILY:
            retry_at = int(next_pacific_midnight_s(now / NS_PER_SECOND)) * NS_PER_SECOND
        else:
            retry_at = now + int(backoff_s(refusals, delay_s) * NS_PER_SECOND)

        freed: list[Mapping[str, Any]] = []

        def wait(doc: dict[str, Any], entry: dict[str, Any]) -> None:
            entry.update(
                error=text, claimUntilNs=retry_at, backoffUntilNs=retry_at, refusals=refusals
            )
            freed[:] = child_room.drop(entry)  # no batch was made: its room is given back

        state = self._settle(root, state, child, wait)
        child_room.give_back(runner, freed)
        runner.result.waiting += 1
        log_fields(
            logger.warning,
            "retry batch refused for now: backing off",
            {
                "name": root.name,
                "id": child,
                "error": text,
                "kind": kind,
                "refusals": refusals,
                "retryAtNs": retry_at,
            },
        )
        return state

    def cancel(self, name: str) -> bool:
        """Ask Gemini to cancel job ``name`` (best effort; the caller read it just before and
        checked it may). True when the cancel was sent."""
        try:
            cancel_batch(self.runner.client, name)
        except GatewayError as exc:
            log_fields(logger.warning, "cancel refused", {"name": name, "error": exc.message})
            return False
        log_fields(logger.warning, "pending timeout: cancelled", {"name": name})
        return True


def _with_nonce(entry: dict[str, Any]) -> str:
    """``entry``'s id; an entry of a plan of the previous release (no ``nonce``: its id is
    guessable) gets a nonce id now, its old id kept as ``legacyId`` (searched for too)."""
    if not entry.get("nonce"):
        old = str(entry["id"])
        index = old.rsplit("-", 1)[-1]
        child, nonce = lineage.new_child_id(
            int(entry.get("attempt") or 0), int(index) if index.isdigit() else 0
        )
        entry.update(id=child, nonce=nonce, legacyId=old)
    return str(entry["id"])


def _text(value: object) -> str | None:
    return value if isinstance(value, str) and value else None


def _ns(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def _by_display(
    client: GeminiClient, marker: str, left: Callable[[], float] | None
) -> Callable[[], list[str]]:
    return lambda: find_by_display_id(client, marker, time_left=left)


class _Ambiguous(Exception):
    """More than one job passes the adoption checks for one retry id."""
