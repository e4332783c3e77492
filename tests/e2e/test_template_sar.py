"""template.yaml against what the AWS Serverless Application Repository accepts (issue 42).

No build needed. The metadata SAR shows is held to the rules of AWS SAM's "Metadata section
properties" page (quoted below); the resource types to SAR's own list (``scripts/sar_supported.
txt``, from AWS's documentation, with its source and date); the policies to what SAR refuses.
template.yaml uses three types that list lacks, so ``scripts/sar_template.py`` writes a variant
without them (by type, never by name: other resources may be added) and these tests hold the
variant to the same list, with cfn-lint when the tools are installed.
"""

from __future__ import annotations

import json
import re
import subprocess
import tomllib
from pathlib import Path
from typing import Any

import pytest

import opstate
from scripts import sar_template
from tests.e2e.harness import require
from tests.support.template import load_template, loads

ROOT = Path(__file__).resolve().parents[2]
CFN_LINT = ROOT / ".tools-venv" / "bin" / "cfn-lint"
SEMVER = re.compile(
    r"^(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)(?:-[0-9A-Za-z.-]+)?(?:\+[0-9A-Za-z.-]+)?$"
)

# "AWS SAM template Metadata section properties" (docs.aws.amazon.com/serverless-application-
# model/latest/developerguide/serverless-sam-template-publishing-applications-metadata-
# properties.html, read 2026-12-06): Name "Minimum length=1. Maximum length=140. Pattern:
# "[a-zA-Z0-9\\-]+";", Description "Minimum length=1. Maximum length=256.", Author "Minimum
# length=1. Maximum length=127. Pattern: "^[a-z0-9](([a-z0-9]|-(?!-))*[a-z0-9])?$";", Labels
# "Minimum length=1. Maximum length=127. Maximum number of labels: 10. Pattern:
# "^[a-zA-Z0-9+\\-_:\\/@]+$";", and "AWS CloudFormation intrinsic functions aren't supported by
# the AWS::ServerlessRepo::Application metadata key."
NAME = re.compile(r"^[a-zA-Z0-9\-]{1,140}$")
AUTHOR = re.compile(r"^[a-z0-9](([a-z0-9]|-(?!-))*[a-z0-9])?$")
LABEL = re.compile(r"^[a-zA-Z0-9+\-_:/@]{1,127}$")
# "Using AWS SAM with the AWS Serverless Application Repository" (read 2026-12-06): SAR "blocks
# publication of applications that include ... Attaching the AWSLambda_FullAccess managed policy
# to Lambda functions [or] Granting iam:AttachRolePolicy, iam:PutRolePolicy, or iam:* on all
# resources (*) in inline IAM policies".
BLOCKED_ACTIONS = {"iam:attachrolepolicy", "iam:putrolepolicy", "iam:*", "*"}


@pytest.fixture(scope="module")
def template() -> dict[str, Any]:
    return load_template()


@pytest.fixture(scope="module")
def supported() -> tuple[frozenset[str], frozenset[str]]:
    return sar_template.read_supported()


@pytest.fixture(scope="module")
def variant(template: dict[str, Any], supported: tuple[frozenset[str], frozenset[str]]) -> Any:
    return sar_template.publishable(template, supported[0])


def metadata(template: dict[str, Any]) -> dict[str, Any]:
    found: dict[str, Any] = template["Metadata"]["AWS::ServerlessRepo::Application"]
    return found


def test_the_metadata_names_every_field_the_issue_asks_for(template: dict[str, Any]) -> None:
    assert set(metadata(template)) == {
        "Name",
        "Description",
        "Author",
        "SpdxLicenseId",
        "LicenseUrl",
        "ReadmeUrl",
        "Labels",
        "HomePageUrl",
        "SemanticVersion",
        "SourceCodeUrl",
    }


def test_the_metadata_keeps_sar_s_own_rules(template: dict[str, Any]) -> None:
    meta = metadata(template)
    assert NAME.match(meta["Name"])
    assert 1 <= len(meta["Description"]) <= 256
    assert AUTHOR.match(meta["Author"]) and len(meta["Author"]) <= 127
    assert 1 <= len(meta["Labels"]) <= 10
    assert all(LABEL.match(label) for label in meta["Labels"]), meta["Labels"]
    for key, value in meta.items():  # no intrinsic function anywhere: plain strings only
        values = value if isinstance(value, list) else [value]
        assert all(isinstance(v, str) for v in values), key


def test_the_semantic_version_is_the_package_s(template: dict[str, Any]) -> None:
    assert metadata(template)["SemanticVersion"] == opstate.__version__
    assert SEMVER.match(opstate.__version__)


