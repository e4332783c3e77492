"""Submitting a batch through opstate, so its input is ours (``opstate submit``, the submit
function; docs/retry.md, "Submit").

Gemini never gives an uploaded file back and deletes it after 48 hours, so the input is kept
first: every line is checked (a ``key`` and a ``request``, keys unique: a clear error naming
the first bad line, nothing created), then it is copied into the results sink at
``inputs/<sha256>/input.jsonl`` (written again even when there: nothing kept is read back,
so the submit function's role needs no read of ``results/inputs/``). Then it is uploaded with
the Files API from the source itself, through the sha256 the check found (a source changed
since fails the upload before it finalizes), the batch is created with ``batches.create`` and
tracked, with its policy and its input beside it.

A crash between the create and the store write is survived the way a retry child's is: a
marker object (``inputs/<sha256>/submit-<id>.json``, the id derived from the input's sha256,
the model and the display name given) is written before the upload (the claim: its time),
then again with the upload's file name before the create. Submitting again with the same
input, model and display name finds the marker, looks for a batch whose input is the upload
it recorded and tracks that one instead of creating a second, when ``opstate.retry.adoption``
holds (its input is that upload, the model, ``createTime`` after the claim) and the upload's
own ``sha256Hash`` is the kept input's (the marker sits in the results storage, which a
bucket writer may reach). A marker of the previous release (no upload recorded) is searched
by the submit id in display names, adopted only on that sha256. (So the same input is
submitted twice on purpose only with another ``--display-name``.)

The batch's display name carries the submit id (``acting.ours`` reads it before a cancel);
the upload's is ``UPLOAD_DISPLAY_NAME``. Neither is evidence of anything: every key of the
project can read and copy both.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from opstate.domain.model import OpEvent, OpRecord
from opstate.domain.retry import RetryPolicy, policy_of
from opstate.domain.times import format_time
from opstate.gemini.errors import GatewayError, classify
from opstate.gemini.files import is_file_name
from opstate.gemini.port import GeminiClient
from opstate.gemini.submit import (
    create_or_delete,
    delete_file,
    find_by_display_id,
    find_by_input_file,
    upload_jsonl,
)
from opstate.ingest import ingest
from opstate.observability import log_fields, logger
from opstate.outcomes.sink import Sink
from opstate.retry import adoption, room, solo_room
from opstate.retry.acting import read_job
from opstate.retry.authority import VIA_SUBMIT
from opstate.retry.inputs import InputError, KeptInput, keep_input, source_chunks, verified
from opstate.retry.policy import attach_policy
from opstate.store.port import RetryingStore

# ``progress(stage, done, total)``: the bytes of the input a stage has read so far, for a caller
# that shows them (``opstate submit``'s bars, opstate.cli.progress); stages "checking" and
# "keeping" (the input's two reads into the sink, total None), "uploading" (total: its bytes).
# Called in the submitting thread between chunks; it must return quickly and never raise.
ProgressHook = Callable[[str, int, int | None], None]
MAX_DISPLAY_NAME_CHARS = 100
# The display name of a submitted input's upload: the project sees it, so it says nothing.
UPLOAD_DISPLAY_NAME = "opstate-submit"
# The largest marker object read back (it holds a few short fields).
MAX_MARKER_BYTES = 4096
# How long a re-run's search for the batch an earlier call created may take (seconds).
SEARCH_SECONDS = 120.0


@dataclass(frozen=True, slots=True)
class Submitted:
    """A submitted batch: its name and state, whether this call created it (False: found
    after an earlier call that crashed or ran before), and its kept input."""

    name: str
    state: str
    created: bool
    input: KeptInput
    display_name: str

    def as_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "state": self.state,
            "created": self.created,
            "displayName": self.display_name,
            "input": {
                "location": self.input.location,
                "sha256": self.input.sha256,
                "rows": self.input.rows,
                "bytes": self.input.bytes,
            },
        }


def submit_id(sha256: str, model: str, display_name: str) -> str:
    """The id a submission's display name carries (``opstate-s-<16 hex>``)."""
    digest = hashlib.sha256(f"{sha256}\0{model}\0{display_name}".encode()).hexdigest()
    return f"opstate-s-{digest[:16]}"


