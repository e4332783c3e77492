"""Run the ``sam build`` output through the real Lambda runtime interface, without Docker.

What runs, and from where:

- the Runtime Interface Emulator binary that ships inside the installed aws-sam-cli package
  (``.tools-venv/.../samcli/local/rapid/aws-lambda-rie-<arch>``, the one ``sam local`` puts in
  its containers);
- ``python -m awslambdaric <Handler>`` from ``.rie-venv``, a virtualenv holding only
  ``awslambdaric`` (and its two own dependencies), so every other import must come from
  ``.aws-sam/build/<Function>`` (the function's code and its own requirements, like
  ``/var/task``) and ``.aws-sam/build/<Layer>/python`` (like ``/opt/python``);
- the environment variables of the *built* template (Globals merged with the function's own),
  with ``Ref``/``Fn::GetAtt``/``Fn::Sub``/``Fn::FindInMap``/``Fn::Join`` resolved to the test's
  resources and parameters at their defaults; the test may add overrides (named at the call
  site);
- and what Lambda itself sets, among it, for a ``LoggingConfig`` with ``LogFormat: JSON``,
  ``AWS_LAMBDA_LOG_FORMAT`` and ``AWS_LAMBDA_LOG_LEVEL`` (its ``ApplicationLogLevel``): "Lambda
  sets the application log level in the runtime using the AWS_LAMBDA_LOG_LEVEL environment
  variable ... your function's log format using the AWS_LAMBDA_LOG_FORMAT environment variable"
  (AWS's Lambda guide, custom runtimes), read by awslambdaric and Powertools.

Every process is started in its own session on 127.0.0.1 free ports and stopped (the whole
process group) by ``LambdaProcess.stop``.

When a prerequisite is missing (tools virtualenv, build output, RIE virtualenv) or the build is
older than the sources, ``require`` fails the test under CI (``CI=true``) and skips it locally
with a message naming the make target that fixes it.
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import re
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.support.motoserver import free_port
from tests.support.prerequisites import require as _require
from tests.support.template import load_template

ROOT = Path(__file__).resolve().parents[2]
BUILD_DIR = ROOT / ".aws-sam" / "build"
BUILT_TEMPLATE = BUILD_DIR / "template.yaml"
TOOLS_VENV = ROOT / ".tools-venv"
RIE_VENV = ROOT / ".rie-venv"
RIE_PYTHON = RIE_VENV / "bin" / "python"
EVENTS_DIR = ROOT / "events"
REGION = "us-east-1"
INVOKE_PATH = "/2015-03-31/functions/function/invocations"


def require(condition: bool, message: str) -> None:
    """A missing prerequisite fails under CI and skips locally (documented in docs/deploy.md)."""
    _require(
        condition,
        message,
        fail_prefix="e2e prerequisite missing under CI: ",
        skip_prefix="e2e prerequisite missing: ",
    )


def rie_binary() -> Path | None:
    """The aws-lambda-rie binary shipped in the installed aws-sam-cli package."""
    arch = {"x86_64": "x86_64", "amd64": "x86_64", "aarch64": "arm64", "arm64": "arm64"}.get(
        platform.machine().lower(), platform.machine().lower()
    )
    pattern = f"lib/python3*/site-packages/samcli/local/rapid/aws-lambda-rie-{arch}"
    for candidate in sorted(TOOLS_VENV.glob(pattern)):
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return candidate
    return None


# --- the built template ------------------------------------------------------------------------


class UnresolvableError(KeyError):
    """An intrinsic the harness was not told how to resolve (add it to the test's resources)."""


@dataclass
class BuiltTemplate:
    data: dict[str, Any]

    @classmethod
    def load(cls, path: Path = BUILT_TEMPLATE) -> BuiltTemplate:
        return cls(load_template(path))

    @property
    def resources(self) -> dict[str, Any]:
        resources: dict[str, Any] = self.data["Resources"]
        return resources

    def function(self, logical_id: str) -> dict[str, Any]:
        resource = self.resources[logical_id]
        assert resource["Type"] == "AWS::Serverless::Function", logical_id
        props: dict[str, Any] = resource["Properties"]
        return props

    def function_setting(self, logical_id: str, key: str) -> Any:
        """A function property, falling back to ``Globals.Function`` as SAM does."""
        props = self.function(logical_id)
        if key in props:
            return props[key]
        return self.data.get("Globals", {}).get("Function", {}).get(key)

    def environment(self, logical_id: str) -> dict[str, Any]:
        """Globals' variables overlaid with the function's own (unresolved)."""
        merged: dict[str, Any] = {}
        globals_env = self.data.get("Globals", {}).get("Function", {}).get("Environment", {})
        merged.update(globals_env.get("Variables", {}))
        merged.update(self.function(logical_id).get("Environment", {}).get("Variables", {}))
        return merged

    @property
    def runtime(self) -> str:
        """The functions' runtime, e.g. ``python3.13`` (Globals)."""
        return str(self.data["Globals"]["Function"]["Runtime"])

    def code_dir(self, logical_id: str) -> Path:
        return BUILD_DIR / str(self.function(logical_id)["CodeUri"])

    def layer_dirs(self, logical_id: str) -> list[Path]:
        """The built layers' directories, each as it would be mounted at /opt."""
        dirs: list[Path] = []
        for layer in self.function_setting(logical_id, "Layers") or []:
            assert isinstance(layer, dict) and "Ref" in layer, f"unsupported layer {layer!r}"
            props = self.resources[layer["Ref"]]["Properties"]
            dirs.append(BUILD_DIR / str(props["ContentUri"]))
        return dirs

    def parameter_default(self, name: str) -> str:
        params = self.data.get("Parameters", {})
        if name not in params or "Default" not in params[name]:
            raise UnresolvableError(f"parameter {name} has no default")
        return str(params[name]["Default"])

    def resolve(self, value: Any, refs: Mapping[str, str]) -> str:
        """Resolve one environment value: ``refs`` maps logical ids / pseudo parameters (and
        ``Logical.Attr`` for GetAtt) to test values; parameters fall back to their defaults."""
        if isinstance(value, bool):
            return "true" if value else "false"
        if isinstance(value, int | float | str):
            return str(value)
        if isinstance(value, dict) and len(value) == 1:
            ((fn, arg),) = value.items()
            intrinsics: dict[str, Callable[[Any, Mapping[str, str]], str]] = {
                "Ref": lambda name, refs: self._ref(str(name), refs),
                "Fn::GetAtt": self._get_att,
                "Fn::FindInMap": self._find_in_map,
                "Fn::Sub": self._sub,
                "Fn::Join": self._join,
            }
            if fn in intrinsics:
                return intrinsics[fn](arg, refs)
        raise UnresolvableError(f"intrinsic {value!r}")

    def _get_att(self, arg: Any, refs: Mapping[str, str]) -> str:
        key = ".".join(arg) if isinstance(arg, list) else str(arg)
        if key in refs:
            return refs[key]
        raise UnresolvableError(f"GetAtt {key}")

    def _find_in_map(self, arg: Any, refs: Mapping[str, str]) -> str:
        m, k1, k2 = (self.resolve(a, refs) for a in arg)
        return str(self.data["Mappings"][m][k1][k2])

    def _join(self, arg: Any, refs: Mapping[str, str]) -> str:
        """``Fn::Join [delimiter, items]``: items a list, or a ``Ref`` to a
        ``CommaDelimitedList`` parameter (its text, items separated by commas)."""
        delimiter, items = arg
        if isinstance(items, list):
            return str(delimiter).join(self.resolve(item, refs) for item in items)
        return str(delimiter).join(self.resolve(items, refs).split(","))

    def _sub(self, arg: Any, refs: Mapping[str, str]) -> str:
        text, local = (arg, {}) if isinstance(arg, str) else (arg[0], arg[1])

        def sub(match: re.Match[str]) -> str:
            name = match.group(1)
            if name in local:
                return self.resolve(local[name], refs)
            if "." in name:
                return self.resolve({"Fn::GetAtt": name.split(".", 1)}, refs)
            return self._ref(name, refs)

        return re.sub(r"\$\{([^}!]+)\}", sub, str(text))

    def _ref(self, name: str, refs: Mapping[str, str]) -> str:
        if name in refs:
            return refs[name]
        if name in self.data.get("Parameters", {}):
            return self.parameter_default(name)
        raise UnresolvableError(f"Ref {name}")

    def resolved_environment(self, logical_id: str, refs: Mapping[str, str]) -> dict[str, str]:
        return {k: self.resolve(v, refs) for k, v in self.environment(logical_id).items()}

    def logging_environment(self, logical_id: str, refs: Mapping[str, str]) -> dict[str, str]:
        """What Lambda sets for the function's ``LoggingConfig``: with ``LogFormat: JSON``, the
        format and the application level (INFO when unset); with Text, nothing."""
        config = self.function_setting(logical_id, "LoggingConfig") or {}
        if self.resolve(config.get("LogFormat", "Text"), refs) != "JSON":
            return {}
        level = self.resolve(config.get("ApplicationLogLevel", "INFO"), refs)
        return {"AWS_LAMBDA_LOG_FORMAT": "JSON", "AWS_LAMBDA_LOG_LEVEL": level}


def source_uri(template: Mapping[str, Any], uri: Any) -> str:
    """A CodeUri/ContentUri of the source template as ``make build`` builds it: a
    ``Fn::If [IsArm64, arm64 dir, x86_64 dir]`` resolved with the parameters' defaults."""
    if isinstance(uri, dict) and "Fn::If" in uri:
        condition, if_true, if_false = uri["Fn::If"]
        test = template["Conditions"][condition]["Fn::Equals"]
        values = [
            str(template["Parameters"][v["Ref"]]["Default"]) if isinstance(v, dict) else str(v)
            for v in test
        ]
        return str(if_true if values[0] == values[1] else if_false)
    return str(uri)


def stale_build_files() -> list[str]:
    """Source files whose built copy differs from (or is missing in) ``.aws-sam/build``:
    every ``.py`` of each function's ``CodeUri`` and of each layer's package."""
    if not BUILT_TEMPLATE.is_file():
        return ["(no build output)"]
    built_resources = BuiltTemplate.load().resources
    source_template = load_template()
    source_resources = source_template["Resources"]
    pairs: list[tuple[Path, Path]] = []
    for logical_id, resource in built_resources.items():
        props = resource.get("Properties", {})
        source_props = source_resources.get(logical_id, {}).get("Properties", {})
        if resource.get("Type") == "AWS::Serverless::Function":
            code = source_uri(source_template, source_props["CodeUri"])
            pairs.append((ROOT / code, BUILD_DIR / str(props["CodeUri"])))
        elif resource.get("Type") == "AWS::Serverless::LayerVersion":
            built = BUILD_DIR / str(props["ContentUri"]) / "python"
            pairs.append((ROOT / source_uri(source_template, source_props["ContentUri"]), built))
    stale: list[str] = []
    for source, built in pairs:
        for path in sorted(source.rglob("*.py")):
            rel = path.relative_to(source)
            if "__pycache__" in rel.parts or ".egg-info" in str(rel):
                continue
            target = built / rel
            if not target.is_file() or target.read_bytes() != path.read_bytes():
                stale.append(str(path.relative_to(ROOT)))
    return stale


# --- one function behind the runtime interface emulator ------------------------------------------


class InvokeError(AssertionError):
    """The function raised (the runtime reported an error) or the invoke failed."""


@dataclass
class LambdaProcess:
    """One built function running behind aws-lambda-rie + awslambdaric on 127.0.0.1."""

    logical_id: str
    process: subprocess.Popen[bytes]
    endpoint: str
    log_path: Path
    env: dict[str, str] = field(repr=False)

    def invoke(self, event: Mapping[str, Any], timeout_s: float = 120.0) -> Any:
        data = json.dumps(event).encode()
        request = urllib.request.Request(
            self.endpoint + INVOKE_PATH,
            data=data,
            method="POST",
            headers={"Content-Type": "application/json"},
        )
        try:
            with urllib.request.urlopen(request, timeout=timeout_s) as response:
                body = response.read()
        except (urllib.error.URLError, TimeoutError, ConnectionError) as exc:
            raise InvokeError(
                f"{self.logical_id}: invoke failed: {exc}\n{self.log_tail()}"
            ) from exc
        try:
            result = json.loads(body) if body else None
        except ValueError as exc:
            raise InvokeError(f"{self.logical_id}: not JSON: {body[:500]!r}") from exc
        if isinstance(result, dict) and "errorType" in result and "errorMessage" in result:
            raise InvokeError(
                f"{self.logical_id} raised {result['errorType']}: {result['errorMessage']}\n"
                f"{self.log_tail()}"
            )
        return result

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(encoding="utf-8", errors="replace")
        except FileNotFoundError:
            return ""

    def log_tail(self, lines: int = 60) -> str:
        return "\n".join(self.log_text().splitlines()[-lines:])

    def stop(self) -> None:
        """Stop rie and the runtime (its child, in the same process group), no survivors."""
        if self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(timeout=10)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGKILL)


