"""Try opstate without a Gemini key: ``make fake-gemini`` (``python -m
tests.support.offline_gemini``) serves the tests' own fake Gemini (``fake_gemini.FakeGemini``:
the REST shapes google-genai reads, so the real client talks to it) on 127.0.0.1 and prints the
two variables that point ``opstate`` at it. Nothing leaves the machine and nothing is billed.

It plays Gemini by itself: a created batch ends SUCCEEDED ``--finish-after`` seconds later
(default 2), every row answered except, the first time a request key is seen, every third row
of the batch, which fails 503 UNAVAILABLE, as Gemini's overloaded rows do. So ``opstate submit
... --retry-attempts 2`` then ``opstate retry --once`` (repeated) shows a real lineage: the
failed rows resubmitted, answered, and one ``final.jsonl``. Each answered row reports its
tokens (``usageMetadata``), so the costs are priced as a real batch's are.

``--port 0`` takes a free port (the tests); the printed lines always name the one in use.
"""

from __future__ import annotations

import argparse
import contextlib
import signal
import sys
import threading
from collections.abc import Iterator, Sequence
from http.server import ThreadingHTTPServer
from types import FrameType
from typing import Any

from tests.support import fake_gemini as fake_module
from tests.support.fake_gemini import FakeGemini
from tests.support.retry_rows import failed, input_keys

DEFAULT_PORT = 8790
DEFAULT_FINISH_AFTER_S = 2.0
DEFAULT_MODEL = "gemini-2.5-flash"
API_KEY = "offline-try"  # any key: the fake checks none


class OfflineGemini:
    """The fake Gemini and the part it plays: which keys it failed once, its timers."""

    def __init__(self, fake: FakeGemini, finish_after_s: float) -> None:
        self.fake = fake
        self.finish_after_s = finish_after_s
        self.seen: set[str] = set()
        self.lock = threading.Lock()
        self.timers: list[threading.Timer] = []

    def created(self, name: str) -> None:
        """A batch was created: it ends ``finish_after_s`` from now."""
        timer = threading.Timer(self.finish_after_s, self.finish, (name,))
        timer.daemon = True
        with self.lock:
            self.timers.append(timer)
        timer.start()

    def finish(self, name: str) -> None:
        keys = input_keys(self.fake.batch_input(name))
        model = _model_of(self.fake.resource(name))
        rows: list[dict[str, Any]] = []
        with self.lock:
            for index, key in enumerate(keys):
                first_time = key not in self.seen
                self.seen.add(key)
                if first_time and index % 3 == 0:
                    rows.append(failed(key, 503, "UNAVAILABLE"))
                else:
                    rows.append(_answered(key, model))
        self.fake.run_batch(name, rows)

    def stop(self) -> None:
        with self.lock:
            for timer in self.timers:
                timer.cancel()


def _model_of(resource: dict[str, Any] | None) -> str:
    """The model the batch was created with (its resource's ``model``), as the rows report."""
    metadata = resource.get("metadata") if resource else None
    model = metadata.get("model") if isinstance(metadata, dict) else None
    text = model if isinstance(model, str) and model else DEFAULT_MODEL
    return text.removeprefix("models/")


def _answered(key: str, model: str) -> dict[str, Any]:
    return {
        "key": key,
        "response": {
            "candidates": [
                {"content": {"parts": [{"text": f"answer {key}"}]}, "finishReason": "STOP"}
            ],
            "modelVersion": model,
            "usageMetadata": {
                "promptTokenCount": 12,
                "candidatesTokenCount": 30,
                "totalTokenCount": 42,
            },
        },
    }


@contextlib.contextmanager
def _listening_on(port: int) -> Iterator[None]:
    """``FakeGemini.start`` binds a free port; for the time of one start, bind ``port``."""
    original = getattr(fake_module, "ThreadingHTTPServer")  # noqa: B009 - not re-exported

    class OnPort(ThreadingHTTPServer):
        def __init__(self, address: tuple[str, int], handler: Any) -> None:
            super().__init__((address[0], port), handler)

    setattr(fake_module, "ThreadingHTTPServer", OnPort)  # noqa: B010
    try:
        yield
    finally:
        setattr(fake_module, "ThreadingHTTPServer", original)  # noqa: B010


def lines_to_paste(base_url: str) -> list[str]:
    return [
        f"export GOOGLE_GEMINI_BASE_URL={base_url} GEMINI_API_KEY={API_KEY}",
    ]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="make fake-gemini", description=__doc__.split("\n\n", 1)[0] if __doc__ else None
    )
    parser.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"default {DEFAULT_PORT}")
    parser.add_argument(
        "--finish-after",
        type=float,
        default=DEFAULT_FINISH_AFTER_S,
        metavar="SECONDS",
        help=f"a created batch ends this long after (default {DEFAULT_FINISH_AFTER_S:g})",
    )
    args = parser.parse_args(argv)
    fake = FakeGemini()
    play = OfflineGemini(fake, max(0.0, args.finish_after))
    fake.on_create(play.created)
    try:
        with _listening_on(args.port):
            fake.start()
    except OSError as exc:
        print(f"fake Gemini: cannot listen on 127.0.0.1:{args.port}: {exc}", file=sys.stderr)
        return 1
    stopped = threading.Event()

    def stop(_signum: int, _frame: FrameType | None) -> None:
        stopped.set()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    print(f"fake Gemini listening on {fake.base_url} (no key, no cost; Ctrl-C stops it)")
    print("paste this into the shell where you run opstate:")
    for line in lines_to_paste(fake.base_url):
        print(line)
    sys.stdout.flush()
    stopped.wait()
    play.stop()
    fake.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
