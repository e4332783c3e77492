"""``opstate``: the local server and the operator commands.

Exit codes: 0 success, 1 failure (not found, store unavailable, Gemini refused, bad replay
lines), 2 usage (bad arguments, invalid name, state or time, bad store URL or configuration).
Errors go to stderr as one sentence; ``--json`` output is documented in ``docs/cli.md``.

google-genai and boto3's Secrets Manager client are imported only by the commands that need
them; google-genai only through ``opstate.reconcile``.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import logging
import os
import re
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, NoReturn, Protocol, TypeVar

from opstate.config import ConfigError, Settings, settings
from opstate.events import (
    WEBHOOK_TYPES,
    EventError,
    InvalidEventError,
    OpEvent,
    UnsupportedEventError,
    from_report,
    from_webhook,
)
from opstate.names import InvalidNameError, Kind, canonical_name
from opstate.reducer import Decision
from opstate.store.port import RetryableError
from opstate.times import InvalidTimeError, format_time, parse_time
from opstate.views import decision_to_json, record_to_json

if TYPE_CHECKING:
    from opstate.store.port import Store

EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_USAGE = 2

PROG = "opstate"
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
# A stored secret list never grows beyond this many entries (newest kept).
MAX_STORED_SECRETS = 8
REVOKE_AFTER_24H = "revoke_previous_secrets_after_h24"
REVOKE_NOW = "revoke_previous_secrets_immediately"

T = TypeVar("T")


class CliError(Exception):
    """An expected failure: one sentence on stderr, no traceback."""

    def __init__(self, message: str, code: int = EXIT_FAILURE) -> None:
        super().__init__(message)
        self.message = message
        self.code = code


class UsageError(CliError):
    def __init__(self, message: str) -> None:
        super().__init__(message, EXIT_USAGE)


# --------------------------------------------------------------------------------------------
# Output helpers


def _out(text: str = "") -> None:
    _stdout().write(text + "\n")


def _err(text: str) -> None:
    sys.stderr.write(text + "\n")
    sys.stderr.flush()


def _print_json(value: Any) -> None:
    _stdout().write(json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False) + "\n")


_STDOUT: list[IO[str]] = []


def _stdout() -> IO[str]:
    return _STDOUT[-1] if _STDOUT else sys.stdout


@contextlib.contextmanager
def _quiet_library_output() -> Iterator[None]:
    """Keep stdout for the command's own output.

    Powertools logs go to stdout by default and metrics print EMF blobs there; while a command
    runs, logs go to stderr at warning level, metrics are off (``POWERTOOLS_METRICS_DISABLED``
    unless the operator set it) and any other stray print goes to stderr. Restored afterwards
    (``main`` may run in-process).
    """
    from opstate.observability import logger

    metrics_switch = "POWERTOOLS_METRICS_DISABLED"
    set_switch = metrics_switch not in os.environ
    if set_switch:
        os.environ[metrics_switch] = "true"

    handler: Any = getattr(logger, "registered_handler", None)
    has_stream = isinstance(handler, logging.StreamHandler)
    previous = handler.stream if has_stream else None
    level = logger.log_level
    if has_stream:
        handler.stream = sys.stderr  # not setStream: it flushes the old stream
    logger.setLevel("WARNING")
    _STDOUT.append(sys.stdout)
    try:
        with contextlib.redirect_stdout(sys.stderr):
            yield
    finally:
        _STDOUT.pop()
        if set_switch:
            os.environ.pop(metrics_switch, None)
        logger.setLevel(level)
        if has_stream:
            handler.stream = previous


def _decision_line(decision: Decision) -> str:
    record = decision.record
    state = record.state if record is not None else decision.event.state
    version = record.version if record is not None else 0
    if decision.applied:
        return f"{decision.event.name}: {decision.reason}, now {state} (version {version})"
    return f"{decision.event.name}: dropped ({decision.reason}), stays {state} (version {version})"


# --------------------------------------------------------------------------------------------
# Settings, store and names


def _settings(args: argparse.Namespace) -> Settings:
    try:
        current = settings()
    except ConfigError as exc:
        raise UsageError(f"configuration error: {exc}") from None
    store = getattr(args, "store", None)
    if store:
        current = dataclasses.replace(current, store_url=store)
    return current


@contextlib.contextmanager
def _open_store(config: Settings) -> Iterator[Store]:
    from opstate.store import store_from_url

    try:
        store = store_from_url(config.store_url, config)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    except RetryableError as exc:
        raise CliError(f"the store {config.store_url} is unavailable: {exc}") from None
    try:
        yield store
    finally:
        store.close()


def _name(raw: str) -> str:
    try:
        return canonical_name(raw)
    except InvalidNameError as exc:
        raise UsageError(str(exc)) from None


def _time_arg(raw: str) -> str:
    try:
        parse_time(raw)
    except InvalidTimeError as exc:
        raise UsageError(str(exc)) from None
    return raw


def _ingest(store: Store, event: OpEvent, config: Settings) -> Decision:
    from opstate.ingest import ingest

    return ingest(store, event, max_attempts=config.ingest_max_attempts)


# --------------------------------------------------------------------------------------------
# get / list / track / report


def cmd_get(args: argparse.Namespace) -> int:
    config = _settings(args)
    name = _name(args.name)
    with _open_store(config) as store:
        record = store.get(name)
    if record is None:
        raise CliError(f"no record for {name} in {config.store_url}")
    view = record_to_json(record)
    if args.json:
        _print_json(view)
        return EXIT_OK
    width = max(len(key) for key in view)
    for key, value in view.items():
        shown = json.dumps(value, sort_keys=True) if isinstance(value, dict) else value
        _out(f"{key:<{width}}  {'-' if shown is None else shown}")
    return EXIT_OK


def cmd_list(args: argparse.Namespace) -> int:
    config = _settings(args)
    with _open_store(config) as store:
        records = [
            r
            for r in store.iter_all()
            if (not args.open or not r.terminal) and (args.kind is None or r.kind == args.kind)
        ]
    records.sort(key=lambda r: r.name)
    if args.json:
        _print_json([record_to_json(r) for r in records])
        return EXIT_OK
    if not records:
        _out("no operations")
        return EXIT_OK
    rows = [
        (
            r.name,
            str(r.kind),
            str(r.state),
            str(r.version),
            format_time(r.update_time_ns) if r.update_time_ns else "-",
        )
        for r in records
    ]
    header = ("NAME", "KIND", "STATE", "VERSION", "UPDATED")
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
    for row in [header, *rows]:
        _out("  ".join(cell.ljust(widths[i]) for i, cell in enumerate(row)).rstrip())
    return EXIT_OK


def _report(args: argparse.Namespace, body: Mapping[str, Any] | None) -> int:
    config = _settings(args)
    name = _name(args.name)
    try:
        event = from_report(name, body, now_ns=time.time_ns())
    except EventError as exc:
        raise UsageError(exc.message) from None
    with _open_store(config) as store:
        decision = _ingest(store, event, config)
    if args.json:
        _print_json(decision_to_json(decision))
    else:
        _out(_decision_line(decision))
    return EXIT_OK


def cmd_track(args: argparse.Namespace) -> int:
    return _report(args, None)


def cmd_report(args: argparse.Namespace) -> int:
    body: dict[str, Any] = {"state": args.state}
    if args.time is not None:
        body["updateTime"] = _time_arg(args.time)
    if args.details is not None:
        try:
            details = json.loads(args.details)
        except ValueError:
            raise UsageError("--details must be a JSON object") from None
        if not isinstance(details, dict):
            raise UsageError("--details must be a JSON object")
        body["details"] = details
    return _report(args, body)


# --------------------------------------------------------------------------------------------
# replay


class Progress:
    """A one-line progress bar on stderr, drawn only when stderr is a terminal."""

    WIDTH = 30

    def __init__(self, total: int | None, stream: IO[str], enabled: bool) -> None:
        self.total = total
        self.stream = stream
        self.enabled = enabled
        self.done = 0
        self._last_draw = 0.0
        self._shown = False

    def advance(self) -> None:
        self.done += 1
        if not self.enabled:
            return
        now = time.monotonic()
        if now - self._last_draw >= 0.05 or self.done == self.total:
            self._draw()
            self._last_draw = now

    def _draw(self) -> None:
        if self.total:
            filled = int(self.WIDTH * self.done / self.total)
            bar = "#" * filled + "-" * (self.WIDTH - filled)
            text = f"\r[{bar}] {self.done}/{self.total} lines"
        else:
            text = f"\r{self.done} lines"
        self.stream.write(text)
        self.stream.flush()
        self._shown = True

    def clear(self) -> None:
        if self.enabled and self._shown:
            self.stream.write("\r" + " " * (self.WIDTH + 40) + "\r")
            self.stream.flush()
            self._shown = False

    def message(self, text: str) -> None:
        self.clear()
        self.stream.write(text + "\n")
        self.stream.flush()
        if self.enabled:
            self._draw()


def event_from_line(obj: object, *, now_ns: int) -> OpEvent:
    """A replay line: a Gemini webhook body (has ``type``) or a report (has ``name``)."""
    if not isinstance(obj, dict):
        raise InvalidEventError("invalid-body", "the line is not a JSON object")
    if "type" in obj:
        return from_webhook(obj)
    if "name" in obj:
        body = {k: obj[k] for k in ("state", "updateTime", "details") if k in obj}
        return from_report(obj["name"], body, now_ns=now_ns)
    raise InvalidEventError(
        "missing-field", "the line is neither a webhook body ('type') nor a report ('name')"
    )


@dataclasses.dataclass
class ReplaySummary:
    file: str
    lines: int = 0
    applied: int = 0
    dropped: int = 0
    reasons: Counter[str] = dataclasses.field(default_factory=Counter)
    bad: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    stopped_at: int | None = None

    def as_dict(self) -> dict[str, Any]:
        return {
            "file": self.file,
            "lines": self.lines,
            "events": self.applied + self.dropped,
            "applied": self.applied,
            "dropped": self.dropped,
            "bad": len(self.bad),
            "reasons": dict(sorted(self.reasons.items())),
            "badLines": self.bad,
            "stoppedAtLine": self.stopped_at,
        }

    def print_text(self) -> None:
        _out(
            f"replayed {self.lines} lines from {self.file}: {self.applied} applied, "
            f"{self.dropped} dropped, {len(self.bad)} bad"
        )
        for reason, count in sorted(self.reasons.items()):
            _out(f"  {reason:<28} {count}")
        if self.bad:
            _out("bad lines: " + ", ".join(str(b["line"]) for b in self.bad))


def _read_lines(path: str) -> tuple[list[bytes], str]:
    if path == "-":
        return sys.stdin.buffer.read().splitlines(), "<stdin>"
    try:
        return Path(path).read_bytes().splitlines(), path
    except OSError as exc:
        raise CliError(f"cannot read {path}: {exc.strerror or exc}") from None


def cmd_replay(args: argparse.Namespace) -> int:
    config = _settings(args)
    lines, label = _read_lines(args.file)
    total = sum(1 for raw in lines if raw.strip())
    interactive = sys.stderr.isatty() and not args.no_progress
    progress = Progress(total, sys.stderr, interactive)
    summary = ReplaySummary(file=label)
    failure: CliError | None = None

    def bad(lineno: int, code: str, message: str) -> None:
        summary.bad.append({"line": lineno, "error": code, "message": message})
        progress.message(f"{label}:{lineno}: {message} (skipped)")

    with _open_store(config) as store:
        for lineno, raw in enumerate(lines, start=1):
            if not raw.strip():
                continue
            summary.lines += 1
            progress.advance()
            try:
                obj = json.loads(raw.decode("utf-8"))
            except UnicodeDecodeError:
                bad(lineno, "invalid-json", "the line is not UTF-8 text")
                continue
            except ValueError as exc:
                bad(lineno, "invalid-json", f"the line is not JSON ({exc})")
                continue
            try:
                event = event_from_line(obj, now_ns=time.time_ns())
            except UnsupportedEventError as exc:
                summary.dropped += 1
                summary.reasons[exc.reason] += 1
                continue
            except InvalidEventError as exc:
                bad(lineno, exc.code, exc.message)
                continue
            try:
                decision = _ingest(store, event, config)
            except RetryableError as exc:
                summary.lines -= 1
                summary.stopped_at = lineno
                failure = CliError(
                    f"stopped at line {lineno} because the store did not accept it ({exc}); "
                    "the lines before it were ingested and replaying the file again is safe"
                )
                break
            if decision.applied:
                summary.applied += 1
            else:
                summary.dropped += 1
            summary.reasons[str(decision.reason)] += 1
    progress.clear()
    if args.json:
        _print_json(summary.as_dict())
    else:
        summary.print_text()
    if failure is not None:
        raise failure
    return EXIT_FAILURE if summary.bad else EXIT_OK


# --------------------------------------------------------------------------------------------
# reconcile


def _require_gemini_key(config: Settings) -> None:
    if not config.gemini_api_key and not config.gemini_api_key_secret_arn:
        raise CliError(
            "no Gemini API key: set GEMINI_API_KEY (or OPSTATE_GEMINI_API_KEY_SECRET_ARN)"
        )


def cmd_reconcile(args: argparse.Namespace) -> int:
    if not args.once:
        raise UsageError(
            "reconcile runs one pass and needs --once (the scheduled Lambda and "
            "`opstate serve` repeat it)"
        )
    config = _settings(args)
    _require_gemini_key(config)
    from opstate.reconcile import run_from_settings

    try:
        result = run_from_settings(config)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    except RetryableError as exc:
        raise CliError(f"the store {config.store_url} is unavailable: {exc}") from None
    _print_json(result.as_dict())
    return EXIT_OK


# --------------------------------------------------------------------------------------------
# webhooks: secret storage


class SecretTarget(Protocol):
    description: str

    def read(self) -> list[str]: ...

    def write(self, secrets: Sequence[str]) -> None: ...


class FileSecretTarget:
    """The local secret file ``opstate serve`` reads (one secret per line, newest first)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.description = f"the local file {path}"

    def read(self) -> list[str]:
        from opstate.local.secret_file import read_secret_file

        try:
            return read_secret_file(self.path)
        except FileNotFoundError:
            return []
        except OSError as exc:
            raise CliError(f"cannot read {self.path}: {exc.strerror or exc}") from None

    def write(self, secrets: Sequence[str]) -> None:
        from opstate.local.secret_file import write_secret_file

        write_secret_file(self.path, secrets)


