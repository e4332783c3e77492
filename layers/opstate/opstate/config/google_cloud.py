"""What Google Cloud needs of the settings (docs/google-cloud.md), read here for the two parts
that hold it: the Pub/Sub push route's token checks (``WebhookSettings``) and the discovery
scopes (``ReconcileSettings``)."""

from __future__ import annotations

import re
from collections.abc import Mapping

from opstate.config.parse import ConfigError, read_str

# Google's OIDC signing keys (Pub/Sub push tokens are Google-signed ID tokens).
DEFAULT_PUBSUB_JWKS_URL = "https://www.googleapis.com/oauth2/v3/certs"
# The issuers of Google-signed ID tokens.
PUBSUB_ISSUERS = ("https://accounts.google.com", "accounts.google.com")

# A project id or number and a location id: Google's alphabet, as opstate.domain.names reads
# them in a job's name (a scope outside it would list jobs whose names are all refused).
_SCOPE_SEGMENT = re.compile(r"[a-z0-9][a-z0-9-]*", re.ASCII)


def cloud_scopes(env: Mapping[str, str]) -> tuple[tuple[str, str], ...] | None:
    """``OPSTATE_GOOGLE_CLOUD_SCOPES``: ``PROJECT/LOCATION`` pairs, separated by spaces or
    commas, in order, without repeats."""
    key = "OPSTATE_GOOGLE_CLOUD_SCOPES"
    raw = read_str(env, key)
    if raw is None:
        return None
    scopes: list[tuple[str, str]] = []
    for item in raw.replace(",", " ").split():
        project, _, location = item.partition("/")
        location = location.lower()  # Google reads a location in any case as one
        if not _SCOPE_SEGMENT.fullmatch(project) or not _SCOPE_SEGMENT.fullmatch(location):
            raise ConfigError(
                f"{key} must be PROJECT/LOCATION pairs separated by spaces, each a lowercase "
                f"project id or number and a location of letters, digits and hyphens "
                f"(e.g. 'my-project/us-central1'), got {item!r}"
            )
        if (project, location) not in scopes:
            scopes.append((project, location))
    return tuple(scopes)
