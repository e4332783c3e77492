"""What opstate acts on (issue 38; docs/retry.md, "What opstate acts on"): Gemini's own word
about a job, read right before a create or a cancel, never a report, a PUT or a webhook.

- ``read_job``: the job's REST resource (``GET batches/{id}``, what ``batches.get`` reads,
  through the client's own request path) as a ``Job``: its event (state, details), the model
  it runs on, its display name, its input file and Gemini's ``createTime``; a name Gemini
  answers 404 for is a ``Job`` that is not ``found`` (retry for it is ``unavailable``,
  never "expired");
- ``whole_evidence``: whether Gemini's state now allows resubmitting a member whole: EXPIRED
  (with ``resubmitExpired``, or after opstate cancelled it), CANCELLED only when opstate
  cancelled it, FAILED as a whole for a retry child;
- ``ours``: whether a job is one opstate created (a submitted root: its display name carries
  the submit id opstate kept; a retry child: its input is the upload its plan recorded);
  only those are ever cancelled, and never before ``MIN_PENDING_TIMEOUT_HOURS`` after
  Gemini's ``createTime``; a lineage cancels at most ``MAX_CANCELS_PER_LINEAGE`` batches.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from opstate.domain.events import EventError
from opstate.domain.events_parsing import sdk_time
from opstate.domain.model import OpEvent
from opstate.domain.retry import MIN_PENDING_TIMEOUT_HOURS
from opstate.domain.states import State
from opstate.domain.times import NS_PER_SECOND
from opstate.gemini.batches import input_file_of, rest_batch_event, rest_resource
from opstate.gemini.errors import GatewayError, classify
from opstate.gemini.port import GeminiClient
from opstate.outcomes.sink import Sink
from opstate.retry import lineage

# Cancels for a pending timeout one lineage may send; the next one due stops the lineage.
MAX_CANCELS_PER_LINEAGE = 3
# The id ``opstate submit`` puts in a batch's display name (``opstate.retry.submit``).
SUBMIT_ID = re.compile(r"opstate-s-[0-9a-f]{16}")


@dataclass(frozen=True, slots=True)
class Job:
    """A batch as Gemini answered for it just now (``event`` None: it answered 404)."""

    name: str
    event: OpEvent | None
    model: str | None = None
    display_name: str = ""
    created_ns: int | None = None
    input_file: str = ""  # metadata.inputConfig.fileName ("": an inlined input)

    @property
    def found(self) -> bool:
        return self.event is not None

    @property
    def state(self) -> State | None:
        return self.event.state if self.event is not None else None

    @property
    def expired(self) -> bool:
        return (
            self.event is not None
            and self.event.state is State.FAILED
            and self.event.details.get("reason") == "expired"
        )

    def carries(self, marker: str) -> bool:
        """Whether the job's own display name holds ``marker`` as one of its words."""
        return bool(marker) and marker in self.display_name.split()


def read_job(client: GeminiClient, name: str) -> Job:
    """Batch ``name`` as Gemini says now (module doc). ``GatewayError`` for a failed read other
    than a 404 (``transient`` when worth trying again), and for a resource this release cannot
    read (non-transient)."""
    try:
        body = rest_resource(client, name)
    except Exception as exc:
        error = exc if isinstance(exc, GatewayError) else classify(exc)
        if error.status == 404:
            return Job(name, None)
        raise error from exc
    metadata = body.get("metadata")
    metadata = metadata if isinstance(metadata, Mapping) else {}
    try:
        event = rest_batch_event(body)
    except EventError as exc:
        raise GatewayError(f"Gemini's answer for {name} is not readable: {exc}") from None
    model = metadata.get("model")
    display = metadata.get("displayName")
    try:
        created = sdk_time(metadata.get("createTime"))
    except (EventError, ValueError, TypeError):
        created = None
    return Job(
        name,
        event,
        model if isinstance(model, str) and model else None,
        display if isinstance(display, str) else "",
        created or None,
        input_file_of(body),
    )


def gone_reason(name: str) -> str:
    return f"Gemini knows no batch {name} (404): nothing is resubmitted for it"


def whole_evidence(job: Job, attempt: int, cancelled_by_us: bool, resubmit_expired: bool) -> bool:
    """Whether Gemini's state of member ``job`` (attempt ``attempt``) allows resubmitting it
    whole now: EXPIRED with ``resubmitExpired`` or after opstate cancelled it, CANCELLED only
    when opstate cancelled it, FAILED as a whole (not expired) for a retry child."""
    if job.expired:
        return resubmit_expired or cancelled_by_us
    if job.state is State.CANCELLED:
        return cancelled_by_us
    return job.state is State.FAILED and attempt >= 1


def pending_limit_ns(hours: float) -> int:
    """A policy's pending timeout in ns, never below ``MIN_PENDING_TIMEOUT_HOURS`` (a stored
    policy from before the floor is clamped to it)."""
    return int(max(hours, MIN_PENDING_TIMEOUT_HOURS) * 3600 * NS_PER_SECOND)


def old_enough(job: Job, now_ns: int, limit_ns: int) -> bool:
    """Whether ``job`` is pending past ``limit_ns`` since Gemini's ``createTime`` (False when
    Gemini gave none: no cancel without it)."""
    return job.created_ns is not None and now_ns - job.created_ns >= limit_ns


def ours(doc: Mapping[str, Any], ref: lineage.MemberRef, job: Job, sink: Sink) -> bool:
    """Whether opstate created ``job`` (member ``ref`` of the root whose doc is ``doc``): a
    retry child whose input is the upload its plan recorded before its create (one the
    previous release created: whose own display name carries the id its plan gave it); a root
    submitted by opstate whose display name carries the submit id kept beside it
    (``submitId``), or, for a root submitted by the previous release (no ``submitId``), a
    submit id whose marker opstate wrote beside the kept input
    (``inputs/<sha256>/submit-<id>.json``)."""
    if ref.attempt >= 1:
        entry = next((c for c in lineage.children(doc) if c.get("name") == ref.name), None)
        if entry is None:
            return False
        upload = lineage.upload_of(entry)
        if upload is not None:
            return job.input_file == upload
        return job.carries(str(entry["id"]))  # created by the previous release
    submitted = doc.get("submitId")
    if isinstance(submitted, str) and submitted:
        return job.carries(submitted)
    sha256 = lineage.input_of(doc).get("sha256")
    if not isinstance(sha256, str) or not re.fullmatch(r"[0-9a-f]{64}", sha256):
        return False
    for word in job.display_name.split():
        if SUBMIT_ID.fullmatch(word) and sink.head(f"inputs/{sha256}/submit-{word}.json"):
            return True
    return False
