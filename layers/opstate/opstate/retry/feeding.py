"""Feeding a job's held parts to Gemini as room frees (issue 46; docs/jobs.md): one step of
the retry pass, over one job's plan (``opstate.retry.jobs``).

A step, in order:

1. parts whose batch ended (``is_open`` says no) are ``ended`` and their tokens freed: after
   their plan is written, so a runner that lost the write frees nothing twice;
2. a part ``creating`` past its lease (its runner died) is found again by its upload: a batch
   listed under the part's display name is adopted only when its own resource names that
   upload as its input and the part's model (a forged batch with the name is not); none found:
   the part is held again, its upload deleted;
3. the held parts that fit by opstate's own count (``domain.parts.room``: per model, in input
   order) are created one by one: the tokens and a batch slot reserved in the store's counters
   (shared by every runner: a conditional add under the cap), the part claimed in the plan
   (under its revision: two runners never claim one part), uploaded (just before the create:
   Gemini keeps 20 GB of files), the upload recorded, the batch created;
4. a refused create frees its reservation and deletes its upload, and ends the model's feeding
   for this step (at most one refused create per step and model). A queue-full refusal while
   nothing of the model was open by opstate's count means the part alone is over Gemini's cap:
   the cap is learned (``domain.parts.learned_cap``) and the part split under it; otherwise it
   stays held, backing off (``domain.parts.held_backoff_s``: 5 minutes, doubling to 30;
   ``every``, an operator's pass, tries at once). A money refusal stops the job.

The enqueued tokens of a model are two counters that only grow (``CountingStore``): reserved
and freed; what is enqueued is their difference, and a reservation is an add to "reserved"
capped at the model's cap plus what was freed.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from functools import partial
from typing import Any, NoReturn, Protocol

from opstate.domain.model import OpEvent
from opstate.domain.parts import Bounds, SplitError, learned_cap, room, split_hashed
from opstate.domain.refusals import Refusal
from opstate.gemini.batches import rest_batch_event, rest_resource
from opstate.gemini.errors import GatewayError, classify
from opstate.gemini.port import GeminiClient
from opstate.gemini.submit import (
    create_or_delete,
    create_refusal,
    delete_file,
    find_by_display_id,
    upload_jsonl,
)
from opstate.observability import count, log_fields, logger
from opstate.retry import job_rate, jobs
from opstate.retry import room as room_count
from opstate.retry.room import (
    enqueued,
    open_slots,
)
from opstate.store.counters import CountingStore

# Writes of one change tried against other runners' writes before the step gives up.
MAX_WRITES = 8


class PlanHolder(Protocol):
    """Where a job's plan is kept: read with its revision, written only over that revision."""

    def read(self) -> tuple[int, Mapping[str, Any]]: ...

    def write(self, rev: int, plan: Mapping[str, Any]) -> bool: ...


class LostPlan(Exception):
    """The plan kept changing under this runner, or a change no longer applies."""


@dataclass(frozen=True, slots=True)
class FeedLimits:
    """What a step feeds under (``SubmitSettings``): the model's configured cap, the open
    batches, a part's bytes and rows, and how long a claim holds."""

    cap: int
    max_batches: int
    max_file_bytes: int
    max_rows: int
    lease_s: float = 900.0


@dataclass
class Fed:
    """What one step did."""

    created: list[OpEvent] = field(default_factory=list)
    refused: int = 0
    ended: int = 0
    split: int = 0
    recovered: int = 0
    stopped: str | None = None


def _reserve(store: CountingStore, model: str, tokens: int, limits: FeedLimits, cap: int) -> bool:
    return room_count.reserve(store, model, tokens, cap, limits.max_batches)


_free = room_count.free


def _hashing(chunks: Iterable[bytes], digest: Any) -> Iterator[bytes]:
    for chunk in chunks:
        digest.update(chunk)
        yield chunk


def lines_of(chunks: Iterable[bytes]) -> Iterator[bytes]:
    """The lines of a byte stream, each with its newline (the last may lack one)."""
    rest = b""
    for chunk in chunks:
        rest += chunk
        *whole, rest = rest.split(b"\n")
        for line in whole:
            yield line + b"\n"
    if rest:
        yield rest