def test_the_license_is_the_one_pyproject_declares_and_its_files_exist(
    template: dict[str, Any],
) -> None:
    meta = metadata(template)
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    assert meta["SpdxLicenseId"] == project["license"] == "Apache-2.0"
    # Local paths (sam package uploads them; sam publish needs them in S3), next to the template.
    assert (
        (ROOT / meta["LicenseUrl"])
        .read_text(encoding="utf-8")
        .lstrip()
        .startswith("Apache License\n                           Version 2.0, January 2004")
    )
    assert (ROOT / meta["ReadmeUrl"]).name == "README.md" and (ROOT / meta["ReadmeUrl"]).is_file()


def test_the_urls_are_https_and_say_when_they_are_placeholders(template: dict[str, Any]) -> None:
    meta = metadata(template)
    for key in ("HomePageUrl", "SourceCodeUrl"):
        assert meta[key].startswith("https://"), key
    if sar_template.PLACEHOLDER in meta["SourceCodeUrl"]:
        readme = (ROOT / "README.md").read_text(encoding="utf-8")
        assert sar_template.PLACEHOLDER in readme, "the README says the URL is a placeholder"


def test_the_kept_list_says_where_it_comes_from_and_when() -> None:
    head = sar_template.SUPPORTED.read_text(encoding="utf-8").split("[resources]\n", 1)[0]
    assert (
        "docs.aws.amazon.com/serverlessrepo/latest/devguide/list-supported-resources.html" in head
    )
    assert "docs.aws.amazon.com/serverlessrepo/latest/devguide/using-aws-sam.html" in head
    assert "Read 2026-12-06" in head


def test_every_type_sar_does_not_list_has_a_stand_in(
    template: dict[str, Any], supported: tuple[frozenset[str], frozenset[str]]
) -> None:
    """A resource type added to template.yaml that SAR does not list fails here, naming it:
    either the list gained it (check AWS's page, add it with the date) or sar_template.py
    needs a stand-in for it."""
    blocked = sar_template.blocking(template, supported[0])
    unknown = {i: t for i, t in blocked.items() if t not in sar_template.REPLACEMENTS}
    assert unknown == {}


def test_what_blocks_a_publish_of_template_yaml_is_said_precisely(
    template: dict[str, Any], supported: tuple[frozenset[str], frozenset[str]]
) -> None:
    """The types README.md names as blocking are exactly those template.yaml uses and the list
    lacks (so the README's sentence stays true as the template and the list change)."""
    blocked_types = set(sar_template.blocking(template, supported[0]).values())
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    section = readme.split("## Use it without a clone", 1)[1].split("\n## ", 1)[0]
    named = set(re.findall(r"`(AWS::[A-Za-z0-9]+::[A-Za-z0-9]+)`", section))
    assert blocked_types <= named, blocked_types - named
    metadata_keys = {"AWS::ServerlessRepo::Application"}
    listed_there = {t for t in named - metadata_keys if t not in supported[0]}
    assert listed_there == blocked_types


def test_the_variant_holds_only_types_sar_lists(
    variant: dict[str, Any], supported: tuple[frozenset[str], frozenset[str]]
) -> None:
    assert sar_template.blocking(variant, supported[0]) == {}


def references(node: Any) -> set[str]:
    """Every logical id a Ref, GetAtt, Sub or DependsOn names."""
    found: set[str] = set()
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "Ref" and isinstance(value, str):
                found.add(value)
            elif key == "Fn::GetAtt":
                found.add(value[0] if isinstance(value, list) else value.split(".", 1)[0])
            elif key == "Fn::Sub":
                text = value if isinstance(value, str) else value[0]
                found |= {m.split(".", 1)[0] for m in re.findall(r"\$\{([^}!]+)\}", text)}
            elif key == "DependsOn":
                found |= {value} if isinstance(value, str) else set(value)
            found |= references(value)
    elif isinstance(node, list):
        for value in node:
            found |= references(value)
    return found


def test_the_variant_names_nothing_it_removed_and_declares_each_stand_in(
    template: dict[str, Any],
    variant: dict[str, Any],
    supported: tuple[frozenset[str], frozenset[str]],
) -> None:
    removed = set(sar_template.blocking(template, supported[0]))
    assert removed  # template.yaml has them today; this test is about their removal
    assert references(variant) & removed == set()
    stand_ins = {p for p in variant["Parameters"] if p.startswith("Existing")}
    assert stand_ins == {
        stand.parameter(i)
        for i, t in sar_template.blocking(template, supported[0]).items()
        if isinstance(stand := sar_template.REPLACEMENTS[t], sar_template.Stand)
    }
    assert stand_ins <= references(variant), "every stand-in is used"
    # The functions still read a secret ARN / the bus name from the same variables.
    env = {
        key: value
        for resource in variant["Resources"].values()
        for key, value in ((resource.get("Properties") or {}).get("Environment") or {})
        .get("Variables", {})
        .items()
    }
    assert env["OPSTATE_EVENT_BUS_NAME"] == {"Ref": "ExistingEventBusName"}
    assert env["OPSTATE_GEMINI_API_KEY_SECRET_ARN"] == {"Ref": "ExistingGeminiApiKeySecretArn"}


