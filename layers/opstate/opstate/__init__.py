"""gemini-opstate: monotonic state records for Gemini long-running operations.

Owns, in layers (a module imports its own layer and the ones below, never above; no cycles;
tests/unit/test_layers.py checks both):

0. the domain - the folder ``domain/``: ``states``, ``times``, ``names``, ``events``,
   ``reducer``, ``model``, ``views``, ``strict_json``, ``details``, ``routes`` (the API's
   paths) - and the settings, ``config`` (one class per part). The domain is pure: no AWS, HTTP
   or Gemini code, no clock (tests/unit/test_purity.py probes the folder);
1. ``store`` (the port and its DynamoDB, SQLite and memory stores), ``signatures`` (webhook
   authenticity), ``webhook_secrets`` (reading and writing the signing secrets), ``api_token``
   (the local server's operations token), ``observability`` (logs, metrics, tracing),
   ``ingest`` (the one ingest path), ``gemini`` (talking to Gemini: the API key, the client,
   the batch reads, error classification; below both of its users);
2. ``api`` (the HTTP API), ``notify`` (announcing state changes), ``reconcile`` (polling
   Gemini and Google Cloud through ``gemini``);
3. ``wiring`` (the composition: where the Lambda entries and the CLI pick their parts, e.g.
   the reconciler's store, gateways, run and archive re-drive), ``local`` (``opstate serve``)
   and ``cli`` (the ``opstate`` command).

No two of these rooms (``opstate.X``) import each other, directly or through others. The Lambda
entries under ``functions/`` import layers 0-2 and ``wiring``. This ``__init__`` may import
nothing of opstate: importing the package loads none of its modules.
"""

# The one place the release is named: pyproject.toml reads it (dynamic version), `opstate
# --version` prints it, template.yaml's SemanticVersion equals it; CHANGELOG.md says what it holds.
__version__ = "0.7.0"