class SecretsManagerTarget:
    """A Secrets Manager secret whose value is a JSON list of ``whsec_`` secrets, newest first."""

    def __init__(self, secret_id: str) -> None:
        import boto3

        self.secret_id = secret_id
        self.description = f"Secrets Manager secret {secret_id}"
        self._client = boto3.client("secretsmanager")

    def read(self) -> list[str]:
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            value = self._client.get_secret_value(SecretId=self.secret_id)
        except ClientError as exc:
            code = exc.response.get("Error", {}).get("Code", "")
            if code == "ResourceNotFoundException" and self._exists():
                return []  # the secret exists but has no value yet
            raise CliError(f"cannot read {self.description}: {exc}") from None
        except BotoCoreError as exc:
            raise CliError(f"cannot read {self.description}: {exc}") from None
        return parse_stored_secrets(value.get("SecretString") or "")

    def _exists(self) -> bool:
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            self._client.describe_secret(SecretId=self.secret_id)
        except (ClientError, BotoCoreError):
            return False
        return True

    def write(self, secrets: Sequence[str]) -> None:
        self._client.put_secret_value(SecretId=self.secret_id, SecretString=json.dumps(secrets))


def parse_stored_secrets(text: str) -> list[str]:
    """A stored value: a JSON list, or whitespace-separated secrets; non-``whsec_`` entries
    (placeholders) are ignored."""
    stripped = text.strip()
    items: list[Any]
    if stripped.startswith("["):
        try:
            loaded = json.loads(stripped)
        except ValueError:
            loaded = []
        items = loaded if isinstance(loaded, list) else []
    else:
        items = stripped.split()
    return [i.strip() for i in items if isinstance(i, str) and i.strip().startswith("whsec_")]


