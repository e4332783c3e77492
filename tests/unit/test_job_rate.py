"""A job's estimate corrected from its parts' usage (opstate.retry.job_rate, issue 46): which
parts teach (settled archives only, answered rows only), what the plan keeps, which parts are
counted again (held ones only), and that a part is counted once however many runners try."""

from __future__ import annotations

import math
from typing import Any

from opstate.domain.parts import corrected_bytes_per_token, range_tokens
from opstate.retry import job_rate
from opstate.store.port import ArchiveState


def part(n: int, phase: str, start: int, end: int, rows: int, tokens: int, **extra: Any) -> Any:
    batch = {"batch": f"batches/p{n}"} if phase in ("created", "ended") else {}
    fields = {"n": n, "phase": phase, "start": start, "end": end, "rows": rows, "tokens": tokens}
    return fields | batch | extra


def archived(succeeded: int, prompt: int) -> ArchiveState:
    return ArchiveState(
        "archived",
        summary={"rows": {"succeeded": succeeded}, "usage": {"promptTokenCount": prompt}},
    )


def plan() -> dict[str, Any]:
    return {
        "parts": [
            part(0, "ended", 0, 4000, 10, 2040),
            part(1, "created", 4000, 8000, 10, 2040),
            part(2, "ended", 8000, 12000, 10, 2040),
            part(3, "held", 12000, 16000, 10, 2040),
            part(4, "creating", 16000, 20000, 10, 2040),
        ]
    }


def test_settled_parts_teach_the_rate_and_only_held_parts_are_recounted() -> None:
    archives = {
        "batches/p0": archived(10, 1000),  # 4 bytes a token
        "batches/p1": archived(5, 500),  # half its rows answered: half its bytes sent
        "batches/p2": ArchiveState("pending"),  # not settled yet: later
    }
    doc = plan()
    change = job_rate.lesson(doc, archives.get)
    assert change is not None
    change(doc)
    rate = math.floor(corrected_bytes_per_token(6000, 1500) * 1000) / 1000
    assert doc["estimate"] == {"sentBytes": 6000, "promptTokens": 1500, "bytesPerToken": rate}
    assert [p.get("counted", False) for p in doc["parts"]] == [True, True, False, False, False]
    held, creating = doc["parts"][3], doc["parts"][4]
    assert held["tokens"] == range_tokens(4000, 10, rate) and held["bpt"] == rate
    assert creating["tokens"] == 2040 and "bpt" not in creating  # reserved: kept
    assert job_rate.rate_of(doc) == rate
    # Counted once: the same lesson again (another runner's) changes nothing.
    again = dict(doc, parts=[dict(p) for p in doc["parts"]])
    change(again)
    assert again["estimate"] == doc["estimate"]
    assert job_rate.lesson(doc, archives.get) is None


def test_parts_that_tell_nothing_are_counted_without_a_lesson() -> None:
    archives = {
        "batches/p0": ArchiveState("none"),  # no results will come
        "batches/p1": archived(0, 0),  # nothing answered
        "batches/p2": archived(11, 900),  # more answered than sent: not believed
    }
    doc = plan()
    change = job_rate.lesson(doc, archives.get)
    assert change is not None
    change(doc)
    assert doc["estimate"]["sentBytes"] == 0 and doc["estimate"]["promptTokens"] == 0
    assert doc["estimate"]["bytesPerToken"] == 2.0 == job_rate.rate_of(doc)
    assert doc["parts"][3]["tokens"] == 2040  # the default rate: nothing recounted
    assert job_rate.rate_of({"parts": []}) == 2.0
