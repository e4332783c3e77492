"""What ``opstate serve`` is started with (``ServeOptions``, the CLI's flags) and how a start
fails (``ServeError``: one sentence, exit 1). Light: the CLI builds its parser from these
defaults."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from opstate.config import DEFAULT_RECONCILE_EVERY_S
from opstate.local.secret_file import DEFAULT_SECRET_FILE

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 3000


@dataclasses.dataclass(frozen=True)
class ServeOptions:
    host: str = DEFAULT_HOST
    port: int = DEFAULT_PORT
    store_url: str | None = None
    reconcile_every_s: float = DEFAULT_RECONCILE_EVERY_S
    secret_file: Path = DEFAULT_SECRET_FILE
    verbose: bool = False
    # What chose the store (``OPSTATE_STORE``, ``--store``, ``the default``), for its line.
    store_chosen_by: str | None = None
    # Host names answered besides loopback and OPSTATE_PUBLIC_URL's (opstate.local.hosts).
    allow_hosts: tuple[str, ...] = ()


class ServeError(Exception):
    """An expected start-up failure (port in use, bad secret file): one sentence, exit 1."""
