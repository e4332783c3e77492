"""The import graph of ``opstate``: no upward arrow between layers, no cycle (between modules,
nor between rooms), every package says what it owns and what it may import.

Layers, bottom up (a module may import its own layer and the ones below, never above):

0. the domain (``opstate/domain/``, pure: no AWS, HTTP or Gemini code; test_purity.py checks
   that) and settings;
1. the store, webhook authenticity (signatures, secrets, the local API token), observability,
   ingest, the quarantine and ``gemini`` (talking to Gemini: below both of its users);
2. the API, the notifier and the reconciler;
3. the composition (``wiring``: where the Lambda entries and the CLI pick their parts), the local
   server and the CLI.

A room is ``opstate.X`` for each top-level module or package ``X`` (``opstate.reconcile``,
``opstate.domain``, ``opstate.ingest``...): no two rooms may import each other, directly or
through others, even within one layer.

Every ``import`` counts, at module level, inside functions (lazy imports) and under
``TYPE_CHECKING`` alike: all are dependencies. Modules are placed by prefix, so a new module in
an existing package needs nothing here; a new top-level module must be given a layer below.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterable, Mapping
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "layers" / "opstate" / "opstate"

# The pure domain: the folder opstate/domain/ and the pure parts of two packages beside it
# (test_purity.py probes every module these prefixes place).
DOMAIN = (
    "opstate.domain",
    "opstate.outcomes.ledger",
    "opstate.outcomes.ledger_reading",  # how the ledger reads one row
    "opstate.outcomes.ledger_rows",  # the ledger's msgspec structs (msgspec: a JSON parser)
    "opstate.outcomes.plan",
    "opstate.waiters.model",  # the waiters' pure part (issue 26)
    "opstate.retry.rules",  # which rows are retried (issue 33)
    "opstate.retry.final",  # the final merge of a lineage's outputs (issue 33)
    "opstate.retry.reading",  # how a retry pass reads a line: strictly, key digests (issue 39)
    "opstate.retry.selection",  # the rules over key digests: which keys are retried (issue 39)
    "opstate.retry.authority",  # who attached a policy, which inputs it may name (issue 38)
    "opstate.retry.jobs",  # a job's parts plan (issue 46)
)
# (layer name, module prefixes): "opstate.store" places opstate.store and opstate.store.*.
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    (
        "domain and settings",
        (
            *DOMAIN,
            "opstate.config",
            "opstate.settings",
            "opstate.private_files",
            "opstate.terminal",
        ),
    ),
    (
        "store, signatures, secrets, observability, ingest, gemini",
        (
            "opstate.store",
            "opstate.signatures",
            "opstate.webhook_secrets",
            "opstate.api_token",
            "opstate.observability",
            "opstate.lambda_logging",  # the process's logging under Lambda's log levels
            "opstate.ingest",
            "opstate.quarantine",
            "opstate.gemini",
        ),
    ),
    (
        "api, notify, reconcile",
        (
            "opstate.api",
            "opstate.notify",
            "opstate.reconcile",
            "opstate.replay",
            "opstate.outcomes",
            "opstate.retry",
            "opstate.waiters",
        ),
    ),
    ("wiring, local, cli", ("opstate.wiring", "opstate.local", "opstate.cli")),
]
ROOT_PACKAGE = "opstate"  # its __init__ imports nothing of opstate: below everything


def module_files(package: Path = PACKAGE) -> dict[str, Path]:
    """Dotted module name -> file, for every module of the package (``__init__`` = package)."""
    modules: dict[str, Path] = {}
    for path in sorted(package.rglob("*.py")):
        parts = list(path.relative_to(package.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        modules[".".join(parts)] = path
    return modules


def _owner(name: str, modules: Mapping[str, Path]) -> str | None:
    """The module ``name`` refers to: itself, or the nearest enclosing package that exists."""
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


def imports_of(module: str, path: Path, modules: Mapping[str, Path]) -> set[str]:
    """The opstate modules ``module`` imports (any statement, anywhere in the file)."""
    found: set[str] = set()
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: from . import x, from ..store import y
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join([*anchor, *([node.module] if node.module else [])])
            # "from opstate.store import sqlite" names a module; "... import MemoryStore" not
            targets = [
                f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base
                for alias in node.names
            ]
        else:
            continue
        for target in targets:
            if target == ROOT_PACKAGE or target.startswith(ROOT_PACKAGE + "."):
                owner = _owner(target, modules)
                if owner is not None and owner != module:
                    found.add(owner)
    return found


def import_graph(modules: Mapping[str, Path] | None = None) -> dict[str, set[str]]:
    modules = modules if modules is not None else module_files()
    return {name: imports_of(name, path, modules) for name, path in modules.items()}


def layer_of(module: str, layers: list[tuple[str, tuple[str, ...]]] = LAYERS) -> int | None:
    if module == ROOT_PACKAGE:
        return -1
    best: tuple[int, int] | None = None  # (prefix length, layer)
    for index, (_name, prefixes) in enumerate(layers):
        for prefix in prefixes:
            if (module == prefix or module.startswith(prefix + ".")) and (
                best is None or len(prefix) > best[0]
            ):
                best = (len(prefix), index)
    return None if best is None else best[1]


def upward_arrows(graph: Mapping[str, Iterable[str]]) -> list[str]:
    problems = []
    for module, targets in sorted(graph.items()):
        source = layer_of(module)
        for target in sorted(targets):
            aim = layer_of(target)
            if source is not None and aim is not None and aim > source:
                problems.append(
                    f"{module} ({LAYERS[source][0]}) imports {target} ({LAYERS[aim][0]})"
                )
    return problems


def _reachable(graph: Mapping[str, Iterable[str]], start: str) -> set[str]:
    seen: set[str] = set()
    todo = list(graph.get(start, ()))
    while todo:
        node = todo.pop()
        if node not in seen:
            seen.add(node)
            todo.extend(graph.get(node, ()))
    return seen


def cycles(graph: Mapping[str, Iterable[str]]) -> list[list[str]]:
    """The groups of modules that import each other, directly or not (each sorted)."""
    reach = {module: _reachable(graph, module) for module in graph}
    groups = {
        tuple(sorted({m, *(o for o in reach[m] if m in reach.get(o, ()))}))
        for m in graph
        if m in reach[m]
    }
    return sorted(list(group) for group in groups)


def room_of(module: str) -> str:
    """``opstate.X``: the top-level module or package of ``module`` (the root is its own)."""
    return ".".join(module.split(".")[:2])


def room_graph(graph: Mapping[str, Iterable[str]]) -> dict[str, set[str]]:
    """room -> the other rooms its modules import."""
    rooms: dict[str, set[str]] = {}
    for module, targets in graph.items():
        source = room_of(module)
        aims = rooms.setdefault(source, set())
        aims.update(room_of(target) for target in targets if room_of(target) != source)
    return rooms


GRAPH = import_graph()


def test_the_graph_is_read() -> None:
    assert "opstate.api.app" in GRAPH["opstate.api"]  # a package imports its modules
    assert "opstate.ingest" in GRAPH["opstate.api.ingesting"]
    # lazy imports count: the Lambda entry builds its store and verifier inside default_app
    assert GRAPH["opstate.api.lambda_entry"] >= {"opstate.signatures", "opstate.store"}
    assert "opstate.store.port" in GRAPH["opstate.ingest"]
    # lazy imports count: the CLI imports the local server inside its command
    assert any(t.startswith("opstate.local") for t in GRAPH["opstate.cli.serve"])


def test_every_module_has_a_layer() -> None:
    unplaced = [m for m in GRAPH if layer_of(m) is None]
    assert unplaced == [], f"give these modules a layer in tests/unit/test_layers.py: {unplaced}"


def test_no_upward_arrow() -> None:
    assert upward_arrows(GRAPH) == []


def test_no_cycle() -> None:
    assert cycles(GRAPH) == []


def test_no_cycle_between_rooms() -> None:
    rooms = room_graph(GRAPH)
    assert {"opstate.domain", "opstate.gemini", "opstate.reconcile", "opstate.wiring"} <= set(rooms)
    assert cycles(rooms) == []


def test_the_types_live_apart_from_the_decision() -> None:
    # Stores, views and logs need the domain's types (opstate.domain.model), never the reducer.
    needs_types_only = [
        m
        for m in GRAPH
        if m.startswith("opstate.store") or m in {"opstate.observability", "opstate.domain.views"}
    ]
    assert "opstate.store.port" in needs_types_only
    assert [m for m in needs_types_only if "opstate.domain.reducer" in GRAPH[m]] == []
    assert "opstate.domain.model" in GRAPH["opstate.store.port"]
    assert GRAPH["opstate.domain.model"] <= {
        "opstate.domain.names",
        "opstate.domain.states",
        "opstate.domain.times",
    }


def test_the_checks_can_fail() -> None:
    bad = {
        "opstate.domain.reducer": {"opstate.store.port"},  # domain -> store: upward
        "opstate.store.port": {"opstate.domain.reducer"},  # ... and back: a cycle
        "opstate.api": {"opstate.cli.app"},  # api -> cli: upward
        "opstate.cli.app": {"opstate.api"},
        "opstate.domain.names": set(),
    }
    assert upward_arrows(bad) == [
        "opstate.api (api, notify, reconcile) imports opstate.cli.app (wiring, local, cli)",
        "opstate.domain.reducer (domain and settings) imports opstate.store.port "
        "(store, signatures, secrets, observability, ingest, gemini)",
    ]
    assert cycles(bad) == [
        ["opstate.api", "opstate.cli.app"],
        ["opstate.domain.reducer", "opstate.store.port"],
    ]
    assert layer_of("opstate.brand_new") is None
    assert layer_of("opstate.gemini.brand_new") == 1
    assert layer_of("opstate.wiring.brand_new") == 3
    assert layer_of("opstate.reconcile.brand_new") == 2
    assert layer_of("opstate.local.brand_new") == 3


def test_the_room_check_can_fail() -> None:
    # No module imports itself back, yet the two rooms import each other (issue 32's cycle).
    bad = {
        "opstate.reconcile.wiring": {"opstate.outcomes.redrive", "opstate.reconcile.run"},
        "opstate.reconcile.run": set(),
        "opstate.reconcile.genai_gateway": set(),
        "opstate.outcomes.redrive": set(),
        "opstate.outcomes.genai_source": {"opstate.reconcile.genai_gateway"},
        "opstate.store.a": {"opstate.store.b"},  # within one room: the module check's business
        "opstate.store.b": {"opstate.domain.model"},
        "opstate": set(),
    }
    assert cycles(bad) == []
    assert room_graph(bad) == {
        "opstate": set(),
        "opstate.outcomes": {"opstate.reconcile"},
        "opstate.reconcile": {"opstate.outcomes"},
        "opstate.store": {"opstate.domain"},
    }
    assert cycles(room_graph(bad)) == [["opstate.outcomes", "opstate.reconcile"]]
    bad["opstate.reconcile.wiring"] = {"opstate.reconcile.run"}  # the composition moved out
    assert cycles(room_graph(bad)) == []


def test_relative_and_from_imports_resolve(tmp_path: Path) -> None:
    package = tmp_path / "opstate"
    (package / "store").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "reducer.py").write_text("")
    (package / "store" / "__init__.py").write_text("from .memory import MemoryStore\n")
    (package / "store" / "memory.py").write_text(
        "from ..reducer import OpRecord\n"
        "def f():\n"
        "    from opstate.store import port, MemoryStore\n"
    )
    (package / "store" / "port.py").write_text("import opstate.reducer\n")
    graph = import_graph(module_files(package))
    assert graph == {
        "opstate": set(),
        "opstate.reducer": set(),
        "opstate.store": {"opstate.store.memory"},
        "opstate.store.memory": {"opstate.reducer", "opstate.store.port", "opstate.store"},
        "opstate.store.port": {"opstate.reducer"},
    }


PACKAGES = sorted(m for m, p in module_files().items() if p.name == "__init__.py")


@pytest.mark.parametrize("package", PACKAGES)
def test_every_package_says_what_it_owns_and_may_import(package: str) -> None:
    path = module_files()[package]
    doc = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8"))) or ""
    assert "owns" in doc.lower(), f"{path}: the docstring should say what the package owns"
    assert "may import" in doc.lower(), f"{path}: the docstring should say what it may import"


# -- the retry room's stages (issue 49) ------------------------------------------------------

RETRY = "opstate.retry"
_STAGE = re.compile(r"^(\d)\. (\w+)[^:]*:(.*?)(?=^\d\. |\n\n|\Z)", re.MULTILINE | re.DOTALL)


def retry_stages(doc: str, modules: Iterable[str]) -> dict[str, tuple[int, str]]:
    """module -> (stage number, stage name), as the numbered list of the retry room's
    docstring places them: every ````name```` in a stage's item that is one of ``modules``."""
    known = set(modules)
    placed: dict[str, tuple[int, str]] = {}
    for number, name, body in _STAGE.findall(doc):
        for word in re.findall(r"``(\w+)``", body):
            if word in known:
                placed.setdefault(word, (int(number), name))
    return placed


