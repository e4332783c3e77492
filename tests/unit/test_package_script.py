"""scripts/package.py on a small stand-in of a ``sam build`` output (issue 42): each code
directory becomes a reproducible zip (same bytes on every run, file modes kept), the template
points at the zips, the architecture parameter is pinned to the build's, and a location that is
no built directory stops it with a sentence."""

from __future__ import annotations

import stat
import zipfile
from pathlib import Path

import pytest
from cfn_flip import dump_yaml

from scripts import package
from tests.support.template import load_template

TEMPLATE = {
    "Transform": "AWS::Serverless-2016-10-31",
    # sam build writes the metadata's files relative to its own folder
    "Metadata": {
        "AWS::ServerlessRepo::Application": {
            "LicenseUrl": "../LICENSE",
            "ReadmeUrl": "../README.md",
        }
    },
    "Parameters": {"Architecture": {"Type": "String", "Default": "x86_64"}},
    "Globals": {"Function": {"Architectures": [{"Ref": "Architecture"}]}},
    "Resources": {
        "Layer": {
            "Type": "AWS::Serverless::LayerVersion",
            "Properties": {"ContentUri": "Layer"},
            "Metadata": {"BuildMethod": "makefile", "BuildArchitecture": "x86_64"},
        },
        "Fn": {
            "Type": "AWS::Serverless::Function",
            "Properties": {"CodeUri": "Fn", "Handler": "app.lambda_handler"},
        },
        "Table": {"Type": "AWS::DynamoDB::Table", "Properties": {}},
    },
}


def build_dir(root: Path, template: dict[str, object] = TEMPLATE) -> Path:
    build = root / "build"
    (root / "LICENSE").write_text("the license\n")
    (root / "README.md").write_text("# the readme\n")
    (build / "Fn").mkdir(parents=True)
    (build / "Fn" / "app.py").write_text("def lambda_handler(e, c):\n    return 1\n")
    (build / "Layer" / "python" / "pkg").mkdir(parents=True)
    (build / "Layer" / "python" / "pkg" / "__init__.py").write_text("")
    tool = build / "Layer" / "bin-tool"
    tool.write_text("#!/bin/sh\n")
    tool.chmod(0o755)
    (build / "template.yaml").write_text(dump_yaml(template))
    return build


def test_each_code_directory_becomes_a_reproducible_zip_the_template_points_at(
    tmp_path: Path,
) -> None:
    build = build_dir(tmp_path)
    package.package(build, tmp_path / "a")
    package.package(build, tmp_path / "b")
    for name in ("Fn.zip", "Layer.zip"):
        assert (tmp_path / "a" / "artifacts" / name).read_bytes() == (
            tmp_path / "b" / "artifacts" / name
        ).read_bytes()
    with zipfile.ZipFile(tmp_path / "a" / "artifacts" / "Layer.zip") as zf:
        assert sorted(zf.namelist()) == ["bin-tool", "python/pkg/__init__.py"]
        mode = zf.getinfo("bin-tool").external_attr >> 16
        assert stat.S_IMODE(mode) == 0o755 and stat.S_ISREG(mode)
    written = load_template(tmp_path / "a" / "template.yaml")
    assert written["Resources"]["Fn"]["Properties"]["CodeUri"] == "artifacts/Fn.zip"
    assert written["Resources"]["Layer"]["Properties"]["ContentUri"] == "artifacts/Layer.zip"
    assert written["Parameters"]["Architecture"]["AllowedValues"] == ["x86_64"]
    meta = written["Metadata"]["AWS::ServerlessRepo::Application"]
    assert meta == {"LicenseUrl": "LICENSE", "ReadmeUrl": "README.md"}
    assert (tmp_path / "a" / "LICENSE").read_text() == "the license\n"
    assert (tmp_path / "a" / "README.md").read_text() == "# the readme\n"


def test_the_conditions_nothing_uses_any_more_are_dropped(tmp_path: Path) -> None:
    """sam build wrote each code directory itself where the source chose one with a condition
    (``CodeUri: !If [IsArm64, ...]``): that condition, and one only it used, go (cfn-lint's
    W8001 "Condition not used" on the packaged template, issue 49); the others stay."""
    template = {**TEMPLATE, "Resources": {**TEMPLATE["Resources"]}}  # type: ignore[dict-item]
    template["Conditions"] = {
        "IsArm64": {"Fn::Equals": [{"Ref": "Architecture"}, "arm64"]},
        "Both": {"Fn::And": [{"Condition": "IsArm64"}, {"Condition": "HasKey"}]},
        "OnlyBoth": {"Fn::Not": [{"Condition": "Both"}]},
        "HasKey": {"Fn::Not": [{"Fn::Equals": [{"Ref": "Architecture"}, ""]}]},
        "Named": {"Fn::Equals": ["a", "a"]},
    }
    template["Resources"]["Table"] = {  # type: ignore[index]
        "Type": "AWS::DynamoDB::Table",
        "Condition": "Named",
        "Properties": {"SSESpecification": {"Fn::If": ["HasKey", {"SSEEnabled": True}, {}]}},
    }
    package.package(build_dir(tmp_path, template), tmp_path / "out")
    written = load_template(tmp_path / "out" / "template.yaml")
    assert sorted(written["Conditions"]) == ["HasKey", "Named"]
    assert package.drop_unused_conditions({"Conditions": {"X": {}}, "Resources": {}}) == ["X"]


def test_a_location_that_is_no_built_directory_stops_it(tmp_path: Path) -> None:
    template = {**TEMPLATE, "Resources": {**TEMPLATE["Resources"]}}  # type: ignore[dict-item]
    template["Resources"]["Fn"] = {  # type: ignore[index]
        "Type": "AWS::Serverless::Function",
        "Properties": {"CodeUri": "s3://bucket/code.zip"},
    }
    with pytest.raises(SystemExit, match=r"Fn\.CodeUri is not a built directory"):
        package.package(build_dir(tmp_path, template), tmp_path / "out")


def test_a_build_of_two_architectures_stops_it(tmp_path: Path) -> None:
    template = {**TEMPLATE, "Resources": {**TEMPLATE["Resources"]}}  # type: ignore[dict-item]
    template["Resources"]["Fn"] = {  # type: ignore[index]
        "Type": "AWS::Serverless::Function",
        "Properties": {"CodeUri": "Fn"},
        "Metadata": {"BuildArchitecture": "arm64"},
    }
    with pytest.raises(SystemExit, match="mixes architectures"):
        package.package(build_dir(tmp_path, template), tmp_path / "out")
