"""``opstate serve``: the API app on this machine (no AWS, no Docker).

Owns: ``apigw`` (API Gateway v2 events, the Lambda context, responses), ``http_server`` (the
HTTP server), ``secret_file`` (the local webhook secret), ``reconcile_loop`` (the reconciler's
timer), ``console`` (the operations page at ``/`` with its ``static`` files) and ``serve``
(the wiring). May import the domain, config, stores, signatures, observability, api and
reconcile, never the CLI; nothing but ``opstate.cli`` imports it.
"""
