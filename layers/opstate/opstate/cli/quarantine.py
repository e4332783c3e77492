"""``opstate quarantine list``: what the quarantine keeps (id, webhook-id, received, reason,
bytes, whether its signature headers were kept), never a body unless ``--body`` asks.

The quarantine is the one ``opstate replay --quarantine`` reads: ``--queue-url`` (else
``OPSTATE_QUARANTINE_QUEUE_URL``), else the local one beside the SQLite store. Listing changes
nothing (an SQS message is received with visibility 0: a replay still sees it).
"""

from __future__ import annotations

import argparse
import base64
from typing import TYPE_CHECKING, Any

from opstate.cli.common import EXIT_OK, UsageError, out, print_json, settings_for
from opstate.domain.times import format_time

if TYPE_CHECKING:
    from opstate.quarantine import Delivery


def add_parser(
    sub: Any, *, store: argparse.ArgumentParser, as_json: argparse.ArgumentParser
) -> None:
    p = sub.add_parser("quarantine", help="what the webhook quarantine keeps")
    verbs = p.add_subparsers(dest="verb", metavar="VERB")
    verbs.required = True
    ls = verbs.add_parser(
        "list",
        parents=[store, as_json],
        help="list the kept deliveries (id, received, reason, bytes); never a body unless asked",
    )
    ls.add_argument("--queue-url", metavar="URL", help="the quarantine SQS queue")
    ls.add_argument(
        "--limit", type=int, default=1000, metavar="N", help="at most N deliveries (default 1000)"
    )
    ls.add_argument(
        "--body",
        action="store_true",
        help="include each body (JSON: base64 in 'body'; text: the body, control characters "
        "escaped)",
    )
    ls.set_defaults(func=cmd_list)


def entry_json(delivery: Delivery, *, body: bool) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "id": delivery.id,
        "webhookId": delivery.webhook_id,
        "received": format_time(delivery.received_ns) if delivery.received_ns else None,
        "reason": delivery.reason,
        "bytes": len(delivery.body),
        "signed": bool(delivery.proof),
    }
    if body:
        doc["body"] = base64.b64encode(delivery.body).decode("ascii")
    return doc


def cmd_list(args: argparse.Namespace) -> int:
    from opstate.cli.replay import quarantine_for

    if args.limit < 1:
        raise UsageError("--limit must be at least 1")
    config = settings_for(args)
    quarantine, label = quarantine_for(args, config)
    kept = quarantine.entries(args.limit)
    if args.json:
        print_json(
            {"quarantine": label, "deliveries": [entry_json(d, body=args.body) for d in kept]}
        )
        return EXIT_OK
    out(f"{len(kept)} kept in {label}")
    for d in kept:
        doc = entry_json(d, body=False)
        signed = "signed" if doc["signed"] else "unsigned"
        out(
            f"  {doc['id']}  {doc['received'] or '-'}  {doc['reason'] or '-'}  "
            f"{doc['bytes']} bytes  {signed}  webhook-id {doc['webhookId'] or '-'}"
        )
        if args.body:
            out("    " + d.body.decode("utf-8", "backslashreplace").replace("\n", "\\n"))
    return EXIT_OK
