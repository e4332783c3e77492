"""Batch outputs for the outcomes tests and benchmark: JSON Lines as Gemini writes them, with
the counts a correct ledger must find."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from opstate.domain.model import OpRecord
from opstate.domain.states import State
from opstate.domain.times import NS_PER_SECOND, format_time
from opstate.outcomes.ledger import BatchLedger
from opstate.outcomes.ledger_reading import (
    MAX_BAND_MODELS,
    MAX_MODEL_CHARS,
    OTHER_MODEL,
    PRICE_TIER_STARTS,
    USAGE_FIELDS,
)
from opstate.outcomes.plan import MAX_CODE_CHARS
from opstate.outcomes.sink import StoredObject
from opstate.outcomes.source import VIDEO, Output, Outputs
from opstate.outcomes.summary import MAX_COUNT, MAX_OBJECTS, summary_of
from opstate.store.port import ARCHIVE_ARCHIVED, ArchiveState


def now_text(offset_s: float = 0) -> str:
    """The time ``offset_s`` seconds from now, as Gemini writes it (``expirationTime``)."""
    return format_time(time.time_ns() + int(offset_s * NS_PER_SECOND))


class Clock:
    """An archiver's ``clock_ns``: the time it was made, moved on only by setting ``now``."""

    def __init__(self) -> None:
        self.now = time.time_ns()

    def __call__(self) -> int:
        return self.now


@dataclass
class Expected:
    rows: dict[str, int] = field(
        default_factory=lambda: {
            "total": 0,
            "succeeded": 0,
            "blocked": 0,
            "failed": 0,
            "unreadable": 0,
        }
    )
    errors: dict[str, int] = field(default_factory=dict)
    usage: dict[str, int] = field(default_factory=lambda: dict.fromkeys(USAGE_FIELDS, 0))


def ok_line(
    key: str, prompt: int, candidates: int, text: str = "hello", model: str | None = None
) -> dict[str, Any]:
    line = {
        "key": key,
        "response": {
            "candidates": [{"content": {"parts": [{"text": text}], "role": "model"}}],
            "usageMetadata": {
                "promptTokenCount": prompt,
                "candidatesTokenCount": candidates,
                "totalTokenCount": prompt + candidates,
            },
        },
    }
    return _with_model(line, model)


def _with_model(line: dict[str, Any], model: str | None) -> dict[str, Any]:
    if model is not None:
        line["response"]["modelVersion"] = model
    return line


def failed_line(key: str, code: int, message: str = "quota") -> dict[str, Any]:
    return {"key": key, "status": {"code": code, "message": message}}


def blocked_line(key: str, i: int) -> dict[str, Any]:
    """A response without an answer: the prompt blocked (no candidates), or the one candidate
    stopped for safety or recitation."""
    if i % 3 == 0:
        response: dict[str, Any] = {"promptFeedback": {"blockReason": "PROHIBITED_CONTENT"}}
    else:
        response = {"candidates": [{"finishReason": "SAFETY" if i % 3 == 1 else "RECITATION"}]}
    response["usageMetadata"] = {"promptTokenCount": 4, "totalTokenCount": 4}
    return {"key": key, "response": response}


def batch_output(
    ok: int,
    failed: dict[int, int],
    unreadable: int = 0,
    blocked: int = 0,
    model: str | None = None,
) -> tuple[bytes, Expected]:
    """``ok`` succeeded rows with an answer, ``blocked`` succeeded rows without one,
    ``failed[code]`` failed rows per code, then broken lines (``model``: the answered rows'
    ``modelVersion``)."""
    expected = Expected()
    lines = []
    for i in range(ok):
        lines.append(json.dumps(ok_line(f"ok-{i}", 10 + i, 5, model=model)))
        expected.usage["promptTokenCount"] += 10 + i
        expected.usage["candidatesTokenCount"] += 5
        expected.usage["totalTokenCount"] += 15 + i
    for i in range(blocked):
        lines.append(json.dumps(blocked_line(f"b-{i}", i)))
        expected.usage["promptTokenCount"] += 4
        expected.usage["totalTokenCount"] += 4
    for code, n in failed.items():
        for i in range(n):
            lines.append(json.dumps(failed_line(f"f-{code}-{i}", code)))
        expected.errors[str(code)] = n
    lines.extend(["{not json"] * unreadable)
    total = ok + blocked + sum(failed.values()) + unreadable
    expected.rows = {
        "total": total,
        "succeeded": ok + blocked,
        "blocked": blocked,
        "failed": sum(failed.values()),
        "unreadable": unreadable,
    }
    return ("\n".join(lines) + "\n").encode(), expected


