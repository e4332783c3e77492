"""A CA file of one certificate, for the google-genai clients of a test whose fake Gemini speaks
plain HTTP (issue 49).

Every ``genai.Client`` builds its TLS contexts when it is made (its httpx clients' and its
websocket's), each loading a CA bundle: certifi's ~150 certificates, ~25 CPU ms a context, ~50
a client. Against a fake on http://127.0.0.1 none of them is ever used. With ``SSL_CERT_FILE``
naming a file of one certificate (certifi's first) the SDK loads that instead (~0.5 ms): a
retry pass makes a client, and test_retry_engine_faults.py's 29 tests, ~220 clients, had spent
two thirds of their CPU loading certificates.

Set it only where every TLS context made is one nothing uses (a test's processes talking to
fakes on 127.0.0.1): a connection that did verify a server would trust that one certificate.
"""

from __future__ import annotations

import os
from pathlib import Path

import certifi

NAME = "one-ca-certificate.pem"
_BEGIN, _END = "-----BEGIN CERTIFICATE-----", "-----END CERTIFICATE-----"


def one_certificate_file(folder: Path) -> Path:
    """``folder/NAME``, holding the first certificate of certifi's bundle (written once; a
    reader never sees half of it)."""
    path = folder / NAME
    if not path.exists():
        bundle = Path(certifi.where()).read_text(encoding="utf-8")
        start = bundle.index(_BEGIN)
        first = bundle[start : bundle.index(_END, start) + len(_END)] + "\n"
        partial = path.with_name(f"{NAME}.{os.getpid()}")
        partial.write_text(first, encoding="ascii")
        partial.replace(path)
    return path


def plain_http_env(folder: Path) -> dict[str, str]:
    """The environment entry that points google-genai's TLS contexts at
    ``one_certificate_file(folder)``."""
    return {"SSL_CERT_FILE": str(one_certificate_file(folder))}
