"""Write the variant of a SAM template that the AWS Serverless Application Repository accepts.

``python scripts/sar_template.py [--source-url URL] IN OUT`` reads IN (template.yaml, or the
packaged ``dist/sam/template.yaml`` that ``make package`` writes) and writes OUT with every
resource whose type SAR does not list (``scripts/sar_supported.txt``, from AWS's own
documentation) replaced or dropped, by type, never by name:

- ``AWS::SecretsManager::Secret`` becomes a parameter ``Existing<Id>Arn``: the ARN of a secret
  the deployer creates first (``aws secretsmanager create-secret``); ``!Ref`` (the ARN) and
  ``!GetAtt <Id>.Id`` read the parameter.
- ``AWS::Events::EventBus`` becomes a parameter ``Existing<Id>Name`` (default ``default``, the
  account's own bus); ``!Ref``/``.Name`` read it, ``.Arn`` is built from it.
- ``AWS::Logs::QueryDefinition`` (saved Logs Insights queries, a convenience) and
  ``AWS::CloudWatch::CompositeAlarm`` are dropped, with any output that names them.

A type neither listed nor known here stops the script: it says which resources block a publish.
The variant keeps everything else as it is (code locations included), adds the new parameters
to the console's parameter groups and, given ``--source-url``, writes it as the metadata's
HomePageUrl and SourceCodeUrl (template.yaml carries placeholders until the project has a
public home).
"""

from __future__ import annotations

import argparse
import copy
import re
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cfn_flip import dump_yaml, load_yaml

SUPPORTED = Path(__file__).resolve().with_name("sar_supported.txt")
METADATA_KEY = "AWS::ServerlessRepo::Application"
PLACEHOLDER = "PLACEHOLDER-OWNER"


def read_supported(path: Path = SUPPORTED) -> tuple[frozenset[str], frozenset[str]]:
    """(resource types, SAM policy template names) SAR accepts, from the kept list."""
    sections: dict[str, set[str]] = {"resources": set(), "policy-templates": set()}
    current: set[str] | None = None
    for raw in path.read_text(encoding="utf-8").splitlines():
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        if line.startswith("[") and line.endswith("]"):
            current = sections[line[1:-1]]
        elif current is not None:
            current.add(line)
    return frozenset(sections["resources"]), frozenset(sections["policy-templates"])


@dataclass(frozen=True)
class Stand:
    """An existing resource the deployer names through a parameter, in place of one SAR
    refuses. ``attributes`` maps a GetAtt attribute to a ``${P}``-form Sub text (P: the
    parameter); ``None`` means the parameter's value itself."""

    suffix: str
    description: str
    pattern: str
    default: str | None
    attributes: dict[str, str | None]

    def parameter(self, logical_id: str) -> str:
        return f"Existing{logical_id}{self.suffix}"

    def declaration(self, logical_id: str) -> dict[str, Any]:
        declared: dict[str, Any] = {
            "Type": "String",
            "AllowedPattern": self.pattern,
            "Description": self.description.format(id=logical_id),
        }
        if self.default is not None:
            declared["Default"] = self.default
        return declared


DROP = "drop"
REPLACEMENTS: dict[str, Stand | str] = {
    "AWS::SecretsManager::Secret": Stand(
        suffix="Arn",
        description=(
            "SAR lists no AWS::SecretsManager::Secret: the ARN of a secret you created for {id} "
            "(aws secretsmanager create-secret; README.md, 'Use it without a clone')."
        ),
        pattern=r"^arn:aws[a-z-]*:secretsmanager:[a-z0-9-]+:\d{12}:secret:.+$",
        default=None,
        attributes={"Id": None},
    ),
    "AWS::Events::EventBus": Stand(
        suffix="Name",
        description=(
            "SAR lists no AWS::Events::EventBus: the name of an existing bus that stands for {id} "
            "(default: the account's default bus)."
        ),
        pattern=r"^[A-Za-z0-9._\-/]{1,256}$",
        default="default",
        attributes={
            "Name": None,
            "Arn": "arn:${AWS::Partition}:events:${AWS::Region}:${AWS::AccountId}:event-bus/${P}",
        },
    ),
    "AWS::Logs::QueryDefinition": DROP,
    # Not in template.yaml today, nor in the list: an alarm built from others would be dropped
    # like the saved queries (the variant keeps the alarms it is built from).
    "AWS::CloudWatch::CompositeAlarm": DROP,
}