def byte_range(chunks: Iterable[bytes], start: int, end: int) -> Iterator[bytes]:
    """The bytes ``[start, end)`` of a stream, streamed."""
    at = 0
    for chunk in chunks:
        lo, hi = max(start - at, 0), min(end - at, len(chunk))
        if lo < hi:
            yield chunk[lo:hi]
        at += len(chunk)
        if at >= end:
            return


class Feeder:
    """One step over one job (see the module docstring)."""

    def __init__(
        self,
        holder: PlanHolder,
        counters: CountingStore,
        client: GeminiClient,
        source: Callable[[], Iterator[bytes]],
        is_open: Callable[[str], bool],
        limits: FeedLimits,
        clock_ns: Callable[[], int] = time.time_ns,
    ) -> None:
        self.holder = holder
        self.counters = counters
        self.client = client
        self.source = source  # the kept input's bytes, from its start
        self.is_open = is_open
        self.limits = limits
        self.clock_ns = clock_ns
        self.fed = Fed()

    # -- the plan ---------------------------------------------------------------------------

    def change(self, edit: Callable[[dict[str, Any]], None]) -> dict[str, Any]:
        """Apply ``edit`` to the plan and write it over its revision, again on a lost race
        (``edit`` raises ``jobs.PlanError`` when it no longer applies)."""
        for _ in range(MAX_WRITES):
            rev, stored = self.holder.read()
            plan = jobs.changed(stored)
            try:
                edit(plan)
            except jobs.PlanError as exc:
                raise LostPlan(str(exc)) from None
            if self.holder.write(rev, plan):
                return plan
        raise LostPlan("the plan kept changing under this runner")

    # -- the step ---------------------------------------------------------------------------

    def step(self, every: bool = False) -> Fed:
        try:
            self._end_parts()
            self._recover()
            self._create(every)
        except LostPlan as exc:
            log_fields(logger.info, "job step left to another runner", {"why": str(exc)})
        return self.fed

    def _end_parts(self) -> None:
        _, plan = self.holder.read()
        done = [
            p for p in plan["parts"] if p["phase"] == jobs.CREATED and not self.is_open(p["batch"])
        ]
        for part in done:
            try:
                self.change(
                    partial(_require, number=int(part["n"]), phase=jobs.CREATED, then=jobs.ended)
                )
            except LostPlan:
                continue  # another runner ended it (and freed its tokens)
            _free(self.counters, plan["model"], int(part["tokens"]))
            self.fed.ended += 1

    def _recover(self) -> None:
        _, plan = self.holder.read()
        now = self.clock_ns()
        for part in plan["parts"]:
            if part["phase"] != jobs.CREATING or int(part.get("leaseNs", 0)) > now:
                continue
            found = self._find(plan, part) if part.get("file") else None
            number, lease = int(part["n"]), int(part.get("leaseNs", 0))
            if found is not None:
                then = partial(_adopt, batch=found.name)
            else:
                then = partial(_release_at, now_ns=now)
            try:
                # Only while the part is still the claim that lapsed (another runner may
                # have recovered it first).
                self.change(partial(_claimed, number=number, lease=lease, then=then))
            except LostPlan:
                continue
            if found is not None:
                self.fed.created.append(found)
            else:
                if part.get("file"):
                    delete_file(self.client, part["file"])
                _free(self.counters, plan["model"], int(part["tokens"]))
            self.fed.recovered += 1

    def _find(self, plan: Mapping[str, Any], part: Mapping[str, Any]) -> OpEvent | None:
        """The batch made of this part's upload: listed under its display name, then read
        itself; adopted only when its input is the part's file and its model the job's."""
        marker = jobs.display_name(plan, int(part["n"]))
        for name in find_by_display_id(self.client, marker):
            try:
                resource = rest_resource(self.client, name)
            except Exception as exc:
                raise classify(exc) from exc
            meta = resource.get("metadata")
            meta = meta if isinstance(meta, Mapping) else {}
            config = meta.get("inputConfig")
            file_name = config.get("fileName") if isinstance(config, Mapping) else None
            model = str(meta.get("model", "")).removeprefix("models/")
            if file_name == part["file"] and model == plan["model"]:
                return rest_batch_event(resource)
        return None

    def _create(self, every: bool) -> None:
        tried: set[str] = set()  # models refused in this step
        while True:
            _, plan = self.holder.read()
            model = plan["model"]
            cap = jobs.cap_of(plan, self.limits.cap)
            if model in tried:
                return
            got = room(
                jobs.waiting(plan, self.clock_ns(), every),
                {model: enqueued(self.counters, model)},
                partial(_same, cap),
                open_slots(self.counters),
                self.limits.max_batches,
            )
            if got.too_big:
                self._split(plan, int(got.too_big[0].key), cap)
                continue
            if not got.fit:
                return
            if not self._create_one(plan, int(got.fit[0].key), cap):
                tried.add(model)

    def _split(self, plan: Mapping[str, Any], number: int, cap: int) -> None:
        part = jobs.part_of(plan, number)
        rate = job_rate.rate_of(plan)  # the estimate corrected from the parts' usage
        bounds = Bounds(cap, self.limits.max_file_bytes, self.limits.max_rows)
        # Streams the part's bytes again: memory holds one line at a time.
        lines = lines_of(byte_range(self.source(), part["start"], part["end"]))
        try:
            pieces = list(
                split_hashed(
                    lines, bounds, first=part["first"], start=part["start"], bytes_per_token=rate
                )
            )
        except SplitError as exc:
            why = f"a line is over the cap Gemini taught: {exc}"
            self.change(partial(jobs.stop, why=why))
            self.fed.stopped = why
            raise LostPlan(why) from None
        self.change(partial(_split_at, number=number, pieces=pieces, rate=rate))
        self.fed.split += 1

    def _create_one(self, plan: Mapping[str, Any], number: int, cap: int) -> bool:
        """Create part ``number``; False when Gemini refused it (the model is done for now)."""
        model, part = plan["model"], jobs.part_of(plan, number)
        tokens = int(part["tokens"])
        before = enqueued(self.counters, model)
        if not _reserve(self.counters, model, tokens, self.limits, cap):
            return False  # another runner took the room: nothing refused, nothing spent
        lease = self.clock_ns() + int(self.limits.lease_s * 1e9)
        claim = partial(_claim, lease_until_ns=lease, tokens=tokens)
        try:
            self.change(partial(_require, number=number, phase=jobs.HELD, then=claim))
        except LostPlan:
            _free(self.counters, model, tokens)
            raise
        mine = Claim(number, lease, model, tokens)
        shown = jobs.display_name(plan, number)
        digest = hashlib.sha256()
        try:
            file_name = upload_jsonl(
                self.client,
                chunks=_hashing(byte_range(self.source(), part["start"], part["end"]), digest),
                size=int(part["end"]) - int(part["start"]),
                display_name=shown,
            )
        except GatewayError as exc:
            self._release(mine, refused=False)
            raise LostPlan(f"part {number}: upload failed: {exc}") from None
        except ValueError as exc:  # the kept input is shorter or longer than planned
            self._integrity(mine, None, str(exc))
        expected = part.get("sha256")
        if expected and digest.hexdigest() != expected:
            self._integrity(mine, file_name, "its bytes hash otherwise than planned")
        self._as(mine, partial(_uploaded, file_name=file_name))
        try:
            event = create_or_delete(self.client, f"models/{model}", file_name, shown)
        except GatewayError as exc:
            return self._refused(mine, before, cap, exc)
        self._as(mine, partial(_adopt, batch=event.name))
        self.fed.created.append(event)
        count("JobPartCreated")
        log_fields(logger.info, "job part created", {"part": number, "name": event.name})
        return True

    def _integrity(self, mine: Claim, file_name: str | None, what: str) -> NoReturn:
        """The kept input changed under the job (a bucket writer, a broken disk): what was
        uploaded is deleted before any create, and the job stops (docs/jobs.md)."""
        if file_name is not None:
            delete_file(self.client, file_name)
        self._release(mine, refused=False)
        why = f"the kept input changed: part {mine.number}: {what}; nothing created from it"
        self.change(partial(jobs.stop, why=why))
        self.fed.stopped = why
        log_fields(logger.error, "job input changed", {"part": mine.number, "why": why})
        raise LostPlan(why)

    def _as(self, mine: Claim, then: Then) -> None:
        """Change the part while it is still this runner's claim."""
        self.change(partial(_claimed, number=mine.number, lease=mine.lease, then=then))

    def _release(self, mine: Claim, *, refused: bool) -> None:
        now = self.clock_ns()
        self._as(mine, partial(_release_at, now_ns=now, refused=refused))
        _free(self.counters, mine.model, mine.tokens)

    def _refused(self, mine: Claim, before: int, cap: int, exc: GatewayError) -> bool:
        if exc.status is None or exc.status >= 500:
            # The batch may exist: the part stays claimed, found again by its upload once
            # its lease is over (step 2).
            raise LostPlan(f"part {mine.number}: create unanswered: {exc}")
        verdict = create_refusal(exc)
        self.fed.refused += 1
        count("JobPartRefused")
        if verdict.kind is Refusal.MONEY or exc.status != 429:
            self._release(mine, refused=False)
            why = f"part {mine.number} refused: {exc}"
            self.change(partial(jobs.stop, why=why))
            self.fed.stopped = why
            return False
        if before == 0:
            # Refused with nothing of the model open: the part alone is over Gemini's cap.
            taught = learned_cap(cap, mine.tokens)
            self._release(mine, refused=False)
            self.change(partial(jobs.learn, cap=taught))
            room_count.learn(self.counters, mine.model, taught)  # the model's next jobs too
            log_fields(
                logger.warning, "job learned a lower cap", {"model": mine.model, "cap": taught}
            )
        else:
            self._release(mine, refused=True)
        return False


