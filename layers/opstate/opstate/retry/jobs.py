"""A job's parts plan (issue 46; docs/jobs.md): one input cut into parts, each held until the
queue has room for it, created, then ended. Pure: the plan is a JSON-shaped mapping (kept in
the job's retry state, written under its revision); these functions read it and change a copy.

A part's phases: ``held`` (waiting for room, or backing off after a refused create) ->
``creating`` (claimed by one runner until ``leaseNs``: its upload and create are under way;
``file`` is the upload once it is known, written before the create) -> ``created`` (``batch``:
the batch Gemini made of it) -> ``ended`` (its batch reached a terminal state: its tokens are
freed). A part the runner claimed and lost (a crash) is found again by its upload: the batch
whose ``inputConfig.fileName`` is that file, never by a display name alone.

Each part has an id with a random nonce (``secrets.token_hex(16)``) that is never published: a
display name carries only the job's public id and the part's number.
"""

from __future__ import annotations

import copy
import secrets
from collections.abc import Iterable, Mapping
from typing import Any

from opstate.domain.parts import (
    CREATED as CREATED,
)
from opstate.domain.parts import (
    CREATING as CREATING,
)
from opstate.domain.parts import (
    ENDED as ENDED,
)
from opstate.domain.parts import (
    HELD as HELD,
)
from opstate.domain.parts import (
    Held,
    PartRange,
    held_backoff_s,
    job_finished,
    job_view,
)

# The most parts one job's plan may hold: a part is about 300 bytes of the retry state's
# 160 KiB (``MAX_RETRY_STATE_BYTES``).
MAX_PARTS = 400


class PlanError(ValueError):
    """A job cannot be planned (too many parts) or a plan is not this module's."""


def new_job_id() -> str:
    """A job's public id (``jobs/<id>``, display names): 24 random hex digits."""
    return secrets.token_hex(12)


def new_plan(
    job_id: str, model: str, source: Mapping[str, Any], parts: Iterable[PartRange]
) -> dict[str, Any]:
    """The plan of a job over ``source`` (its kept input: location, sha256, rows, bytes), every
    part held, in input order. ``PlanError`` over ``MAX_PARTS``."""
    entries: list[dict[str, Any]] = []
    for part in parts:
        if len(entries) >= MAX_PARTS:
            raise PlanError(
                f"the input needs more than {MAX_PARTS} parts; raise the model's "
                "OPSTATE_SUBMIT_ENQUEUED_TOKENS if the tier allows, or submit it in pieces"
            )
        entries.append(_entry(len(entries), part))
    if not entries:
        raise PlanError("an empty input has nothing to submit")
    return {"id": job_id, "model": model, "input": dict(source), "parts": entries}


def _entry(number: int, part: PartRange) -> dict[str, Any]:
    hashed = {"sha256": part.sha256} if part.sha256 else {}
    return hashed | {
        "n": number,
        "nonce": secrets.token_hex(16),
        "first": part.first,
        "rows": part.rows,
        "start": part.start,
        "end": part.end,
        "tokens": part.tokens,
        "phase": HELD,
        "refusals": 0,
        "dueNs": 0,
    }


def changed(plan: Mapping[str, Any]) -> dict[str, Any]:
    """A deep copy of ``plan`` to change and write back."""
    return copy.deepcopy(dict(plan))


def part_of(plan: Mapping[str, Any], number: int) -> dict[str, Any]:
    for entry in plan["parts"]:
        if entry["n"] == number:
            found: dict[str, Any] = entry
            return found
    raise PlanError(f"the plan has no part {number}")


def display_name(plan: Mapping[str, Any], number: int) -> str:
    """What a part's batch and upload are named at Gemini (public: no nonce)."""
    return f"opstate-job-{plan['id']}-p{number}"


def cap_of(plan: Mapping[str, Any], configured: int) -> int:
    """The cap the job feeds under: the configured one, or lower once a refusal taught it."""
    learned = plan.get("learnedCap")
    return min(configured, learned) if isinstance(learned, int) and learned > 0 else configured


