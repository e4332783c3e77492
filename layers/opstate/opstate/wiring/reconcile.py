"""The reconciler's wiring: settings -> store + gateways -> one run (the Lambda entry and the CLI
call this), then the archive re-drive (``opstate.outcomes.redrive``); one poll now with the
gateways made for it (``refresh_with``).

The Google Cloud gateway is made only when Google Cloud is configured
(``Settings.google_cloud_configured``); it loads its credentials on its first request. A
deployment with Google Cloud scopes and no usable Gemini API key follows Google Cloud only
(one error line per run); without scopes a missing key fails the run, as it always did.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence

from opstate.config import ConfigError, Settings
from opstate.domain.model import OpEvent, OpRecord
from opstate.gemini.client import make_client, warm_client
from opstate.observability import logger
from opstate.outcomes.redrive import Cadence, redrive
from opstate.reconcile.cloud_gateway import GoogleCloudGateway
from opstate.reconcile.discovery import Settled
from opstate.reconcile.gateway import AuthError, Listed, WebhookInfo
from opstate.reconcile.genai_gateway import GenaiGateway
from opstate.reconcile.run import DecisionHook, Refreshed, RunResult, reconcile_once, refresh_one
from opstate.store.port import PollingStore

# The re-drive's cadence in this process (a Lambda container, a CLI loop): see ``Cadence``.
REDRIVE_CADENCE = Cadence()
# With OPSTATE_DISCOVER=all, the Gemini API's batches are listed at once in a new container,
# at the next run after a listing that changed something (or failed), else this long after the
# last one (issue 48: a quiet project's 288 listings a day were a third of its AWS cost). A
# batch nobody tracks is found within this plus a run; its end comes by webhook at once.
DISCOVER_EVERY_S = 900.0
DISCOVERY_CADENCE = Cadence(DISCOVER_EVERY_S)
# The final records discovery found, kept for this process's next listings (``Settled``:
# a listed job that drops against one is not read again).
DISCOVERY_SETTLED = Settled()


def new_container() -> None:
    """Forget what this process keeps between runs (the cadences, the settled records), as a
    new Lambda container starts: tests start each as one, the cost benchmark once an hour."""
    global REDRIVE_CADENCE, DISCOVERY_CADENCE, DISCOVERY_SETTLED
    REDRIVE_CADENCE = Cadence()
    DISCOVERY_CADENCE = Cadence(DISCOVER_EVERY_S)
    DISCOVERY_SETTLED = Settled()


class NoGeminiApi:
    """The Gemini API side of a Google-Cloud-only deployment: no request, ever."""

    def __init__(self, why: str) -> None:
        self.why = why

    def webhooks(self) -> Sequence[WebhookInfo]:
        return ()

    def batch_pages(self, page_size: int) -> Iterator[Sequence[Listed]]:
        return iter(())

    def fetch(self, record: OpRecord) -> OpEvent:
        raise AuthError(self.why)

    def close(self) -> None:
        return None


def gemini_gateway(settings: Settings, *, warm: bool = False) -> GenaiGateway | NoGeminiApi:
    """The Gemini API gateway; ``NoGeminiApi`` when there is no key but Cloud scopes are set.
    ``warm``: on the client kept for the next run (``warm_client``; closing the gateway
    leaves it open)."""
    try:
        if warm:
            return GenaiGateway(warm_client(settings), owned=False)
        return GenaiGateway(make_client(settings))
    except ConfigError as exc:
        if not settings.google_cloud_scopes:
            raise
        logger.error(
            "no Gemini API key; this run follows Google Cloud only", extra={"error": str(exc)}
        )
        return NoGeminiApi(str(exc))


def run_from_settings(
    settings: Settings,
    remaining_ms: Callable[[], int] | None = None,
    on_decision: DecisionHook | None = None,
) -> RunResult:
    """Open the configured store, run once on the google-genai client kept warm for the next
    run (``warm_client``), close the store."""
    from opstate.store import store_from_url

    store = store_from_url(settings.store_url, settings)
    try:
        if not isinstance(store, PollingStore):  # pragma: no cover - every store of ours is
            raise TypeError(f"{type(store).__name__} cannot schedule polls")
        gateway = gemini_gateway(settings, warm=True)
        cloud = GoogleCloudGateway(settings) if settings.google_cloud_configured else None
        try:
            result = reconcile_once(
                store,
                gateway,
                settings=settings,
                remaining_ms=remaining_ms,
                on_decision=on_decision,
                cloud=cloud,
                discovery=DISCOVERY_CADENCE,
                settled=DISCOVERY_SETTLED,
            )
        finally:
            gateway.close()
            if cloud is not None:
                cloud.close()
        # Pending archives whose trigger was lost: handed to the archiver, within the budget.
        left = (lambda: remaining_ms() / 1000.0) if remaining_ms is not None else None
        redrive(store, settings, remaining_s=left, cadence=REDRIVE_CADENCE)
        return result
    finally:
        store.close()


def refresh_with(
    store: PollingStore,
    settings: Settings,
    record: OpRecord,
    on_decision: DecisionHook | None = None,
) -> Refreshed:
    """``refresh_one`` on an open store with the gateways made for this one poll
    (``opstate refresh`` and the operations page's button)."""
    gateway = gemini_gateway(settings)
    cloud = GoogleCloudGateway(settings) if settings.google_cloud_configured else None
    try:
        return refresh_one(
            store, gateway, record, settings=settings, on_decision=on_decision, cloud=cloud
        )
    finally:
        gateway.close()
        if cloud is not None:
            cloud.close()
