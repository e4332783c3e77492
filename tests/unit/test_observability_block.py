"""The dashboard and the alarms watch metrics the code really emits, with the same dimensions.

Three sources are compared: the table ``opstate.observability.METRICS``; the metric calls in
the package, read from its syntax tree (``count("X", reason=...)``,
``metrics.add_metric(name="X", unit=...)``); and template.yaml (the generated dashboard body,
the alarms). The committed observability block must be exactly what the generator writes.
"""

from __future__ import annotations

import ast
import io
import json
import logging
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

import scripts.observability_block as generator
from opstate.api import create_app
from opstate.config import Settings
from opstate.observability import METRICS, SERVICE, WEBHOOK_OUTCOMES, logger
from opstate.signatures import SecretsUnavailableError, StaticSecretsVerifier
from opstate.store import MemoryStore
from tests.support.template import TEMPLATE, load_template
from tests.support.webhooks import (
    EVENT_TIMESTAMP,
    OTHER_SECRET,
    TEST_SECRET,
    compact,
    signed_headers,
    webhook_event,
)

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "layers" / "opstate" / "opstate"
NAMESPACE = "GeminiOpstate"
STACK = "my-stack"
# Call sites that forward a name they were given (checked at their own call sites).
# count() and the helper that has Powertools build its EMF text forward their caller's metric.
FORWARDERS = {("observability.py", "count"), ("observability.py", "_blob")}


@pytest.fixture(scope="module")
def template() -> dict[str, Any]:
    return load_template()


# --- emission sites, read from the code ----------------------------------------------------------


@dataclass(frozen=True)
class Site:
    metric: str
    dimensions: frozenset[str]
    unit: str
    where: str


