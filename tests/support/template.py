"""Read template.yaml (with CloudFormation's short-form tags) and build resources from it.

The DynamoDB table used by every test is created from the ``OperationsTable`` resource, so the
code and the template cannot drift apart.
"""

from __future__ import annotations

import copy
import functools
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
TEMPLATE = ROOT / "template.yaml"


class _CfnLoader(yaml.SafeLoader):
    """SafeLoader with CloudFormation's tags, refusing a key given twice in one mapping (YAML
    loaders keep the last one silently: a line merge that interleaves two resources would
    otherwise load as one, half of it gone)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[Any] = set()
        for key_node, _value in node.value:
            key = self.construct_object(key_node, deep=deep)
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    "while reading a mapping",
                    node.start_mark,
                    f"found the key {key!r} twice",
                    key_node.start_mark,
                )
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


def _tag(loader: yaml.SafeLoader, suffix: str, node: yaml.Node) -> dict[str, Any]:
    name = "Ref" if suffix == "Ref" else f"Fn::{suffix}"
    value: Any
    if isinstance(node, yaml.ScalarNode):
        value = loader.construct_scalar(node)
        if suffix == "GetAtt" and isinstance(value, str):
            value = value.split(".", 1)
    elif isinstance(node, yaml.SequenceNode):
        value = loader.construct_sequence(node, deep=True)
    else:
        value = loader.construct_mapping(node, deep=True)  # type: ignore[arg-type]
    return {name: value}


_CfnLoader.add_multi_constructor("!", _tag)


def load_template(path: Path = TEMPLATE) -> dict[str, Any]:
    with path.open(encoding="utf-8") as fh:
        data = loads(fh.read())
    assert isinstance(data, dict)
    return data


def loads(text: str) -> Any:
    """YAML text with CloudFormation's tags; a key twice in one mapping raises."""
    return yaml.load(text, Loader=_CfnLoader)


@functools.lru_cache(maxsize=4)
def _template_snapshot(path: Path, mtime_ns: int) -> dict[str, Any]:
    return load_template(path)


def table_properties(resource: str = "OperationsTable") -> dict[str, Any]:
    # Parsing the template costs ~0.1 s; tests create many tables, so parse once per version.
    template = _template_snapshot(TEMPLATE, TEMPLATE.stat().st_mtime_ns)
    props = copy.deepcopy(template["Resources"][resource]["Properties"])
    assert isinstance(props, dict)
    return props


def create_table_from_template(
    client: Any, table_name: str, resource: str = "OperationsTable"
) -> dict[str, Any]:
    """Create ``table_name`` with the key schema, attributes, GSIs, stream and TTL of the
    template's table ``resource`` (``OperationsTable`` or ``WaitersTable``).

    ``client`` is a boto3 DynamoDB client (moto in-process or moto server). Returns the
    ``TableDescription``.
    """
    props = table_properties(resource)
    kwargs: dict[str, Any] = {
        "TableName": table_name,
        "AttributeDefinitions": props["AttributeDefinitions"],
        "KeySchema": props["KeySchema"],
        "BillingMode": props.get("BillingMode", "PAY_PER_REQUEST"),
    }
    if "GlobalSecondaryIndexes" in props:
        kwargs["GlobalSecondaryIndexes"] = props["GlobalSecondaryIndexes"]
    stream = props.get("StreamSpecification")
    if stream:
        kwargs["StreamSpecification"] = {
            "StreamEnabled": True,
            "StreamViewType": stream["StreamViewType"],
        }
    description: dict[str, Any] = client.create_table(**kwargs)["TableDescription"]
    client.get_waiter("table_exists").wait(TableName=table_name)
    ttl = props.get("TimeToLiveSpecification")
    if ttl and ttl.get("Enabled"):
        client.update_time_to_live(
            TableName=table_name,
            TimeToLiveSpecification={"Enabled": True, "AttributeName": ttl["AttributeName"]},
        )
    return description