def later_stage_imports(
    graph: Mapping[str, Iterable[str]], stages: Mapping[str, tuple[int, str]]
) -> list[str]:
    """Imports inside the retry room that point to a later stage than their own."""
    problems = []
    for module, targets in sorted(graph.items()):
        short = module.removeprefix(RETRY + ".")
        if short not in stages:
            continue
        for target in sorted(targets):
            aim = stages.get(target.removeprefix(RETRY + "."))
            if target.startswith(RETRY + ".") and aim is not None and aim[0] > stages[short][0]:
                problems.append(
                    f"{short} ({stages[short][1]}) imports {target.removeprefix(RETRY + '.')} "
                    f"({aim[1]})"
                )
    return problems


RETRY_MODULES = sorted(m.removeprefix(RETRY + ".") for m in GRAPH if m.startswith(RETRY + "."))
RETRY_DOC = ast.get_docstring(ast.parse(module_files()[RETRY].read_text(encoding="utf-8"))) or ""


def test_every_retry_module_has_a_stage() -> None:
    stages = retry_stages(RETRY_DOC, RETRY_MODULES)
    assert [m for m in RETRY_MODULES if m not in stages] == [], (
        "list these modules under their stage in the docstring of opstate/retry/__init__.py"
    )
    assert {name for _number, name in stages.values()} == {"rules", "plans", "acting", "passes"}
    assert stages["rules"] == (1, "rules") and stages["engine"] == (4, "passes")


def test_retry_imports_point_to_earlier_stages() -> None:
    stages = retry_stages(RETRY_DOC, RETRY_MODULES)
    assert later_stage_imports(GRAPH, stages) == []


def test_the_stage_check_can_fail() -> None:
    doc = (
        "Stages:\n\n1. rules, pure: ``rules`` (the ``table``), ``final``;\n"
        "2. plans: ``lineage``;\n3. acting (one step each):\n   ``children``\n\n"
        "Not a stage: ``engine``.\n"
    )
    stages = retry_stages(doc, ["rules", "final", "lineage", "children", "engine"])
    assert stages == {
        "rules": (1, "rules"),
        "final": (1, "rules"),
        "lineage": (2, "plans"),
        "children": (3, "acting"),
    }
    graph = {
        "opstate.retry.rules": {"opstate.retry.lineage", "opstate.domain.model"},  # later
        "opstate.retry.final": {"opstate.retry.rules"},  # same stage
        "opstate.retry.lineage": {"opstate.retry.final"},  # earlier
        "opstate.retry.children": {"opstate.retry.engine"},  # unplaced: the other test's
    }
    assert later_stage_imports(graph, stages) == ["rules (rules) imports lineage (plans)"]