def merge_secrets(new: str, existing: Sequence[str]) -> list[str]:
    """The new secret first, then the previous ones (deduplicated), at most MAX_STORED_SECRETS."""
    merged = [new]
    for secret in existing:
        if secret not in merged:
            merged.append(secret)
    return merged[:MAX_STORED_SECRETS]


_TRUNCATION = re.compile(r"\.{2,}|…|\*+")


def secret_matches(secret: str, truncated: str) -> bool:
    """Whether a full secret is the one a truncated form (``whsec_AbC...xYz``) shows."""
    if not truncated:
        return False
    parts = _TRUNCATION.split(truncated)
    if len(parts) == 1:
        return secret == truncated
    head, tail = parts[0], parts[-1]
    if not head and not tail:
        return False
    for candidate in (secret, secret.removeprefix("whsec_")):
        if (
            candidate.startswith(head)
            and candidate.endswith(tail)
            and len(candidate) >= len(head) + len(tail)
        ):
            return True
    return False


def prune_secrets(
    secrets: Sequence[str], new: str, webhooks: Sequence[Any], now: datetime
) -> list[str]:
    """Drop stored secrets Gemini no longer lists (revoked or expired).

    Only when the answer is trustworthy: Gemini lists truncated secrets and the new secret
    matches one of them. Otherwise everything is kept (a secret kept too long is harmless; a
    secret dropped too early loses deliveries).
    """
    live: list[str] = []
    for webhook in webhooks:
        for entry in getattr(webhook, "signing_secrets", None) or ():
            truncated = getattr(entry, "truncated_secret", None)
            expires = getattr(entry, "expire_time", None)
            if not truncated:
                continue
            if isinstance(expires, datetime) and expires.tzinfo is not None and expires <= now:
                continue
            live.append(truncated)
    if not any(secret_matches(new, t) for t in live):
        return list(secrets)
    return [s for s in secrets if s == new or any(secret_matches(s, t) for t in live)]