def _names(node: ast.expr, tables: dict[str, list[str]]) -> list[str] | None:
    """The metric name(s) an argument can be: a literal, either branch of ``a if c else b``, or
    any value of a module-level dict of literals (``count(_NAMES[key], n)``)."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value]
    if isinstance(node, ast.IfExp):
        body, orelse = _names(node.body, tables), _names(node.orelse, tables)
        return None if body is None or orelse is None else body + orelse
    if isinstance(node, ast.Subscript) and isinstance(node.value, ast.Name):
        return tables.get(node.value.id)
    return None


def _literal_tables(tree: ast.Module) -> dict[str, list[str]]:
    """Module-level ``NAME = {key: "Literal", ...}`` dicts whose values are all strings."""
    tables: dict[str, list[str]] = {}
    for statement in tree.body:
        if isinstance(statement, ast.Assign) and len(statement.targets) == 1:
            target, value = statement.targets[0], statement.value
        elif isinstance(statement, ast.AnnAssign) and statement.value is not None:
            target, value = statement.target, statement.value
        else:
            continue
        if isinstance(target, ast.Name) and isinstance(value, ast.Dict):
            names = [v.value for v in value.values if isinstance(v, ast.Constant)]
            if names and len(names) == len(value.values) and all(isinstance(n, str) for n in names):
                tables[target.id] = [str(n) for n in names]
    return tables


def emission_sites() -> tuple[list[Site], list[str]]:
    """Every metric call in the package, and the calls whose metric could not be read."""
    sites: list[Site] = []
    unresolved: list[str] = []
    for path in sorted(PACKAGE.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        tables = _literal_tables(tree)
        for func in ast.walk(tree):
            if not isinstance(func, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            for call in ast.walk(func):
                if not isinstance(call, ast.Call):
                    continue
                callee = call.func
                callee_name = (
                    callee.id
                    if isinstance(callee, ast.Name)
                    else callee.attr
                    if isinstance(callee, ast.Attribute)
                    else ""
                )
                where = f"{path.relative_to(PACKAGE)}:{call.lineno} ({func.name})"
                keywords = {k.arg: k.value for k in call.keywords}
                if callee_name == "count" and isinstance(callee, ast.Name):
                    name_node = call.args[0] if call.args else keywords.get("name")
                    dims = frozenset(k for k in keywords if k not in ("name", "value"))
                    unit = "Count"
                    forwarding = None in keywords
                elif callee_name in ("add_metric", "single_metric"):
                    name_node = keywords.get("name")
                    dims = frozenset()
                    unit_node = keywords.get("unit")
                    unit = unit_node.attr if isinstance(unit_node, ast.Attribute) else "?"
                    forwarding = False
                else:
                    continue
                names = _names(name_node, tables) if name_node is not None else None
                if names is None or forwarding:
                    if (path.name, func.name) not in FORWARDERS:
                        unresolved.append(where)
                    continue
                sites += [Site(n, dims, unit, where) for n in names]
    return sites, unresolved


def test_every_metric_call_names_a_metric_of_the_table_with_its_dimensions_and_unit() -> None:
    sites, unresolved = emission_sites()
    assert not unresolved, f"metric calls whose name or dimensions cannot be read: {unresolved}"
    assert len(sites) >= 20  # the scan really found the calls
    for site in sites:
        spec = METRICS.get(site.metric)
        assert spec is not None, f"{site.where} emits {site.metric}, missing from METRICS"
        assert site.dimensions == set(spec.dimensions), site
        assert site.unit == spec.unit, site


def test_the_scanner_reads_literals_branches_and_literal_tables() -> None:
    tree = ast.parse(
        "_N = {'a': 'Alpha', 'b': 'Beta'}\n"
        "def f(k, x):\n"
        "    count('Gamma', reason=x)\n"
        "    count('Delta' if x else 'Epsilon')\n"
        "    count(_N[k], 2)\n"
        "    count(k)\n"
    )
    tables = _literal_tables(tree)
    calls = [c for c in ast.walk(tree) if isinstance(c, ast.Call)]
    assert [_names(c.args[0], tables) for c in calls] == [
        ["Gamma"],
        ["Delta", "Epsilon"],
        ["Alpha", "Beta"],
        None,
    ]


def test_every_metric_of_the_table_is_emitted_somewhere() -> None:
    emitted = {site.metric for site in emission_sites()[0]}
    assert set(METRICS) - emitted == set()


# --- the generated block -------------------------------------------------------------------------


def test_the_committed_block_is_what_the_generator_writes() -> None:
    text = TEMPLATE.read_text(encoding="utf-8")
    assert generator.BEGIN in text, "run `make dashboard`"
    assert generator.committed_block(text) == generator.block(), "run `make dashboard`"
    assert generator.main(["--check"]) == 0


def test_the_generator_replaces_only_its_block() -> None:
    text = TEMPLATE.read_text(encoding="utf-8")
    stale = text.replace('"Signature rejections"', '"Old title"')
    assert stale != text
    assert generator.replace_block(stale, generator.block()) == text
    without = stale.replace(generator.committed_block(stale), "")
    assert generator.replace_block(without, generator.block()).count(generator.BEGIN) == 1


def substitute(text: str, variables: dict[str, str], resources: dict[str, Any]) -> str:
    """Fn::Sub as CloudFormation does it: ``${!x}`` is a literal ``${x}``; a resource
    reference must name a resource of the template."""

    def one(match: re.Match[str]) -> str:
        inner = match.group(1)
        if inner.startswith("!"):
            return "${" + inner[1:] + "}"
        if inner in variables:
            return variables[inner]
        logical_id, _, attribute = inner.partition(".")
        assert logical_id in resources, f"${{{inner}}} names no resource"
        return f"<{logical_id}{'.' + attribute if attribute else ''}>"

    return re.sub(r"\$\{([^}]*)\}", one, text)


@pytest.fixture(scope="module")
def body(template: dict[str, Any]) -> dict[str, Any]:
    dashboard = template["Resources"]["Dashboard"]
    assert dashboard["Type"] == "AWS::CloudWatch::Dashboard"
    assert dashboard["Properties"]["DashboardName"] == {"Ref": "AWS::StackName"}
    text, variables = dashboard["Properties"]["DashboardBody"]["Fn::Sub"]
    assert variables == {"Namespace": {"Fn::FindInMap": ["Observability", "Metrics", "Namespace"]}}
    assert template["Mappings"]["Observability"]["Metrics"]["Namespace"] == NAMESPACE
    names = {"Namespace": NAMESPACE, "AWS::StackName": STACK, "AWS::Region": "eu-west-1"}
    parsed: dict[str, Any] = json.loads(substitute(text, names, template["Resources"]))
    return parsed


def dashboard_lines(body: dict[str, Any]) -> list[tuple[str, str, dict[str, str]]]:
    """(namespace, metric, dimensions) of every line on the dashboard, SEARCHes included."""
    out: list[tuple[str, str, dict[str, str]]] = []
    for widget in body["widgets"]:
        for line in widget["properties"].get("metrics", []):
            head = line[0]
            if isinstance(head, dict):
                expression = head["expression"]
                match = re.fullmatch(
                    r"SEARCH\('\{([^}]*)\} MetricName=\"(\w+)\" service=\"([^\"]+)\"', "
                    r"'(\w+)', (\d+)\)",
                    expression,
                )
                assert match, expression
                namespace, *keys = match.group(1).split(",")
                dims = dict.fromkeys(keys, "*")
                dims["service"] = match.group(3)
                out.append((namespace, match.group(2), dims))
            else:
                values = [part for part in line if not isinstance(part, dict)]
                pairs = values[2:]
                out.append((values[0], values[1], dict(zip(pairs[::2], pairs[1::2], strict=True))))
    return out


def test_the_dashboard_draws_every_metric_of_the_table_with_its_dimensions(
    body: dict[str, Any],
) -> None:
    emitted = {site.metric for site in emission_sites()[0]}
    custom = [(m, d) for ns, m, d in dashboard_lines(body) if ns == NAMESPACE]
    for metric, dims in custom:
        assert metric in METRICS and metric in emitted, metric
        assert set(dims) == {"service", *METRICS[metric].dimensions}, metric
        assert dims["service"] == STACK
    assert {m for m, _ in custom} == set(METRICS)


def test_the_dashboard_covers_what_the_issue_asks(body: dict[str, Any]) -> None:
    lines = dashboard_lines(body)
    by_namespace: dict[str, set[tuple[str, str]]] = {}
    for namespace, metric, dims in lines:
        by_namespace.setdefault(namespace, set()).add((metric, ",".join(sorted(dims.values()))))
    functions = {
        "<WebhookFunction>",
        "<ReconcileFunction>",
        "<NotifyFunction>",
        "<WaiterResumerFunction>",
    }
    for metric in ("Errors", "Duration", "Throttles"):
        assert {d for m, d in by_namespace["AWS/Lambda"] if m == metric} == functions
    assert {d for _, d in by_namespace["AWS/SQS"]} == {
        "<NotifyDeadLetterQueue.QueueName>",
        "<SchedulerDeadLetterQueue.QueueName>",
        "<WaiterDeadLetterQueue.QueueName>",
    }
    titles = [w["properties"].get("title") for w in body["widgets"]]
    assert "Webhook deliveries by outcome" in titles
    # The grid: 24 columns, no two widgets overlap.
    cells: set[tuple[int, int]] = set()
    for widget in body["widgets"]:
        assert widget["x"] + widget["width"] <= 24
        area = {
            (x, y)
            for x in range(widget["x"], widget["x"] + widget["width"])
            for y in range(widget["y"], widget["y"] + widget["height"])
        }
        assert not cells & area, widget
        cells |= area
        if widget["type"] == "metric":
            assert widget["properties"]["region"] == "eu-west-1"
    # CloudWatch's dynamic label survived Fn::Sub as ${PROP(...)}.
    assert "${PROP('Dim.reason')}" in json.dumps(body)


def test_every_alarmed_custom_metric_is_emitted_with_the_alarms_dimensions(
    template: dict[str, Any],
) -> None:
    emitted = {site.metric for site in emission_sites()[0]}
    namespace = {"Fn::FindInMap": ["Observability", "Metrics", "Namespace"]}
    alarmed = []
    for alarm in template["Resources"].values():
        if alarm["Type"] != "AWS::CloudWatch::Alarm":
            continue
        props = alarm["Properties"]
        stats = [props] + [
            m["MetricStat"]["Metric"] for m in props.get("Metrics", []) if "MetricStat" in m
        ]
        for stat in stats:
            if stat.get("Namespace") != namespace:
                continue
            metric = stat["MetricName"]
            alarmed.append(metric)
            assert metric in METRICS and metric in emitted, metric
            dims = {d["Name"]: d["Value"] for d in stat.get("Dimensions", [])}
            assert dims == {"service": {"Ref": "AWS::StackName"}}, metric
            assert set(METRICS[metric].dimensions) == set(), metric
    assert {"IngestGaveUp", "SignatureRejected", "WebhooksDisabled"} <= set(alarmed)


# --- the saved queries are in the template as generated ------------------------------------------


def test_saved_queries_are_on_the_functions_log_groups(template: dict[str, Any]) -> None:
    resources = template["Resources"]
    definitions = {k: v for k, v in resources.items() if v["Type"] == "AWS::Logs::QueryDefinition"}
    assert set(definitions) == {q.logical_id for q in generator.QUERIES}
    for query in generator.QUERIES:
        props = definitions[query.logical_id]["Properties"]
        assert props["Name"] == {"Fn::Sub": "${AWS::StackName}/" + query.title}
        assert props["QueryString"] == query.text
        for group in props["LogGroupNames"]:
            target = resources[group["Ref"]]
            assert target["Type"] == "AWS::Logs::LogGroup"
            assert target["Properties"]["LogGroupName"]["Fn::Sub"].startswith("/aws/lambda/")
    assert {q.title for q in generator.QUERIES} == {
        "every decision for one operation",
        "drops by reason",
        "signature rejections",
        "503s and give-ups",
    }


# --- WebhookDeliveries, as the code emits it -----------------------------------------------------


def _blobs(out: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in out.splitlines() if line.startswith('{"_aws"')]


class _BrokenStore(MemoryStore):
    def get(self, name: str) -> Any:
        from opstate.store.port import StoreUnavailableError

        raise StoreUnavailableError("table unreachable")


class _NoSecrets(StaticSecretsVerifier):
    def verify(self, raw: bytes, headers: Any) -> None:
        raise SecretsUnavailableError("secrets unreachable")


def _body(event_type: str = "batch.succeeded") -> bytes:
    return compact(
        {"type": event_type, "timestamp": "2026-05-10T09:59:00Z", "data": {"id": "batches/w1"}}
    )


def test_webhook_deliveries_are_counted_by_outcome(capsys: pytest.CaptureFixture[str]) -> None:
    good = StaticSecretsVerifier((TEST_SECRET,), clock_s=lambda: EVENT_TIMESTAMP)
    app = create_app(store=MemoryStore(), verifier=good, settings=Settings())
    broken = create_app(store=_BrokenStore(), verifier=good, settings=Settings())
    no_secrets = create_app(
        store=MemoryStore(),
        verifier=_NoSecrets((TEST_SECRET,), clock_s=lambda: EVENT_TIMESTAMP),
        settings=Settings(),
    )

    def send(target: Any, body: bytes, secret: str = TEST_SECRET) -> int:
        event = webhook_event(body, signed_headers(body, secrets=(secret,)))
        return int(target.resolve(event, None)["statusCode"])

    capsys.readouterr()
    statuses = [
        send(app, _body()),  # applied
        send(app, _body()),  # the same delivery again: dropped
        send(app, _body("batch.paused")),  # unsupported type: dropped
        send(app, _body(), OTHER_SECRET),  # rejected
        send(app, b"{not json"),  # signed but unreadable: quarantined
        send(app, b"{not json", OTHER_SECRET),  # unsigned and unreadable: rejected
        send(broken, _body()),  # retry-later (store)
        send(no_secrets, _body()),  # retry-later (secrets)
    ]
    assert statuses == [200, 200, 200, 401, 200, 401, 503, 503]
    blobs = [b for b in _blobs(capsys.readouterr().out) if "WebhookDeliveries" in b]
    outcomes = [b["outcome"] for b in blobs]
    assert (
        outcomes
        == ["applied", "dropped", "dropped", "rejected", "quarantined", "rejected"]
        + ["retry-later"] * 2
    )
    assert set(outcomes) <= set(WEBHOOK_OUTCOMES)
    for blob in blobs:
        (directive,) = blob["_aws"]["CloudWatchMetrics"]
        assert [set(d) for d in directive["Dimensions"]] == [{"service", "outcome"}]
        assert blob["service"] == SERVICE


def test_decision_log_lines_carry_the_events_server_time() -> None:
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(logger.registered_formatter)
    std = logging.getLogger(SERVICE)
    std.addHandler(handler)
    try:
        good = StaticSecretsVerifier((TEST_SECRET,), clock_s=lambda: EVENT_TIMESTAMP)
        app = create_app(store=MemoryStore(), verifier=good, settings=Settings())
        body = _body()
        app.resolve(webhook_event(body, signed_headers(body)), None)
    finally:
        std.removeHandler(handler)
    lines = [json.loads(x) for x in stream.getvalue().splitlines() if x.startswith("{")]
    (applied,) = [x for x in lines if x.get("message") == "event applied"]
    assert applied["update_time"] == "2026-05-10T09:59:00.000000000Z"
