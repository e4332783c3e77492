"""``opstate webhooks register``, ``status`` and ``rotate``: the Gemini webhook and its
signing secret."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from opstate.cli.common import (
    EXIT_OK,
    CliError,
    Parser,
    UsageError,
    out,
    print_json,
    require_gemini_key,
    settings_for,
)
from opstate.cli.webhook_secrets import SecretTarget, rotate_command, secret_target
from opstate.config import Settings
from opstate.domain.events import WEBHOOK_TYPES
from opstate.domain.times import format_time, parse_time
from opstate.webhook_secrets import rotation_change

# The event types `webhooks register` subscribes to by default (those the Gemini API documents).
DEFAULT_WEBHOOK_EVENTS = (
    "batch.succeeded",
    "batch.failed",
    "batch.expired",
    "video.generated",
    "interaction.completed",
    "interaction.failed",
    "interaction.requires_action",
)
REVOKE_AFTER_24H = "revoke_previous_secrets_after_h24"
REVOKE_NOW = "revoke_previous_secrets_immediately"


def add_parser(sub: Any, *, as_json: argparse.ArgumentParser) -> None:
    from opstate.local.secret_file import DEFAULT_SECRET_FILE

    secret = Parser(add_help=False)
    secret.add_argument(
        "--secret-arn",
        metavar="ARN",
        help="Secrets Manager secret for the signing secrets "
        "(default: OPSTATE_WEBHOOK_SECRET_ARN, else the local secret file)",
    )
    secret.add_argument(
        "--secret-file",
        metavar="PATH",
        default=str(DEFAULT_SECRET_FILE),
        help=f"local secret file (default: {DEFAULT_SECRET_FILE})",
    )

    p = sub.add_parser("webhooks", help="manage the Gemini webhook")
    wsub = p.add_subparsers(dest="webhooks_command", metavar="ACTION", parser_class=Parser)
    wsub.required = True
    w = wsub.add_parser("register", parents=[secret, as_json], help="create the Gemini webhook")
    w.add_argument("--url", required=True, help="the public URL Gemini posts to")
    w.add_argument(
        "--events",
        nargs="+",
        metavar="EVENT",
        help=f"event types (default: {' '.join(DEFAULT_WEBHOOK_EVENTS)})",
    )
    w.add_argument("--name", help="a display name for the webhook")
    w.set_defaults(func=cmd_webhooks_register)
    w = wsub.add_parser("status", parents=[as_json], help="list webhooks and their state")
    w.set_defaults(func=cmd_webhooks_status)
    w = wsub.add_parser("rotate", parents=[secret, as_json], help="rotate the signing secret")
    w.add_argument("--id", help="the webhook to rotate (default: the only one)")
    w.add_argument(
        "--revoke-now",
        action="store_true",
        help="revoke the previous secret at once (default: Gemini keeps it for 24 h)",
    )
    w.set_defaults(func=cmd_webhooks_rotate)


def _secret_target(args: argparse.Namespace, config: Settings) -> SecretTarget:
    return secret_target(args.secret_arn or config.webhook_secret_arn, Path(args.secret_file))


def _gemini(config: Settings) -> Any:
    require_gemini_key(config)
    from opstate.reconcile import make_client

    try:
        return make_client(config)
    except ValueError as exc:
        raise CliError(f"cannot build the Gemini client: {exc}") from None


def _call[T](what: str, fn: Callable[[], T]) -> T:
    try:
        return fn()
    except CliError:
        raise
    except Exception as exc:
        text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise CliError(f"Gemini refused to {what}: {text[:300]}") from None


def _list_webhooks(client: Any) -> list[Any]:
    def page(token: str | None) -> Any:
        return client.webhooks.list(page_size=100, page_token=token)

    hooks: list[Any] = []
    token: str | None = None
    for _ in range(100):
        answer = _call("list webhooks", lambda t=token: page(t))  # type: ignore[misc]
        hooks.extend(answer.webhooks or ())
        token = answer.next_page_token
        if not token:
            break
    return hooks


def _iso(value: Any) -> str | None:
    if isinstance(value, datetime) and value.tzinfo is not None:
        return format_time(parse_time(value))
    return None if value is None else str(value)


def webhook_json(webhook: Any) -> dict[str, Any]:
    """A webhook as the CLI prints it; never carries a full secret."""
    return {
        "id": webhook.id,
        "name": webhook.name,
        "uri": webhook.uri,
        "state": None if webhook.state is None else str(webhook.state),
        "subscribedEvents": [str(e) for e in webhook.subscribed_events or ()],
        "createTime": _iso(webhook.create_time),
        "updateTime": _iso(webhook.update_time),
        "signingSecrets": [
            {"truncatedSecret": s.truncated_secret, "expireTime": _iso(s.expire_time)}
            for s in webhook.signing_secrets or ()
        ],
    }


def cmd_webhooks_register(args: argparse.Namespace) -> int:
    config = settings_for(args)
    events = list(dict.fromkeys(args.events or DEFAULT_WEBHOOK_EVENTS))
    unknown = [e for e in events if e not in WEBHOOK_TYPES]
    if unknown:
        raise UsageError(
            f"unknown event type {unknown[0]!r}; expected some of {', '.join(WEBHOOK_TYPES)}"
        )
    if not args.url.startswith(("https://", "http://")):
        raise UsageError(f"--url must be an http(s) URL, got {args.url!r}")
    target = _secret_target(args, config)
    target.read()  # fails before the webhook exists if the target is unusable
    client = _gemini(config)
    webhook = _call(
        "create the webhook",
        lambda: client.webhooks.create(subscribed_events=events, uri=args.url, name=args.name),
    )
    secret = webhook.new_signing_secret
    if not secret:
        raise CliError(f"Gemini created webhook {webhook.id} but returned no signing secret")
    try:
        # Re-read and merge right before writing (under a lock / version check): a secret
        # stored meanwhile by another command is kept.
        target.update(rotation_change(secret))
    except Exception as exc:
        reason = exc.message if isinstance(exc, CliError) else str(exc)
        raise CliError(
            f"webhook {webhook.id} was created but its signing secret could not be stored in "
            f"{target.description} ({reason}); run `{rotate_command(webhook.id, target)}` "
            "to get a new one"
        ) from None
    view = webhook_json(webhook)
    view["secretStoredIn"] = target.description
    if args.json:
        print_json(view)
    else:
        out(f"registered webhook {webhook.id} ({view['state'] or 'unknown state'}) -> {args.url}")
        out(f"  events: {', '.join(view['subscribedEvents'])}")
        out(f"  signing secret stored in {target.description}")
    return EXIT_OK


def cmd_webhooks_status(args: argparse.Namespace) -> int:
    config = settings_for(args)
    client = _gemini(config)
    hooks = [webhook_json(w) for w in _list_webhooks(client)]
    if args.json:
        print_json(hooks)
        return EXIT_OK
    if not hooks:
        out("no webhooks")
        return EXIT_OK
    for hook in hooks:
        flag = "" if hook["state"] == "enabled" else "   <-- not enabled"
        out(f"{hook['id']}  {hook['state']}  {hook['uri']}{flag}")
        out(f"  events: {', '.join(hook['subscribedEvents'])}")
        for s in hook["signingSecrets"]:
            expiry = f" (expires {s['expireTime']})" if s["expireTime"] else ""
            out(f"  secret {s['truncatedSecret']}{expiry}")
    return EXIT_OK


def _listed_secrets(hooks: list[Any], webhook_id: str, now: datetime | None = None) -> list[str]:
    """The truncated secrets Gemini lists for ``webhook_id``; with ``now``, only those it still
    honours then (an entry whose ``expire_time`` has passed no longer counts as listed)."""
    listed: list[str] = []
    for hook in hooks:
        if hook.id != webhook_id:
            continue
        for entry in getattr(hook, "signing_secrets", None) or ():
            truncated = getattr(entry, "truncated_secret", None)
            expires = getattr(entry, "expire_time", None)
            if not truncated:
                continue
            if (
                now is not None
                and isinstance(expires, datetime)
                and expires.tzinfo is not None
                and expires <= now
            ):
                continue
            listed.append(truncated)
    return listed


def cmd_webhooks_rotate(args: argparse.Namespace) -> int:
    config = settings_for(args)
    target = _secret_target(args, config)
    target.read()  # fails before anything changes at Gemini if the target is unusable
    client = _gemini(config)
    webhook_id = args.id
    try:
        before_hooks = _list_webhooks(client)
    except CliError:
        if webhook_id is None:
            raise
        before_hooks = []  # nothing known about what this webhook listed: nothing is pruned
    if webhook_id is None:
        if len(before_hooks) != 1:
            raise UsageError(
                f"there are {len(before_hooks)} webhooks; name the one to rotate with --id"
                if before_hooks
                else "there is no webhook to rotate"
            )
        webhook_id = before_hooks[0].id
    # Everything Gemini lists for this webhook, expired or not, is known to be its own.
    listed_before = _listed_secrets(before_hooks, webhook_id)
    behavior = REVOKE_NOW if args.revoke_now else REVOKE_AFTER_24H
    answer = _call(
        f"rotate the signing secret of {webhook_id}",
        lambda: client.webhooks.rotate_signing_secret(webhook_id, revocation_behavior=behavior),
    )
    secret = answer.secret
    if not secret:
        raise CliError(f"Gemini rotated webhook {webhook_id} but returned no secret")
    try:
        listed_after = _listed_secrets(_list_webhooks(client), webhook_id, datetime.now(UTC))
    except CliError:
        listed_after = []  # untrusted answer: nothing is pruned
    # Re-read, merge and write under a lock (file) or a version check (Secrets Manager): only
    # what this webhook listed before the rotation and no longer lists is dropped.
    change = rotation_change(secret, listed_before=listed_before, listed_after=listed_after)
    try:
        stored = target.update(change)
    except Exception as exc:
        reason = exc.message if isinstance(exc, CliError) else str(exc)
        raise CliError(
            f"the secret of webhook {webhook_id} was rotated but could not be stored in "
            f"{target.description} ({reason}); run `{rotate_command(webhook_id, target)}` "
            "once it is writable"
        ) from None
    result = {
        "id": webhook_id,
        "revocation": behavior,
        "secretStoredIn": target.description,
        "storedSecrets": len(stored),
    }
    if args.json:
        print_json(result)
    else:
        out(f"rotated the signing secret of webhook {webhook_id}")
        out(
            f"  {target.description} now holds {len(stored)} secret(s): the new one and those "
            "still valid"
        )
        if behavior == REVOKE_AFTER_24H:
            out("  Gemini keeps signing with the previous secret for up to 24 hours too")
    return EXIT_OK
