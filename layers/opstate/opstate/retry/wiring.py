"""Wiring: settings -> store + sink + google-genai client -> one retry pass, or one submit."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from opstate.config import ConfigError, Settings
from opstate.domain.retry import RetryPolicy
from opstate.gemini.port import GeminiClient
from opstate.outcomes.sink import Sink
from opstate.retry.engine import retry_once
from opstate.retry.job_submit import JobSubmitted, submit_job
from opstate.retry.passes import RetryConfig, RetryResult
from opstate.retry.rules import parse_table
from opstate.retry.submit import ProgressHook, Submitted, submit
from opstate.store.port import RetryPassStore, Store

MiB = 1024 * 1024


def config_from(settings: Settings) -> RetryConfig:
    """The pass's settings (``OPSTATE_RETRY_*``, the results' line cap)."""
    return RetryConfig(
        table=parse_table(settings.retry_transient),
        max_rows=settings.retry_max_rows,
        max_batches=settings.retry_max_batches,
        check_s=settings.retry_check_s,
        lease_s=settings.retry_lease_s,
        max_line_bytes=settings.results_max_line_mib * MiB,
        max_active_lineages=settings.retry_max_active_lineages,
        max_batches_per_hour=settings.retry_max_batches_per_hour,
        input_prefixes=settings.retry_input_prefixes,
        daily_budget_usd=settings.retry_daily_budget_usd,
        submit_caps=settings.submit_enqueued_tokens,
        submit_max_batches=settings.submit_max_batches,
    )


@contextmanager
def _opened(
    settings: Settings, store: Store | None
) -> Iterator[tuple[RetryPassStore, Sink, GeminiClient]]:
    """The configured store (unless given), the results sink and a google-genai client (the
    archiver's per-read timeout, no SDK retries); what was opened here is closed after."""
    from opstate.gemini.client import make_client
    from opstate.outcomes.wiring import results_url_for, sink_from_url
    from opstate.store import store_from_url

    sink = sink_from_url(results_url_for(settings), settings)
    used = store if store is not None else store_from_url(settings.store_url, settings)
    try:
        kept = pass_store(used)
        client = make_client(settings, timeout_s=settings.results_http_timeout_s)
        try:
            yield kept, sink, client
        finally:
            client.close()
    finally:
        if store is None:
            used.close()


def pass_store(store: Store) -> RetryPassStore:
    """``store`` as a retry pass uses it (narrowed at the edge, as ``check_keepable`` does);
    ``ConfigError`` for a store that keeps no retry states, archive states or counters (every
    store of this package keeps them)."""
    if not isinstance(store, RetryPassStore):
        raise ConfigError(f"{type(store).__name__} keeps no retry states: no retry pass on it")
    return store


def retry_from_settings(
    settings: Settings,
    remaining_s: Callable[[], float] | None = None,
    *,
    store: Store | None = None,
    names: list[str] | None = None,
    on_final: Callable[[str], None] | None = None,
    every: bool = False,
) -> RetryResult:
    """One pass over the configured store (unless given), the sink and a client."""
    with _opened(settings, store) as (used, sink, client):
        return retry_once(
            used,
            sink,
            client,
            config_from(settings),
            remaining_s=remaining_s,
            safety_s=settings.reconcile_safety_margin_s,
            names=names,
            on_final=on_final,
            every=every,
        )


def submit_from_settings(
    settings: Settings,
    *,
    source: str,
    model: str,
    policy: RetryPolicy,
    display_name: str = "",
    store: Store | None = None,
    progress: ProgressHook | None = None,
    feed: bool = True,
) -> Submitted | JobSubmitted:
    """``opstate submit`` and the submit function: keep, upload, create, track
    (``progress``: told each stage's bytes, ``retry.submit.ProgressHook``); an input
    larger than one batch allows is a job (``retry.job_submit``, docs/jobs.md), whose first
    feeding step runs at once unless ``feed`` is False (the submit function: feeding reads
    the kept input, which its role may not; the archiver's pass feeds the job, due now)."""
    from opstate.retry import solo_room
    from opstate.retry.inputs import source_chunks

    with _opened(settings, store) as (used, sink, client):
        tokens: list[int] = []

        def alone(estimate: int) -> bool:
            tokens.append(estimate)
            return solo_room.fits(used, settings, model, estimate)

        def as_job() -> JobSubmitted | None:
            return submit_job(
                used,
                sink,
                source_chunks(source),
                model=model,
                policy=policy,
                limits=settings,
                display_name=display_name,
                max_line_bytes=settings.results_max_line_mib * MiB,
                alone=alone if not tokens else lambda _: False,
            )

        job = as_job()
        if job is not None:
            if feed and job.parts > 1:  # a job of one part is held: the pass feeds it
                retry_once(used, sink, client, config_from(settings), names=[job.name], every=True)
            return job
        try:
            return submit(
                used,
                sink,
                client,
                source=source,
                model=model,
                policy=policy,
                display_name=display_name,
                max_line_bytes=settings.results_max_line_mib * MiB,
                progress=progress,
                reserve=lambda: solo_room.take(used, settings, model, tokens[-1] if tokens else 1),
            )
        except Exception as exc:
            # No room by opstate's count, or a full queue at Gemini: a job of one part, held.
            if not isinstance(exc, solo_room.NoRoom) and not solo_room.queue_full(exc):
                raise
        held = as_job()
        assert held is not None
        return held


def roots_of(store: Store, names: list[str]) -> list[str]:
    """The roots whose lineage ``names`` belong to (a child: its root; a root: itself), for a
    pass over the operations a bus trigger named (``GetItem``s, no listing)."""
    from opstate.store.retry_state import RETRY_ACTIVE, RETRY_MEMBER

    roots: list[str] = []
    kept = pass_store(store)
    for name in names:
        state = kept.get_retry(name)
        if state is None:
            continue
        if state.status == RETRY_ACTIVE:
            roots.append(name)
            job = state.doc.get("partOf")  # a job's part (issue 46): its job feeds on
            if isinstance(job, str) and job.startswith("jobs/"):
                roots.append(job)
        elif state.status == RETRY_MEMBER:
            found = state.doc.get("lineage")
            root = found.get("root") if isinstance(found, dict) else None
            if isinstance(root, str) and root:
                roots.append(root)
    return list(dict.fromkeys(roots))


def submit_request(
    settings: Settings, event: Any, invoke: Callable[[str, bytes], None] | None = None
) -> dict[str, Any]:
    """The submit function's event (``{"submit": {...}}``) submitted (``submit_event``);
    ``SubmitRefusedError`` for any other event (nothing created). A job is handed to the
    archiver at once (``outcomes.redrive.nudge``, through ``invoke``: its pass creates the
    parts), not left for the re-drive's 15-minute cadence."""
    if not isinstance(event, dict) or set(event) != {"submit"}:
        raise SubmitRefusedError(
            'the submit function takes {"submit": {"input": "s3://...", "model": ...}}'
        )
    submitted = submit_event(settings, event["submit"])
    name = submitted.get("name")
    if isinstance(name, str) and name.startswith("jobs/"):
        from opstate.outcomes.redrive import nudge

        nudge(settings, name, invoke=invoke)
    return submitted


def submit_event(settings: Settings, request: Any) -> dict[str, Any]:
    """The submit function's request (``{"input": "s3://...", "model", "displayName",
    "retry": {...}}``, docs/retry.md) submitted; ``SubmitRefusedError`` when it is not one
    this system accepts (nothing created)."""
    from opstate.domain.parts import SplitError
    from opstate.domain.retry import InvalidRetryError, parse_retry
    from opstate.retry.inputs import InputError
    from opstate.retry.jobs import PlanError
    from opstate.retry.policy import settings_policy

    if not isinstance(request, dict):
        raise SubmitRefusedError("'submit' must be a JSON object")
    unknown = sorted(set(request) - {"input", "model", "displayName", "retry"})
    if unknown:
        raise SubmitRefusedError(f"'submit' has unknown keys {unknown}")
    source, model = _submit_input(settings, request.get("input")), request.get("model")
    if not isinstance(model, str) or not model.strip():
        raise SubmitRefusedError("'submit.model' must name a model")
    display = request.get("displayName", "")
    if not isinstance(display, str):
        raise SubmitRefusedError("'submit.displayName' must be text")
    try:
        defaults = settings_policy(settings)  # no "retry": the default as it is (0: off)
        policy = parse_retry(request["retry"], defaults) if "retry" in request else defaults
    except InvalidRetryError as exc:
        raise SubmitRefusedError(str(exc)) from None
    try:
        done = submit_from_settings(
            settings, source=source, model=model, policy=policy, display_name=display, feed=False
        )
    except (InputError, SplitError, PlanError) as exc:
        raise SubmitRefusedError(f"nothing submitted: {exc}") from None
    return done.as_dict() | {"retry": policy.as_doc()}


def _submit_input(settings: Settings, source: object) -> str:
    """A submit request's input: an object under ``incoming/`` of the results bucket
    (``OPSTATE_RESULTS_URL``'s), as the function's role says too: never someone's kept input
    or output under ``results/`` (issue 38). ``SubmitRefusedError`` otherwise."""
    from opstate.retry.authority import incoming_prefix, input_allowed
    from opstate.retry.inputs import source_chunks

    if not isinstance(source, str) or not source.startswith("s3://"):
        raise SubmitRefusedError("'submit.input' must be an s3://BUCKET/KEY of a JSONL file")
    try:
        source_chunks(source)  # only parses it: s3://BUCKET alone names no object
    except ValueError as exc:
        raise SubmitRefusedError(str(exc)) from None
    incoming = incoming_prefix(settings.results_url)
    if incoming is None:
        raise SubmitRefusedError("the submit function keeps inputs in S3: OPSTATE_RESULTS_URL")
    if not input_allowed(source, (incoming,)):
        raise SubmitRefusedError(f"'submit.input' must be an object under {incoming}")
    return source


class SubmitRefusedError(ValueError):
    """A submit request this system does not accept: nothing was created."""
