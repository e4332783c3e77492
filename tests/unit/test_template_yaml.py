"""template.yaml is read by a loader that refuses a key given twice in a mapping: a merge that
interleaves two resources (it happened once: a queue's properties went silently missing) fails
every template test instead of loading half of it."""

from __future__ import annotations

import pytest
import yaml

from tests.support.template import load_template, loads


def test_a_key_twice_in_a_mapping_is_refused_at_any_depth() -> None:
    with pytest.raises(yaml.constructor.ConstructorError, match="'Queue' twice"):
        loads("Resources:\n  Queue:\n    Type: A\n  Queue:\n    Type: B\n")
    with pytest.raises(yaml.constructor.ConstructorError, match="'Type' twice"):
        loads("Resources:\n  Queue:\n    Type: A\n    Type: B\n")
    with pytest.raises(yaml.constructor.ConstructorError, match="'a' twice"):
        loads("X: !Sub\n  a: 1\n  a: 2\n")


def test_the_template_has_no_key_twice_and_keeps_its_tags() -> None:
    template = load_template()
    assert template["Resources"]["OperationsTable"]["Type"] == "AWS::DynamoDB::Table"
    assert loads("A: !GetAtt T.Arn\nB: !Ref X\n") == {
        "A": {"Fn::GetAtt": ["T", "Arn"]},
        "B": {"Ref": "X"},
    }
