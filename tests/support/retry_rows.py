"""The rows of a batch's input and output as the retry tests build them (issue 33): a keyed
request line, an answered, blocked or failed output row, an input file, and the keys of an
input's bytes. One copy for the SQLite, DynamoDB, serve, crash and built-function tests."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def request_line(key: str) -> dict[str, Any]:
    """One input line: ``{"key", "request"}``."""
    return {"key": key, "request": {"contents": [{"parts": [{"text": f"question {key}"}]}]}}


def request_bytes(key: str) -> bytes:
    """``request_line`` as the JSONL line an input file holds (with its newline)."""
    return json.dumps(request_line(key)).encode() + b"\n"


def write_input(path: Path, keys: list[str]) -> Path:
    """An input file of one request line per key."""
    path.write_bytes(b"".join(request_bytes(k) for k in keys))
    return path


def answered(key: str) -> dict[str, Any]:
    """An output row that answered."""
    return {
        "key": key,
        "response": {
            "candidates": [
                {"content": {"parts": [{"text": f"answer {key}"}]}, "finishReason": "STOP"}
            ]
        },
    }


def blocked(key: str) -> dict[str, Any]:
    """An output row whose response carries no answer (the prompt was blocked)."""
    return {"key": key, "response": {"promptFeedback": {"blockReason": "SAFETY"}}}


def failed(key: str, code: int, status: str) -> dict[str, Any]:
    """An output row that failed with a ``google.rpc.Status``."""
    return {"key": key, "error": {"code": code, "message": f"fake {status}", "status": status}}


def input_keys(data: bytes) -> list[str]:
    """The keys of an input's bytes, in order."""
    return [json.loads(line)["key"] for line in data.splitlines() if line.strip()]
