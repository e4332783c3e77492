"""``make package`` on the real build (issue 42): ``scripts/package.py`` turns ``.aws-sam/build``
into a template whose code is local zip files, and SAM CLI's own packager takes it, with no AWS
account: ``sam package`` runs against S3 on a moto server and uploads our zips byte for byte,
for the template ``sam deploy`` takes and for the SAR variant, whose packaged form has every
location in S3 (LicenseUrl and ReadmeUrl too), as ``sam publish`` needs. What only AWS does (the
deploy's change set, SAR's acceptance of the application) is not run here.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest
from cfn_flip import dump_yaml

import opstate
from scripts import package, sar_template
from tests.e2e.harness import BUILD_DIR, BUILT_TEMPLATE, TOOLS_VENV, require
from tests.support.motoserver import MotoServer, start_moto_server
from tests.support.template import load_template

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
SAM = TOOLS_VENV / "bin" / "sam"
BUCKET = "opstate-package-test"


@pytest.fixture(scope="module")
def packaged(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``dist/sam`` as ``make package`` writes it, in a temporary folder."""
    require(BUILT_TEMPLATE.is_file(), "no sam build output: run `make build`")
    out = tmp_path_factory.mktemp("dist") / "sam"
    template = package.package(BUILD_DIR, out)
    variant = sar_template.publishable(template, sar_template.read_supported()[0])
    (out / "template-sar.yaml").write_text(dump_yaml(variant), encoding="utf-8")
    return out


def code_locations(template: dict[str, Any]) -> dict[str, str]:
    found = {}
    for logical_id, resource in template["Resources"].items():
        prop = package.CODE_PROPERTY.get(resource["Type"])
        if prop is not None:
            found[logical_id] = resource["Properties"][prop]
    return found


def test_every_function_and_the_layer_is_a_zip_beside_the_template(packaged: Path) -> None:
    template = load_template(packaged / "template.yaml")
    built = load_template(BUILT_TEMPLATE)
    locations = code_locations(template)
    assert set(locations) == set(code_locations(built)) and locations
    for logical_id, location in locations.items():
        assert location == f"artifacts/{logical_id}.zip"
        with zipfile.ZipFile(packaged / location) as zf:
            names = set(zf.namelist())
        source = BUILD_DIR / code_locations(built)[logical_id]
        assert names == {p.relative_to(source).as_posix() for p in source.rglob("*") if p.is_file()}
        kind = template["Resources"][logical_id]["Type"]
        assert (
            ("app.py" in names)
            if kind == "AWS::Serverless::Function"
            else ("python/opstate/__init__.py" in names)
        )
    assert (packaged / "LICENSE").read_bytes() == (ROOT / "LICENSE").read_bytes()
    assert (packaged / "README.md").read_bytes() == (ROOT / "README.md").read_bytes()


def test_the_layer_zip_holds_this_version(packaged: Path) -> None:
    template = load_template(packaged / "template.yaml")
    layer = next(
        loc
        for i, loc in code_locations(template).items()
        if template["Resources"][i]["Type"] == "AWS::Serverless::LayerVersion"
    )
    with zipfile.ZipFile(packaged / layer) as zf:
        init = zf.read("python/opstate/__init__.py").decode()
    assert f'__version__ = "{opstate.__version__}"' in init


def test_the_architecture_is_pinned_to_the_build_s(packaged: Path) -> None:
    template = load_template(packaged / "template.yaml")
    built = package.built_architecture(load_template(BUILT_TEMPLATE))
    assert built is not None
    architecture = template["Parameters"]["Architecture"]
    assert architecture["AllowedValues"] == [built] and architecture["Default"] == built


@pytest.fixture(scope="module")
def moto_s3() -> Iterator[MotoServer]:
    server = start_moto_server()
    try:
        yield server
    finally:
        server.stop()


def sam_package(folder: Path, template: str, out: Path, endpoint: str) -> None:
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("AWS_")},
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_ENDPOINT_URL": endpoint,  # S3 on the moto server: no AWS account, no credentials
        "SAM_CLI_TELEMETRY": "0",
    }
    result = subprocess.run(
        [
            *(str(SAM), "package", "--template-file", template, "--s3-bucket", BUCKET),
            *("--output-template-file", str(out), "--region", "us-east-1", "--no-progressbar"),
        ],
        cwd=folder,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]


@pytest.mark.parametrize("name", ["template.yaml", "template-sar.yaml"])
def test_sam_package_takes_it_and_uploads_our_zips_as_they_are(
    packaged: Path, moto_s3: MotoServer, tmp_path: Path, name: str
) -> None:
    require(SAM.exists(), "sam not found in .tools-venv: run `make tools`")
    s3 = boto3.client(
        "s3",
        endpoint_url=moto_s3.endpoint,
        region_name="us-east-1",
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
    )
    s3.create_bucket(Bucket=BUCKET)
    out = tmp_path / "packaged.yaml"
    sam_package(packaged, name, out, moto_s3.endpoint)
    result = load_template(out)
    stored = {o["Key"] for o in s3.list_objects_v2(Bucket=BUCKET).get("Contents", [])}
    for logical_id, location in code_locations(result).items():
        assert location.startswith(f"s3://{BUCKET}/"), (logical_id, location)
        key = location.rsplit("/", 1)[1]
        ours = (packaged / "artifacts" / f"{logical_id}.zip").read_bytes()
        assert key in stored
        body = s3.get_object(Bucket=BUCKET, Key=key)["Body"].read()
        assert hashlib.sha256(body).digest() == hashlib.sha256(ours).digest(), logical_id
    if name == "template-sar.yaml":  # what sam publish takes: every location in S3
        meta = result["Metadata"][sar_template.METADATA_KEY]
        for field, local in (("LicenseUrl", "LICENSE"), ("ReadmeUrl", "README.md")):
            assert meta[field].startswith(f"s3://{BUCKET}/"), field
            key = meta[field].rsplit("/", 1)[1]
            body = s3.get_object(Bucket=BUCKET, Key=key)["Body"].read()
            assert body == (packaged / local).read_bytes(), field
        assert meta["SemanticVersion"] == opstate.__version__
        supported = sar_template.read_supported()[0]
        assert sar_template.blocking(result, supported) == {}


def test_the_packaged_template_lints_clean(packaged: Path) -> None:
    """``sam validate --lint`` on ``dist/sam/template.yaml``, as ``make template-check`` runs it
    on the source (issue 49: the built template names each code directory itself, so the
    source's ``IsArm64`` went unused and cfn-lint said ``W8001 Condition IsArm64 not used``;
    scripts/package.py drops what nothing uses). The one lint of a packaged template (issue 49:
    tests/unit/test_package_script.py linted a packaged stand-in build with cfn-lint too, 4 s
    more for the same template; its unit tests check the dropping itself)."""
    require(SAM.exists(), "sam not found in .tools-venv: run `make tools`")
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("AWS_")},
        "AWS_DEFAULT_REGION": "us-east-1",
        "SAM_CLI_TELEMETRY": "0",
    }
    result = subprocess.run(
        [str(SAM), "validate", "--lint", "--template-file", "template.yaml"],
        cwd=packaged,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "W8001" not in result.stdout + result.stderr
    assert (
        "Conditions" not in load_template(packaged / "template.yaml")
        or "IsArm64" not in (load_template(packaged / "template.yaml")["Conditions"])
    )
