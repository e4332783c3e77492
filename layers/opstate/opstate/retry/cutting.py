"""The input files of row retries (step 5 of a retry pass, ``opstate.retry.engine``): the
original lines of the keys to retry, cut from the kept input's bytes as they are hashed
(``inputs.verified``: bytes that no longer have the kept input's sha256 raise
``IntegrityError`` and nothing is planned from them), at most ``max_rows`` a file, each file
written into the sink under its child's id before the plan names it, with its own sha256."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from itertools import islice
from typing import Any

from opstate.domain.model import OpRecord
from opstate.outcomes.plan import prefix_of
from opstate.outcomes.sink import Sink
from opstate.retry import lineage
from opstate.retry.inputs import subset, verified
from opstate.retry.passes import Runner


def write_inputs(
    runner: Runner,
    root: OpRecord,
    doc: Mapping[str, Any],
    keys: set[str],
    attempt: int,
    parent: str,
    room: int,
    model: str | None,
) -> list[lineage.ChildInput]:
    """The retry batches of ``keys``: the root input's original lines, in input order, at
    most ``max_rows`` per file and ``room`` files, written before the plan names them. They
    are cut from the kept input's bytes as they are hashed: when those do not match its
    sha256 (the copy was swapped or changed), ``IntegrityError`` and nothing is planned."""
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
    written: list[lineage.ChildInput] = []
    index = len(lineage.children(doc))
    while len(written) < room:
        batch = list(islice(picked, runner.config.max_rows))
        if not batch:
            break
        child, _ = lineage.new_child_id(attempt, index + len(written))
        key = f"{prefix_of(root)}/retry/{child}.jsonl"
        stored, size, digest = _put(runner.sink, key, root.name, batch)
        written.append(
            lineage.ChildInput(stored, len(batch), size, False, parent, digest, model, child)
        )
    for _ in picked:  # the rest is read too: the whole input's hash is checked
        pass
    return written


def _put(sink: Sink, key: str, name: str, lines: Iterable[bytes]) -> tuple[str, int, str]:
    digest = hashlib.sha256()
    size = 0
    with sink.open(key, name=name) as out:
        for line in lines:
            data = line + b"\n"
            out.write(data)
            digest.update(data)
            size += len(data)
        stored = out.commit(digest.hexdigest())
    return stored.location, size, digest.hexdigest()
