"""``opstate serve``: the API app on this machine (no AWS, no Docker).

Owns: ``apigw`` (API Gateway v2 events, the Lambda context, responses), ``http_server`` (the
HTTP server), ``secret_file`` (the local webhook secret), ``reconcile_loop`` (the reconciler's
timer), ``console`` (the operations page at ``/`` with its ``static`` files), ``hosts`` (the
Host check), ``waiters`` (the local waiters), ``options`` (what serve is started with),
``front`` (the API app and the page behind the HTTP server), ``start_lines`` (what serve
prints) and ``serve`` (the wiring: the start, the loops, the shutdown). May import every room
below it (the domain, config, stores, signatures, secrets, observability, quarantine, api,
reconcile, outcomes, waiters) and the composition (``opstate.wiring``), never the CLI; nothing
but ``opstate.cli`` imports it.
"""
