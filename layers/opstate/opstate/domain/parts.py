"""One job of any size, the pure part (issue 46; docs/jobs.md): how many tokens a line may
cost, where an input is cut into parts, which held parts fit Gemini's queue now, and what a
refused create teaches. Pure: bytes and counts in, plans out; no I/O, no clock.

**The estimate.** Gemini counts a request's tokens with its own tokenizer, which no one outside
runs. A token stands for at least one byte of the text it encodes (a SentencePiece piece is a
run of characters, its byte fallback one byte), and the text of a request is a part of its JSON
line, so a line's UTF-8 size is above its count; opstate takes half of it
(``BYTES_PER_TOKEN`` = 2), still above the count of English (about 4 bytes a token) and of
Chinese, Japanese and Korean (3 bytes a character, a character or more a token), by a factor of
about 2 for English and 1.5 or more for CJK. Text that falls back to bytes (rare scripts,
random bytes) may count more: the learned cap (below) covers it. A line that refers to a file
(``fileData``) carries tokens its bytes do not show: such inputs need a lower setting.

**Output is not counted.** Gemini's page says the cap is on tokens "enqueued for batch
processing across all your active batch jobs" and refuses the create itself, before any output
exists; one report has ~245 k tokens refused and ~131 k accepted for inputs alone. opstate
counts input only; should Gemini count more, its refusals teach a lower cap.

**Splitting** is streamed: lines in, one ``PartRange`` out each time a part closes, holding
only counters. A part is a run of whole lines under three bounds (tokens, bytes, rows); one line
over a bound is a ``SplitError`` naming it, raised before anything is created.

**Room**: held parts are fed in input order per model; the first that does not fit stops that
model (later ones never overtake it), and no more than the open-batch bound are opened.
"""

from __future__ import annotations

import hashlib
import math
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, replace
from typing import Any

# A job's part phases (``opstate.retry.jobs``).
HELD = "held"
CREATING = "creating"
CREATED = "created"
ENDED = "ended"
PHASES = (HELD, CREATING, CREATED, ENDED)
BYTES_PER_TOKEN = 2
# The least a line is counted: a request carries a role and parts beside its text.
MIN_LINE_TOKENS = 4
# How long a part refused for a full queue waits before the next try (doubling per refusal):
# users report the queue clearing in about 15-20 minutes after a 429.
HELD_BACKOFF_S = 300.0
MAX_HELD_BACKOFF_S = 1800.0


def line_tokens(size: int, bytes_per_token: float = BYTES_PER_TOKEN) -> int:
    """The tokens a line of ``size`` bytes (its newline too) is counted for."""
    return max(MIN_LINE_TOKENS, math.ceil(size / bytes_per_token))


def range_tokens(size: int, rows: int, bytes_per_token: float = BYTES_PER_TOKEN) -> int:
    """At least the tokens ``line_tokens`` counts for ``rows`` lines of ``size`` bytes in all,
    their lengths unknown: a line's count is under its bytes over the rate plus
    ``MIN_LINE_TOKENS``, so the sum is under the bytes over the rate plus that per line."""
    return max(MIN_LINE_TOKENS, math.ceil(size / bytes_per_token) + MIN_LINE_TOKENS * rows)


def recounted(tokens: int, size: int, rows: int, counted_at: float, rate: float) -> int:
    """A part's ``tokens`` (counted at ``counted_at`` bytes a token, at or above its lines'
    count at that rate) counted again at ``rate``: ``range_tokens`` of its bytes and rows, and
    when ``rate`` counts fewer tokens a byte, never more than it had."""
    bound = range_tokens(size, rows, rate)
    return min(tokens, bound) if rate >= counted_at else bound


def corrected_bytes_per_token(sent_bytes: int, prompt_tokens: int) -> float:
    """The bytes per token to estimate with, learned from parts Gemini counted
    (``usageMetadata.promptTokenCount`` summed over ``sent_bytes`` of lines): the bytes each
    counted token stood for, less a quarter for the next input's variation, never below one
    byte a token nor above four times ``BYTES_PER_TOKEN``; nothing counted yet: the default."""
    if sent_bytes <= 0 or prompt_tokens <= 0:
        return float(BYTES_PER_TOKEN)
    seen = sent_bytes / prompt_tokens * 0.75
    return min(max(seen, 1.0), 4.0 * BYTES_PER_TOKEN)


