"""``sam local`` on the built app: the SAM CLI of ``.tools-venv``, a Docker engine, and the
Lambda Python base image (``scripts/lambda-base-image.sh``: AWS's image, or the offline stand-in).

Networking: SAM runs each function in a container on Docker's default bridge network (SAM 1.170
ignores ``--docker-network host``: it only skips connecting the container to a named network).
The moto server and the fake Gemini server therefore listen on the bridge's gateway address
(``docker network inspect bridge``, usually 172.17.0.1), which both this process and the
containers reach; nothing listens on a public interface. The endpoints are passed to SAM
through the environment (``AWS_ENDPOINT_URL``, ``GOOGLE_GEMINI_BASE_URL``): the template
declares them, ``events/env.json`` does not set them, so SAM takes them from the shell.

When a prerequisite is missing, ``require`` fails the test under ``CI=true`` and skips it
otherwise, with one line naming what is missing and how to get it.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import signal
import socket
import struct
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import boto3
from botocore import UNSIGNED
from botocore.config import Config

from tests.e2e.harness import BUILT_TEMPLATE, stale_build_files
from tests.support.prerequisites import require as _require

ROOT = Path(__file__).resolve().parents[2]
SAM = ROOT / ".tools-venv" / "bin" / "sam"
EVENTS_DIR = ROOT / "events"
ENV_FILE = EVENTS_DIR / "env.json"
# The image SAM builds its invoke image on for a python3.13 x86_64 function.
BASE_IMAGE = "public.ecr.aws/lambda/python:3.13-x86_64"
REGION = "us-east-1"


def require(condition: bool, message: str) -> None:
    _require(
        condition,
        message,
        fail_prefix="sam local prerequisite missing under CI: ",
        skip_prefix="sam local tests skipped: ",
    )


def _docker(*args: str, timeout_s: float = 30.0) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["docker", *args],
        capture_output=True,
        text=True,
        timeout=timeout_s,
        stdin=subprocess.DEVNULL,
        check=False,
    )


def missing_prerequisite() -> str | None:
    """What keeps the ``sam local`` tests from running here, in one line (None: nothing)."""
    if shutil.which("docker") is None:
        return "no docker CLI (install Docker, or run .ci/run, which provisions one)"
    try:
        info = _docker("info", "--format", "{{.ServerVersion}}")
    except subprocess.TimeoutExpired:
        return "the Docker engine does not answer (`docker info` timed out)"
    if info.returncode != 0 or not info.stdout.strip():
        return "no Docker engine answers `docker info` (start dockerd, or run .ci/run)"
    if _docker("image", "inspect", BASE_IMAGE).returncode != 0:
        return f"the Lambda base image {BASE_IMAGE} is missing: run `make lambda-base-image`"
    if not SAM.is_file():
        return "the SAM CLI (.tools-venv) is missing: run `make tools`"
    if not BUILT_TEMPLATE.is_file():
        return ".aws-sam/build is missing: run `make build`"
    stale = stale_build_files()
    if stale:
        return "the sam build output is older than the sources (run `make build`): " + ", ".join(
            stale[:3]
        )
    return None


def bridge_gateway() -> str:
    """The host's address on Docker's default bridge (reachable from its containers): the
    network's configured gateway, else the address of its bridge interface (docker0)."""
    out = _docker("network", "inspect", "bridge", "--format", "{{json .}}")
    if out.returncode != 0:
        raise RuntimeError(f"cannot inspect Docker's bridge network: {out.stderr.strip()}")
    network = json.loads(out.stdout)
    for config in (network.get("IPAM") or {}).get("Config") or []:
        if config.get("Gateway"):
            return str(config["Gateway"])
    name = (network.get("Options") or {}).get("com.docker.network.bridge.name", "docker0")
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        siocgifaddr = 0x8915
        packed = fcntl.ioctl(sock.fileno(), siocgifaddr, struct.pack("256s", name[:15].encode()))
    return socket.inet_ntoa(packed[20:24])


