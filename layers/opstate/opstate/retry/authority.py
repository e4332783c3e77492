"""Who asked opstate to act, and which inputs it may read for them (issue 38; docs/security.md,
"Acting"). Pure: no store, no settings object, no I/O.

- **Provenance.** Every retry state a policy is attached to records how it came (``via``):
  ``api`` (``PUT /operations`` by a caller holding the retry right), ``cli`` (``opstate track``
  on the store: the operator) or ``submit`` (``opstate submit``, the submit function). A state
  the previous release wrote has none.
- **What a policy may do** (``acting_policy``): a policy with a provenance acts as written. One
  without (attached before this release, when every caller of ``PUT /operations`` could attach
  one) keeps retrying failed rows, but resubmits nothing whole and cancels nothing until an
  operator attaches it again (``opstate track NAME --retry-attempts N ...``).
- **Inputs over HTTP** (``input_allowed``): an ``s3://`` URI under one of the configured
  prefixes (``OPSTATE_RETRY_INPUT_PREFIXES``); the submit function's under the results
  bucket's ``incoming/`` (``incoming_prefix``), checked on the key as the reader decodes it.
  A refusal tells the caller only ``INPUT_UNUSABLE``; the log says why.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import replace
from typing import Any
from urllib.parse import unquote, urlsplit

from opstate.domain.retry import RetryPolicy, policy_of

VIA_API = "api"
VIA_CLI = "cli"
VIA_SUBMIT = "submit"
VIAS = (VIA_API, VIA_CLI, VIA_SUBMIT)
# Attached by the operator on the store (or through the submit function, whose invokers hold
# lambda:InvokeFunction): an input they name is read wherever it is.
OPERATOR_VIAS = (VIA_CLI, VIA_SUBMIT)
INPUT_UNUSABLE = "input unusable"
NOT_UNDER = (
    "is not under OPSTATE_RETRY_INPUT_PREFIXES (named over HTTP, or by a policy kept before its "
    "provenance was): never read"
)
INCOMING = "incoming/"


def provenance(doc: Mapping[str, Any]) -> str | None:
    """How the policy of a root's retry state was attached (None: not recorded)."""
    via = doc.get("via")
    return via if isinstance(via, str) and via in VIAS else None


def acting_policy(doc: Mapping[str, Any]) -> RetryPolicy:
    """The policy the retry pass acts on: the kept one; without a provenance (the previous
    release's) neither ``resubmitExpired`` nor ``pendingTimeoutHours`` (module doc)."""
    policy = policy_of(doc)
    if provenance(doc) is not None:
        return policy
    return replace(policy, resubmit_expired=False, pending_timeout_hours=None)


def withheld(doc: Mapping[str, Any]) -> bool:
    """Whether ``acting_policy`` withholds something the kept policy asks for."""
    return acting_policy(doc) != policy_of(doc)


def _segments_ok(key: str) -> bool:
    return all(part not in ("", ".", "..") for part in key.split("/"))


def input_allowed(uri: str, prefixes: Iterable[str]) -> bool:
    """Whether ``uri`` is an ``s3://BUCKET/KEY`` under one of ``prefixes`` (each
    ``s3://BUCKET/`` or ``s3://BUCKET/PATH/``, as the settings normalise them), its key without
    an empty, ``.`` or ``..`` segment. Checked on the key as it will be read: the reader
    (``opstate.retry.inputs.source_chunks``) percent-decodes it once, so the decoded key is
    the one whose segments and prefix are checked (``incoming/%2e%2e/results/...`` is
    ``incoming/../results/...``: refused), and the URI as given must pass too. No prefixes: no
    input is allowed."""
    parts = urlsplit(uri)
    if parts.scheme != "s3" or not parts.netloc or parts.query or parts.fragment:
        return False
    bucket = f"s3://{parts.netloc}/"
    if not uri.startswith(bucket):
        return False
    key = uri[len(bucket) :]
    read = unquote(key)  # what source_chunks reads
    if not key or not _segments_ok(key) or not read or not _segments_ok(read):
        return False
    return any(
        prefix.endswith("/") and uri.startswith(prefix) and f"{bucket}{read}".startswith(prefix)
        for prefix in prefixes
    )


def incoming_prefix(results_url: str | None) -> str | None:
    """``s3://BUCKET/incoming/`` of the bucket ``results_url`` names (the submit function's
    inputs); None when the results are not in S3."""
    if not results_url:
        return None
    parts = urlsplit(results_url)
    if parts.scheme != "s3" or not parts.netloc:
        return None
    return f"s3://{parts.netloc}/{INCOMING}"


def reads_input(doc: Mapping[str, Any], source: str, prefixes: Iterable[str]) -> bool:
    """Whether the retry pass may read ``source``, the input named by the policy of ``doc``:
    always for an operator's policy (``cli``, ``submit``); for one attached over HTTP only
    under ``prefixes``; for one without a provenance also a ``file://`` (the previous
    release's API refused those, so only its CLI could have named one)."""
    via = provenance(doc)
    if via in OPERATOR_VIAS:
        return True
    if via is None and source.startswith("file://"):
        return True
    return input_allowed(source, prefixes)