class SplitError(ValueError):
    """An input cannot be cut into parts: a line is over a bound on its own."""

    def __init__(self, line: int, message: str) -> None:
        super().__init__(f"line {line}: {message}")
        self.line = line


@dataclass(
    frozen=True,
    slots=True,  # mutant: equivalent — slots=False changes only the memory
)
class Bounds:
    """What one part may hold: estimated tokens, bytes and rows (each at least 1)."""

    tokens: int
    file_bytes: int
    rows: int

    def __post_init__(self) -> None:
        if min(self.tokens, self.file_bytes, self.rows) < 1:
            raise ValueError(f"bounds must be positive: {self}")


@dataclass(
    frozen=True,
    slots=True,  # mutant: equivalent — slots=False changes only the memory
)
class PartRange:
    """A part: ``rows`` whole lines from line ``first`` (0-based), the bytes
    ``[start, end)`` of the input, estimated at ``tokens``."""

    first: int
    rows: int
    start: int
    end: int
    tokens: int
    sha256: str = ""  # of its bytes, when ``split_hashed`` cut it

    @property
    def size(self) -> int:
        return self.end - self.start


def split_lines(
    lines: Iterable[bytes],
    bounds: Bounds,
    *,
    first: int = 0,
    start: int = 0,
    bytes_per_token: float = BYTES_PER_TOKEN,
) -> Iterator[PartRange]:
    """Cut ``lines`` (each with its newline, as a binary file yields them; the last may lack
    one) into parts under ``bounds``, in order, each as soon as it closes. ``first`` and
    ``start`` place the lines in a larger input (splitting one part again)."""
    part_first, part_start, rows, size, tokens = first, start, 0, 0, 0
    number = first
    for line in lines:
        number += 1
        length = len(line)
        cost = line_tokens(length, bytes_per_token)
        if length > bounds.file_bytes:
            raise SplitError(number, f"{length} bytes, over a part's {bounds.file_bytes}")
        if cost > bounds.tokens:
            raise SplitError(
                number, f"about {cost} tokens, over the {bounds.tokens} a part may hold"
            )
        if rows and (
            rows + 1 > bounds.rows
            or size + length > bounds.file_bytes
            or tokens + cost > bounds.tokens
        ):
            yield PartRange(part_first, rows, part_start, part_start + size, tokens)
            part_first, part_start = part_first + rows, part_start + size
            rows, size, tokens = 0, 0, 0
        rows, size, tokens = rows + 1, size + length, tokens + cost
    if rows:
        yield PartRange(part_first, rows, part_start, part_start + size, tokens)


def split_hashed(
    lines: Iterable[bytes],
    bounds: Bounds,
    *,
    first: int = 0,
    start: int = 0,
    bytes_per_token: float = BYTES_PER_TOKEN,
) -> Iterator[PartRange]:
    """``split_lines``, each part with the sha256 of its bytes (what an upload of it must
    hash to). ``split_lines`` reads at most one line past a part before it yields it: that line
    is held back from the part's digest and begins the next one."""
    pulled = [start]
    digest = [hashlib.sha256()]
    last: list[bytes] = []

    def feed() -> Iterator[bytes]:
        for line in lines:
            if last:
                digest[0].update(last.pop())
            last.append(line)
            pulled[0] += len(line)
            yield line

    for part in split_lines(
        feed(), bounds, first=first, start=start, bytes_per_token=bytes_per_token
    ):
        if pulled[0] == part.end and last:
            digest[0].update(last.pop())
        yield replace(part, sha256=digest[0].hexdigest())
        digest[0] = hashlib.sha256()


@dataclass(
    frozen=True,
    slots=True,  # mutant: equivalent — slots=False changes only the memory
)
class Held:
    """A part waiting for room: its id, model (an id without ``models/``) and tokens."""

    key: str
    model: str
    tokens: int


@dataclass(
    frozen=True,
    slots=True,  # mutant: equivalent — slots=False changes only the memory
)
class Room:
    """What a feeding pass may do now: ``fit`` (to create, in order) and ``too_big`` (parts
    over their model's cap on their own: to split first)."""

    fit: tuple[Held, ...]
    too_big: tuple[Held, ...]


