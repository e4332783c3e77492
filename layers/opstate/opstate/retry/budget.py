"""The deployment's budget for what retries create (issue 38; docs/retry.md, "Budget"): at most
``OPSTATE_RETRY_MAX_ACTIVE_LINEAGES`` lineages retrying at once and at most
``OPSTATE_RETRY_MAX_BATCHES_PER_HOUR`` retry batches created in any hour, whatever the
policies ask.

Lineages: counted from the stored retry states: once per pass, before its first create, the
active roots are listed (``iter_retry_due``: every active root); a lineage is *retrying* when
its root is active, not stopped, and has a child being created or created. Runners passing at
the same time each count before the other's create (at most one lineage over per concurrent
runner).

Batches per hour (issue 47): a store counter like the daily spend's (``store.counters``:
``HOUR_COUNTER`` of the UTC clock hour), taken one at a time under the bound by an atomic add
before each create (or each adoption of a batch found after an ambiguous create), so runners
passing at once never go over it together, and a batch counts for its hour whatever became of
its lineage since (0.6.0 counted the active lineages' children only: a lineage that finished
dropped out). The hour is the clock hour: at most the bound per UTC hour, so at most twice
the bound in a 60-minute span that straddles two. A slot taken for a create that then fails
stays taken (over-counted, never under). A store without counters counts from the stored
states as 0.6.0 did. The children 0.6.0 created or claimed in the last hour (a claim that
recorded no ``upload``: 0.6.0 recorded none) are in no counter: they count against the
bound too, so an upgrade within the hour does not start it afresh (a claim of this release
whose upload failed counts twice for that hour: over, never under).

A root that is over the budget creates nothing: its children stay planned and it is due again
later; counted in ``RetryBudgetReached`` (alarm ``RetryBudgetAlarm``) and logged once a pass.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from opstate.domain.model import OpRecord
from opstate.domain.times import NS_PER_SECOND, format_time
from opstate.observability import count, log_fields, logger
from opstate.retry import lineage
from opstate.retry.passes import Runner
from opstate.store.counters import CountingStore

HOUR_NS = 3600 * NS_PER_SECOND
HOUR_COUNTER = "retry-batches:{hour}"
# A due time past any root's: the listing of every active root.
EVERY_NS = 2**62


@dataclass
class Budget:
    """The budget as one pass sees it (loaded at its first create, then kept up to date)."""

    runner: Runner
    loaded: bool = False
    retrying: set[str] = field(default_factory=set)
    recent: int = 0
    legacy: int = 0  # 0.6.0's children of the last hour, in no counter
    refused: set[str] = field(default_factory=set)

    def _load(self) -> None:
        since = self.runner.clock_ns() - HOUR_NS
        for record, state in self.runner.store.iter_retry_due(EVERY_NS):
            if state.created_ns != record.created_ns:
                continue
            started = False
            for entry in lineage.children(state.doc):
                phase = entry.get("phase")
                at = {lineage.CREATED: "createdNs", lineage.CREATING: "claimedNs"}.get(str(phase))
                if at is None:
                    continue
                started = True
                when = entry.get(at)
                if isinstance(when, int) and not isinstance(when, bool) and when >= since:
                    self.recent += 1
                    self.legacy += "upload" not in entry
            if started and not state.doc.get("stopped"):
                self.retrying.add(record.name)
        self.loaded = True

    def allows(self, root: OpRecord) -> bool:
        """Whether ``root`` may create a retry batch now; said and counted once a pass when
        it may not."""
        if not self.loaded:
            self._load()
        config = self.runner.config
        why = None
        if root.name not in self.retrying and len(self.retrying) >= config.max_active_lineages:
            why = (
                f"{len(self.retrying)} lineages are retrying, the most "
                f"OPSTATE_RETRY_MAX_ACTIVE_LINEAGES ({config.max_active_lineages}) allows"
            )
        elif not self._take_hour():
            why = (
                f"{self.recent} retry batches were created this hour, the most "
                f"OPSTATE_RETRY_MAX_BATCHES_PER_HOUR ({config.max_batches_per_hour}) allows"
            )
        if why is None:
            return True
        if root.name not in self.refused:
            self.refused.add(root.name)
            count("RetryBudgetReached")
            log_fields(
                logger.warning,
                "retry budget reached: nothing created, the root waits",
                {"name": root.name, "why": why},
            )
        return False

    def _take_hour(self) -> bool:
        """Take one of this hour's batches (False: none is left)."""
        store, most = self.runner.store, self.runner.config.max_batches_per_hour
        if not isinstance(store, CountingStore):
            return self.recent < most
        counter = HOUR_COUNTER.format(hour=format_time(self.runner.clock_ns())[:13])
        if most > self.legacy and store.add_counter(counter, 1, most - self.legacy):
            return True
        self.recent = store.get_counter(counter) + self.legacy
        return False

    def spent(self, root: OpRecord) -> None:
        """``root`` created a retry batch in this pass."""
        self.recent += 1
        self.retrying.add(root.name)
