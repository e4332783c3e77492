"""Submitting a batch through opstate, so its input is ours (``opstate submit``, the submit
function; docs/retry.md, "Submit").

Gemini never gives an uploaded file back and deletes it after 48 hours, so the input is kept
first: every line is checked (a ``key`` and a ``request``, keys unique: a clear error naming
the first bad line, nothing created), then it is copied into the results sink at
``inputs/<sha256>/input.jsonl``. Then it is uploaded with the Files API, the batch is created
with ``batches.create`` and tracked, with its policy and its input beside it.

A crash between the create and the store write is survived the way a retry child's is: the
batch's display name carries a submit id derived from the input's sha256, the model and the
display name given, and a marker object (``inputs/<sha256>/submit-<id>.json``) is written
before the create. Submitting again with the same input, model and display name finds the
marker, looks for a batch carrying the id (each found job read itself) and tracks that one
instead of creating a second. (So the same input is submitted twice on purpose only with
another ``--display-name``.)
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from opstate.domain.model import OpEvent, OpRecord
from opstate.domain.retry import RetryPolicy, policy_of
from opstate.domain.times import format_time
from opstate.gemini.errors import GatewayError, classify
from opstate.gemini.port import GeminiClient
from opstate.gemini.submit import create_or_delete, find_by_display_id, upload_jsonl
from opstate.ingest import ingest
from opstate.observability import log_fields, logger
from opstate.outcomes.sink import Sink
from opstate.retry.acting import read_job
from opstate.retry.authority import VIA_SUBMIT
from opstate.retry.inputs import KeptInput, keep_input, source_chunks
from opstate.retry.policy import attach_policy
from opstate.store.port import RetryingStore

MAX_DISPLAY_NAME_CHARS = 100
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
) -> Submitted:
    """Keep, upload, create and track (see the module docstring). ``InputError`` for a bad
    input (nothing created), ``GatewayError`` when Gemini refused or failed."""
    if not model.strip():
        raise ValueError("a model is required (--model)")
    kept = keep_input(source_chunks(source), sink, max_line_bytes)
    marker_id = submit_id(kept.sha256, model, display_name)
    shown = f"{display_name[:MAX_DISPLAY_NAME_CHARS]} {marker_id}".strip()
    marker = f"inputs/{kept.sha256}/submit-{marker_id}.json"
    event = _found(client, marker_id) if sink.head(marker) is not None else None
    created = event is None
    if event is None:
        _write_marker(sink, marker, model, shown, clock_ns())
        try:
            file_name = upload_jsonl(
                client,
                chunks=sink.chunks(kept.location),
                size=kept.bytes,
                display_name=marker_id,
            )
            event = create_or_delete(client, model, file_name, shown)
        except GatewayError:
            raise
        except Exception as exc:
            raise classify(exc) from exc
    decision = ingest(store, event)
    record = decision.record or store.get(event.name)
    assert record is not None
    if not created:
        _same_policy(store, record, policy)
    _keep_state(store, record, policy, model, kept, clock_ns(), marker_id)
    log_fields(
        logger.info,
        "batch submitted" if created else "submitted batch found again",
        {"name": record.name, "rows": kept.rows, "input": kept.location},
    )
    return Submitted(record.name, str(record.state), created, kept, shown)


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


def _found(client: GeminiClient, marker_id: str) -> OpEvent | None:
    """The batch an earlier call created under ``marker_id``: each job the listing names is
    read itself and counts only when its own display name carries the id (issue 38). A search
    cut short (``SearchCutError``: page cap, repeated token, ``SEARCH_SECONDS``) raises:
    nothing is created on an unfinished search."""
    until = time.monotonic() + SEARCH_SECONDS
    try:
        names = find_by_display_id(client, marker_id, time_left=lambda: until - time.monotonic())
        jobs = [read_job(client, name) for name in dict.fromkeys(names)]
    except GatewayError:
        raise
    except Exception as exc:
        raise classify(exc) from exc
    events = [job.event for job in jobs if job.event is not None and job.carries(marker_id)]
    return min(events, key=lambda e: e.name) if events else None


def _write_marker(sink: Sink, key: str, model: str, shown: str, now_ns: int) -> None:
    data = json.dumps(
        {"model": model, "displayName": shown, "at": format_time(now_ns)}, sort_keys=True
    ).encode()
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
