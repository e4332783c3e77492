"""A moto server in its own process on 127.0.0.1 (its backends stay apart from ``mock_aws``)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        port: int = sock.getsockname()[1]
        return port


@dataclass
class MotoServer:
    process: subprocess.Popen[bytes]
    endpoint: str

    def reset(self) -> None:
        """Forget every resource (moto's reset API)."""
        req = urllib.request.Request(f"{self.endpoint}/moto-api/reset", method="POST")
        urllib.request.urlopen(req, timeout=10).close()

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=10)


ATOMIC_LAUNCHER = Path(__file__).with_name("moto_atomic.py")


def start_moto_server(
    timeout_s: float = 30.0, *, atomic_dynamodb: bool = True, host: str = "127.0.0.1"
) -> MotoServer:
    """Start a moto server. ``atomic_dynamodb`` (default) serialises DynamoDB requests so a
    conditional write is atomic as in real DynamoDB (see ``moto_atomic.py``). ``host`` is the
    address it listens on (the ``sam local`` tests use the Docker bridge's gateway, which the
    Lambda containers reach)."""
    port = free_port(host)
    env = dict(os.environ)
    env.setdefault("AWS_DEFAULT_REGION", "us-east-1")
    launcher = [str(ATOMIC_LAUNCHER)] if atomic_dynamodb else ["-m", "moto.server"]
    process = subprocess.Popen(
        [sys.executable, *launcher, "-H", host, "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        stdin=subprocess.DEVNULL,
        env=env,
    )
    endpoint = f"http://{host}:{port}"
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"moto server exited with {process.returncode}")
        try:
            urllib.request.urlopen(f"{endpoint}/moto-api/", timeout=1).close()
            return MotoServer(process, endpoint)
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            time.sleep(0.1)
    process.kill()
    raise RuntimeError("moto server did not start in time")