@dataclass(frozen=True, slots=True)
class Claim:
    """A part this runner claimed: its number, its lease (the claim's mark), model, tokens."""

    number: int
    lease: int
    model: str
    tokens: int


Then = Callable[[dict[str, Any], int], None]


def _require(plan: dict[str, Any], *, number: int, phase: str, then: Then) -> None:
    if jobs.part_of(plan, number)["phase"] != phase:
        raise jobs.PlanError(f"part {number} is no longer {phase}")
    then(plan, number)


def _claimed(plan: dict[str, Any], *, number: int, lease: int, then: Then) -> None:
    part = jobs.part_of(plan, number)
    if part["phase"] != jobs.CREATING or int(part.get("leaseNs", 0)) != lease:
        raise jobs.PlanError(f"part {number} is no longer the claim of lease {lease}")
    then(plan, number)


def _uploaded(plan: dict[str, Any], number: int, *, file_name: str) -> None:
    jobs.uploaded(plan, number, file_name)


def _claim(plan: dict[str, Any], number: int, *, lease_until_ns: int, tokens: int) -> None:
    if int(jobs.part_of(plan, number)["tokens"]) != tokens:  # recounted since it was reserved
        raise jobs.PlanError(f"part {number} was counted again")
    jobs.claim(plan, number, lease_until_ns)


def _split_at(plan: dict[str, Any], *, number: int, pieces: list[Any], rate: float) -> None:
    jobs.split(plan, number, pieces)
    starts = {piece.start for piece in pieces}
    for part in plan["parts"]:
        if part["phase"] == jobs.HELD and part["start"] in starts:
            part[job_rate.RATE] = rate


def _adopt(plan: dict[str, Any], number: int, *, batch: str) -> None:
    jobs.created(plan, number, batch)


def _release_at(plan: dict[str, Any], number: int, *, now_ns: int, refused: bool = False) -> None:
    jobs.released(plan, number, now_ns, refused=refused)


def _same(value: int, _model: str) -> int:
    return value