def submit(
    store: RetryingStore,
    sink: Sink,
    client: GeminiClient,
    *,
    source: str,
    model: str,
    policy: RetryPolicy,
    display_name: str = "",
    max_line_bytes: int = 32 * 1024 * 1024,
    clock_ns: Callable[[], int] = time.time_ns,
    progress: ProgressHook | None = None,
    reserve: Callable[[], Mapping[str, Any] | None] | None = None,
) -> Submitted:
    """Keep, upload, create and track (see the module docstring). ``InputError`` for a bad
    input (nothing created), ``GatewayError`` when Gemini refused or failed. ``progress``:
    told the bytes each stage has read (``ProgressHook``). ``reserve``: takes the batch's room
    in the project's queue before its upload (``solo_room.take``; None: no room, and
    ``solo_room.NoRoom`` is raised with nothing sent)."""
    if not model.strip():
        raise ValueError("a model is required (--model)")
    read: Callable[[], Iterable[bytes]] = source_chunks(source)
    reads = read if progress is None else _reported(read, progress, ("checking", "keeping"))
    # Never read back from the results (the submit function's role reads no kept input): kept
    # again, and uploaded from the source itself through the sha256 the check found.
    kept = keep_input(reads, sink, max_line_bytes, reuse=False)
    marker_id = submit_id(kept.sha256, model, display_name)
    shown = f"{display_name[:MAX_DISPLAY_NAME_CHARS]} {marker_id}".strip()
    marker = f"inputs/{kept.sha256}/submit-{marker_id}.json"
    earlier = _read_marker(sink, marker)
    event = _found(client, marker_id, earlier, model, kept.sha256) if earlier is not None else None
    created = event is None
    # The batch's room: one an earlier call of this submit recorded (it died before the
    # create, or without its answer), else taken now.
    held: Mapping[str, Any] | None = room.reservation((earlier or {}).get(solo_room.RESERVED))
    if event is None:
        if held is None and reserve is not None:
            held = reserve()
            if held is None:
                raise solo_room.NoRoom(f"no room for {model}'s batch by opstate's count")
        event = _create(
            (store, sink, client),
            lambda: _counted(
                verified(read(), kept.sha256, f"the input {source}"),
                progress,
                "uploading",
                kept.bytes,
            ),
            (marker, model, shown),
            kept.bytes,
            earlier,
            held,
            clock_ns(),
        )
    decision = ingest(store, event)
    record = decision.record or store.get(event.name)
    assert record is not None
    if not created:
        _same_policy(store, record, policy)
    _keep_state(store, record, policy, model, kept, clock_ns(), marker_id)
    if held:
        solo_room.record(store, record.name, record.created_ns, held)
    log_fields(
        logger.info,
        "batch submitted" if created else "submitted batch found again",
        {"name": record.name, "rows": kept.rows, "input": kept.location},
    )
    return Submitted(record.name, str(record.state), created, kept, shown)


def _create(
    at: tuple[RetryingStore, Sink, GeminiClient],
    chunks: Callable[[], Iterable[bytes]],
    marked: tuple[str, str, str],
    size: int,
    earlier: Mapping[str, Any] | None,
    held: Mapping[str, Any] | None,
    claimed: int,
) -> OpEvent:
    """Upload ``chunks`` and create the batch, the marker written before each (with the
    batch's room ``held``, given back when no batch was made)."""
    store, sink, client = at
    marker, model, shown = marked
    _write_marker(sink, marker, model, shown, claimed, held=held)
    asked, file_name = False, None
    try:
        file_name = upload_jsonl(
            client, chunks=chunks(), size=size, display_name=UPLOAD_DISPLAY_NAME
        )
        _write_marker(sink, marker, model, shown, claimed, file_name, held=held)
        old = (earlier or {}).get("file")
        if isinstance(old, str) and is_file_name(old) and old != file_name:
            delete_file(client, old)  # nothing was found on it: never adopted now
        asked = True
        return create_or_delete(client, model, file_name, shown)
    except Exception as exc:
        error = exc if isinstance(exc, (GatewayError, InputError)) else classify(exc)
        status = error.status if isinstance(error, GatewayError) else None
        if live_held(held) and (not asked or (status is not None and 400 <= status < 500)):
            # No batch was made: the marker forgets the room, then it is given back.
            _write_marker(sink, marker, model, shown, claimed, file_name)
            solo_room.give_back(store, held)
        if error is exc:
            raise
        raise error from exc


def _counted(
    chunks: Iterable[bytes], progress: ProgressHook | None, stage: str, total: int | None
) -> Iterable[bytes]:
    """``chunks`` as they are, each one's bytes told to ``progress`` (when given)."""
    if progress is None:
        return chunks

    def told() -> Iterator[bytes]:
        done = 0
        progress(stage, 0, total)
        for chunk in chunks:
            done += len(chunk)
            progress(stage, done, total)
            yield chunk

    return told()


def _reported(
    reads: Callable[[], Iterable[bytes]], progress: ProgressHook, stages: tuple[str, ...]
) -> Callable[[], Iterable[bytes]]:
    """``reads`` (a fresh stream per call), the n-th call's bytes told as ``stages[n]``
    (a read past the named stages, e.g. naming a repeated key, as "reading")."""
    calls = iter(stages)

    def read() -> Iterable[bytes]:
        return _counted(reads(), progress, next(calls, "reading"), None)

    return read


