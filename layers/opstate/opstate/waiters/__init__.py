"""Waiters: a workflow waiting for one operation is resumed when its condition holds.

One module per concern:

- ``model``: what a registration says (``parse_waiter``, ``Waiter``) and what a condition
  decides (``decide``: pending, success ``{record, results}``, failure ``error`` / ``cause``);
  pure, shared with ``opstate wait``;
- ``port``: the ``WaiterStore``, the ``Callbacks`` that resume a waiter, the status and results
  readers, and their errors;
- ``memory``, ``sqlite``, ``dynamodb``: one waiter store each (never the record's row or item);
- ``callbacks``: ``Callbacks`` on Step Functions and Lambda durable functions (boto3);
- ``enabled``: which kinds of waiter are on (only those whose ARNs the operator named; issue
  31), the refusal the API answers with otherwise;
- ``run``: ``Registrar`` (bounded, idempotent registration) and ``Resumer`` (resume the
  waiters of one operation, at least once, retrying throttling with backoff);
- ``wiring``: the waiter store a store URL implies, the production resumer, the Lambda event
  handler (bus events and the waiters table's stream).

Owns: waiters, their stores and their resumption. May import the domain, ``config``,
``observability``, the store (port, ``store_from_url``, the DynamoDB client helpers) and boto3
(``callbacks``, ``dynamodb`` and ``wiring`` only); never ingest, the API, the notifier, the
reconciler, the local server or the CLI.
"""