def room(
    held: Iterable[Held],
    enqueued: Mapping[str, int],
    cap: Callable[[str], int],
    open_batches: int,
    max_batches: int,
) -> Room:
    """The held parts (in input order) that fit now by opstate's own count: per model, the
    tokens already enqueued plus the part's stay within the model's cap; the first part of a
    model that does not fit stops that model; no more batches than ``max_batches`` open."""
    fit: list[Held] = []
    too_big: list[Held] = []
    used = dict(enqueued)
    stopped: set[str] = set()
    slots = max(0, max_batches - open_batches)
    for part in held:
        if part.model in stopped:
            continue
        limit = cap(part.model)
        if part.tokens > limit:
            too_big.append(part)
            stopped.add(part.model)
            continue
        if len(fit) >= slots:
            break
        if used.get(part.model, 0) + part.tokens > limit:
            stopped.add(part.model)
            continue
        used[part.model] = used.get(part.model, 0) + part.tokens
        fit.append(part)
    return Room(tuple(fit), tuple(too_big))


def learned_cap(cap: int, refused_tokens: int) -> int:
    """The cap to keep after a create of ``refused_tokens`` was refused while nothing of its
    model was open (the part alone is over Gemini's real cap): half the refused part, never
    above what was known."""
    return max(1, min(cap, refused_tokens // 2))


def held_backoff_s(refusals: int) -> float:
    """How long a part refused ``refusals`` times in a row for a full queue waits."""
    if refusals < 1:
        return 0.0
    doublings = min(
        refusals - 1,
        16,  # mutant: equivalent — 16 only keeps the power finite: the cap is reached at 4
    )
    return min(MAX_HELD_BACKOFF_S, HELD_BACKOFF_S * 2.0**doublings)


def job_finished(plan: Mapping[str, Any]) -> bool:
    """Whether no part of a job's plan will be created or is open: every part ended, or the
    job stopped and every part created has ended (held parts then never will be)."""
    phases = {p.get("phase") for p in _parts(plan)}
    if plan.get("stopped"):
        return not phases & {CREATING, CREATED}
    return phases == {ENDED}


def _parts(plan: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    parts = plan.get("parts")
    return [p for p in parts if isinstance(p, Mapping)] if isinstance(parts, list) else []


def job_view(plan: Mapping[str, Any], configured_cap: int | None = None) -> dict[str, Any]:
    """What a job's record shows: parts per phase, rows, the tokens it has enqueued against
    the cap (and a cap Gemini taught), whether it stopped, and what it waits for."""
    parts = _parts(plan)
    phases = Counter(p.get("phase") for p in parts)
    limits = plan.get("limits")
    cap = configured_cap
    if cap is None and isinstance(limits, Mapping) and isinstance(limits.get("cap"), int):
        cap = limits["cap"]
    learned = plan.get("learnedCap")
    if isinstance(learned, int) and learned > 0 and cap is not None:
        cap = min(cap, learned)
    shown: dict[str, Any] = {
        "parts": {phase: phases.get(phase, 0) for phase in PHASES},
        "rows": sum(int(p.get("rows", 0)) for p in parts),
        "model": plan.get("model"),
        "enqueuedTokens": sum(
            int(p.get("tokens", 0)) for p in parts if p.get("phase") in (CREATING, CREATED)
        ),
        "cap": cap,
    }
    if isinstance(learned, int):
        shown["learnedCap"] = learned
    estimate = plan.get("estimate")
    if isinstance(estimate, Mapping):  # corrected from the parts' usageMetadata
        shown["estimate"] = {
            key: estimate.get(key) for key in ("bytesPerToken", "sentBytes", "promptTokens")
        }
    if plan.get("stopped"):
        shown["stopped"] = plan.get("stoppedWhy", "stopped")
    if job_finished(plan):
        shown["waitingFor"] = "nothing"
    elif phases.get(HELD) and not plan.get("stopped"):
        shown["waitingFor"] = "room in the model's queue"
    else:
        shown["waitingFor"] = "created parts to end"
    return shown
