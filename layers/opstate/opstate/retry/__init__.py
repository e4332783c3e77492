"""Retries of a batch's failed rows and one final result per request (issue 33; docs/retry.md).

The package owns: ``rules`` and ``final`` (pure: which rows are retried, the final merge),
``lineage`` (a root's plan as its retry state holds it), ``inputs`` (keeping a batch's input),
``policy`` (a policy kept beside a record), ``authority`` (who attached it, which inputs may
be read for them: pure), ``engine`` and ``passes`` (one retry pass),
``children`` (creating a planned child at most once), ``adoption`` (what a batch found after
a lost create must show to be adopted), ``submit`` (submitting through opstate)
and ``wiring`` (from settings). It may import the domain, settings, the store, ingest,
``opstate.gemini``, ``opstate.outcomes`` (sinks, plan, ledger) and observability; it sits beside
``opstate.outcomes`` in the layers and nothing below it imports it (the API, the CLI, the local
server and the archiver function import it).
"""