def waiting(plan: Mapping[str, Any], now_ns: int, every: bool = False) -> list[Held]:
    """The held parts that may be tried now, in input order, as ``Held`` for
    ``domain.parts.room``: up to the first one still backing off (a later part never overtakes
    it; ``every``, an operator's pass, tries them all at once). A stopped job has none."""
    if plan.get("stopped"):
        return []
    found: list[Held] = []
    for part in plan["parts"]:
        if part["phase"] != HELD:
            continue
        if not every and int(part.get("dueNs", 0)) > now_ns:
            break
        found.append(Held(str(part["n"]), plan["model"], int(part["tokens"])))
    return found


def claim(plan: dict[str, Any], number: int, lease_until_ns: int) -> None:
    part = part_of(plan, number)
    if part["phase"] != HELD:
        raise PlanError(f"part {number} is {part['phase']}, not held")
    part.update(phase=CREATING, leaseNs=lease_until_ns)


def uploaded(plan: dict[str, Any], number: int, file_name: str) -> None:
    part_of(plan, number)["file"] = file_name


def created(plan: dict[str, Any], number: int, batch: str) -> None:
    part = part_of(plan, number)
    part.update(phase=CREATED, batch=batch, refusals=0)
    part.pop("leaseNs", None)


def released(plan: dict[str, Any], number: int, now_ns: int, *, refused: bool) -> None:
    """A claimed part back to held: after a refused create (``refused``: it backs off, the
    refusals counted) or a claim that came to nothing (due at once)."""
    part = part_of(plan, number)
    count = int(part.get("refusals", 0)) + (1 if refused else 0)
    wait_ns = int(held_backoff_s(count) * 1e9) if refused else 0
    part.update(phase=HELD, refusals=count, dueNs=now_ns + wait_ns)
    part.pop("leaseNs", None)
    part.pop("file", None)


def ended(plan: dict[str, Any], number: int) -> None:
    part_of(plan, number)["phase"] = ENDED


def learn(plan: dict[str, Any], cap: int) -> None:
    """Keep a cap Gemini taught (a part refused while nothing of its model was open)."""
    known = plan.get("learnedCap")
    plan["learnedCap"] = min(cap, known) if isinstance(known, int) and known > 0 else cap


def split(plan: dict[str, Any], number: int, pieces: list[PartRange]) -> None:
    """Replace held part ``number`` by ``pieces`` (its lines cut under a lower cap), numbered
    after every part so far; the plan keeps input order."""
    part = part_of(plan, number)
    if part["phase"] != HELD:
        raise PlanError(f"part {number} is {part['phase']}: only a held part is split")
    if (
        not pieces
        or pieces[0].start != part["start"]
        or pieces[-1].end != part["end"]
        or sum(p.rows for p in pieces) != part["rows"]
    ):
        raise PlanError(f"the pieces do not cover part {number}")
    if len(plan["parts"]) - 1 + len(pieces) > MAX_PARTS:
        raise PlanError(f"splitting part {number} would pass {MAX_PARTS} parts")
    following = 1 + max(int(p["n"]) for p in plan["parts"])
    at = plan["parts"].index(part)
    plan["parts"][at : at + 1] = [_entry(following + i, p) for i, p in enumerate(pieces)]


def stop(plan: dict[str, Any], why: str) -> None:
    """Create no more parts (``retry --stop``, money): what was created finishes."""
    plan["stopped"] = True
    plan.setdefault("stoppedWhy", why)


def finished(plan: Mapping[str, Any]) -> bool:
    """Whether no part will be created or is open (``domain.parts.job_finished``)."""
    return job_finished(plan)


def summary(plan: Mapping[str, Any], configured_cap: int | None = None) -> dict[str, Any]:
    """What the job's record shows (``domain.parts.job_view``)."""
    return job_view(plan, configured_cap)
