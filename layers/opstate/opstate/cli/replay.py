"""``opstate replay``: ingest webhook bodies and reports from a JSONL file."""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from collections import Counter
from pathlib import Path
from typing import IO, Any

from opstate.cli.common import (
    EXIT_FAILURE,
    EXIT_OK,
    CliError,
    ingest_event,
    open_store,
    out,
    print_json,
    settings_for,
)
from opstate.events import (
    InvalidEventError,
    OpEvent,
    UnsupportedEventError,
    from_report,
    from_webhook,
)
from opstate.store.port import RetryableError


def add_parser(
    sub: Any, *, store: argparse.ArgumentParser, as_json: argparse.ArgumentParser
) -> None:
    p = sub.add_parser(
        "replay", parents=[store, as_json], help="ingest webhook bodies and reports from JSONL"
    )
    p.add_argument("file", metavar="FILE.jsonl", help="a JSONL file, or - for stdin")
    p.add_argument("--no-progress", action="store_true", help="never draw a progress bar")
    p.set_defaults(func=cmd_replay)


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
        out(
            f"replayed {self.lines} lines from {self.file}: {self.applied} applied, "
            f"{self.dropped} dropped, {len(self.bad)} bad"
        )
        for reason, count in sorted(self.reasons.items()):
            out(f"  {reason:<28} {count}")
        if self.bad:
            out("bad lines: " + ", ".join(str(b["line"]) for b in self.bad))


def _read_lines(path: str) -> tuple[list[bytes], str]:
    if path == "-":
        return sys.stdin.buffer.read().splitlines(), "<stdin>"
    try:
        return Path(path).read_bytes().splitlines(), path
    except OSError as exc:
        raise CliError(f"cannot read {path}: {exc.strerror or exc}") from None


def cmd_replay(args: argparse.Namespace) -> int:
    config = settings_for(args)
    lines, label = _read_lines(args.file)
    total = sum(1 for raw in lines if raw.strip())
    interactive = sys.stderr.isatty() and not args.no_progress
    progress = Progress(total, sys.stderr, interactive)
    summary = ReplaySummary(file=label)
    failure: CliError | None = None

    def bad(lineno: int, code: str, message: str) -> None:
        summary.bad.append({"line": lineno, "error": code, "message": message})
        progress.message(f"{label}:{lineno}: {message} (skipped)")

    with open_store(config) as store:
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
                decision = ingest_event(store, event, config)
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
        print_json(summary.as_dict())
    else:
        summary.print_text()
    if failure is not None:
        raise failure
    return EXIT_FAILURE if summary.bad else EXIT_OK
