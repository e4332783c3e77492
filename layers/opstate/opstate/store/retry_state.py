"""The retry state beside a record (issue 33): a root's retry policy, its children and its final
result, or a child's lineage. Like ``ArchiveState`` it is its own conditional write (``rev``),
never the record's version, state, details or keys (``RetryingStore`` in ``store.port``).

- ``status``: ``active`` (a root with a policy: the retry runner has work now or later),
  ``done`` (a root whose final result is written, or whose retry is unavailable, stopped or
  off) or ``member`` (a child: lineage only, never listed by ``iter_retry_due``).
- ``created_ns``: the record incarnation it belongs to (``OpRecord.created_ns``); ``rev``:
  counts the writes of this state (the condition of the next; 0 = never written); ``due_ns``:
  when the runner should look at an active root next.
- ``doc``: the JSON-shaped body (a root's policy, input, children and final result; a child's
  lineage), at most ``MAX_RETRY_STATE_BYTES`` as compact JSON with the rest of the state.

Pure (no store code): ``store.port`` imports it for ``RetryingStore`` and ``check_retry``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

RETRY_ACTIVE = "active"
RETRY_DONE = "done"
RETRY_MEMBER = "member"
RETRY_STATUSES = (RETRY_ACTIVE, RETRY_DONE, RETRY_MEMBER)
# The compact JSON of ``as_dict()`` may not be larger (DynamoDB items stop at 400 KB, and the
# record's own details may take up to their limit beside it).
MAX_RETRY_STATE_BYTES = 160 * 1024


@dataclass(frozen=True, slots=True)
class RetryState:
    """The retry state of one record (see the module docstring)."""

    status: str
    created_ns: int = 0
    rev: int = 0
    due_ns: int = 0
    doc: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.status not in RETRY_STATUSES:
            raise ValueError(f"unknown retry status {self.status!r}")

    @property
    def active(self) -> bool:
        return self.status == RETRY_ACTIVE

    def as_dict(self) -> dict[str, Any]:
        """The stored form (JSON-shaped: text, integers, maps and lists)."""
        return {
            "status": self.status,
            "created_ns": self.created_ns,
            "rev": self.rev,
            "due_ns": self.due_ns,
            "doc": dict(self.doc),
        }

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> RetryState:
        """The state of a stored form; missing numbers read as 0, a missing or unknown status
        as ``done`` (nothing the runner would act on), a doc that is no map as ``{}``."""

        def number(key: str) -> int:
            value = raw.get(key)
            try:
                return int(value) if value is not None else 0
            except (TypeError, ValueError):
                return 0

        status = raw.get("status")
        doc = raw.get("doc")
        return cls(
            status=status if isinstance(status, str) and status in RETRY_STATUSES else RETRY_DONE,
            created_ns=number("created_ns"),
            rev=number("rev"),
            due_ns=number("due_ns"),
            doc=dict(doc) if isinstance(doc, Mapping) else {},
        )


def retry_json(state: RetryState) -> str:
    """The compact JSON of ``state`` (keys sorted, UTF-8 text as is), what the stores write
    and measure against ``MAX_RETRY_STATE_BYTES``. ``ValueError`` when it is no JSON document
    (NaN, infinities, a lone surrogate, values JSON cannot hold) or larger than the limit
    (``store.port.check_retry`` turns it into ``RecordRejectedError``)."""
    try:
        text = json.dumps(
            state.as_dict(),
            separators=(",", ":"),
            sort_keys=True,
            ensure_ascii=False,
            allow_nan=False,
        )
        size = len(text.encode("utf-8"))
    except (TypeError, ValueError) as exc:
        raise ValueError(f"retry state is no JSON document: {exc}") from None
    if size > MAX_RETRY_STATE_BYTES:
        raise ValueError(
            f"retry state of {size} bytes is larger than {MAX_RETRY_STATE_BYTES} bytes"
        )
    return text
