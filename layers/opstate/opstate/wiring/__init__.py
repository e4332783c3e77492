"""Composition: where the Lambda entries, the CLI and the local server pick their parts.

- ``reconcile``: settings -> store + Gemini API and Google Cloud gateways -> one reconcile run,
  then the archive re-drive (``opstate.outcomes.redrive``): ``run_from_settings`` (the
  reconciler's Lambda entry, ``opstate reconcile --once``); ``refresh_with`` (one poll now:
  ``opstate refresh``, the operations page's button).
- ``lineages``: before a retry pass, the open batches of every active retry lineage read from
  Gemini (``refresh_one``) and those that ended archived (``archive_from_settings``):
  ``opstate retry --once`` and ``opstate serve``'s pass.

Owns no logic of its own, only the choice of parts: it sits at the top, beside ``local`` and
``cli``, so the rooms it puts together never import each other. May import every room below
(the domain, ``config``, the store, ``observability``, ``gemini``, ``reconcile``,
``outcomes``, ``retry``); never ``local`` or ``cli``, which import it.

Importing this package loads none of its modules.
"""