class Unpublishable(Exception):
    """The template holds something this script cannot make SAR accept."""


def blocking(template: dict[str, Any], supported: frozenset[str]) -> dict[str, str]:
    """{logical id: type} of every resource whose type SAR does not list."""
    return {
        logical_id: resource["Type"]
        for logical_id, resource in template.get("Resources", {}).items()
        if resource["Type"] not in supported
    }


def _walk(node: Any, visit: Callable[[Any], Any]) -> Any:
    """Rebuild ``node`` bottom-up, each dict/list/str passed through ``visit``."""
    if isinstance(node, dict):
        return visit({key: _walk(value, visit) for key, value in node.items()})
    if isinstance(node, list):
        return visit([_walk(value, visit) for value in node])
    return visit(node)


def _getatt(value: Any) -> tuple[str, str] | None:
    if isinstance(value, list) and len(value) == 2 and all(isinstance(v, str) for v in value):
        return value[0], value[1]
    if isinstance(value, str) and "." in value:
        head, attribute = value.split(".", 1)
        return head, attribute
    return None


class _Rewriter:
    """Replaces references to the stood-in resources; collects those to dropped ones."""

    def __init__(self, stands: dict[str, Stand], dropped: set[str]) -> None:
        self.stands = stands
        self.dropped = dropped
        self.dangling: set[str] = set()

    def sub_text(self, logical_id: str, attribute: str | None) -> str:
        stand = self.stands[logical_id]
        parameter = stand.parameter(logical_id)
        text = None if attribute is None else stand.attributes[attribute]
        return (
            "${" + parameter + "}" if text is None else text.replace("${P}", "${" + parameter + "}")
        )

    def value(self, logical_id: str, attribute: str | None) -> Any:
        stand = self.stands[logical_id]
        if attribute is not None and attribute not in stand.attributes:
            raise Unpublishable(f"{logical_id}.{attribute}: no stand-in for that attribute")
        if attribute is None or stand.attributes[attribute] is None:
            return {"Ref": stand.parameter(logical_id)}
        return {"Fn::Sub": self.sub_text(logical_id, attribute)}

    def _sub(self, text: str) -> str:
        def replace(match: re.Match[str]) -> str:
            logical_id, _, attribute = match.group(1).partition(".")
            if logical_id in self.dropped:
                self.dangling.add(logical_id)
            if logical_id not in self.stands:
                return match.group(0)
            return self.sub_text(logical_id, attribute or None)

        return re.sub(r"\$\{([A-Za-z0-9]+(?:\.[A-Za-z0-9.]+)?)\}", replace, text)

    def _target(self, logical_id: str) -> bool:
        """Whether ``logical_id`` is stood in for; notes it when it was dropped."""
        if logical_id in self.dropped:
            self.dangling.add(logical_id)
        return logical_id in self.stands

    def __call__(self, node: Any) -> Any:
        if not isinstance(node, dict) or len(node) != 1:
            return node
        ((key, value),) = node.items()
        if key == "Ref" and isinstance(value, str):
            return self.value(value, None) if self._target(value) else node
        if key == "Fn::GetAtt":
            target = _getatt(value)
            return self.value(*target) if target and self._target(target[0]) else node
        if key == "Fn::Sub" and isinstance(value, str):
            return {"Fn::Sub": self._sub(value)}
        if key == "Fn::Sub" and isinstance(value, list) and value and isinstance(value[0], str):
            return {"Fn::Sub": [self._sub(value[0]), *value[1:]]}
        return node


def _names(node: Any, rewriter: _Rewriter) -> set[str]:
    before = set(rewriter.dangling)
    rewriter.dangling.clear()
    _walk(node, rewriter)
    found = set(rewriter.dangling)
    rewriter.dangling = before
    return found


def _without(items: Iterable[str], gone: set[str]) -> list[str]:
    return [item for item in items if item not in gone]