def lambda_environment(
    template: BuiltTemplate,
    logical_id: str,
    *,
    refs: Mapping[str, str],
    aws_endpoint: str,
    overrides: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """The whole environment of the runtime process: a clean base (no inherited variables),
    what Lambda itself sets, the built template's variables, then the test's overrides."""
    code_dir = template.code_dir(logical_id)
    python_path = [str(code_dir)]
    for layer in template.layer_dirs(logical_id):
        # Lambda puts /opt/python/lib/<runtime>/site-packages and /opt/python on the path.
        site = layer / "python" / "lib" / template.runtime / "site-packages"
        if site.is_dir():
            python_path.append(str(site))
        python_path.append(str(layer / "python"))
    env = {
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "LANG": "C.UTF-8",
        "TZ": "UTC",
        "HOME": str(code_dir),
        "PYTHONPATH": os.pathsep.join(python_path),
        "PYTHONDONTWRITEBYTECODE": "1",
        "PYTHONNOUSERSITE": "1",
        "LAMBDA_TASK_ROOT": str(code_dir),
        "AWS_EXECUTION_ENV": f"AWS_Lambda_{template.runtime}",
        "AWS_LAMBDA_FUNCTION_NAME": logical_id,
        "AWS_LAMBDA_FUNCTION_TIMEOUT": str(template.function_setting(logical_id, "Timeout") or 3),
        # MemorySize may be a Ref to a template parameter (its default here).
        "AWS_LAMBDA_FUNCTION_MEMORY_SIZE": template.resolve(
            template.function_setting(logical_id, "MemorySize") or 128, refs
        ),
        "AWS_REGION": REGION,
        "AWS_DEFAULT_REGION": REGION,
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_SESSION_TOKEN": "testing",
        "AWS_ENDPOINT_URL": aws_endpoint,
        # X-Ray segments (Tracing: Active) go to a UDP port on 127.0.0.1 nobody listens on.
        "AWS_XRAY_DAEMON_ADDRESS": f"127.0.0.1:{free_port()}",
        "AWS_XRAY_CONTEXT_MISSING": "LOG_ERROR",
    }
    ca_bundle = os.environ.get("AWS_CA_BUNDLE")
    if ca_bundle:
        env["AWS_CA_BUNDLE"] = ca_bundle
    env.update(template.logging_environment(logical_id, refs))
    env.update(template.resolved_environment(logical_id, refs))
    # The test's AWS is the moto server: the template's empty AWS_ENDPOINT_URL (declared for
    # `sam local` only, "unset" to boto3) must not hide it.
    env["AWS_ENDPOINT_URL"] = aws_endpoint
    env.update(overrides or {})
    return env


def start_function(
    template: BuiltTemplate,
    logical_id: str,
    *,
    refs: Mapping[str, str],
    aws_endpoint: str,
    log_dir: Path,
    overrides: Mapping[str, str] | None = None,
    startup_timeout_s: float = 20.0,
) -> LambdaProcess:
    rie = rie_binary()
    if rie is None:
        raise RuntimeError("aws-lambda-rie not found in .tools-venv")
    handler = str(template.function_setting(logical_id, "Handler"))
    env = lambda_environment(
        template, logical_id, refs=refs, aws_endpoint=aws_endpoint, overrides=overrides
    )
    port, api_port = free_port(), free_port()
    log_path = log_dir / f"{logical_id}.log"
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            [
                str(rie),
                "--runtime-interface-emulator-address",
                f"127.0.0.1:{port}",
                "--runtime-api-address",
                f"127.0.0.1:{api_port}",
                "--log-level",
                "info",
                str(RIE_PYTHON),
                "-m",
                "awslambdaric",
                handler,
            ],
            cwd=template.code_dir(logical_id),
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    proc = LambdaProcess(logical_id, process, f"http://127.0.0.1:{port}", log_path, env)
    deadline = time.monotonic() + startup_timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(
                f"aws-lambda-rie exited with {process.returncode}\n{proc.log_tail()}"
            )
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return proc
        except OSError:
            time.sleep(0.05)
    proc.stop()
    raise RuntimeError(f"aws-lambda-rie did not listen in time\n{proc.log_tail()}")


def subscribe(
    clients: Mapping[str, Any], *, bus: str, queue_url: str, rule: str, detail_types: list[str]
) -> None:
    """A consumer's subscription, as docs/deploy.md describes it: a rule on the bus matching
    opstate's ``detail_types``, delivering to the queue at ``queue_url``."""
    queue_arn = clients["sqs"].get_queue_attributes(
        QueueUrl=queue_url, AttributeNames=["QueueArn"]
    )["Attributes"]["QueueArn"]
    clients["events"].put_rule(
        Name=rule,
        EventBusName=bus,
        EventPattern=json.dumps({"source": ["gemini-opstate"], "detail-type": detail_types}),
    )
    clients["events"].put_targets(
        Rule=rule, EventBusName=bus, Targets=[{"Id": "consumer", "Arn": queue_arn}]
    )


def json_objects(log_text: str, start: str = "{") -> list[dict[str, Any]]:
    """The JSON object each line of a function's log holds from the first ``start`` on (lines
    without one, or not JSON there, are left out)."""
    found: list[dict[str, Any]] = []
    for line in log_text.splitlines():
        at = line.find(start)
        if at < 0:
            continue
        try:
            doc = json.loads(line[at:])
        except ValueError:
            continue
        if isinstance(doc, dict):
            found.append(doc)
    return found


def load_event(name: str) -> dict[str, Any]:
    event: dict[str, Any] = json.loads((EVENTS_DIR / name).read_text(encoding="utf-8"))
    return event
