"""Progress on long work, drawn on stderr with tqdm: only when stderr is a terminal and
``--no-progress`` was not given (``enabled``); otherwise nothing is written, not even a
carriage return. The CLI alone imports it (tqdm is the CLI's dependency, never the Lambda
layer's: tests/unit/test_cli_progress.py).

- ``ByteSteps``: the hook ``submit`` calls (``opstate.retry.submit.ProgressHook``: ``(stage,
  done, total)``, bytes), one bar per stage (reading, checking, keeping, uploading).
- ``LineBar``: ``replay``'s lines.
- ``WaitBar``: ``wait``'s record: the counts its details show (``wait_counts``), a lineage's
  retry batches by phase.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import IO, Any

from opstate.terminal import printable, printable_lines


def enabled(no_progress: bool, stream: IO[str] | None = None) -> bool:
    """Whether to draw: on a terminal, unless ``--no-progress``."""
    shown = sys.stderr if stream is None else stream
    return not no_progress and shown.isatty()


def _bar(stream: IO[str], **kwargs: Any) -> Any:
    from tqdm import tqdm

    # A terminal that reports no width (a fresh pseudo-terminal) gets 80 columns: tqdm would
    # otherwise draw an empty line.
    width = {"dynamic_ncols": True} if _columns(stream) else {"ncols": 80}
    return tqdm(file=stream, leave=False, mininterval=0.1, **width, **kwargs)


def _columns(stream: IO[str]) -> int:
    try:
        return os.get_terminal_size(stream.fileno()).columns
    except (OSError, ValueError, AttributeError):
        return 0


class ByteSteps:
    """``(stage, done, total)`` calls drawn as one byte bar per stage; ``total`` None: the
    size given here (a local file's), else a counter without a bar."""

    def __init__(self, on: bool, size: int | None = None, stream: IO[str] | None = None) -> None:
        self.on = on
        self.size = size
        self.stream = sys.stderr if stream is None else stream
        self._stage: str | None = None
        self._bar: Any = None

    def __call__(self, stage: str, done: int, total: int | None) -> None:
        if not self.on:
            return
        if stage != self._stage:
            self.close()
            self._stage = stage
            self._bar = _bar(
                self.stream,
                desc=stage,
                total=total if total is not None else self.size,
                unit="B",
                unit_scale=True,
                unit_divisor=1024,
            )
        self._bar.update(max(0, done - self._bar.n))

    def read(self, stage: str, chunks: Iterable[bytes]) -> Iterator[bytes]:
        """``chunks`` passed through, each counted in ``stage``."""
        done = 0
        self.close()  # a stage read again (a repeated key named) starts its bar afresh
        self(stage, 0, None)
        for chunk in chunks:
            done += len(chunk)
            self(stage, done, None)
            yield chunk

    def close(self) -> None:
        if self._bar is not None:
            self._bar.refresh()  # the stage's last count drawn, then the line cleared
            self._bar.close()
            self._bar = None
            self._stage = None


class LineBar:
    """``replay``'s lines: ``advance`` per line; ``message`` prints a line above the bar (on
    or off: a bad line is always said)."""

    def __init__(self, total: int | None, on: bool, stream: IO[str] | None = None) -> None:
        self.stream = sys.stderr if stream is None else stream
        self.on = on
        known = "{l_bar}{bar}| {n_fmt}/{total_fmt} lines [{elapsed}<{remaining}]"
        unknown = "{n_fmt} lines [{elapsed}, {rate_fmt}]"
        self._bar: Any = (
            _bar(self.stream, total=total, unit=" lines", bar_format=known if total else unknown)
            if on
            else None
        )

    def advance(self) -> None:
        if self._bar is not None:
            self._bar.update(1)

    def message(self, text: str) -> None:
        line = printable_lines(text)
        if self._bar is None:
            self.stream.write(line + "\n")
            self.stream.flush()
            return
        self._bar.write(line, file=self.stream)

    def clear(self) -> None:
        if self._bar is not None:
            self._bar.refresh()  # the last count drawn, then the line cleared
            self._bar.close()
            self._bar = None


# The bar shows at most this many counts, each name cut to this length: details come from
# outside (a producer's report, Gemini's answer), a million keys must not make a million-column
# line.
MAX_COUNTS = 12
MAX_COUNT_NAME = 40


def wait_counts(details: Mapping[str, Any]) -> dict[str, int]:
    """The counts a record's details show, by name: every whole number at the top or one
    level down (``batch_stats.successfulRequestCount``, a job's parts done / held / running,
    whatever a producer reports), so the bar follows what the record says. Names come from
    outside: control characters escaped (``opstate.terminal``), cut, at most ``MAX_COUNTS``."""
    counts: dict[str, int] = {}
    for key, value in details.items():
        found = value.items() if isinstance(value, Mapping) else [(key, value)]
        for name, number in found:
            if isinstance(number, int) and not isinstance(number, bool):
                counts[printable(str(name))[:MAX_COUNT_NAME]] = number
            if len(counts) >= MAX_COUNTS:
                return counts
    return counts


def _short(name: str) -> str:
    for suffix in ("RequestCount", "Count"):
        if name.endswith(suffix) and len(name) > len(suffix):
            return name[: -len(suffix)]
    return name


def _phases(retry: Mapping[str, Any] | None) -> str:
    """A lineage's retry batches by phase (``created 1, ended 2``), from the retry state."""
    doc = retry.get("doc") if retry is not None else None
    children = doc.get("children") if isinstance(doc, Mapping) else None
    phases: dict[str, int] = {}
    for child in children if isinstance(children, list) else []:
        if isinstance(child, Mapping):
            phase = printable(str(child.get("phase") or "planned"))[:MAX_COUNT_NAME]
            phases[phase] = phases.get(phase, 0) + 1
    if not phases:
        return ""
    return "retries " + ", ".join(f"{phase} {n}" for phase, n in sorted(phases.items()))


class WaitBar:
    """``wait``'s progress: the state, the rows answered of the requests (when the details
    count them: done = succeeded + failed), every other count, the lineage's retries."""

    def __init__(self, name: str, on: bool, stream: IO[str] | None = None) -> None:
        self.name = name
        self.on = on
        self.stream = sys.stderr if stream is None else stream
        self._bar: Any = None

    def show(self, state: str, details: Mapping[str, Any], retry: Mapping[str, Any] | None) -> None:
        if not self.on:
            return
        counts = wait_counts(details)
        total = counts.get("requestCount")
        done = counts.get("successfulRequestCount", 0) + counts.get("failedRequestCount", 0)
        shown = [f"{_short(k)} {v}" for k, v in counts.items() if k != "requestCount"]
        postfix = ", ".join(filter(None, [*shown, _phases(retry)]))
        if self._bar is None or (total or None) != self._bar.total:
            self.close()  # a bar of its own once the record says how many rows
            rows = "{desc}: {percentage:3.0f}%|{bar}| {n_fmt}/{total_fmt} rows, {postfix}"
            self._bar = _bar(
                self.stream,
                total=total or None,
                desc=f"{self.name} {state}",
                bar_format=rows if total else "{desc}{postfix}",
            )
        bar = self._bar
        bar.n = done
        bar.set_description_str(f"{self.name} {state}", refresh=False)
        bar.set_postfix_str(postfix if total else f": {postfix or 'no counts yet'}", refresh=False)
        bar.refresh()

    def say(self, text: str) -> None:
        """A line on stderr above the bar (the bar is redrawn under it)."""
        line = printable_lines(text)
        if self._bar is None:
            self.stream.write(line + "\n")
            self.stream.flush()
        else:
            self._bar.write(line, file=self.stream)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None


def watched(read: Callable[[str, bool], Any], bar: WaitBar) -> Callable[[str, bool], Any]:
    """``read`` (``wait``'s status reader), each status drawn on ``bar``."""

    def each(name: str, with_results: bool) -> Any:
        status = read(name, with_results)
        record = status.record
        if record is not None:
            bar.show(str(record.state), record.details, status.retry)
        return status

    return each