def _plan(template: dict[str, Any], supported: frozenset[str]) -> tuple[dict[str, Stand], set[str]]:
    """(stand-ins by logical id, dropped logical ids); Unpublishable for an unknown type."""
    blocked = blocking(template, supported)
    unknown = {i: t for i, t in blocked.items() if t not in REPLACEMENTS}
    if unknown:
        listed = ", ".join(f"{i} ({t})" for i, t in sorted(unknown.items()))
        raise Unpublishable(
            f"SAR does not list these resource types and no stand-in is known: {listed}"
        )
    stands = {i: r for i, t in blocked.items() if isinstance(r := REPLACEMENTS[t], Stand)}
    return stands, {i for i, t in blocked.items() if REPLACEMENTS[t] == DROP}


def _declare(out: dict[str, Any], stands: dict[str, Stand]) -> None:
    parameters: dict[str, Any] = out.setdefault("Parameters", {})
    taken = set(parameters) | set(out["Resources"]) | set(out.get("Outputs", {}))
    for logical_id, stand in sorted(stands.items()):
        name = stand.parameter(logical_id)
        if name in taken:
            raise Unpublishable(f"{name}: the stand-in parameter's name is already taken")
        parameters[name] = stand.declaration(logical_id)


def _unlink(out: dict[str, Any], gone: set[str], rewriter: _Rewriter) -> None:
    """Drop the outputs that showed a dropped resource and DependsOn entries naming a removed
    one; Unpublishable when a remaining resource still needs a dropped one."""
    outputs: dict[str, Any] = out.get("Outputs", {})
    for name in [o for o, v in outputs.items() if _names(v, rewriter)]:
        del outputs[name]
    for logical_id, resource in out["Resources"].items():
        depends = resource.get("DependsOn")
        if depends is not None:
            kept = _without([depends] if isinstance(depends, str) else depends, gone)
            resource["DependsOn"] = kept
            if not kept:
                del resource["DependsOn"]
        if _names(resource, rewriter):
            raise Unpublishable(
                f"{logical_id} refers to a dropped resource: {sorted(rewriter.dropped)}"
            )


def publishable(
    template: dict[str, Any],
    supported: frozenset[str],
    *,
    source_url: str | None = None,
) -> dict[str, Any]:
    """The variant of ``template`` SAR accepts; raises Unpublishable naming what blocks it."""
    out = copy.deepcopy(template)
    stands, dropped = _plan(out, supported)
    _declare(out, stands)
    for logical_id in [*stands, *dropped]:
        del out["Resources"][logical_id]
    rewriter = _Rewriter(stands, dropped)
    _unlink(out, set(stands) | dropped, rewriter)
    for section in ("Resources", "Outputs", "Conditions", "Globals"):
        if section in out:
            out[section] = _walk(out[section], rewriter)
    _group(out, [stand.parameter(i) for i, stand in sorted(stands.items())])
    if source_url is not None:
        meta = out.setdefault("Metadata", {}).setdefault(METADATA_KEY, {})
        meta["HomePageUrl"] = source_url
        meta["SourceCodeUrl"] = source_url
    return out


def _group(template: dict[str, Any], names: list[str]) -> None:
    if not names:
        return
    interface = template.setdefault("Metadata", {}).setdefault("AWS::CloudFormation::Interface", {})
    interface.setdefault("ParameterGroups", []).append(
        {"Label": {"default": "Existing resources (the SAR variant)"}, "Parameters": names}
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("source", type=Path, help="the template to read")
    parser.add_argument("target", type=Path, help="where to write the publishable variant")
    parser.add_argument("--source-url", help="the public repository: HomePageUrl, SourceCodeUrl")
    args = parser.parse_args(argv)
    template = load_yaml(args.source.read_text(encoding="utf-8"))
    supported, _templates = read_supported()
    try:
        variant = publishable(template, supported, source_url=args.source_url)
    except Unpublishable as exc:
        print(f"sar_template: {exc}", file=sys.stderr)
        return 1
    args.target.parent.mkdir(parents=True, exist_ok=True)
    args.target.write_text(dump_yaml(variant), encoding="utf-8")
    replaced = blocking(template, supported)
    print(
        f"sar_template: wrote {args.target}; replaced or dropped: "
        + (", ".join(f"{i} ({t})" for i, t in sorted(replaced.items())) or "nothing")
    )
    meta = variant.get("Metadata", {}).get(METADATA_KEY, {})
    if PLACEHOLDER in str(meta.get("SourceCodeUrl", "")):
        print(
            "sar_template: HomePageUrl/SourceCodeUrl are still placeholders: pass --source-url",
            file=sys.stderr,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
