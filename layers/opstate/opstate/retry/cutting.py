"""The input files of the next attempt (step 5 of a retry pass, ``opstate.retry.engine``), cut
from bytes opstate verified as they are hashed (``inputs.verified``: bytes that no longer have
their recorded sha256 raise ``IntegrityError`` and nothing is planned from them), at most
``max_rows`` lines a file, each file written into the sink under its child's id (a nonce id,
``lineage.new_child_id``) before the plan names it, with its own sha256:

- ``write_inputs``: a row retry, the original lines of the keys chosen (a
  ``selection.Selection``, a membership test over key digests), streamed from the kept input;
- ``whole_inputs``: a whole resubmit, the member's own input as it is when it holds at most
  ``max_rows`` rows, else its lines (bytes unchanged, in order) split like a row retry's.

Which keys a row retry holds (``retry_keys``) is ``selection.select_keys`` over the lineage's
outputs in the sink. Lines are streamed: a file's lines are held while it is written, never
the input's."""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Container, Iterable, Iterator, Mapping
from itertools import islice
from typing import Any

from opstate.domain.model import OpRecord
from opstate.outcomes.plan import prefix_of
from opstate.outcomes.sink import Sink
from opstate.retry import lineage
from opstate.retry.finalize import chunks_of, lines_of, output_location
from opstate.retry.inputs import subset, verified
from opstate.retry.passes import Runner
from opstate.retry.reading import KeyIndex, key_of
from opstate.retry.rules import lines
from opstate.retry.selection import Selection, select_keys
from opstate.store.port import ArchiveState


def retry_keys(
    runner: Runner,
    doc: Mapping[str, Any],
    output: str,
    earlier: list[lineage.MemberRef],
    archives: Mapping[str, ArchiveState | None],
    attempt: int,
    max_attempts: int,
) -> Selection:
    """The keys of the root's input that attempt ``attempt`` retries from ``output``
    (``opstate.retry.selection``: the rules over key digests, never the keys' text)."""
    sink, table, cap = runner.sink, runner.config.table, runner.config.max_line_bytes
    location = lineage.input_of(doc).get("location")
    assert isinstance(location, str)
    index = KeyIndex(
        key for line in lines_of(sink.chunks(location), cap) if (key := key_of(line)) is not None
    )
    locations = [output_location(archives.get(ref.name)) for ref in earlier]
    # The failures of each candidate so far: every earlier member's output, then this one.
    outputs = [chunks_of(sink, loc) for loc in [*(x for x in locations if x is not None), output]]

    def latest() -> Iterable[bytes]:
        return lines_of(sink.chunks(output), cap)

    def read(chunks: Callable[[], Iterable[bytes]]) -> Callable[[], Iterable[bytes]]:
        return lambda: lines_of(chunks(), cap)

    return select_keys(index, latest, map(read, outputs), table, attempt, max_attempts)


def write_inputs(
    runner: Runner,
    root: OpRecord,
    doc: Mapping[str, Any],
    keys: Container[str],
    attempt: int,
    parent: str,
    room: int,
    start: int,
    model: str | None,
) -> list[lineage.ChildInput]:
    """The retry batches of ``keys``: the root input's original lines, in input order, at
    most ``max_rows`` per file and ``room`` files in all (``start`` planned already in this
    attempt), written before the plan names them. They are cut from the kept input's bytes
    as they are hashed: when those do not match its sha256 (the copy was swapped or changed),
    ``IntegrityError`` and nothing is planned."""
    kept = lineage.input_of(doc)
    location = kept.get("location")
    assert isinstance(location, str)
    sha256 = kept.get("sha256")
    stream = verified(
        runner.sink.chunks(location),
        sha256 if isinstance(sha256, str) else None,
        f"the kept input {location}",
    )
    picked = (line for _, line in subset(stream, keys, runner.config.max_line_bytes))
    return _split(runner, root, doc, picked, attempt, parent, room, start, model, whole=False)


def whole_inputs(
    runner: Runner,
    root: OpRecord,
    doc: Mapping[str, Any],
    ref: lineage.MemberRef,
    attempt: int,
    room: int,
    start: int,
    model: str | None,
) -> list[lineage.ChildInput]:
    """A whole resubmit of ``ref``'s input (module doc): that input itself when it holds at
    most ``max_rows`` rows, else its lines cut from its verified bytes into files of
    ``max_rows`` (at most ``room`` files in all, ``start`` planned already)."""
    assert ref.input is not None and ref.rows
    config = runner.config
    if ref.rows <= config.max_rows:
        return [
            lineage.ChildInput(
                ref.input, ref.rows, ref.size or 0, True, ref.name, ref.sha256, model
            )
        ]
    stream = verified(runner.sink.chunks(ref.input), ref.sha256, f"the input {ref.input}")
    picked = (
        line
        for line in lines(stream, config.max_line_bytes, skip_long=True)
        if line and not line.isspace()
    )
    return _split(runner, root, doc, picked, attempt, ref.name, room, start, model, whole=True)


def _split(
    runner: Runner,
    root: OpRecord,
    doc: Mapping[str, Any],
    picked: Iterator[bytes],
    attempt: int,
    parent: str,
    room: int,
    start: int,
    model: str | None,
    *,
    whole: bool,
) -> list[lineage.ChildInput]:
    """``picked`` lines into files of at most ``max_rows`` lines, while fewer than ``room``
    children are planned in this attempt (``start`` already); each file is named by the
    nonce id its child will have (at the plan's next indexes). The rest of ``picked`` is
    read too: the whole source's hash is checked before anything is planned from it."""
    written: list[lineage.ChildInput] = []
    index = len(lineage.children(doc)) + start
    while start + len(written) < room:
        batch = list(islice(picked, runner.config.max_rows))
        if not batch:
            break
        child, _ = lineage.new_child_id(attempt, index + len(written))
        key = f"{prefix_of(root)}/retry/{child}.jsonl"
        stored, size, digest = _put(runner.sink, key, root.name, batch)
        written.append(
            lineage.ChildInput(stored, len(batch), size, whole, parent, digest, model, child)
        )
        del batch  # let its lines go before the next are read
    for _ in picked:
        pass
    return written


def _put(sink: Sink, key: str, name: str, lines: Iterable[bytes]) -> tuple[str, int, str]:
    digest = hashlib.sha256()
    size = 0
    with sink.open(key, name=name) as out:
        for line in lines:  # the line and its newline apart: a line is never copied
            for data in (line, b"\n"):
                out.write(data)
                digest.update(data)
                size += len(data)
        stored = out.commit(digest.hexdigest())
    return stored.location, size, digest.hexdigest()