class PolicyChangedError(ValueError):
    """The same input, model and display name submitted again with another retry policy:
    nothing is changed (the kept policy changes only through ``opstate track``)."""


def _same_policy(store: RetryingStore, record: OpRecord, policy: RetryPolicy) -> None:
    """Refuse a submit found again whose policy differs from the one kept beside it."""
    state = store.get_retry(record.name)
    if state is None or state.created_ns != record.created_ns:
        return  # the earlier call stopped before keeping it: this one keeps its policy
    kept = policy_of(state.doc).as_doc()
    if kept != policy.as_doc():
        raise PolicyChangedError(
            f"{record.name} was already submitted from this input with the retry policy "
            f"{json.dumps(kept, sort_keys=True)}; nothing changed (this call asked "
            f"{json.dumps(policy.as_doc(), sort_keys=True)}). To change the kept policy: "
            f"opstate track {record.name} --retry-attempts N [--resubmit-expired] "
            "[--pending-timeout-hours H]; to submit it again as another batch: --display-name"
        )


def _found(
    client: GeminiClient, marker_id: str, earlier: Mapping[str, Any], model: str, sha256: str
) -> OpEvent | None:
    """The batch an earlier call created under ``marker_id`` (whose marker said ``earlier``):
    each job the listing names is read itself and counts only on the evidence of the module
    docstring. A search cut short (``SearchCutError``: page cap, repeated token,
    ``SEARCH_SECONDS``) raises: nothing is created on an unfinished search."""
    until = time.monotonic() + SEARCH_SECONDS

    def left() -> float:
        return until - time.monotonic()

    recorded = earlier.get("file")
    at = earlier.get("atNs")
    after = at if isinstance(at, int) and not isinstance(at, bool) and at > 0 else None
    try:
        if isinstance(recorded, str) and is_file_name(recorded):
            claim = adoption.Claim(recorded, model, after, sha256)
            names = find_by_input_file(client, recorded, time_left=left)
        else:  # a marker of the previous release: no upload recorded
            claim = adoption.Claim(None, model, after, sha256)
            names = find_by_display_id(client, marker_id, time_left=left)
        jobs = [read_job(client, name) for name in dict.fromkeys(names)]
        events = []
        for job in jobs:
            if job.event is None or (claim.file is None and not job.carries(marker_id)):
                continue
            why = adoption.refusal(client, job, claim)
            if why is not None:
                log_fields(
                    logger.error,
                    "a batch found for a submit is not adopted",
                    {"id": marker_id, "name": job.name, "why": why},
                )
                continue
            events.append(job.event)
    except GatewayError:
        raise
    except Exception as exc:
        raise classify(exc) from exc
    return min(events, key=lambda e: e.name) if events else None


def _read_marker(sink: Sink, key: str) -> Mapping[str, Any] | None:
    """The marker an earlier call wrote (``{}`` when unreadable: searched as the previous
    release's), or None when there is none."""
    data = sink.read(key, MAX_MARKER_BYTES)
    if data is None:
        return None
    try:
        found = json.loads(data)
    except ValueError:
        return {}
    return found if isinstance(found, Mapping) else {}


def live_held(held: Mapping[str, Any] | None) -> bool:
    return room.reservation(held) is not None


def _write_marker(
    sink: Sink,
    key: str,
    model: str,
    shown: str,
    now_ns: int,
    file_name: str | None = None,
    *,
    held: Mapping[str, Any] | None = None,
) -> None:
    fields: dict[str, Any] = {
        "model": model,
        "displayName": shown,
        "at": format_time(now_ns),
        "atNs": now_ns,
    }
    if file_name is not None:
        fields["file"] = file_name
    if live_held(held):
        fields[solo_room.RESERVED] = dict(held or {})
    data = json.dumps(fields, sort_keys=True).encode()
    with sink.open(key, name=shown) as out:
        out.write(data)
        out.commit(hashlib.sha256(data).hexdigest())


def _keep_state(
    store: RetryingStore,
    record: OpRecord,
    policy: RetryPolicy,
    model: str,
    kept: KeptInput,
    now_ns: int,
    marker_id: str,
) -> None:
    """The policy and the input beside the record: an active root when the policy asks for
    anything, else a ``done`` state that still names the input (a later ``opstate track
    --retry-attempts N`` uses it)."""
    attach_policy(
        store,
        record,
        policy,
        model=model,
        now_ns=now_ns,
        via=VIA_SUBMIT,
        kept_input=kept.as_dict(),
        submit_id=marker_id,
    )
