"""``GET`` and ``PUT /operations/{name+}``: a record out, a report from the user's own producer
in; each request admitted by ``operations_auth`` before anything else.

The results view (``opstate.outcomes.results``) is imported by the first GET, the waiters code
by the first report that names a waiter, the retry policy (``opstate.domain.retry``,
``opstate.retry.policy``) by the first report with a ``"retry"`` object or the first view of a
record that has a retry state: none is needed at init (docs/api.md, "Cold start")."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, TypeGuard
from urllib.parse import unquote

from opstate.api.auth import OperationsAuth, RetryRight
from opstate.api.errors import ApiError, json_response, unavailable
from opstate.api.ingesting import Ingester
from opstate.api.lazy import OnFirstUse
from opstate.api.request import parse_json, raw_body
from opstate.api.router import Response
from opstate.config import DEFAULT_MAX_FUTURE_SKEW_S, RetrySettings
from opstate.domain.events import InvalidEventError, UnsupportedEventError, from_report
from opstate.domain.names import InvalidNameError, Kind, ParsedName, parse_name
from opstate.domain.routes import OPERATIONS_PREFIX
from opstate.domain.views import decision_to_json, record_to_json
from opstate.ingest import find_named
from opstate.observability import log_fields, logger
from opstate.store.port import RetryableError, RetryingStore, Store

if TYPE_CHECKING:
    from opstate.domain.model import Decision
    from opstate.domain.retry import RetryPolicy
    from opstate.waiters.model import Waiter
    from opstate.waiters.run import Registrar

# A route rule is a regular expression (``api.router``): ".+" is a greedy, slash-containing
# operation name.
OPERATIONS_ROUTE = OPERATIONS_PREFIX + ".+"


class OperationsRoutes:
    """The operations routes over ``store``; ``path`` is the request's path as the resolver
    sees it (its stage removed)."""

    __slots__ = (
        "clock_ns",
        "ingest",
        "max_bytes",
        "max_future_skew_s",
        "on_waiter",
        "operations_auth",
        "registrar",
        "retry_right",
        "retry_settings",
        "store",
    )

    def __init__(
        self,
        *,
        store: Store,
        ingest: Ingester,
        operations_auth: OperationsAuth,
        max_bytes: int,
        clock_ns: Callable[[], int],
        registrar: OnFirstUse[Registrar | None] | None = None,
        on_waiter: Callable[[str], None] | None = None,
        max_future_skew_s: float = DEFAULT_MAX_FUTURE_SKEW_S,
        retry_settings: RetrySettings | None = None,
        retry_right: RetryRight | None = None,
    ) -> None:
        # Attaching a retry policy is a right of its own (docs/security.md, "Acting"); None:
        # no caller has it.
        self.retry_right = retry_right
        self.max_future_skew_s = max_future_skew_s
        # The default policy a body's "retry" object fills its missing keys from.
        self.retry_settings = retry_settings if retry_settings is not None else RetrySettings()
        self.store = store
        self.ingest = ingest
        self.operations_auth = operations_auth
        self.max_bytes = max_bytes
        self.clock_ns = clock_ns
        # Waiters (docs/waiters.md): a registrar of None refuses a body's "waiter" (it is built
        # by the first report that names one: ``OnFirstUse``); ``on_waiter(name)`` runs
        # after a waiter was kept (the local server resumes at once; in AWS the waiters
        # table's stream does).
        self.registrar = registrar if registrar is not None else OnFirstUse.ready(None)
        self.on_waiter = on_waiter

    def get(self, event: Mapping[str, Any], path: str) -> Response:
        """The record (``views.record_to_json``) or 404."""
        self.operations_auth(event)
        parsed = _path_parsed(path)
        name = parsed.key
        try:
            # A video operation tracked before its key dropped the model, and a Cloud job keyed
            # with its location as written, are still found.
            record = find_named(self.store, parsed)
        except RetryableError as exc:
            raise unavailable(exc, name=name) from None
        if record is None:
            raise ApiError(404, "not-found", f"no operation named {name!r} is tracked")
        from opstate.outcomes.results import record_outcome

        try:
            results, progress = record_outcome(self.store, record.name)
            retry = self.store.get_retry(record.name) if _retrying(self.store) else None
        except RetryableError as exc:
            raise unavailable(exc, name=name) from None
        view = record_to_json(record, results, progress, retry.doc if retry is not None else None)
        return json_response(200, view)

    def put(self, event: Mapping[str, Any], path: str) -> Response:
        """A report; no body = "track this job" (PENDING now); an optional ``waiter`` is
        checked with the report before anything is written, then kept before the report is
        ingested (so no change can slip between the two unseen). An optional ``retry`` policy
        (docs/retry.md) needs the retry right (403 ``retry-not-allowed``), is checked before
        anything is written too (400 ``invalid-retry``; an input outside the configured
        prefixes 400 ``input-unusable``), and kept beside the record once the report is
        ingested."""
        self.operations_auth(event)
        raw_name = _raw_path_name(path)
        raw = raw_body(event, self.max_bytes)
        body = None if not raw.strip() else parse_json(raw)
        if body is not None and not isinstance(body, Mapping):
            raise ApiError(400, "invalid-body", "the report body must be a JSON object")
        try:
            op_event = from_report(
                raw_name, body, now_ns=self.clock_ns(), max_future_skew_s=self.max_future_skew_s
            )
        except InvalidEventError as exc:
            raise ApiError(400, exc.code, exc.message) from None
        except UnsupportedEventError as exc:
            # The producer is the user's own code: an unknown state is its bug to fix.
            raise ApiError(400, "invalid-state", exc.message) from None
        if op_event.kind is Kind.JOB:
            # A job (issue 46) is opstate's own: only ``opstate submit`` writes one.
            raise ApiError(400, "invalid-name", "a jobs/ name is opstate's own: report batches")
        policy = None
        if body is not None and "retry" in body:
            self._may_act(event, op_event.name)
            policy = self._policy(op_event.name, body)
        kept = None if body is None or "waiter" not in body else self._waiter(op_event.name, body)
        added = _register(*kept) if kept is not None else False
        decision = self.ingest(op_event)
        answer = decision_to_json(decision)
        if policy is not None:
            answer["retry"] = self._attach(decision, policy)
        if kept is not None:
            waiter = kept[0]
            answer["waiter"] = {"id": waiter.waiter_id, "when": str(waiter.when), "added": added}
            if self.on_waiter is not None:
                self.on_waiter(waiter.name)
        return json_response(200, answer)

    def _may_act(self, event: Mapping[str, Any], name: str) -> None:
        """403 unless the caller holds the retry right: a policy makes opstate create, upload
        and cancel at Gemini with the user's key, which reporting or tracking never does."""
        if self.retry_right is not None and self.retry_right(event):
            return
        log_fields(
            logger.warning, "retry policy refused: the caller lacks the retry right", {"name": name}
        )
        raise ApiError(
            403,
            "retry-not-allowed",
            "this caller may report and track, not attach a retry policy (it makes opstate "
            "create and cancel batches): see docs/security.md, 'Acting'",
        )

    def _policy(self, name: str, body: Mapping[str, Any]) -> RetryPolicy:
        """The body's ``retry`` policy, checked before anything is written."""
        from opstate.domain.retry import InvalidRetryError, parse_retry
        from opstate.retry.authority import INPUT_UNUSABLE, input_allowed
        from opstate.retry.policy import check_keepable, settings_policy

        try:
            policy = parse_retry(body["retry"], settings_policy(self.retry_settings))
        except InvalidRetryError as exc:
            raise ApiError(400, "invalid-retry", str(exc)) from None
        if policy.input is not None and not policy.input.startswith("s3://"):
            # A file:// input would have the retry pass read any file of this host into the
            # results and upload it to Gemini: an HTTP caller names s3:// only (the CLI, run by
            # the host's own user, takes a local file: opstate track --input).
            raise ApiError(
                400,
                "invalid-retry",
                "'retry.input' must be s3://BUCKET/KEY here; a local file is given with "
                "opstate track NAME --input PATH",
            )
        prefixes = self.retry_settings.retry_input_prefixes
        if policy.input is not None and not input_allowed(policy.input, prefixes):
            # Never read, and the caller learns nothing about it; the operator reads why.
            log_fields(
                logger.warning,
                "retry input refused: not under OPSTATE_RETRY_INPUT_PREFIXES",
                {"name": name, "input": policy.input, "prefixes": list(prefixes)},
            )
            raise ApiError(400, "input-unusable", INPUT_UNUSABLE)
        try:
            check_keepable(self.store, name)
        except InvalidRetryError as exc:
            raise ApiError(400, "invalid-retry", str(exc)) from None
        except RetryableError as exc:
            raise unavailable(exc, name=name) from None
        return policy

    def _attach(self, decision: Decision, policy: RetryPolicy) -> dict[str, Any] | None:
        """Keep ``policy`` beside the record the report left; its ``retry`` view (None: no
        record, or a policy that asks for nothing on a record without one)."""
        from opstate.retry.authority import VIA_API
        from opstate.retry.policy import keep_policy

        record = decision.record
        if record is None or not _retrying(self.store):
            return None
        try:
            return keep_policy(self.store, record, policy, self.clock_ns(), via=VIA_API)
        except ValueError as exc:  # it became a retry child since _policy looked
            raise ApiError(400, "invalid-retry", str(exc)) from None
        except RetryableError as exc:
            raise unavailable(exc, name=record.name) from None

    def _waiter(self, name: str, body: Mapping[str, Any]) -> tuple[Waiter, Registrar]:
        from opstate.waiters.enabled import TargetNotEnabledError
        from opstate.waiters.model import InvalidWaiterError, parse_waiter
        from opstate.waiters.run import ArchivingUnavailableError

        registrar = self.registrar.get()
        if registrar is None:
            raise ApiError(400, "waiters-not-enabled", "waiters are not enabled in this deployment")
        try:
            waiter = parse_waiter(name, body["waiter"], now_ns=self.clock_ns())
            registrar.check(waiter)
        except InvalidWaiterError as exc:
            raise ApiError(400, "invalid-waiter", str(exc)) from None
        except TargetNotEnabledError as exc:
            raise ApiError(400, "waiters-not-enabled", str(exc)) from None
        except ArchivingUnavailableError as exc:
            raise ApiError(400, "archiving-not-available", str(exc)) from None
        return waiter, registrar


def _retrying(store: Store) -> TypeGuard[RetryingStore]:
    return isinstance(store, RetryingStore)


def _register(waiter: Waiter, registrar: Registrar) -> bool:
    from opstate.waiters.port import TooManyWaitersError

    try:
        return registrar.register(waiter)
    except TooManyWaitersError:
        raise ApiError(
            409,
            "too-many-waiters",
            f"{waiter.name} already has the most waiters allowed ({registrar.limit})",
        ) from None
    except RetryableError as exc:
        raise unavailable(exc, name=waiter.name) from None


def _raw_path_name(path: str) -> str:
    return unquote(path[len(OPERATIONS_PREFIX) :])


def _path_parsed(path: str) -> ParsedName:
    try:
        return parse_name(_raw_path_name(path))
    except InvalidNameError as exc:
        raise ApiError(400, "invalid-name", str(exc)) from None
