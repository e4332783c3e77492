"""The one observability module: Powertools Logger, Metrics and Tracer, and decision logging.

Every decision is logged as one structured line with its reason and counted with a ``reason``
dimension. Secrets, signatures and whole bodies are never logged: callers pass identifiers
(operation name, ``webhook-id``, event type), never payloads or headers.

Metrics (EMF, namespace ``POWERTOOLS_METRICS_NAMESPACE``, default ``GeminiOpstate``, every one
with the dimension ``service``): the table ``METRICS`` below names each metric the code emits,
its extra dimensions and unit. The stack's CloudWatch dashboard is generated from it
(``scripts/observability_block.py``) and a test checks every ``count(...)`` / ``add_metric``
call in the package against it, so a metric added here, on a dashboard or in an alarm is one
the code really emits with those dimensions.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Final, NamedTuple, cast

from aws_lambda_powertools import Logger, Metrics, Tracer
from aws_lambda_powertools.logging.formatter import RESERVED_LOG_ATTRS, LambdaPowertoolsFormatter
from aws_lambda_powertools.logging.formatter import _get_context as thread_local_keys
from aws_lambda_powertools.metrics import MetricUnit
from aws_lambda_powertools.metrics.base import SingleMetric
from aws_lambda_powertools.metrics.functions import is_metrics_disabled

from opstate.config import ConfigError, detailed_metrics
from opstate.domain.model import Decision, Reason
from opstate.domain.times import format_time
from opstate.lambda_logging import settle

if TYPE_CHECKING:
    from aws_lambda_powertools.logging.types import PowertoolsLogRecord

SERVICE = os.environ.get("POWERTOOLS_SERVICE_NAME", "gemini-opstate")
NAMESPACE = os.environ.get("POWERTOOLS_METRICS_NAMESPACE", "GeminiOpstate")


class MetricSpec(NamedTuple):
    """One metric the code emits: its name, its dimensions besides ``service``, its unit,
    which function emits it and what it counts."""

    name: str
    dimensions: tuple[str, ...]
    unit: str
    emitters: tuple[str, ...]
    description: str


def _spec(
    name: str, emitters: str, description: str, *dimensions: str, unit: str = "Count"
) -> MetricSpec:
    return MetricSpec(name, tuple(dimensions), unit, tuple(emitters.split()), description)


# Every metric the code emits (``emitters``: the functions that do - webhook, reconcile,
# notify, archive). One line per metric; the dashboard generator and the template tests read this.
METRICS: Final[Mapping[str, MetricSpec]] = {
    spec.name: spec
    for spec in (
        _spec("WebhookDeliveries", "webhook", "webhook requests by outcome", "outcome"),
        _spec("EventsApplied", "webhook reconcile", "decisions that applied", "reason"),
        _spec("EventsDropped", "webhook reconcile", "decisions that dropped", "reason"),
        _spec("IngestConflicts", "webhook reconcile", "lost conditional writes retried"),
        _spec("IngestGaveUp", "webhook reconcile", "ingest hit its attempt bound (503)"),
        _spec("StoreRejected", "webhook reconcile", "records the store refused (too large)"),
        _spec("DetailsNormalised", "webhook reconcile", "events whose details were trimmed"),
        _spec("StoreUnavailable", "webhook reconcile", "store or secrets unreachable (503)"),
        _spec("SignatureRejected", "webhook", "webhooks that failed verification"),
        _spec("WebhooksQuarantined", "webhook", "signed webhooks kept unread (quarantine)"),
        _spec("QuarantineFull", "webhook", "signed webhooks answered 503: quarantine full"),
        _spec("WebhooksDisabled", "reconcile", "Gemini webhooks not enabled"),
        _spec("GoogleCloudAuthFailed", "reconcile", "runs whose Google Cloud credentials failed"),
        _spec("Discovered", "reconcile", "batch jobs read by discovery"),
        _spec("Polled", "reconcile", "open operations polled"),
        _spec("Applied", "reconcile", "decisions of a run that applied"),
        _spec("Dropped", "reconcile", "decisions of a run that dropped"),
        _spec("NotFound", "reconcile", "polls answered 404"),
        _spec("OperationsLost", "reconcile", "operations newly marked lost"),
        _spec("OperationsOverdue", "reconcile", "operations newly marked overdue"),
        _spec("Errors", "reconcile", "failed polls and listings"),
        _spec("Throttled", "reconcile", "polls answered 429"),
        _spec("RemainingDue", "reconcile", "due operations a run did not reach"),
        _spec("StoppedEarly", "reconcile", "runs that stopped starting work early"),
        _spec(
            "OldestOpenAgeSeconds", "reconcile", "age of the oldest open operation", unit="Seconds"
        ),
        _spec("EventsPublished", "notify", "state changes put on the bus"),
        _spec("PublishFailures", "notify", "stream records not published"),
        _spec("ResultsArchived", "archive", "operations whose results were archived"),
        _spec("ResultsFailed", "archive", "failed copies of results (retried later)"),
        _spec("ResultsLost", "archive", "results deleted by Gemini before they were archived"),
        _spec("ResultsAtRisk", "archive", "results not archived within the warning margin"),
        _spec("ResultsBytes", "archive", "bytes of results archived"),
        _spec("RetrySubmitted", "archive", "retry batches created (failed rows, expired inputs)"),
        _spec(
            "RetryStopped",
            "archive",
            "lineages stopped: a create refused for money, a guard, a spending budget",
        ),
        _spec("RetryBudgetStopped", "archive", "lineages stopped by maxCostUSD or the daily cap"),
        _spec("ResultsCostUSD", "archive", "US dollars archived batches cost (Batch API prices)"),
        _spec("ResultsUnpriced", "archive", "archived batches whose cost is unknown"),
        _spec("RetryCostUSD", "archive", "US dollars retries added, at each final result"),
        _spec("RetryUnavailable", "archive", "roots whose input opstate cannot use for retries"),
        _spec(
            "RetrySearchCut",
            "archive",
            "searches for a lost child cut short (page cap, repeated token, time): none created",
        ),
        _spec("RetryBudgetReached", "archive", "roots held back by the deployment's retry budget"),
        _spec("ResultsFinal", "archive", "lineages whose final.jsonl was written"),
        _spec("JobPartCreated", "archive", "parts of a job created (issue 46)"),
        _spec("JobPartRefused", "archive", "creates of a job's part Gemini refused (held again)"),
        _spec("JobPartsHeld", "archive", "parts of a job held at the end of its step"),
        _spec("JobTokensEnqueued", "archive", "tokens a job holds in Gemini's queue (estimate)"),
        _spec("JobFinal", "archive", "jobs whose final.jsonl was written"),
        _spec("WaitersRegistered", "webhook", "waiters newly registered"),
        _spec("WaitersResumed", "waiters", "waiters resumed, by outcome", "outcome"),
    )
}

# The core set (issue 48): the metrics an alarm reads, sent whatever ``OPSTATE_DETAILED_METRICS``
# says. CloudWatch bills each custom metric (name x dimension values) sent in a month, so on AWS
# (the template's DetailedMetrics=false) every other metric is not sent and a core one only
# when it counts something: an alarm's "missing data" is "not breaching", the same answer as 0.
CORE_METRICS: Final = frozenset(
    {"StoreUnavailable", "SignatureRejected", "WebhooksQuarantined", "WebhooksDisabled"}
    | {"OperationsOverdue", "OperationsLost", "ResultsAtRisk", "ResultsLost"}
    | {"RetryStopped", "RetryBudgetReached"}
)
_DETAILED: list[bool] = []  # read once (the environment), kept until reset_metric_switch()


def metrics_detailed() -> bool:
    """Whether every metric of ``METRICS`` is sent (``OPSTATE_DETAILED_METRICS``, unset: yes;
    a value the settings refuse counts as yes here: the settings stop the function anyway)."""
    if not _DETAILED:
        try:
            _DETAILED.append(detailed_metrics(os.environ))
        except ConfigError:
            _DETAILED.append(True)
    return _DETAILED[0]


def reset_metric_switch() -> None:
    """Read ``OPSTATE_DETAILED_METRICS`` again at the next metric (tests, the benchmark)."""
    _DETAILED.clear()


def metric_on(name: str, value: float = 1) -> bool:
    """Whether ``name`` with ``value`` is sent: every metric when detailed, else a core one
    that is not zero."""
    return metrics_detailed() or (name in CORE_METRICS and value != 0)


# What a webhook request ended as (the ``outcome`` dimension of ``WebhookDeliveries``).
WEBHOOK_OUTCOMES: Final = (
    "applied",
    "dropped",
    "quarantined",
    "rejected",
    "invalid",
    "retry-later",
    "error",
)


# What X-Ray instruments: the AWS calls (botocore) and plain http.client (urllib: the JWKS fetch).
# Powertools' default patches every module the X-Ray SDK supports that is importable, which
# imports `requests` (the reconciler has it through google-auth, never calls it) and `sqlite3`
# at init just to patch them: 25 ms of CPU per reconciler cold start at one vCPU, 3 ms for the
# webhook (docs/deploy.md, "Import only what the first request needs"). google-genai talks
# through its own httpx2, which the X-Ray SDK does not instrument either way.
TRACED_MODULES: Final = ("botocore", "httplib")


class LazyTracer:
    """The Powertools ``Tracer``, built on first use, instrumenting ``TRACED_MODULES`` only.

    Building a ``Tracer`` imports ``aws_xray_sdk.core``, whose global recorder creates botocore
    X-Ray clients: 0.2-0.5 s of cold start. Where tracing is off (outside Lambda, under SAM
    local, ``POWERTOOLS_TRACE_DISABLED=true`` - Powertools' own rule) ``capture_lambda_handler``
    returns the handler unchanged and nothing is built; anything else delegates to the real
    ``Tracer`` (built once).
    """

    def __init__(self, service: str) -> None:
        self._service = service
        self._tracer: Tracer | None = None

    @staticmethod
    def enabled() -> bool:
        is_disabled = getattr(Tracer, "_is_tracer_disabled", None)
        return True if is_disabled is None else not is_disabled()

    def get(self) -> Tracer:
        if self._tracer is None:
            self._tracer = Tracer(service=self._service, patch_modules=TRACED_MODULES)
        return self._tracer

    def capture_lambda_handler(self, lambda_handler: Any = None, **options: Any) -> Any:
        if not self.enabled():
            return lambda_handler if lambda_handler is not None else (lambda handler: handler)
        return self.get().capture_lambda_handler(lambda_handler, **options)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.get(), name)


# Keys the stdlib refuses in ``extra`` (LogRecord attributes, e.g. ``name``): passed under an
# alias (``_ALIAS`` + key) and renamed back by the formatter, so the line still says
# ``"name": ...``.
_RESERVED = frozenset(logging.makeLogRecord({}).__dict__) | {"message", "asctime"}
_ALIAS = "opstate_reserved."


# What Powertools' formatter treats as the record's own attributes (a tuple there, tested key by
# key for every attribute of every record), and the first characters of a message that
# ``json.loads`` might take (its whitespace, then a JSON value or NaN / Infinity).
_RECORD_ATTRS = frozenset(RESERVED_LOG_ATTRS)
_JSON_START = frozenset('{["-0123456789tfnNI')


class _Formatter(LambdaPowertoolsFormatter):
    """Powertools' JSON formatter (the same keys, order and values), which also writes the
    fields whose names the stdlib reserves (``log_fields``), and costs less per line.

    - Reserved names: per line, a rename of the aliased keys; the alternative, Powertools'
      thread-safe appended keys added and removed around every line, cost about a fifth of a
      webhook request (benchmarks/bench_hotpath.py).
    - The same work as Powertools' own methods, done cheaper: the record's attributes found in
      a set, not a tuple; a message that cannot be JSON is not handed to ``json.loads`` to fail
      (Powertools parses every message, in case it is JSON); the default timestamp's text is
      built once per second (its milliseconds are the only part that changes within one). The
      lines are byte for byte Powertools' (tests/unit/test_observability_output.py compares
      them with its formatter's).
    """

    def __init__(self) -> None:
        super().__init__()
        # (second, text before the milliseconds, text after them) of the last default stamp
        self._stamp: tuple[int, str, str] = (-1, "", "")

    def serialize(self, log: dict[str, Any] | PowertoolsLogRecord) -> str:
        fields = cast("dict[str, Any]", log)
        for key in [key for key in fields if key.startswith(_ALIAS)]:
            fields[key.removeprefix(_ALIAS)] = fields.pop(key)
        return super().serialize(log)

    def formatTime(self, record: logging.LogRecord, datefmt: str | None = None) -> str:
        if datefmt or self.datefmt or self.use_rfc3339_iso8601:
            return super().formatTime(record, datefmt)
        # Powertools' default: strftime of "%Y-%m-%d %H:%M:%S,<msecs>%z"; only <msecs>
        # changes within one second.
        second = int(record.created)
        cached, head, tail = self._stamp
        if second != cached:
            when = self.converter(record.created)
            head = time.strftime("%Y-%m-%d %H:%M:%S,", when)
            tail = time.strftime("%z", when)
            self._stamp = (second, head, tail)
        return f"{head}{int(record.msecs):03d}{tail}"

    def _extract_log_message(self, log_record: logging.LogRecord) -> Any:
        message = log_record.msg
        if (
            isinstance(message, str)
            and not log_record.args
            and message.lstrip(" \t\n\r")[:1] not in _JSON_START
        ):
            return message  # json.loads would fail: Powertools keeps the text then
        return super()._extract_log_message(log_record)

    def _extract_log_keys(self, log_record: logging.LogRecord) -> dict[str, Any]:
        record_dict = log_record.__dict__.copy()
        record_dict["asctime"] = self.formatTime(record=log_record)
        formatted: dict[str, Any] = {}
        for keys in (self.log_format, thread_local_keys().get()):
            for key, value in keys.items():
                if value and key in _RECORD_ATTRS:
                    if not isinstance(value, str):  # Powertools' own error
                        return super()._extract_log_keys(log_record)
                    formatted[key] = value % record_dict
                else:
                    formatted[key] = value
        formatted.update({k: v for k, v in record_dict.items() if k not in _RECORD_ATTRS})
        return formatted


logger = Logger(service=SERVICE, logger_formatter=_Formatter())
settle(logging.getLogger(logger.name))  # LogLevel decides under Lambda's JSON log format
metrics = Metrics(namespace=NAMESPACE, service=SERVICE)
tracer: Tracer = cast(Tracer, LazyTracer(SERVICE))

# Longest text of any caller-supplied value put in a log line (event types, names from bodies).
MAX_LOGGED_TEXT = 200


# A dimensioned metric's EMF text, as Powertools' ``SingleMetric`` serialises it, split around
# its timestamp, by (name, value, dimensions): Powertools builds each distinct blob once and
# every later one is that text with the current time. ``single_metric()`` per metric built a new
# metrics object each time (reading the environment, listing the unit enums, validating,
# serialising): about a fifth of a webhook request (benchmarks/bench_hotpath.py).
_BLOBS: dict[tuple[str, float, tuple[tuple[str, str], ...]], tuple[str, str]] = {}
_BLOBS_MAX = 1024  # dimension values are small closed sets (outcomes, reasons)
_STAMP = 1  # the placeholder timestamp of a cached blob
_BLOBS_LOCK = threading.Lock()


def _blob(name: str, value: float, dimensions: tuple[tuple[str, str], ...]) -> tuple[str, str]:
    """The EMF text of one metric before and after its timestamp (built by Powertools)."""
    key = (name, value, dimensions)
    parts = _BLOBS.get(key)
    if parts is not None:
        return parts
    metric = SingleMetric(namespace=NAMESPACE, service=SERVICE)
    metric.add_metric(name=name, unit=MetricUnit.Count, value=value)
    metric.add_dimension(name="service", value=SERVICE)
    for dim_name, dim_value in dimensions:
        metric.add_dimension(name=dim_name, value=dim_value)
    metric.timestamp = _STAMP  # a placeholder (set_timestamp would warn: 1970)
    text = json.dumps(metric.serialize_metric_set(), separators=(",", ":"))
    marker = f'"Timestamp":{_STAMP},'
    head, found, tail = text.partition(marker)
    if not found:  # pragma: no cover - Powertools' layout changed: no reuse
        raise RuntimeError("unexpected EMF layout")
    parts = (head + '"Timestamp":', "," + tail)
    with _BLOBS_LOCK:
        if len(_BLOBS) < _BLOBS_MAX:
            _BLOBS[key] = parts
    return parts


def _metrics_switches() -> bool:
    """Whether either variable of Powertools' metrics switch is set (``is_metrics_disabled``
    decides then; with neither set metrics are on, and its parsing is skipped)."""
    environ = os.environ
    return "POWERTOOLS_METRICS_DISABLED" in environ or "POWERTOOLS_DEV" in environ


def count(name: str, value: float = 1, **dimensions: str) -> None:
    """Emit one metric; with dimensions it goes out as its own EMF blob (what Powertools'
    ``single_metric`` prints: the dimensions ``service`` then ``dimensions``, one metric).

    Powertools prints a single metric's blob even where its metrics are disabled
    (``POWERTOOLS_METRICS_DISABLED``, ``POWERTOOLS_DEV``), so that rule is applied here too.
    A metric outside the core set is sent only with detailed metrics on (``metric_on``).
    """
    if not metric_on(name, value):
        return
    if not dimensions:
        metrics.add_metric(name=name, unit=MetricUnit.Count, value=value)
        return
    if _metrics_switches() and is_metrics_disabled():
        return
    head, tail = _blob(name, value, tuple((k, str(v)) for k, v in dimensions.items()))
    print(f"{head}{time.time_ns() // 1_000_000}{tail}")


def log_fields(
    level: Callable[..., None], message: str, fields: Mapping[str, object], *, stacklevel: int = 3
) -> None:
    """Log ``message`` with ``fields`` as structured keys at ``level`` (``logger.info``, ...),
    even the ones the stdlib reserves (``name``). ``stacklevel`` 3: the line's location is the
    caller of this function."""
    extra = {(_ALIAS + k if k in _RESERVED else k): v for k, v in fields.items()}
    level(message, extra=extra, stacklevel=stacklevel)


def _enabled(level: int) -> bool:
    """Whether a line at ``level`` would be written (checked before its fields are built)."""
    return logger._logger.isEnabledFor(level)


def _clip(value: object) -> object:
    if isinstance(value, str) and len(value) > MAX_LOGGED_TEXT:
        return value[: MAX_LOGGED_TEXT - 3] + "..."
    return value


def _context(context: Mapping[str, object]) -> dict[str, object]:
    return {key: _clip(value) for key, value in context.items()}


def _server_time(ns: int) -> str | None:
    """The event's server time as RFC3339 (None when the source gave none)."""
    return format_time(ns) if ns > 0 else None


