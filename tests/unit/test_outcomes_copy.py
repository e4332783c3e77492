"""The copy's two threads (the download counts lines, a writer thread writes and hashes): what
reaches the sink is the source's bytes in order with their sha256 and exact counts, and a
storage failure stops the download at the next chunk, leaves nothing archived and is reported
as the sink's error."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from opstate.config import Settings
from opstate.domain.model import OpEvent, OpRecord
from opstate.domain.states import State
from opstate.domain.times import NS_PER_SECOND
from opstate.ingest import ingest
from opstate.outcomes.copy import WRITE_QUEUE_CHUNKS
from opstate.outcomes.file_sink import FileSink
from opstate.outcomes.run import archive_once
from opstate.outcomes.source import BATCH_OUTPUT, Output, Outputs, Writer
from opstate.store import MemoryStore

CHUNK = 1 << 20


def line(i: int) -> bytes:
    usage = {"promptTokenCount": i, "totalTokenCount": i + 1}
    candidates = [{"finishReason": "SAFETY" if i % 7 == 0 else "STOP"}]  # 1 in 7 blocked
    response = {"candidates": candidates, "usageMetadata": usage}
    return json.dumps({"key": str(i), "response": response}).encode() + b"\n"


class ChunkSource:
    """A Source handing ``chunks`` to the writer one by one (lines cut anywhere)."""

    def __init__(self, chunks: list[bytes]) -> None:
        self.chunks = chunks
        self.written = 0  # chunks the writer took

    def outputs(self, record: OpRecord) -> Outputs:
        return Outputs((Output("output.jsonl", BATCH_OUTPUT, file="files/x"),), requests=None)

    def download(self, file: str, writer: Writer) -> None:
        for chunk in self.chunks:
            writer.write(chunk)
            self.written += 1

    def close(self) -> None:
        pass


class FailingSink(FileSink):
    """A folder whose writer fails at its ``fail_at``-th write (a full disk, say)."""

    def __init__(self, root: Path, fail_at: int, error: Exception) -> None:
        super().__init__(root)
        self.fail_at = fail_at
        self.error = error

    @contextmanager
    def open(self, key: str, *, name: str, sha256: str = "") -> Iterator[Any]:
        with super().open(key, name=name, sha256=sha256) as writer:
            calls = {"n": 0}
            real = writer.write

            def write(data: bytes) -> int:
                calls["n"] += 1
                if calls["n"] >= self.fail_at:
                    raise self.error
                return real(data)

            writer.write = write  # type: ignore[method-assign]
            yield writer


def pending_store() -> MemoryStore:
    store = MemoryStore()
    t = 1_700_000_000 * NS_PER_SECOND
    ingest(store, OpEvent("batches/x", State.SUCCEEDED, t, "poll", {}), clock_ns=lambda: t)
    return store


def test_the_copy_is_the_source_in_order_with_its_digest_and_counts(tmp_path: Path) -> None:
    data = b"".join(line(i) for i in range(40_000))
    cuts = list(range(0, len(data), 65_537))  # lines cut anywhere, many chunks queued
    chunks = [data[a : a + 65_537] for a in cuts]
    store = pending_store()
    clock = store.get("batches/x").applied_ns  # type: ignore[union-attr]
    result = archive_once(
        store, ChunkSource(chunks), FileSink(tmp_path), settings=Settings(), clock_ns=lambda: clock
    )
    assert result.archived == 1
    [stored] = tmp_path.rglob("output.jsonl")
    assert stored.read_bytes() == data
    state = store.get_archive("batches/x")
    assert state is not None
    summary = state.summary
    assert summary["objects"][0]["sha256"] == hashlib.sha256(data).hexdigest()
    assert summary["rows"] == {
        "total": 40_000,
        "succeeded": 40_000,
        "blocked": len(range(0, 40_000, 7)),
        "failed": 0,
        "unreadable": 0,
    }
    assert summary["usage"]["promptTokenCount"] == sum(range(40_000))
    assert summary["usage"]["totalTokenCount"] == sum(range(1, 40_001))


@pytest.mark.parametrize(
    "error", [OSError(28, "No space left on device"), RuntimeError("disk gone")], ids=repr
)
def test_a_storage_failure_stops_the_download_and_archives_nothing(
    tmp_path: Path, error: Exception
) -> None:
    chunks = [b'{"response": {}}\n' * (CHUNK // 17)] * 200
    source = ChunkSource(chunks)
    store = pending_store()
    clock = store.get("batches/x").applied_ns  # type: ignore[union-attr]
    sink = FailingSink(tmp_path, fail_at=2, error=error)
    result = archive_once(store, source, sink, settings=Settings(), clock_ns=lambda: clock)
    assert (result.archived, result.failed) == (0, 1)
    # Stopped at the next chunk after the failure, give or take the queue: not read to the end.
    assert source.written <= 2 + WRITE_QUEUE_CHUNKS + 1 < len(chunks)
    state = store.get_archive("batches/x")
    assert state is not None and state.status == "failed" and state.attempts == 1
    assert str(error.args[-1]) in state.last_error
    assert [p for p in tmp_path.rglob("*") if p.is_file()] == []


def test_a_storage_failure_on_the_last_chunk_is_still_a_failure(tmp_path: Path) -> None:
    source = ChunkSource([line(1), line(2)])
    store = pending_store()
    clock = store.get("batches/x").applied_ns  # type: ignore[union-attr]
    sink = FailingSink(tmp_path, fail_at=2, error=OSError(5, "Input/output error"))
    result = archive_once(store, source, sink, settings=Settings(), clock_ns=lambda: clock)
    assert (result.archived, result.failed, source.written) == (0, 1, 2)
    state = store.get_archive("batches/x")
    assert state is not None and "Input/output error" in state.last_error
    assert [p for p in tmp_path.rglob("*") if p.is_file()] == []
