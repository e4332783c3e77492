"""Step 6 of a retry pass (``opstate.retry.engine``): when nothing is left to plan,
``final.jsonl`` (one line per original key, ``opstate.retry.final``) and ``final.json`` (its
ledger, the lineage, its cost, why it stopped if it did) are written beside the root's
results, then the root's retry state says ``final`` (which announces ``Operation Results
Final``) and ``done``. A batch of the lineage that ended as a whole without an output
(FAILED, EXPIRED, CANCELLED) stands in the merge for one failed row per key of its input
(``ended_whole``)."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterable, Iterator, Mapping

from opstate.domain.costs import lineage_cost
from opstate.domain.model import OpRecord
from opstate.domain.states import State
from opstate.domain.strict_json import dumps
from opstate.observability import count, log_fields, logger
from opstate.outcomes.plan import prefix_of
from opstate.outcomes.sink import Sink
from opstate.retry import lineage
from opstate.retry.final import Member, write_final
from opstate.retry.passes import Runner
from opstate.retry.reading import key_of
from opstate.retry.rules import lines
from opstate.store.port import ArchiveState
from opstate.store.retry_state import RETRY_DONE, RetryState

OUTPUT_OBJECT = "output.jsonl"
FINAL_KEY = "final.jsonl"
FINAL_LEDGER_KEY = "final.json"
MAX_MESSAGE_CHARS = 300


def chunks_of(sink: Sink, location: str) -> Callable[[], Iterable[bytes]]:
    """A fresh chunk stream of the object at ``location`` on each call."""
    return lambda: sink.chunks(location)


def write_final_of(
    runner: Runner,
    root: OpRecord,
    state: RetryState,
    refs: list[lineage.MemberRef],
    archives: Mapping[str, ArchiveState | None],
) -> None:
    doc = lineage.mutable(state.doc)
    location = lineage.input_of(doc).get("location")
    assert isinstance(location, str)
    cap = runner.config.max_line_bytes
    unknown = set(lineage.unknown(doc))  # Gemini knew them not (404): no end to report
    members = []
    for ref in refs:
        output = output_location(archives.get(ref.name))
        chunks = chunks_of(runner.sink, output) if output is not None else None
        held = chunks_of(runner.sink, ref.input) if ref.input else None
        if chunks is None and held is not None and ref.name not in unknown:
            record = runner.store.get(ref.name)
            if record is not None and record.terminal and record.state is not State.SUCCEEDED:
                chunks = ended_whole(record, held, cap)
        members.append(Member(attempt=ref.attempt, name=ref.name, output=chunks, input=held))
    digest = hashlib.sha256()
    prefix = prefix_of(root)
    with runner.sink.open(f"{prefix}/{FINAL_KEY}", name=root.name) as out:

        def write(data: bytes) -> None:
            out.write(data)
            digest.update(data)

        ledger = write_final(members, chunks_of(runner.sink, location), write, cap)
        stored = out.commit(digest.hexdigest())
    summary = ledger.as_dict()
    summary["cost"] = lineage_cost(
        [r.name for r in refs],
        {name: (a.as_dict() if a is not None else None) for name, a in archives.items()},
    )
    stopped = doc.get("stopped")
    document = json.dumps(
        {
            "name": root.name,
            "lineage": [r.name for r in refs],
            **summary,
            # output lines left out: not strict JSON objects; a key the member was not given
            "unreadable": ledger.unreadable,
            "foreign": ledger.foreign,
            "location": stored.location,
            "stopped": stopped if isinstance(stopped, str) else None,
        },
        sort_keys=True,
        indent=1,
    ).encode()
    with runner.sink.open(f"{prefix}/{FINAL_LEDGER_KEY}", name=root.name) as out:
        out.write(document)
        out.commit(hashlib.sha256(document).hexdigest())
    doc["final"] = {"status": lineage.FINAL, "location": stored.location, **summary}
    runner.write(root, state, doc, status=RETRY_DONE, due_ns=0)
    runner.result.final += 1
    count("ResultsFinal")
    if summary["cost"]["retries_usd"] is not None:
        count("RetryCostUSD", float(summary["cost"]["retries_usd"]))
    left_out = {"unreadable": ledger.unreadable, "foreign": ledger.foreign}
    log_fields(logger.info, "results final", {"name": root.name, **summary["rows"], **left_out})
    if runner.on_final is not None:
        runner.on_final(root.name)


def ended_whole(
    record: OpRecord, held: Callable[[], Iterable[bytes]], max_line_bytes: int
) -> Callable[[], Iterable[bytes]]:
    """The output a batch that ended FAILED, EXPIRED or CANCELLED as a whole (no output of
    its own) stands for in the final merge: one failed row per key of its input, its code
    the batch's end (``EXPIRED`` for an expired one) and the batch named in the message, so
    that a key no later attempt answered shows what happened to it (not ``missing``)."""
    ended = "EXPIRED" if record.details.get("reason") == "expired" else str(record.state)
    said = record.details.get("error_message")
    message = f"the batch {record.name} ended {ended} as a whole" + (
        f": {said[:MAX_MESSAGE_CHARS]}" if isinstance(said, str) and said else ""
    )

    def chunks() -> Iterator[bytes]:
        for line in lines_of(held(), max_line_bytes):
            key = key_of(line)
            if key is not None:
                row = {"key": key, "error": {"code": ended, "message": message}}
                yield dumps(row).encode("utf-8") + b"\n"

    return chunks


def output_location(archive: ArchiveState | None) -> str | None:
    """The archived batch output (``output.jsonl``) of an archive state, or None."""
    if archive is None or archive.status != "archived":
        return None
    objects = archive.summary.get("objects")
    for item in objects if isinstance(objects, list) else []:
        location = item.get("location") if isinstance(item, Mapping) else None
        if isinstance(location, str) and location.endswith(f"/{OUTPUT_OBJECT}"):
            return location
    return None


def lines_of(chunks: Iterable[bytes], max_line_bytes: int) -> Iterator[bytes]:
    return lines(chunks, max_line_bytes, skip_long=True)