def decision_fields(decision: Decision, *, attempts: int = 1, conflicts: int = 0) -> dict[str, Any]:
    """The structured fields of one decision (what its log line carries); ``attempts`` and
    ``conflicts`` are what ingest reported beside it (``opstate.ingest.Ingested``)."""
    record = decision.record
    return {
        "name": decision.event.name,
        "state": str(decision.event.state),
        "stored_state": str(record.state) if record is not None else None,
        "reason": str(decision.reason),
        "applied": decision.applied,
        "version": record.version if record is not None else 0,
        "source": str(decision.event.source),
        "update_time": _server_time(decision.event.update_time_ns),
        "attempts": attempts,
        "conflicts": conflicts,
    }


# Decisions that tell an operator nothing the table does not already hold: the event's state
# (or a later one) is stored, or only its time moved. Counted (``EventsDropped`` /
# ``EventsApplied`` by ``reason``), logged at DEBUG only.
QUIET_REASONS: Final = frozenset(
    {
        Reason.STALE_OR_EQUAL_UPDATE_TIME,
        Reason.LOWER_RANK,
        Reason.REGRESS_FROM_TERMINAL,
        Reason.REFRESHED,
    }
)


def decision_level(decision: Decision) -> int:
    """The level of a decision's line: WARNING for a ``terminal-conflict`` (two sources
    disagree on how the operation ended), DEBUG for ``QUIET_REASONS``, else INFO (a record
    created or its state changed; a record the store refused)."""
    if decision.reason == Reason.TERMINAL_CONFLICT:
        return logging.WARNING
    return logging.DEBUG if decision.reason in QUIET_REASONS else logging.INFO


