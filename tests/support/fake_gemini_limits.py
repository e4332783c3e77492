"""The Batch API's limits, enforced by the fake Gemini (issue 46): tokens enqueued per model
across the active batches, batches open at once, and bytes per uploaded file.

Gemini's rate-limits page ("Batch API rate limits"): "Concurrent batch requests: 100", "Input
file size limit: 2GB", "Enqueued tokens per model: The Batch enqueued tokens table lists the
maximum number of tokens that can be enqueued for batch processing across all your active
batch jobs for a given model." A create over a cap is answered as Gemini answers a full queue
(issue 46, from users' reports): HTTP 429, status RESOURCE_EXHAUSTED, the generic sentence, no
RetryInfo, no Retry-After; the ``google.rpc.Help`` detail is the one a real 429 of the Batch
API carried (langchain4j/langchain4j PR 3942, a CI log of ``batches`` calls, 2026-01-12).
What Gemini answers an upload over 2 GB is not public: the fake answers 400 and records it
(a test asserts no upload was ever over).

``count_tokens`` is the fake's own tokenizer (default: a token per 4 bytes of the file, about
English text's rate, below opstate's estimate): the tests set it lower or higher to play a
Gemini that counts otherwise.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

QUEUE_FULL_MESSAGE = (
    "You exceeded your current quota, please check your plan and billing details. For more "
    "information on this error, head to: https://ai.google.dev/gemini-api/docs/rate-limits."
)


def queue_full_body() -> dict[str, Any]:
    return {
        "error": {
            "code": 429,
            "message": QUEUE_FULL_MESSAGE,
            "status": "RESOURCE_EXHAUSTED",
            "details": [
                {
                    "@type": "type.googleapis.com/google.rpc.Help",
                    "links": [
                        {
                            "description": "Learn more about Gemini API quotas",
                            "url": "https://ai.google.dev/gemini-api/docs/rate-limits",
                        }
                    ],
                }
            ],
        }
    }


def quarter_bytes(data: bytes) -> int:
    return len(data) // 4


@dataclass
class QueueLimits:
    """The limits one fake enforces, and what it saw (for "no limit was exceeded")."""

    enqueued_tokens: dict[str, int] = field(default_factory=dict)  # model id -> cap
    max_open: int | None = None
    max_file_bytes: int | None = None
    count_tokens: Callable[[bytes], int] = quarter_bytes
    # Seen: batch -> (model, tokens); refusals (model, tokens, open tokens of the model).
    batches: dict[str, tuple[str, int]] = field(default_factory=dict)
    refusals: list[tuple[str, int, int]] = field(default_factory=list)
    peak_tokens: dict[str, int] = field(default_factory=dict)
    peak_open: int = 0
    biggest_upload: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def admit(
        self, batch: str, model: str, data: bytes, active: Callable[[str], bool]
    ) -> dict[str, Any] | None:
        """Whether a create of ``model`` over ``data`` fits (None: it was recorded as
        ``batch``), else the error body. ``active(name)``: a batch is pending or running."""
        model = model.removeprefix("models/")
        tokens = self.count_tokens(data)
        with self.lock:
            open_batches = [b for b in self.batches if active(b)]
            mine = sum(t for b, (m, t) in self.batches.items() if m == model and b in open_batches)
            cap = self.enqueued_tokens.get(model)
            full = self.max_open is not None and len(open_batches) >= self.max_open
            if full or (cap is not None and mine + tokens > cap):
                self.refusals.append((model, tokens, mine))
                return queue_full_body()
            self.batches[batch] = (model, tokens)
            self.peak_tokens[model] = max(self.peak_tokens.get(model, 0), mine + tokens)
            self.peak_open = max(self.peak_open, len(open_batches) + 1)
        return None

    def upload_size(self, size: int) -> bool:
        """Whether an upload of ``size`` bytes is taken."""
        with self.lock:
            self.biggest_upload = max(self.biggest_upload, size)
        return self.max_file_bytes is None or size <= self.max_file_bytes