def generated_output(
    size: int, line_text_bytes: int = 900
) -> tuple[Callable[[], Iterator[bytes]], int, int]:
    """A large batch output generated on the fly: (chunks factory, exact size, rows).

    Every row is one succeeded line of the same length (so the size is exact); the body is
    never held whole (1 MiB chunks)."""
    line = (json.dumps(ok_line("k", 7, 3, "x" * line_text_bytes)) + "\n").encode()
    rows = size // len(line)
    exact = rows * len(line)
    per_chunk = max(1, (1 << 20) // len(line))
    block = line * per_chunk

    def chunks() -> Iterator[bytes]:
        sent = 0
        while sent < exact:
            piece = block[: exact - sent]
            sent += len(piece)
            yield piece

    return chunks, exact, rows


def chunked(data: bytes, cuts: list[int]) -> list[bytes]:
    """``data`` cut at ``cuts`` (each taken modulo its length + 1): the chunks a stream may
    arrive in, empty ones included."""
    points = sorted({c % (len(data) + 1) for c in cuts})
    pieces, start = [], 0
    for point in points:
        pieces.append(data[start:point])
        start = point
    pieces.append(data[start:])
    return pieces


def worst_case() -> tuple[OpRecord, ArchiveState]:
    """A record with the longest name and the largest state every bound allows: as many
    objects as an archive keeps, at long locations, every error code as long as kept, every
    count at its maximum, every filtered reason as long as kept, the longest last error."""
    name = "batches/" + "a" * (512 - len("batches/"))
    record = OpRecord(name, State.SUCCEEDED, 1, 2, "poll", {}, created_ns=2**62)
    location = "s3://" + "b" * 63 + "/" + "p" * 200 + "/" + name + f"/{2**62}/video-99.mp4"
    objects = [StoredObject(location, MAX_COUNT, "f" * 64) for _ in range(MAX_OBJECTS)]
    ledger = BatchLedger()
    ledger.rows.total = ledger.rows.succeeded = ledger.rows.blocked = MAX_COUNT
    ledger.rows.failed = ledger.rows.unreadable = MAX_COUNT
    codes = ((f"{i:04d}" + "c" * MAX_CODE_CHARS)[:MAX_CODE_CHARS] for i in range(1000))
    ledger.errors = dict.fromkeys(codes, MAX_COUNT)  # as many as the ledger tells apart
    ledger.usage = dict.fromkeys(ledger.usage, 10**30)  # a sum past any int64
    # every band the ledger keeps apart: MAX_BAND_MODELS models named as long as kept, "other"
    # and none, each in every band, every sum past any int64
    models = [(f"{i}" + "m" * MAX_MODEL_CHARS)[:MAX_MODEL_CHARS] for i in range(MAX_BAND_MODELS)]
    ledger._bands = {
        (model, band): [10**30] * (1 + len(USAGE_FIELDS))
        for model in [*models, OTHER_MODEL, None]
        for band in range(len(PRICE_TIER_STARTS) + 1)
    }
    outputs = Outputs(
        tuple(Output(f"video-{i}.mp4", VIDEO, file=f"files/v{i}") for i in range(MAX_OBJECTS)),
        requests=10**40,
        filtered_count=10**40,
        filtered_reasons=tuple("r" * 10_000 for _ in range(1000)),
    )
    summary = summary_of(record, outputs, objects, ledger)
    summary["cost"] = {  # an unknown cost with the longest reason kept
        "usd": None,
        "model": None,
        "priced_at": format_time(2**62),
        "prices": "genai-prices 0.2.5",
        "batch_discount": None,
        "reason": "r" * 300,
    }
    state = ArchiveState(
        ARCHIVE_ARCHIVED,
        created_ns=2**62,
        rev=2**62,
        attempts=2**31,
        last_error="e" * 300,
        deadline_ns=2**62,
        archived_ns=2**62,
        location=location,
        summary=summary,
    )
    return record, state