def _secret_target(args: argparse.Namespace, config: Settings) -> SecretTarget:
    arn = args.secret_arn or config.webhook_secret_arn
    if arn:
        return SecretsManagerTarget(arn)
    return FileSecretTarget(Path(args.secret_file))


# --------------------------------------------------------------------------------------------
# webhooks: Gemini calls


def _gemini(config: Settings) -> Any:
    _require_gemini_key(config)
    from opstate.reconcile import make_client

    try:
        return make_client(config)
    except ValueError as exc:
        raise CliError(f"cannot build the Gemini client: {exc}") from None


def _call(what: str, fn: Callable[[], T]) -> T:
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
    config = _settings(args)
    events = list(dict.fromkeys(args.events or DEFAULT_WEBHOOK_EVENTS))
    unknown = [e for e in events if e not in WEBHOOK_TYPES]
    if unknown:
        raise UsageError(
            f"unknown event type {unknown[0]!r}; expected some of {', '.join(WEBHOOK_TYPES)}"
        )
    if not args.url.startswith(("https://", "http://")):
        raise UsageError(f"--url must be an http(s) URL, got {args.url!r}")
    target = _secret_target(args, config)
    existing = target.read()  # fails before the webhook exists if the target is unusable
    client = _gemini(config)
    webhook = _call(
        "create the webhook",
        lambda: client.webhooks.create(subscribed_events=events, uri=args.url, name=args.name),
    )
    secret = webhook.new_signing_secret
    if not secret:
        raise CliError(f"Gemini created webhook {webhook.id} but returned no signing secret")
    try:
        target.write(merge_secrets(secret, existing))
    except Exception as exc:
        raise CliError(
            f"webhook {webhook.id} was created but its signing secret could not be stored in "
            f"{target.description} ({exc}); run `opstate webhooks rotate --id {webhook.id}` "
            "to get a new one"
        ) from None
    view = webhook_json(webhook)
    view["secretStoredIn"] = target.description
    if args.json:
        _print_json(view)
    else:
        _out(f"registered webhook {webhook.id} ({view['state'] or 'unknown state'}) -> {args.url}")
        _out(f"  events: {', '.join(view['subscribedEvents'])}")
        _out(f"  signing secret stored in {target.description}")
    return EXIT_OK