def sam_environment(aws_endpoint: str, extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """A clean environment for the SAM CLI: fake credentials, the endpoints, nothing from the
    test process (whose POWERTOOLS_* settings would otherwise reach the declared variables)."""
    env = {
        "PATH": os.environ.get("PATH", "/usr/local/bin:/usr/bin:/bin"),
        "HOME": os.environ.get("HOME", "/root"),
        "LANG": "C.UTF-8",
        "SAM_CLI_TELEMETRY": "0",
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_SESSION_TOKEN": "testing",
        "AWS_DEFAULT_REGION": REGION,
        "AWS_REGION": REGION,
        # Reached by SAM itself (its sts:GetCallerIdentity, answered by moto at once) and, as a
        # declared variable, by the functions in their containers.
        "AWS_ENDPOINT_URL": aws_endpoint,
    }
    for key in ("DOCKER_HOST", "DOCKER_CONFIG", "TMPDIR"):
        if key in os.environ:
            env[key] = os.environ[key]
    env.update(extra or {})
    return env


def sam_command(*args: str) -> list[str]:
    return [
        str(SAM),
        *args,
        "--template",
        str(BUILT_TEMPLATE),
        "--env-vars",
        str(ENV_FILE),
        # The image is local (built offline or pulled by scripts/lambda-base-image.sh).
        "--skip-pull-image",
    ]


class InvokeError(AssertionError):
    """``sam local invoke`` failed or printed no result."""


@dataclass
class Invocation:
    function: str
    event: str
    result: Any
    logs: str
    seconds: float


def sam_invoke(
    function: str,
    event_path: Path,
    env: Mapping[str, str],
    timeout_s: float = 240.0,
) -> Invocation:
    """``sam local invoke FUNCTION -e EVENT --env-vars events/env.json`` on the build; the
    function's answer is the last line SAM prints on stdout, its logs are on stderr."""
    started = time.monotonic()
    proc = subprocess.run(
        [*sam_command("local", "invoke", function, "--event", str(event_path))],
        cwd=ROOT,
        env=dict(env),
        capture_output=True,
        text=True,
        timeout=timeout_s,
        stdin=subprocess.DEVNULL,
        check=False,
    )
    seconds = time.monotonic() - started
    lines = [line for line in proc.stdout.splitlines() if line.strip()]
    if proc.returncode != 0 or not lines:
        raise InvokeError(
            f"sam local invoke {function} -e {event_path.name} exited {proc.returncode}\n"
            f"stdout: {proc.stdout[-2000:]}\nstderr: {proc.stderr[-4000:]}"
        )
    try:
        result = json.loads(lines[-1])
    except ValueError as exc:
        raise InvokeError(f"not JSON: {lines[-1][:500]!r}\n{proc.stderr[-4000:]}") from exc
    if isinstance(result, dict) and "errorType" in result and "errorMessage" in result:
        raise InvokeError(f"{function} raised: {result}\n{proc.stderr[-4000:]}")
    return Invocation(function, event_path.name, result, proc.stderr, seconds)


# --- sam local start-api ------------------------------------------------------------------------


@dataclass
class LocalApi:
    """A running ``sam local start-api --warm-containers LAZY`` (a container for a function at
    its first request: EAGER would start all six, the test calls one)."""

    process: subprocess.Popen[bytes]
    base_url: str
    log_path: Path
    started_s: float = 0.0  # from the command to the first answer
    run_s: float = 0.0  # from the command to the end of stop()
    t0: float = field(default_factory=time.monotonic)

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(encoding="utf-8", errors="replace")
        except FileNotFoundError:
            return ""

    def request(
        self,
        method: str,
        path: str,
        body: bytes | None = None,
        headers: Mapping[str, str] | None = None,
        timeout_s: float = 120.0,
    ) -> tuple[int, Any]:
        request = urllib.request.Request(
            self.base_url + path, data=body, method=method, headers=dict(headers or {})
        )
        try:
            with urllib.request.urlopen(request, timeout=timeout_s) as response:
                status, raw = response.status, response.read()
        except urllib.error.HTTPError as exc:
            status, raw = exc.code, exc.read()
        try:
            return status, json.loads(raw) if raw else None
        except ValueError:
            return status, raw.decode(errors="replace")

    def container_ids(self) -> list[str]:
        return container_ids(self.log_text())

    def stop(self) -> None:
        stop_sam(self.process, self.container_ids())
        self.run_s = time.monotonic() - self.t0


def stop_sam(process: subprocess.Popen[bytes], container_ids: list[str]) -> None:
    """Ctrl-C (SAM then removes its warm containers), then, after a short grace, the process
    group; any container SAM reported and left behind is removed (``docker rm -f``). The grace
    is short on purpose: SAM stopping three warm containers one by one took the whole minute
    this used to wait (a 61 s teardown at the end of a run), and ``docker rm -f`` does the same
    at once."""
    if process.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGINT)
        try:
            process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=10)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
    leftovers = [cid for cid in container_ids if cid]
    if leftovers:
        _docker("rm", "-f", *leftovers, timeout_s=60)


def container_ids(log: str) -> list[str]:
    """The containers SAM reported starting (``SAM_CONTAINER_ID:`` lines of its log)."""
    return [
        line.rsplit(":", 1)[1].strip() for line in log.splitlines() if "SAM_CONTAINER_ID:" in line
    ]


