"""Adopting a batch found after a create whose answer was lost (issue 47; docs/security.md,
"Acting").

``batches.create`` takes no idempotency key: after a timeout or a 5xx the batch may exist, and
the next pass looks for it before creating another. A display name is public to every key of
the project (``files.list`` and ``batches.list`` show it), so it is never evidence: another
producer could copy it onto a batch of its own, with its own input and answers. A found job is
adopted only on evidence no other producer can make:

- its input (``metadata.inputConfig.fileName``) is the upload this claim recorded in the store
  (or beside the kept input, for ``opstate submit``) before its create: a file Gemini named
  for us after the claim, so the job runs exactly the bytes opstate sent;
- it runs on the planned model (``models/`` or not);
- Gemini's ``createTime`` is after the claim that uploaded it.

A claim of the previous release recorded no upload: its job is found by its display name and
adopted only when its input file's own ``sha256Hash`` (``files.get``) is the planned input's
sha256 (same model, created after the claim when it was recorded): another producer would have
to send the very bytes opstate planned.
"""

from __future__ import annotations

from dataclasses import dataclass

from opstate.gemini.errors import GatewayError, classify
from opstate.gemini.files import file_info, is_file_name
from opstate.gemini.port import GeminiClient
from opstate.retry.acting import Job


@dataclass(frozen=True, slots=True)
class Claim:
    """What one claim planned and recorded before its create: the upload (``files/<id>``;
    None: a claim of the previous release), the model, when it was claimed (ns; None: not
    recorded) and the planned input's sha256 (hex; None: not recorded). With both an upload
    and a sha256 (a record kept where a bucket writer may reach), the upload's own
    ``sha256Hash`` is checked too."""

    file: str | None
    model: str | None
    after_ns: int | None
    sha256: str | None = None


def model_id(model: str | None) -> str:
    """A model's id with or without ``models/`` (Gemini answers ``models/<id>``)."""
    return (model or "").removeprefix("models/")


def refusal(client: GeminiClient, job: Job, claim: Claim) -> str | None:
    """Why ``job`` is not the batch ``claim`` created (None: it is, by the module's rules).
    ``GatewayError`` (transient) when the input file's own sha256 could not be read for a
    reason other than a 404."""
    if claim.file and job.input_file != claim.file:
        return f"its input {job.input_file or 'none'} is not the upload {claim.file} recorded"
    if not claim.file or claim.sha256:
        why = _same_bytes(client, job, claim.sha256)
        if why is not None:
            return why
    if claim.model and model_id(job.model) != model_id(claim.model):
        return f"it runs on {job.model or 'no model said'}, not {claim.model}"
    if claim.after_ns is not None and (job.created_ns is None or job.created_ns <= claim.after_ns):
        return "Gemini says it was created before the claim"
    return None


def _same_bytes(client: GeminiClient, job: Job, sha256: str | None) -> str | None:
    """Why ``job``'s input file does not hold the planned bytes (None: it does)."""
    if not sha256:
        return "no upload was recorded and no sha256 to check its input against"
    if not is_file_name(job.input_file):
        return "it has no input file"
    try:
        info = file_info(client, job.input_file)
    except Exception as exc:
        error = exc if isinstance(exc, GatewayError) else classify(exc)
        if error.status == 404:
            return f"its input file {job.input_file} is gone"
        raise error from exc
    if not info.sha256 or info.sha256 != sha256.lower():
        return f"its input file {job.input_file} does not hold the planned input"
    return None