def cmd_webhooks_status(args: argparse.Namespace) -> int:
    config = _settings(args)
    client = _gemini(config)
    hooks = [webhook_json(w) for w in _list_webhooks(client)]
    if args.json:
        _print_json(hooks)
        return EXIT_OK
    if not hooks:
        _out("no webhooks")
        return EXIT_OK
    for hook in hooks:
        flag = "" if hook["state"] == "enabled" else "   <-- not enabled"
        _out(f"{hook['id']}  {hook['state']}  {hook['uri']}{flag}")
        _out(f"  events: {', '.join(hook['subscribedEvents'])}")
        for s in hook["signingSecrets"]:
            expiry = f" (expires {s['expireTime']})" if s["expireTime"] else ""
            _out(f"  secret {s['truncatedSecret']}{expiry}")
    return EXIT_OK


def cmd_webhooks_rotate(args: argparse.Namespace) -> int:
    config = _settings(args)
    target = _secret_target(args, config)
    stored = target.read()
    client = _gemini(config)
    webhook_id = args.id
    if webhook_id is None:
        hooks = _list_webhooks(client)
        if len(hooks) != 1:
            raise UsageError(
                f"there are {len(hooks)} webhooks; name the one to rotate with --id"
                if hooks
                else "there is no webhook to rotate"
            )
        webhook_id = hooks[0].id
    behavior = REVOKE_NOW if args.revoke_now else REVOKE_AFTER_24H
    answer = _call(
        f"rotate the signing secret of {webhook_id}",
        lambda: client.webhooks.rotate_signing_secret(webhook_id, revocation_behavior=behavior),
    )
    secret = answer.secret
    if not secret:
        raise CliError(f"Gemini rotated webhook {webhook_id} but returned no secret")
    from datetime import UTC

    merged = merge_secrets(secret, stored)
    try:
        after = _list_webhooks(client)
    except CliError:
        after = []
    merged = prune_secrets(merged, secret, after, datetime.now(UTC))
    try:
        target.write(merged)
    except Exception as exc:
        raise CliError(
            f"the secret of webhook {webhook_id} was rotated but could not be stored in "
            f"{target.description} ({exc}); rotate again once it is writable"
        ) from None
    result = {
        "id": webhook_id,
        "revocation": behavior,
        "secretStoredIn": target.description,
        "storedSecrets": len(merged),
    }
    if args.json:
        _print_json(result)
    else:
        _out(f"rotated the signing secret of webhook {webhook_id}")
        _out(
            f"  {target.description} now holds {len(merged)} secret(s): the new one and those "
            "Gemini still honours"
        )
        if behavior == REVOKE_AFTER_24H:
            _out("  Gemini keeps signing with the previous secret for up to 24 hours too")
    return EXIT_OK


