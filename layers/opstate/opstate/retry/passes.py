"""What one retry pass is given and what it reports (``opstate.retry.engine``), and the
part of the runner the child-creating protocol uses (``opstate.retry.children``)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from opstate.config import DEFAULT_SUBMIT_MAX_BATCHES, TIER1_ENQUEUED_TOKENS
from opstate.domain.model import OpRecord
from opstate.gemini.port import GeminiClient
from opstate.observability import count, log_fields, logger
from opstate.outcomes.sink import Sink
from opstate.retry.rules import TransientTable
from opstate.store.port import RetryPassStore
from opstate.store.retry_state import RetryState


@dataclass(frozen=True, slots=True)
class RetryConfig:
    """What a pass needs of the settings (``opstate.retry.wiring`` builds it)."""

    table: TransientTable
    max_rows: int = 50_000
    max_batches: int = 10
    check_s: float = 60.0
    lease_s: float = 900.0
    max_line_bytes: int = 32 * 1024 * 1024
    # The deployment's budget (``opstate.retry.budget``).
    max_active_lineages: int = 20
    max_batches_per_hour: int = 60
    # Where an input named over HTTP (or by a policy of unknown origin) may be read from
    # (``OPSTATE_RETRY_INPUT_PREFIXES``; ``opstate.retry.authority.reads_input``).
    input_prefixes: tuple[str, ...] = ()
    # What retries may spend over every lineage in a UTC day (US dollars; None: no cap).
    daily_budget_usd: float | None = None
    # The project's queue (``OPSTATE_SUBMIT_*``; ``opstate.retry.room``): a retry batch takes
    # its tokens of its model's cap and a batch slot, as a job's part does.
    submit_caps: tuple[tuple[str, int], ...] = TIER1_ENQUEUED_TOKENS
    submit_max_batches: int = DEFAULT_SUBMIT_MAX_BATCHES


@dataclass
class RetryResult:
    """What one pass did (``opstate retry --once`` prints ``as_dict``)."""

    planned: int = 0
    submitted: int = 0
    final: int = 0
    cancelled: int = 0
    unavailable: int = 0
    stopped: int = 0
    waiting: int = 0
    skipped: int = 0
    errors: int = 0
    remaining: int = 0

    def as_dict(self) -> dict[str, int]:
        return {
            "planned": self.planned,
            "submitted": self.submitted,
            "final": self.final,
            "cancelled": self.cancelled,
            "unavailable": self.unavailable,
            "stopped": self.stopped,
            "waiting": self.waiting,
            "skipped": self.skipped,
            "errors": self.errors,
            "remaining": self.remaining,
        }


class LostRace(Exception):
    """The root's retry state changed under this runner: leave the root to the other one."""


class Runner(Protocol):
    """What ``children.Creator`` uses of the runner driving it."""

    store: RetryPassStore
    sink: Sink
    client: GeminiClient
    config: RetryConfig
    clock_ns: Callable[[], int]
    result: RetryResult
    on_final: Callable[[str], None] | None
    every: bool  # an operator's pass (``opstate retry --once``)
    # Seconds the pass has left (None: no limit): the display-name search stops at 0.
    time_left: Callable[[], float] | None

    def write(
        self, root: OpRecord, state: RetryState, doc: Mapping[str, Any], **change: Any
    ) -> RetryState: ...


def said_stopped(runner: Runner, root: OpRecord, why: str) -> None:
    """A lineage's stop, once its state saying so is written (a write that lost its race
    counts nothing): said at error level and counted in ``RetryStopped`` (alarmed)."""
    runner.result.stopped += 1
    count("RetryStopped")
    log_fields(logger.error, "retry lineage stopped", {"name": root.name, "why": why})
