"""The counts the README and docs/deploy.md state about the stack are read from template.yaml
(issue 49: "fill the two secrets" when the stack has three, "both DLQs" of four, "three thin
functions" of six, two parameter rows written twice, outputs missing from the list)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from tests.support.template import load_template

ROOT = Path(__file__).resolve().parents[2]
WORDS = {2: "two", 3: "three", 4: "four", 5: "five", 6: "six", 7: "seven", 8: "eight"}


def _of_type(template: dict[str, Any], kind: str) -> list[str]:
    return [name for name, r in template["Resources"].items() if r["Type"] == kind]


@pytest.fixture(scope="module")
def counts() -> dict[str, str]:
    template = load_template()
    queues = _of_type(template, "AWS::SQS::Queue")
    found = {
        "functions": len(_of_type(template, "AWS::Serverless::Function")),
        "secrets": len(_of_type(template, "AWS::SecretsManager::Secret")),
        "dlqs": len([q for q in queues if q.endswith("DeadLetterQueue")]),
    }
    return {key: WORDS[n] for key, n in found.items()}


def _text(path: str) -> str:
    return " ".join((ROOT / path).read_text(encoding="utf-8").split())  # lines joined


def test_the_readme_counts_what_the_template_has(counts: dict[str, str]) -> None:
    readme = _text("README.md")
    assert f"fill the {counts['secrets']} secrets the stack creates" in readme
    assert f"the {counts['dlqs']} DLQs" in readme
    assert f"`AWS::SecretsManager::Secret` (the {counts['secrets']} secrets)" in readme
    for untrue in ("two secrets", "both DLQ"):
        assert untrue not in readme, untrue


def test_deploy_md_counts_what_the_template_has(counts: dict[str, str]) -> None:
    deploy = _text("docs/deploy.md")
    assert f"{counts['functions']} thin functions over one layer" in deploy
    assert f"{counts['dlqs']} dead-letter queues" in deploy
    assert f"{counts['secrets']} secrets, the alarms" in deploy
    assert f"for the {counts['functions']} functions;" in deploy
    assert f"the tables, the {counts['secrets']} secrets and the log groups" in deploy
    for untrue in ("two secrets", "three thin functions", "two dead-letter queues"):
        assert untrue not in deploy, untrue


def test_deploy_md_has_one_row_per_parameter_and_names_every_output() -> None:
    template = load_template()
    parameters = set(template["Parameters"])
    rows: list[str] = []
    for line in (ROOT / "docs/deploy.md").read_text(encoding="utf-8").splitlines():
        if line.startswith("| `"):
            names = re.findall(r"`([A-Za-z0-9]+)`", line.split("|")[1])
            if names and set(names) <= parameters:
                rows.extend(names)
    assert sorted(rows) == sorted(parameters)  # each once: none missing, none repeated
    deploy = _text("docs/deploy.md")
    listed = deploy.split("Outputs: ", 1)[1].split(". Read them with", 1)[0]
    assert set(re.findall(r"`([A-Za-z0-9]+)`", listed)) == set(template["Outputs"])