# --------------------------------------------------------------------------------------------
# serve


def cmd_serve(args: argparse.Namespace) -> int:
    from opstate.local.serve import ServeError, ServeOptions, serve

    config = _settings(args)
    options = ServeOptions(
        host=args.host,
        port=args.port,
        store_url=config.store_url,
        reconcile_every_s=args.reconcile_every,
        secret_file=Path(args.secret_file),
        verbose=args.verbose,
    )
    try:
        return serve(options, config)
    except ServeError as exc:
        raise CliError(str(exc)) from None
    except ValueError as exc:
        raise UsageError(str(exc)) from None


# --------------------------------------------------------------------------------------------
# Parser


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message}\n")


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds, got {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive number of seconds, got {text}")
    return value


def _port(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a port number, got {text!r}") from None
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"expected a port between 0 and 65535, got {value}")
    return value


def build_parser() -> argparse.ArgumentParser:
    from opstate.local.secret_file import DEFAULT_SECRET_FILE
    from opstate.local.serve import DEFAULT_HOST, DEFAULT_PORT

    store = _Parser(add_help=False)
    store.add_argument(
        "--store",
        metavar="URL",
        help="dynamodb://TABLE, sqlite:///PATH or memory:// "
        "(default: OPSTATE_STORE, else sqlite:///.opstate/ops.db)",
    )
    as_json = _Parser(add_help=False)
    as_json.add_argument("--json", action="store_true", help="print JSON (see docs/cli.md)")
    secret = _Parser(add_help=False)
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

    parser = _Parser(
        prog=PROG,
        description="Monotonic state records for Gemini long-running operations.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    sub.required = True

    p = sub.add_parser("serve", parents=[store], help="serve the API locally")
    p.add_argument("--host", default=DEFAULT_HOST, help=f"default {DEFAULT_HOST}")
    p.add_argument("--port", type=_port, default=DEFAULT_PORT, help=f"default {DEFAULT_PORT}")
    p.add_argument(
        "--reconcile-every",
        type=_positive_float,
        default=300.0,
        metavar="SECONDS",
        help="reconciler period when GEMINI_API_KEY is set (default 300)",
    )
    p.add_argument(
        "--secret-file",
        metavar="PATH",
        default=str(DEFAULT_SECRET_FILE),
        help=f"webhook secret file when OPSTATE_WEBHOOK_SECRETS is unset "
        f"(default: {DEFAULT_SECRET_FILE})",
    )
    p.add_argument("--verbose", action="store_true", help="log requests and decisions")
    p.set_defaults(func=cmd_serve)

    p = sub.add_parser("get", parents=[store, as_json], help="show one operation")
    p.add_argument("name", metavar="NAME")
    p.set_defaults(func=cmd_get)

    p = sub.add_parser("list", parents=[store, as_json], help="list operations")
    p.add_argument("--open", action="store_true", help="only operations not yet finished")
    p.add_argument("--kind", choices=[str(k) for k in Kind], help="only this kind")
    p.set_defaults(func=cmd_list)

    p = sub.add_parser("track", parents=[store, as_json], help="record NAME as PENDING now")
    p.add_argument("name", metavar="NAME")
    p.set_defaults(func=cmd_track)

    p = sub.add_parser("report", parents=[store, as_json], help="report a state of NAME")
    p.add_argument("name", metavar="NAME")
    p.add_argument(
        "state",
        metavar="STATE",
        help="PENDING, RUNNING, REQUIRES_ACTION, SUCCEEDED, FAILED or CANCELLED",
    )
    p.add_argument("--time", metavar="RFC3339", help="server time of the state (default: now)")
    p.add_argument("--details", metavar="JSON", help="a JSON object merged into the details")
    p.set_defaults(func=cmd_report)

    p = sub.add_parser(
        "replay", parents=[store, as_json], help="ingest webhook bodies and reports from JSONL"
    )
    p.add_argument("file", metavar="FILE.jsonl", help="a JSONL file, or - for stdin")
    p.add_argument("--no-progress", action="store_true", help="never draw a progress bar")
    p.set_defaults(func=cmd_replay)

    p = sub.add_parser("reconcile", parents=[store], help="run one reconciler pass")
    p.add_argument("--once", action="store_true", help="run one pass and exit (required)")
    p.set_defaults(func=cmd_reconcile)

    p = sub.add_parser("webhooks", help="manage the Gemini webhook")
    wsub = p.add_subparsers(dest="webhooks_command", metavar="ACTION", parser_class=_Parser)
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
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """The ``opstate`` console script; returns the exit code."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # --help (0) or a usage error (2)
        return exc.code if isinstance(exc.code, int) else EXIT_USAGE
    quiet = _quiet_library_output() if args.command != "serve" else contextlib.nullcontext()
    try:
        with quiet:
            code: int = args.func(args)
        return code
    except CliError as exc:
        _err(f"{PROG}: error: {exc.message}")
        return exc.code
    except ConfigError as exc:
        _err(f"{PROG}: error: configuration error: {exc}")
        return EXIT_USAGE
    except RetryableError as exc:
        _err(f"{PROG}: error: the store is unavailable, try again later: {exc}")
        return EXIT_FAILURE
    except KeyboardInterrupt:
        _err(f"{PROG}: interrupted")
        return 130
    except BrokenPipeError:
        return EXIT_FAILURE
    except Exception as exc:
        if type(exc).__module__.startswith(("botocore", "boto3")):
            _err(f"{PROG}: error: an AWS call failed: {exc}")
            return EXIT_FAILURE
        raise


if __name__ == "__main__":
    sys.exit(main())
