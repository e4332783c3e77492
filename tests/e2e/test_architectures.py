"""Each architecture's build holds only its own machine code.

``make build`` (Architecture=x86_64, the default) and ``make build-arm64``
(``--parameter-overrides Architecture=arm64`` into ``.aws-sam/arm64/build``): every ELF file of
the functions and the layer (shared objects, executables) is x86-64 in the first and aarch64
in the second - pip fetched aarch64 wheels for the arm64 build, never the build host's
x86-64 ones. Then, where Docker can run arm64 containers (qemu-user-static with binfmt_misc)
and the arm64 Lambda stand-in image exists (``OPSTATE_BASE_IMAGE_ARCH=arm64
scripts/lambda-base-image.sh``), the arm64 webhook and reconciler are initialised in it.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.e2e.harness import BUILD_DIR, ROOT, require
from tests.support.template import load_template

pytestmark = pytest.mark.e2e

ARM64_BUILD = ROOT / ".aws-sam" / "arm64" / "build"
EM_X86_64 = 62
EM_AARCH64 = 183
ARM64_IMAGE = "public.ecr.aws/lambda/python:3.13-arm64"
# Compiled dependencies the build must carry (a build without them proves nothing).
COMPILED = ("_pydantic_core", "_rust.abi3.so", "_cffi_backend", "wrapt")


def elf_machines(root: Path) -> dict[str, int]:
    """Every ELF file under ``root`` (by its magic, whatever its name) -> its e_machine."""
    found: dict[str, int] = {}
    for path in root.rglob("*"):
        if not path.is_file() or path.is_symlink():
            continue
        with path.open("rb") as handle:
            header = handle.read(20)
        if header[:4] == b"\x7fELF":
            little = header[5] == 1  # EI_DATA: 1 little-endian, 2 big-endian
            machine = int.from_bytes(header[18:20], "little" if little else "big")
            found[str(path.relative_to(root))] = machine
    return found


def check_build(root: Path, machine: int) -> None:
    require(
        (root / "template.yaml").is_file(),
        f"{root.relative_to(ROOT)} is missing: run `make build build-arm64`",
    )
    machines = elf_machines(root)
    for name in COMPILED:
        assert any(name in path for path in machines), f"no {name} in {root}: {sorted(machines)}"
    wrong = {path: m for path, m in machines.items() if m != machine}
    assert not wrong, f"{len(wrong)} ELF files of another machine in {root}: {wrong}"


def test_the_x86_64_build_holds_only_x86_64_machine_code() -> None:
    check_build(BUILD_DIR, EM_X86_64)


def test_the_arm64_build_holds_only_aarch64_machine_code() -> None:
    check_build(ARM64_BUILD, EM_AARCH64)


def test_the_arm64_build_is_the_arm64_code_directories() -> None:
    # The x86-64 build's source directories never feed the arm64 build's compiled parts.
    source = load_template()["Resources"]
    assert source["OpstateLayer"]["Properties"]["ContentUri"]["Fn::If"][1] == (
        "layers/opstate-arm64"
    )
    for code_dir in (
        "layers/opstate-arm64",
        "functions/reconcile-arm64",
        "functions/archiver-arm64",
        "functions/submit-arm64",
    ):
        assert (ROOT / code_dir / "Makefile").is_file()
        assert "manylinux2014_aarch64" in (ROOT / code_dir / "Makefile").read_text()


def _arm64_containers_run() -> str | None:
    """Why arm64 containers cannot run here (None: they can)."""
    binfmt = Path("/proc/sys/fs/binfmt_misc/qemu-aarch64")
    if not binfmt.is_file() or "enabled" not in binfmt.read_text():
        return "qemu-aarch64 is not registered with binfmt_misc"
    image = subprocess.run(
        ["docker", "image", "inspect", ARM64_IMAGE], capture_output=True, timeout=30, check=False
    )
    if image.returncode != 0:
        return f"{ARM64_IMAGE} is missing (OPSTATE_BASE_IMAGE_ARCH=arm64 make lambda-base-image)"
    return None


PROBE = """
import platform, sys
sys.path[:0] = ["/var/task", "/opt/python"]
import app
{init}
print("OK", platform.machine(), sys.version.split()[0])
"""
INIT = {
    "WebhookFunction": "from opstate.api import default_app\ndefault_app()",
    "ReconcileFunction": (
        "from opstate.config import settings\nfrom opstate.reconcile import make_client\n"
        "import pydantic_core\nmake_client(settings())"
    ),
}


@pytest.mark.parametrize("logical_id", sorted(INIT))
def test_the_arm64_build_initialises_on_arm64(logical_id: str) -> None:
    reason = _arm64_containers_run()
    if reason is not None:
        pytest.skip(f"arm64 not run here: {reason}")
    check_build(ARM64_BUILD, EM_AARCH64)
    out = subprocess.run(
        [
            "docker",
            "run",
            "--rm",
            # No --platform: this engine (20.10) records an imported image as amd64 whatever
            # `docker import --platform` says; binfmt runs its aarch64 programs all the same,
            # and the probe prints the machine it ran on.
            "--network",
            "none",
            "-v",
            f"{ARM64_BUILD / logical_id}:/var/task:ro",
            "-v",
            f"{ARM64_BUILD / 'OpstateLayer'}:/opt:ro",
            "-e",
            "AWS_DEFAULT_REGION=us-east-1",
            "-e",
            "POWERTOOLS_TRACE_DISABLED=true",
            "-e",
            "OPSTATE_STORE=memory://",
            "-e",
            "OPSTATE_WEBHOOK_SECRETS=whsec_YXJtNjQtc3RhbmQtaW4tc2VjcmV0LTMyLWJ5dGVzIQ==",
            "-e",
            "GEMINI_API_KEY=not-a-key",
            "-w",
            "/var/task",
            "--entrypoint",
            "python3.13",
            ARM64_IMAGE,
            "-c",
            PROBE.format(init=INIT[logical_id]),
        ],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.split()[-3:-1] == ["OK", "aarch64"], out.stdout
