"""Retries of a batch's failed rows and one final result per request (issue 33; docs/retry.md).

The package owns its modules in four stages, read as a story: pure rules decide, plans are
kept beside a root, acting steps carry a plan out against Gemini, the sink and the store, and a
pass runs the steps. A module imports its own stage and earlier ones, never a later one
(``tests/unit/test_layers.py`` reads the list below and checks it; a new module is added to
its stage here):

1. rules, pure (bytes in, keys out; no I/O): ``reading`` (lines read strictly, key digests),
   ``rules`` (which rows are retried), ``selection`` (the keys of the next attempt),
   ``final`` (the final merge), ``authority`` (who attached a policy, which inputs it names);
2. plans (what a root keeps, the pass's vocabulary): ``lineage`` (a root's plan in its retry
   state), ``policy`` (a policy kept beside a record), ``spend`` and ``budget`` (what retries
   may spend and create), ``room`` (the project's queue as opstate counts it: tokens enqueued
   per model, batches open, a learned cap), ``jobs`` (a job's parts plan), ``passes`` (what
   a pass is given and reports, the runner's port);
3. acting (one step each): ``acting`` (Gemini's word, read before acting), ``inputs``
   (keeping a batch's input), ``finalize`` (step 6), ``cutting`` (step 5's input files),
   ``evidence`` (step 5's reads), ``timeouts`` (step 3), ``adoption`` (what a batch found
   after a lost create must show to be adopted), ``child_room`` (a retry batch's room in the
   project's queue), ``solo_room`` (a batch submitted alone in the project's queue),
   ``children`` (step 2: a planned child created at most once), ``submit``
   (submitting through opstate), ``job_rate`` (a job's estimate corrected from its parts'
   usage), ``feeding`` (a job's held parts created as room frees), ``job_step`` (a job moved
   one step: feeding, its parts tracked, its final result), ``job_submit`` (an input larger
   than one batch kept, split and written as a job);
4. passes: ``engine`` (one pass, steps 1-6), ``wiring`` (from settings; the store narrowed to
   ``RetryPassStore``, the client a ``GeminiClient``).

It may import the domain, settings, the store, ingest, ``opstate.gemini``,
``opstate.outcomes`` (sinks, plan, ledger) and observability; it sits beside
``opstate.outcomes`` in the layers and nothing below it imports it (the API, the CLI, the local
server and the archiver function import it).
"""
