"""``python tests/support/moto_atomic.py -H 127.0.0.1 -p PORT``: moto's server, with DynamoDB
requests handled one at a time.

moto's DynamoDB backend checks a ``ConditionExpression`` and then writes, with no lock between
the two; its server handles requests on many threads. Two concurrent conditional writes on one
item can therefore both pass their condition (both "win" ``version = :expected``), which real
DynamoDB never allows. Concurrency tests of optimistic writes need the real guarantee, so this
launcher serialises every DynamoDB request (identified by its ``X-Amz-Target`` header) behind
one lock. Other services keep moto's concurrency (SQS long polls must not block everything).
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterable
from typing import Any

from moto.moto_server.werkzeug_app import (
    DomainDispatcherApplication,
    MotoRequestHandler,
    create_backend_app,
)
from werkzeug.serving import run_simple


class SerialDynamoDB:
    """WSGI middleware: DynamoDB requests run one at a time, the body fully produced inside."""

    def __init__(self, app: Callable[..., Iterable[bytes]]) -> None:
        self.app = app
        self.lock = threading.Lock()

    def __call__(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> Any:
        target = environ.get("HTTP_X_AMZ_TARGET", "")
        if not target.startswith("DynamoDB_"):
            return self.app(environ, start_response)
        with self.lock:
            body = self.app(environ, start_response)
            try:
                return [b"".join(body)]
            finally:
                close = getattr(body, "close", None)
                if callable(close):
                    close()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("-H", "--host", default="127.0.0.1")
    parser.add_argument("-p", "--port", type=int, required=True)
    args = parser.parse_args(argv)
    os.environ.setdefault("MOTO_PORT", str(args.port))  # as moto.server does (queue URLs)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    app = DomainDispatcherApplication(create_backend_app)
    run_simple(
        args.host,
        args.port,
        SerialDynamoDB(app),
        threaded=True,
        request_handler=MotoRequestHandler,
    )


if __name__ == "__main__":
    main()
