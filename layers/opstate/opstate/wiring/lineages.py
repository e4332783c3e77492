"""One command moves a lineage as far as it can go now (issue 40): before a retry pass plans,
the open members of every active lineage are read from Gemini itself (the reconciler's own poll
and ingest, ``refresh_one``) and the members that ended have their results archived (the
archiver's own pass, over those names). ``opstate retry --once`` and ``opstate serve``'s retry
pass call ``read_members``; nothing here polls or archives in a way of its own.

google-genai is loaded only when there is something to ask Gemini: a store without an active
lineage, or whose lineages wait on nothing open or unarchived, makes no client.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from opstate.config import ConfigError, Settings
from opstate.domain.model import OpRecord
from opstate.retry import lineage
from opstate.retry.engine import EVERY_NS, SETTLED
from opstate.retry.wiring import pass_store
from opstate.store.port import PollingStore, Store

# Most members read from Gemini in one call (a pass stays a bounded number of requests).
MAX_MEMBER_READS = 200


@dataclass
class Members:
    """What ``open_members`` found: the active roots, the members still open (to read from
    Gemini) and the terminal members whose results are not settled (to archive)."""

    roots: int = 0
    open: list[OpRecord] = field(default_factory=list)
    unarchived: list[str] = field(default_factory=list)


@dataclass
class MembersRead:
    """What ``read_members`` did (``opstate retry --once`` prints ``read`` and ``archived``
    beside the pass's counts, its errors among theirs)."""

    read: int = 0
    changed: int = 0
    archived: int = 0
    errors: int = 0
    first_error: str | None = None


def open_members(store: Store) -> Members:
    """The members of every active lineage that Gemini or the archiver still has to move."""
    found, kept = Members(), pass_store(store)
    for root, state in kept.iter_retry_due(EVERY_NS):
        if state.created_ns != root.created_ns:
            continue
        found.roots += 1
        for ref in lineage.members(root.name, state.doc):
            record = root if ref.name == root.name else kept.get(ref.name)
            if record is None:
                continue
            if not record.terminal:
                found.open.append(record)
                continue
            archive = kept.get_archive(record.name)
            if archive is None or archive.status not in SETTLED:
                found.unarchived.append(record.name)
    found.open = found.open[:MAX_MEMBER_READS]
    return found


def read_members(
    store: Store,
    settings: Settings,
    *,
    remaining_s: Callable[[], float] | None = None,
    archive: bool = True,
) -> MembersRead:
    """Read each open member of every active lineage from Gemini (its state ingested as a
    poll's would be), then (``archive``) archive the members that ended and are not yet
    archived (``opstate serve`` archives them in its own pass that follows)."""
    done = MembersRead()
    members = open_members(store)
    if members.open:
        _poll(store, settings, members.open, done)
        members = open_members(store)  # those that just ended are archived below
    if archive and members.unarchived:
        from opstate.outcomes.wiring import archive_from_settings

        result = archive_from_settings(settings, remaining_s, store=store, names=members.unarchived)
        done.archived = result.archived + result.expired + result.none
        done.errors += result.errors + result.failed
    return done


def _poll(store: Store, settings: Settings, records: list[OpRecord], done: MembersRead) -> None:
    from opstate.reconcile.cloud_gateway import GoogleCloudGateway
    from opstate.reconcile.run import refresh_one
    from opstate.wiring.reconcile import gemini_gateway

    if not isinstance(store, PollingStore):
        raise ConfigError(f"{type(store).__name__} keeps no open index: its members cannot be read")
    polling = store
    gateway = gemini_gateway(settings)
    cloud = GoogleCloudGateway(settings) if settings.google_cloud_configured else None
    try:
        for record in records:
            refreshed = refresh_one(polling, gateway, record, settings=settings, cloud=cloud)
            done.read += 1
            if refreshed.decision is not None and refreshed.decision.applied:
                done.changed += 1
            if refreshed.error is not None:
                done.errors += 1
                done.first_error = done.first_error or refreshed.error
    finally:
        gateway.close()
        if cloud is not None:
            cloud.close()
