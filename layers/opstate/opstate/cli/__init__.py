"""``opstate``: the local server and the operator commands.

Exit codes: 0 success, 1 failure (not found, store unavailable, Gemini refused, bad replay
lines), 2 usage (bad arguments, invalid name, state or time, bad store URL or configuration).
Errors go to stderr as one sentence; ``--json`` output is documented in ``docs/cli.md``.

google-genai and boto3's Secrets Manager client are imported only by the commands that need
them; google-genai only through ``opstate.gemini``.

Owns: ``app`` (parser and dispatch: ``main``), ``common`` (errors, exit codes, output, store
opening), one module per command group (``records``: get/list/track/report, ``replay``,
``reconcile``, ``webhooks`` with ``webhook_secrets``, ``serve``). May import everything in
opstate; nothing in opstate imports it.
"""

from opstate.cli.app import main

__all__ = ["main"]
