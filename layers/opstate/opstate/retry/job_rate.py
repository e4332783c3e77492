"""A job's estimate corrected from what Gemini counted (issue 46; docs/jobs.md, "The
estimate"): when a part's batch has ended and its results are archived (its archive settled;
read before the feeding step, so the parts that step creates are counted at the new rate),
the archive's summary holds ``usageMetadata.promptTokenCount`` summed over its answered rows
(``opstate.outcomes``' ledger, the same sum its cost is priced from). The job keeps the
bytes and tokens so counted (``estimate``: ``sentBytes``, ``promptTokens``,
``bytesPerToken``) and the rate ``domain.parts.corrected_bytes_per_token`` makes of them
(three quarters of the bytes a counted token stood for, between 1 and 8); its held parts are
counted again at that rate (``domain.parts.recounted``: from their bytes and rows, never
below their lines' count at it), so the next parts' room and reservations follow Gemini's own
count. A part created or claimed keeps the count it was reserved under (freed as reserved).

A part's sent bytes are its bytes, in the share of its rows that were answered (only those
report their usage). A part whose results are known absent (``none``, ``expired``) or that
answered nothing teaches nothing; it is marked counted all the same.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from functools import partial
from typing import Any

from opstate.domain.parts import BYTES_PER_TOKEN, HELD, corrected_bytes_per_token, recounted
from opstate.store.port import ArchiveState

# A part's phases once its batch exists (a settled archive says it has ended).
DONE = frozenset({"created", "ended"})
COUNTED = "counted"  # in a part: its usage is in the estimate (or it had none to give)
ESTIMATE = "estimate"
RATE = "bpt"  # in a part: the bytes per token its tokens were counted at (absent: the default)
# Archive statuses after which nothing more will come.
SETTLED = frozenset({"archived", "none", "expired"})


def rate_of(plan: Mapping[str, Any]) -> float:
    """The bytes per token a job's next parts are counted at."""
    found = plan.get(ESTIMATE)
    rate = found.get("bytesPerToken") if isinstance(found, Mapping) else None
    return float(rate) if isinstance(rate, int | float) and rate > 0 else float(BYTES_PER_TOKEN)


def lesson(
    plan: Mapping[str, Any], archive_of: Callable[[str], ArchiveState | None]
) -> Callable[[dict[str, Any]], None] | None:
    """The change that adds the usage of the job's ended parts not counted yet whose archive
    is settled, or None when there is none."""
    learned: dict[int, tuple[int, int]] = {}
    for part in plan.get("parts", []):
        if part.get("phase") not in DONE or part.get(COUNTED) or not part.get("batch"):
            continue
        archive = archive_of(str(part["batch"]))
        if archive is None or archive.status not in SETTLED:
            continue
        learned[int(part["n"])] = _usage(part, archive)
    return partial(_learn, learned=learned) if learned else None


def _usage(part: Mapping[str, Any], archive: ArchiveState) -> tuple[int, int]:
    """(sent bytes, prompt tokens) of an ended part, (0, 0) when it tells nothing."""
    summary = archive.summary if archive.status == "archived" else {}
    rows, usage = summary.get("rows"), summary.get("usage")
    answered = rows.get("succeeded") if isinstance(rows, Mapping) else None
    tokens = usage.get("promptTokenCount") if isinstance(usage, Mapping) else None
    total = int(part.get("rows", 0))
    if not isinstance(answered, int) or not isinstance(tokens, int) or total <= 0:
        return 0, 0
    if answered <= 0 or tokens <= 0 or answered > total:
        return 0, 0
    size = int(part["end"]) - int(part["start"])
    return size * answered // total, tokens


def _learn(plan: dict[str, Any], *, learned: Mapping[int, tuple[int, int]]) -> None:
    found = plan.get(ESTIMATE)
    estimate = dict(found) if isinstance(found, Mapping) else {}
    sent, tokens = int(estimate.get("sentBytes", 0)), int(estimate.get("promptTokens", 0))
    for part in plan["parts"]:
        usage = learned.get(int(part["n"]))
        if usage is None or part.get(COUNTED):
            continue  # another runner counted it first
        part[COUNTED] = True
        sent, tokens = sent + usage[0], tokens + usage[1]
    # Kept to three decimals, rounded down (fewer bytes a token: more tokens counted).
    rate = math.floor(corrected_bytes_per_token(sent, tokens) * 1000) / 1000
    plan[ESTIMATE] = {"sentBytes": sent, "promptTokens": tokens, "bytesPerToken": rate}
    for part in plan["parts"]:
        if part.get("phase") == HELD:
            recount(part, rate)


def recount(part: dict[str, Any], rate: float) -> None:
    """A held part's tokens at ``rate`` (``domain.parts.recounted``)."""
    was = float(part.get(RATE, BYTES_PER_TOKEN))
    if was == rate:
        return
    size = int(part["end"]) - int(part["start"])
    part["tokens"] = recounted(int(part["tokens"]), size, int(part["rows"]), was, rate)
    part[RATE] = rate