def test_a_type_without_a_stand_in_stops_the_variant_naming_it(
    template: dict[str, Any], supported: tuple[frozenset[str], frozenset[str]]
) -> None:
    odd = json.loads(json.dumps(template))
    odd["Resources"]["Url"] = {"Type": "AWS::Lambda::Url", "Properties": {"AuthType": "NONE"}}
    with pytest.raises(sar_template.Unpublishable, match=r"Url \(AWS::Lambda::Url\)"):
        sar_template.publishable(odd, supported[0])


def test_a_resource_that_needs_a_dropped_one_stops_the_variant(
    template: dict[str, Any], supported: tuple[frozenset[str], frozenset[str]]
) -> None:
    odd = json.loads(json.dumps(template))
    query = next(
        i for i, r in odd["Resources"].items() if r["Type"] == "AWS::Logs::QueryDefinition"
    )
    odd["Resources"]["Extra"] = {
        "Type": "AWS::SSM::Parameter",
        "Properties": {"Type": "String", "Value": {"Ref": query}},
    }
    with pytest.raises(sar_template.Unpublishable, match="Extra refers to a dropped resource"):
        sar_template.publishable(odd, supported[0])


def test_the_source_url_replaces_the_placeholders(
    template: dict[str, Any], supported: tuple[frozenset[str], frozenset[str]]
) -> None:
    out = sar_template.publishable(template, supported[0], source_url="https://example.org/x")
    assert metadata(out)["HomePageUrl"] == metadata(out)["SourceCodeUrl"] == "https://example.org/x"


def policies(resource: dict[str, Any]) -> list[Any]:
    found = (resource.get("Properties") or {}).get("Policies") or []
    return found if isinstance(found, list) else [found]


def test_policies_use_only_sam_s_policy_templates_and_nothing_sar_blocks(
    template: dict[str, Any], supported: tuple[frozenset[str], frozenset[str]]
) -> None:
    for name, resource in template["Resources"].items():
        for policy in policies(resource):
            if resource["Type"] == "AWS::Serverless::Function" and isinstance(policy, dict):
                named = set(policy) - {"Statement", "Version", "PolicyName", "PolicyDocument"}
                assert named <= supported[1], (name, named)
            assert policy != "AWSLambda_FullAccess" and "AWSLambda_FullAccess" not in str(
                (resource.get("Properties") or {}).get("ManagedPolicyArns", "")
            ), name
        for statement in statements(resource):
            acts = statement.get("Action", [])
            acts = {acts.lower()} if isinstance(acts, str) else {a.lower() for a in acts}
            if statement.get("Resource") in ("*", ["*"]):
                assert not acts & BLOCKED_ACTIONS, (name, acts)


def statements(resource: dict[str, Any]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for policy in policies(resource):
        if isinstance(policy, dict):
            document = policy.get("PolicyDocument", policy)
            if isinstance(document, dict):
                out.extend(document.get("Statement", []))
    return out


def test_the_variant_passes_cfn_lint(variant: dict[str, Any], tmp_path: Path) -> None:
    require(CFN_LINT.exists(), "cfn-lint not found in .tools-venv: run `make tools`")
    from cfn_flip import dump_yaml

    path = tmp_path / "template-sar.yaml"
    path.write_text(dump_yaml(variant), encoding="utf-8")
    assert loads(path.read_text(encoding="utf-8"))["Resources"]  # our own reader reads it too
    result = subprocess.run(
        [str(CFN_LINT), "--", str(path)], capture_output=True, text=True, timeout=180
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_a_composite_alarm_is_dropped_from_the_variant_with_its_output(
    template: dict[str, Any], supported: tuple[frozenset[str], frozenset[str]]
) -> None:
    odd = json.loads(json.dumps(template))
    assert "AWS::CloudWatch::CompositeAlarm" not in supported[0]
    odd["Resources"]["AnyAlarm"] = {
        "Type": "AWS::CloudWatch::CompositeAlarm",
        "Properties": {"AlarmRule": "ALARM(x)"},
    }
    odd["Outputs"]["AnyAlarmArn"] = {"Value": {"Fn::GetAtt": ["AnyAlarm", "Arn"]}}
    out = sar_template.publishable(odd, supported[0])
    assert "AnyAlarm" not in out["Resources"] and "AnyAlarmArn" not in out["Outputs"]
    assert sar_template.blocking(out, supported[0]) == {}
