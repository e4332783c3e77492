"""Translate template.yaml with samtranslator (the SAM transform CloudFormation runs) and print
the result as JSON. Run by the tools environment's python (aws-sam-cli brings samtranslator):
``.tools-venv/bin/python tests/support/sam_translate.py template.yaml``."""

from __future__ import annotations

import json
import os
import sys
from typing import Any


class _NoManagedPolicies:
    """The managed-policy loader: the template names none by bare name."""

    def load(self) -> dict[str, str]:
        return {}


def translate(path: str) -> dict[str, Any]:
    from samtranslator.translator.transform import transform
    from samtranslator.yaml_helper import yaml_parse

    with open(path, encoding="utf-8") as handle:
        template = yaml_parse(handle.read())
    for resource in template["Resources"].values():
        props = resource.get("Properties", {})
        # The transform wants S3 code locations (sam build / package sets them).
        if resource["Type"] == "AWS::Serverless::Function":
            props["CodeUri"] = "s3://bucket/code.zip"
        elif resource["Type"] == "AWS::Serverless::LayerVersion":
            props["ContentUri"] = "s3://bucket/layer.zip"
    os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")
    translated: dict[str, Any] = transform(template, {}, _NoManagedPolicies())
    return translated


if __name__ == "__main__":
    json.dump(translate(sys.argv[1]), sys.stdout, default=str)
