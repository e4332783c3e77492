"""What ``opstate serve`` prints: one thread-safe ``Printer`` for every line, the line of each
state change, and the start-up text (where the store, secret and token are, the URLs, and
paste-ready tries whose answers the tests check)."""

from __future__ import annotations

import shlex
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, TextIO
from urllib.parse import quote

from opstate.api_token import API_TOKEN_ENV, ApiToken
from opstate.config import store_location
from opstate.domain.model import Decision
from opstate.domain.routes import OPERATIONS_PREFIX, WEBHOOK_PATH
from opstate.domain.times import format_time
from opstate.local.secret_file import SecretSource
from opstate.terminal import printable_lines

if TYPE_CHECKING:
    from opstate.local.options import ServeOptions


class Printer:
    """Thread-safe line printer (stdout is shared by request and reconciler threads)."""

    def __init__(self, out: TextIO) -> None:
        self._out = out
        self._lock = threading.Lock()
        self._broken = False

    def __call__(self, line: str) -> None:
        with self._lock:
            if self._broken:
                return
            try:
                # Every line printed goes through the one escape (opstate.terminal).
                self._out.write(printable_lines(line) + "\n")
                self._out.flush()
            except (OSError, ValueError):
                # stdout went away (a closed pipe): keep serving and, above all, keep shutdown
                # working; printing is best effort.
                self._broken = True


def change_line(decision: Decision, now_ns: int | None = None) -> str | None:
    """``<time>  <name>  <previous> -> <new>  v<version>`` for a state change, else None."""
    if not decision.state_changed or decision.record is None:
        return None
    record = decision.record
    previous = str(decision.previous.state) if decision.previous is not None else "(new)"
    stamp = format_time(now_ns if now_ns is not None else time.time_ns())
    stamp = stamp[:19] + "Z"
    return f"{stamp}  {record.name}  {previous} -> {record.state}  v{record.version}"


def token_expression(token: ApiToken) -> str:
    """A shell expression for the API token, read at paste time (never the token itself)."""
    if token.origin == "file" and token.path is not None:
        return f"$(cat {shlex.quote(str(token.path))})"
    return f"${{{API_TOKEN_ENV}}}"


def track_example(base_url: str, token: ApiToken) -> str:
    """A ready-to-paste ``curl`` that tracks a job through the token-protected route."""
    return (
        f'curl -sS -X PUT -H "Authorization: Bearer {token_expression(token)}" '
        f"{base_url}{OPERATIONS_PREFIX}batches/<id>"
    )


def curl_example(base_url: str, source: SecretSource) -> str:
    """A ready-to-paste shell snippet that signs and posts a test webhook (openssl + curl)."""
    if source.origin == "file" and source.path is not None:
        secret_expr = f"$(head -n1 {shlex.quote(str(source.path))})"
    else:
        secret_expr = '"${OPSTATE_WEBHOOK_SECRETS%% *}"'
    url = f"{base_url}{WEBHOOK_PATH}"
    return "\n".join(
        [
            f"  secret={secret_expr}",
            "  id=msg_$RANDOM$RANDOM; ts=$(date +%s)",
            '  body=\'{"type":"batch.succeeded","version":"v1","timestamp":"\'"$(date -u'
            ' +%Y-%m-%dT%H:%M:%SZ)"\'","data":{"id":"batches/demo-1"}}\'',
            "  key=$(printf %s \"${secret#whsec_}\" | base64 -d | od -An -vtx1 | tr -d ' \\n')",
            '  sig=$(printf %s "$id.$ts.$body" | openssl dgst -sha256 -mac HMAC'
            ' -macopt "hexkey:$key" -binary | base64)',
            f"  curl -sS -X POST {url} -H 'content-type: application/json' \\",
            '    -H "webhook-id: $id" -H "webhook-timestamp: $ts"'
            ' -H "webhook-signature: v1,$sig" -d "$body"; echo',
        ]
    )


def print_start(
    say: Callable[[str], None],
    options: ServeOptions,
    store_url: str,
    source: SecretSource,
    token: ApiToken,
    base_url: str,
) -> None:
    """Where things are: the store, the secret and token origins, the URLs, paste-ready tries."""
    chosen = f" (chosen by {options.store_chosen_by})" if options.store_chosen_by else ""
    say(f"opstate serve: store {store_location(store_url)}{chosen}")
    _print_secret_origin(say, source)
    _print_token_origin(say, token)
    say(f"webhook URL: {base_url}{WEBHOOK_PATH}")
    say("  give Gemini the public https URL of a tunnel that forwards only this path, e.g.")
    say(f"  opstate webhooks register --url https://<your-tunnel>{WEBHOOK_PATH}")
    say("signed test webhook (paste into a shell):")
    say(curl_example(base_url, source))
    say(f"  # {FIRST_ANSWER}")
    say("the same signed delivery again, as Gemini retries it (paste into the same shell):")
    say(f"  {redeliver_example(base_url)}")
    say(f"  # {REDELIVERY_ANSWER}")
    say(f"track a job: {track_example(base_url, token)}")
    say(f"operations page: {page_link(base_url, token)}")
    say(f"  {page_hint(token)}")


# What the printed tries answer (the tests run them and check these).
FIRST_ANSWER = (
    'answers "applied":true, "reason":"created" (on later pastes "refreshed": '
    "its body time is new each time)"
)
REDELIVERY_ANSWER = (
    'answers "applied":false, "reason":"stale-or-equal-update-time": the redelivery is '
    "dropped, the record keeps its version"
)


def redeliver_example(base_url: str) -> str:
    """The ``curl`` that posts the delivery ``curl_example`` signed again, byte for byte (its
    ``$id``, ``$ts``, ``$sig`` and ``$body``), as Gemini's retry would."""
    return (
        f"curl -sS -X POST {base_url}{WEBHOOK_PATH} -H 'content-type: application/json' "
        '-H "webhook-id: $id" -H "webhook-timestamp: $ts" -H "webhook-signature: v1,$sig" '
        '-d "$body"; echo'
    )


def page_link(base_url: str, token: ApiToken) -> str:
    """The page's URL, with a generated (file) token in its fragment, as notebook servers
    print theirs: a browser never sends the fragment to a server. A token from
    ``OPSTATE_API_TOKEN`` is never echoed: the page asks for it."""
    if token.origin == "file":
        return f"{base_url}/#token={quote(token.token, safe='')}"
    return f"{base_url}/"


def page_hint(token: ApiToken) -> str:
    if token.origin == "file":
        return (
            f"the link carries the API token from {token.path} (the part after # stays in "
            "the browser, never sent to the server); the page says where the file is"
        )
    return f"the page asks for the API token: paste the value of {API_TOKEN_ENV}"


def _print_secret_origin(say: Callable[[str], None], source: SecretSource) -> None:
    if source.origin == "env":
        say(f"webhook secrets: {len(source.secrets)} from OPSTATE_WEBHOOK_SECRETS")
    elif source.generated:
        say(f"webhook secret (generated, saved in {source.path} with mode 0600):")
        say(f"  {source.secrets[0]}")
    else:
        say(f"webhook secrets: {len(source.secrets)} from {source.path}")
    for warning in source.warnings:
        say(f"warning: {warning}")


def _print_token_origin(say: Callable[[str], None], token: ApiToken) -> None:
    if token.origin == "env":
        say(f"API token (operations routes): from {API_TOKEN_ENV}")
    elif token.generated:
        say(f"API token (operations routes): generated, saved in {token.path} with mode 0600")
    else:
        say(f"API token (operations routes): from {token.path}")