def launch_local(
    command: str, env: Mapping[str, str], port: int, log_path: Path
) -> subprocess.Popen[bytes]:
    """``sam local COMMAND`` (start-api or start-lambda) on 127.0.0.1:PORT with LAZY warm
    containers, in its own session (``stop_sam`` stops the group), its output in ``log_path``."""
    with log_path.open("wb") as log:
        return subprocess.Popen(
            sam_command(
                "local",
                command,
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
                "--warm-containers",
                "LAZY",
            ),
            cwd=ROOT,
            env=dict(env),
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def start_api(
    env: Mapping[str, str], port: int, log_path: Path, timeout_s: float = 240.0
) -> LocalApi:
    started = time.monotonic()
    process = launch_local("start-api", env, port, log_path)
    api = LocalApi(process, f"http://127.0.0.1:{port}", log_path, t0=started)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"sam local start-api exited {process.returncode}\n{api.log_text()}")
        try:
            # Any HTTP answer means the server is up (a GET on the POST-only route is 403/404).
            api.request("GET", "/gemini/webhook", timeout_s=2)
            api.started_s = time.monotonic() - started
            return api
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            time.sleep(0.25)
    api.stop()
    raise RuntimeError(f"sam local start-api did not answer in time\n{api.log_text()[-4000:]}")


# --- sam local start-lambda ---------------------------------------------------------------------


@dataclass
class LocalLambda:
    """A running ``sam local start-lambda --warm-containers LAZY``: AWS's Lambda Invoke API on
    a local port, one container per function made at its first invoke and kept for the next
    ones. The functions' logs go to SAM's stderr (here ``log_path``); the answer is the
    Invoke API's payload."""

    process: subprocess.Popen[bytes]
    endpoint: str
    log_path: Path
    client: Any = field(repr=False)
    started_s: float = 0.0  # from the command to the first answer
    t0: float = field(default_factory=time.monotonic)

    def log_bytes(self) -> bytes:
        try:
            return self.log_path.read_bytes()
        except FileNotFoundError:
            return b""

    def log_text(self) -> str:
        return self.log_bytes().decode(errors="replace")

    def invoke(self, function: str, event_path: Path, log_holds: str = "") -> Invocation:
        """``Invoke`` (RequestResponse) with the event file's bytes as the payload; the logs
        are what SAM wrote from the call on, once they hold ``log_holds`` (a container's
        output may trail its answer by a moment)."""
        offset = len(self.log_bytes())
        started = time.monotonic()
        response = self.client.invoke(FunctionName=function, Payload=event_path.read_bytes())
        payload = response["Payload"].read()
        seconds = time.monotonic() - started
        deadline = time.monotonic() + 30.0
        while log_holds not in (logs := self.log_bytes()[offset:].decode(errors="replace")):
            if time.monotonic() > deadline:
                break
            time.sleep(0.1)
        try:
            result = json.loads(payload)
        except ValueError as exc:
            raise InvokeError(f"not JSON: {payload[:500]!r}\n{logs[-4000:]}") from exc
        if response.get("FunctionError") or (
            isinstance(result, dict) and "errorType" in result and "errorMessage" in result
        ):
            raise InvokeError(f"{function} raised: {result}\n{logs[-4000:]}")
        return Invocation(function, event_path.name, result, logs, seconds)

    def stop(self) -> None:
        stop_sam(self.process, container_ids(self.log_text()))


def lambda_client(endpoint: str) -> Any:
    """boto3's Lambda client on ``sam local start-lambda``, configured as SAM's help shows:
    unsigned, no retries; a read timeout longer than any run here (urllib3 refuses 0)."""
    return boto3.client(
        "lambda",
        region_name=REGION,
        endpoint_url=endpoint,
        config=Config(signature_version=UNSIGNED, read_timeout=300, retries={"max_attempts": 0}),
    )


def start_lambda(
    env: Mapping[str, str], port: int, log_path: Path, timeout_s: float = 240.0
) -> LocalLambda:
    started = time.monotonic()
    process = launch_local("start-lambda", env, port, log_path)
    endpoint = f"http://127.0.0.1:{port}"
    try:
        client = lambda_client(endpoint)
    except Exception:
        stop_sam(process, [])
        raise
    local = LocalLambda(process, endpoint, log_path, client, t0=started)
    probe = urllib.request.Request(endpoint + "/2015-03-31/functions/WebhookFunction/invocations")
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(
                f"sam local start-lambda exited {process.returncode}\n{local.log_text()}"
            )
        try:
            # Any HTTP answer means the server is up (a GET on the invoke path is 405).
            with urllib.request.urlopen(probe, timeout=2):
                pass
        except urllib.error.HTTPError:
            pass
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            time.sleep(0.25)
            continue
        local.started_s = time.monotonic() - started
        return local
    local.stop()
    raise RuntimeError(f"sam local start-lambda did not answer in time\n{local.log_text()[-4000:]}")