def log_decision(
    decision: Decision, *, attempts: int = 1, conflicts: int = 0, **context: object
) -> None:
    """One structured line for a decision, by the one rule of the API and the reconciler
    (``decision_level``): ``event applied`` or ``event dropped``."""
    level = decision_level(decision)
    if not _enabled(level):
        return
    fields = {
        **decision_fields(decision, attempts=attempts, conflicts=conflicts),
        **_context(context),
    }
    write = {logging.WARNING: logger.warning, logging.INFO: logger.info}.get(level, logger.debug)
    message = "event applied" if decision.applied else "event dropped"
    log_fields(write, message, fields, stacklevel=4)


def record_decision(
    decision: Decision, *, attempts: int = 1, conflicts: int = 0, **context: object
) -> None:
    """Log one line (``log_decision``) and count one metric for a decision, and the lost
    conditional writes before it (``IngestConflicts``).

    ``context`` adds identifiers such as ``webhook_id`` (never secrets or bodies).
    """
    log_decision(decision, attempts=attempts, conflicts=conflicts, **context)
    if decision.applied:
        count("EventsApplied", reason=str(decision.reason))
    else:
        count("EventsDropped", reason=str(decision.reason))
    if conflicts:
        count("IngestConflicts", conflicts)


def record_unsupported(reason: str, message: str, **context: object) -> None:
    """An event deliberately not turned into a state (``unsupported-event-type``,
    ``unknown-state``): a warning line and ``EventsDropped`` with that reason."""
    fields = {"reason": reason, "applied": False, "detail": _clip(message), **_context(context)}
    log_fields(logger.warning, "event dropped", fields)
    count("EventsDropped", reason=reason)


def record_signature_rejected(**context: object) -> None:
    """A webhook that failed verification (which check failed is not recorded)."""
    log_fields(logger.warning, "webhook signature rejected", _context(context))
    count("SignatureRejected")


def record_retry_later(kind: str, message: str, **context: object) -> None:
    """An event neither applied nor dropped: the sender is told to retry (503).

    ``kind`` is ``gave-up`` (ingest contention: ``IngestGaveUp``) or ``unavailable`` (the store
    or the secrets could not be reached: ``StoreUnavailable``).
    """
    fields = {"retry": kind, "error": message, **_context(context)}
    log_fields(logger.error, "event not acknowledged", fields)
    count("IngestGaveUp" if kind == "gave-up" else "StoreUnavailable")


def record_webhook_outcome(outcome: str) -> None:
    """Count one webhook request by what it ended as (one of ``WEBHOOK_OUTCOMES``)."""
    count("WebhookDeliveries", outcome=outcome)
