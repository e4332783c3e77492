"""Mutation testing of the domain modules, the retry room's and the job queue's pure modules and
the signatures package (``make mutate``; not part of ``make test``).

An AST driver of our own rather than mutmut: the package lives in a SAM layer directory
(``layers/opstate``) and is installed in editable mode, which mutmut 3's copy-the-tree runner
does not fit. For every mutant the driver copies the package to a scratch directory, writes the
one mutated module there, and runs the module's tests with that copy first on ``sys.path``, in
a process forked from one that imported pytest and hypothesis once (``_forks``). A mutant is
*killed* when the tests fail (or time out) and *survives* when they pass: a survivor is
behaviour no test pins down, or an equivalent mutant.

Mutations: comparison operators (``<``/``<=``, ``>``/``>=``, ``==``/``!=``, ``in``/``not in``,
``is``/``is not``), ``+``/``-``, ``and``/``or``, ``not x`` -> ``x``, integer constants ``n`` ->
``n + 1``, ``True``/``False``, ``split``/``rsplit`` (with a maxsplit: without one they agree)
and ``strip``/``lstrip``, ``if`` conditions
negated, ``break``/``continue``, and the message strings of ``raise`` statements. Annotations
and docstrings are never mutated.

Equivalent mutants: a line whose comment is ``# mutant: equivalent — <why>`` (an em dash or
``-``, then the reason) has every mutant on it skipped, never run; the run says how many. The
claim is one line's: put the marker on the line the mutant is on (``--list`` shows it; a
mutant of a wrapped expression is on the line its node starts), split a line whose other
mutants are not equivalent, and check a claim with ``--marked`` (runs only the skipped
mutants: each should survive). A marker on a line without a mutant fails the run.

``make mutate`` runs the gate, ``GATED``: the modules every mutant of which is killed or marked.
To gate a module: give it its tests in ``TARGETS``, run ``make mutate MUTATE_ARGS="--module
NAME"``, kill or mark each survivor, then add it to ``GATED``. ``--all`` runs every module of
``TARGETS``.

Usage: python tools/mutate.py [--module NAME ... | --all] [--max N] [--jobs N] [--list]
       [--marked]
Exit status: 0 when every mutant that was run was killed, 1 when some survived (they are
listed) or a marker names no mutant, 2 when the tests fail without any mutation.
"""

from __future__ import annotations

import argparse
import ast
import copy
import multiprocessing
import multiprocessing.context
import os
import re
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "layers" / "opstate" / "opstate"
# What a test run needs, copied once at start: edits made while the run goes on change nothing.
SNAPSHOT_PARTS = (
    "layers/opstate/opstate",
    "functions",
    "tests",
    "events",
    "pyproject.toml",
    "template.yaml",
)

# Module -> the tests that pin it (the unit tests and the ingest-conflict tests).
TARGETS: dict[str, list[str]] = {
    "domain.states": ["tests/unit/test_states.py", "tests/unit/test_reducer.py"],
    "domain.times": ["tests/unit/test_times.py", "tests/unit/test_properties.py"],
    "domain.names": ["tests/unit/test_names.py", "tests/unit/test_events.py"],
    # The normalisers (domain.events only re-exports them, one module per kind of source).
    "domain.events_parsing": [
        "tests/unit/test_events.py",
        "tests/unit/test_input_edges.py",
        "tests/unit/test_reducer.py",
    ],
    "domain.events_webhook": ["tests/unit/test_events.py", "tests/unit/test_cloud_events.py"],
    "domain.events_polls": [
        "tests/unit/test_events.py",
        "tests/unit/test_cloud_events.py",
        "tests/unit/test_input_edges.py",
        "tests/unit/test_reducer.py",
    ],
    "domain.events_report": ["tests/unit/test_events.py", "tests/unit/test_input_edges.py"],
    "domain.reducer": [
        "tests/unit/test_reducer.py",
        "tests/unit/test_properties.py",
        "tests/unit/test_ingest.py",
        "tests/integration/test_ingest_conflicts.py",
    ],
    "domain.model": [
        "tests/unit/test_reducer.py",
        "tests/unit/test_properties.py",
        "tests/unit/test_time_bounds.py",
        "tests/unit/test_events.py",
        "tests/unit/test_notify.py",
        "tests/unit/test_model.py",
    ],
    "domain.details": ["tests/unit/test_details.py", "tests/unit/test_reducer.py"],
    # The retry room's pure modules (issue 39). retry.final's own mutant-killing tests are
    # apart (test_retry_final_mutants.py) from its behaviour tests.
    "domain.retry": [
        "tests/unit/test_retry_policy.py",
        "tests/unit/test_retry_policy_mutants.py",
        "tests/unit/test_waiters_final.py",
    ],
    "domain.refusals": ["tests/unit/test_refusals.py", "tests/unit/test_gemini_errors.py"],
    "retry.rules": [
        "tests/unit/test_retry_rules.py",
        "tests/unit/test_retry_rules_mutants.py",
        "tests/unit/test_gemini_errors.py",
    ],
    "retry.final": [
        "tests/unit/test_retry_final_mutants.py",
        "tests/unit/test_retry_final_order.py",
        "tests/unit/test_retry_final.py",
        "tests/unit/test_waiters_final.py",
    ],
    # The job queue's pure modules (issue 46): the split, estimate, room, learned cap and
    # backoff; a job's parts plan (of test_job_parts.py, only its two plan tests). The mutant
    # tests first: fast and exact, they kill most mutants before the properties run.
    "domain.parts": ["tests/unit/test_job_parts_mutants.py", "tests/unit/test_job_parts.py"],
    "retry.jobs": [
        "tests/unit/test_retry_jobs_mutants.py",
        "tests/unit/test_job_parts.py::test_a_plan_holds_parts_in_input_order_with_unpublished_nonces",
        "tests/unit/test_job_parts.py::test_a_plan_over_its_parts_bound_is_refused_before_anything",
    ],
    "signatures.standard": ["tests/unit/test_signatures.py"],
    "signatures.jwt_tokens": ["tests/unit/test_signatures.py"],
    "signatures.wiring": ["tests/unit/test_signatures.py"],
}

# What ``make mutate`` runs and must pass: every mutant killed or marked equivalent.
GATED = (
    "domain.retry",
    "domain.refusals",
    "retry.rules",
    "retry.final",
    "domain.parts",
    "retry.jobs",
)

# ``# mutant: equivalent — why`` (an em dash, an en dash or a hyphen; a reason after it).
EQUIVALENT = re.compile(r"#\s*mutant: equivalent\s*[\u2014\u2013-]+\s*(\S.*)$")

_COMPARE_SWAP: dict[type[ast.cmpop], type[ast.cmpop]] = {
    ast.Lt: ast.LtE,
    ast.LtE: ast.Lt,
    ast.Gt: ast.GtE,
    ast.GtE: ast.Gt,
    ast.Eq: ast.NotEq,
    ast.NotEq: ast.Eq,
    ast.In: ast.NotIn,
    ast.NotIn: ast.In,
    ast.Is: ast.IsNot,
    ast.IsNot: ast.Is,
}
_METHOD_SWAP = {"split": "rsplit", "rsplit": "split", "strip": "lstrip", "lstrip": "strip"}


@dataclass(frozen=True)
class Mutant:
    module: str
    index: int
    line: int
    description: str


def _skipped_nodes(tree: ast.AST) -> set[int]:
    """ids of nodes never mutated: annotations and docstrings."""
    skip: set[int] = set()

    def mark(node: ast.AST | None) -> None:
        if node is not None:
            skip.update(id(n) for n in ast.walk(node))

    for node in ast.walk(tree):
        if isinstance(node, ast.arg | ast.AnnAssign):
            mark(node.annotation)
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            mark(node.returns)
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                mark(body[0])
    return skip


def _raise_strings(tree: ast.AST) -> set[int]:
    out: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Raise) and node.exc is not None:
            for inner in ast.walk(node.exc):
                if isinstance(inner, ast.Constant) and isinstance(inner.value, str):
                    out.add(id(inner))
    return out


def _bounded_splits(tree: ast.AST) -> set[int]:
    """ids of ``.split``/``.rsplit`` attributes called with a maxsplit."""
    return {
        id(call.func)
        for call in ast.walk(tree)
        if isinstance(call, ast.Call)
        and isinstance(call.func, ast.Attribute)
        and (len(call.args) >= 2 or any(k.arg == "maxsplit" for k in call.keywords))
    }


# Node kinds with a single mutation point, each with the test that spots it.
_SIMPLE_KINDS: list[tuple[str, Callable[[ast.AST], bool]]] = [
    ("arith", lambda n: isinstance(n, ast.BinOp) and isinstance(n.op, ast.Add | ast.Sub)),
    ("boolop", lambda n: isinstance(n, ast.BoolOp)),
    ("not", lambda n: isinstance(n, ast.UnaryOp) and isinstance(n.op, ast.Not)),
    ("if", lambda n: isinstance(n, ast.If)),
    ("loop", lambda n: isinstance(n, ast.Break | ast.Continue)),
]


def _points(tree: ast.AST) -> Iterator[tuple[ast.AST, str, int]]:
    """(node, kind, slot) for every mutation point, in a stable order."""
    skip = _skipped_nodes(tree)
    messages = _raise_strings(tree)
    bounded_splits = _bounded_splits(tree)
    for node in ast.walk(tree):
        if id(node) not in skip:
            for kind, slot in _node_points(node, messages, bounded_splits):
                yield node, kind, slot


def _node_points(
    node: ast.AST, messages: set[int], bounded_splits: set[int]
) -> list[tuple[str, int]]:
    """(kind, slot) of every mutation point of one node."""
    if isinstance(node, ast.Compare):
        return [("compare", s) for s, op in enumerate(node.ops) if type(op) in _COMPARE_SWAP]
    if isinstance(node, ast.Constant):
        kind = _constant_kind(node, messages)
        return [] if kind is None else [(kind, 0)]
    if isinstance(node, ast.Attribute):
        if node.attr not in _METHOD_SWAP:
            return []
        if node.attr in ("split", "rsplit") and id(node) not in bounded_splits:
            return []  # without maxsplit, split and rsplit agree: an equivalent mutant
        return [("method", 0)]
    return [(kind, 0) for kind, matches in _SIMPLE_KINDS if matches(node)]


def _constant_kind(node: ast.Constant, messages: set[int]) -> str | None:
    if isinstance(node.value, bool):
        return "bool"
    if isinstance(node.value, int):
        return "int"
    if isinstance(node.value, str) and id(node) in messages:
        return "message"
    return None


def _describe(node: ast.AST, kind: str, slot: int) -> str:
    if kind == "compare":
        assert isinstance(node, ast.Compare)
        op = node.ops[slot]
        return f"{type(op).__name__} -> {_COMPARE_SWAP[type(op)].__name__}"
    if kind == "arith":
        assert isinstance(node, ast.BinOp)
        return "+ -> -" if isinstance(node.op, ast.Add) else "- -> +"
    if kind == "boolop":
        assert isinstance(node, ast.BoolOp)
        return "and -> or" if isinstance(node.op, ast.And) else "or -> and"
    if kind == "int":
        assert isinstance(node, ast.Constant) and isinstance(node.value, int)
        return f"{node.value} -> {node.value + 1}"
    if kind == "bool":
        assert isinstance(node, ast.Constant)
        return f"{node.value!r} -> {not node.value!r}"
    if kind == "method":
        assert isinstance(node, ast.Attribute)
        return f".{node.attr} -> .{_METHOD_SWAP[node.attr]}"
    if kind == "message":
        return "raise message -> 'XX' + message + 'XX'"
    if kind == "if":
        return "if c -> if not c"
    if kind == "not":
        return "not x -> x"
    return "break <-> continue"


def _apply(tree: ast.Module, target: int) -> tuple[ast.Module, str, int]:
    tree = copy.deepcopy(tree)
    for i, (node, kind, slot) in enumerate(_points(tree)):
        if i == target:
            text = _describe(node, kind, slot)
            line = getattr(node, "lineno", 0)
            return _mutate(tree, node, kind, slot), text, line
    raise IndexError(target)


def _mutate(tree: ast.Module, node: ast.AST, kind: str, slot: int) -> ast.Module:
    """``tree`` with the mutation ``kind`` applied at ``node`` (changed in place when it can be)."""
    if kind == "not":
        return _replace_not(tree, node)
    if kind == "loop":
        return _swap_loop(tree, node)
    _IN_PLACE[kind](node, slot)
    return ast.fix_missing_locations(tree)


def _flip_compare(node: ast.AST, slot: int) -> None:
    assert isinstance(node, ast.Compare)
    node.ops[slot] = _COMPARE_SWAP[type(node.ops[slot])]()


def _flip_arith(node: ast.AST, slot: int) -> None:
    assert isinstance(node, ast.BinOp)
    node.op = ast.Sub() if isinstance(node.op, ast.Add) else ast.Add()


def _flip_boolop(node: ast.AST, slot: int) -> None:
    assert isinstance(node, ast.BoolOp)
    node.op = ast.Or() if isinstance(node.op, ast.And) else ast.And()


def _bump_int(node: ast.AST, slot: int) -> None:
    assert isinstance(node, ast.Constant) and isinstance(node.value, int)
    node.value = node.value + 1


def _flip_bool(node: ast.AST, slot: int) -> None:
    assert isinstance(node, ast.Constant)
    node.value = not node.value


def _mark_message(node: ast.AST, slot: int) -> None:
    assert isinstance(node, ast.Constant) and isinstance(node.value, str)
    node.value = "XX" + node.value + "XX"


def _swap_method(node: ast.AST, slot: int) -> None:
    assert isinstance(node, ast.Attribute)
    node.attr = _METHOD_SWAP[node.attr]


def _negate_if(node: ast.AST, slot: int) -> None:
    assert isinstance(node, ast.If)
    node.test = ast.UnaryOp(op=ast.Not(), operand=node.test)


# The mutations that change one node in place, by kind.
_IN_PLACE: dict[str, Callable[[ast.AST, int], None]] = {
    "compare": _flip_compare,
    "arith": _flip_arith,
    "boolop": _flip_boolop,
    "int": _bump_int,
    "bool": _flip_bool,
    "message": _mark_message,
    "method": _swap_method,
    "if": _negate_if,
}


class _Replacer(ast.NodeTransformer):
    def __init__(self, old: ast.AST, new: ast.AST) -> None:
        self.old, self.new = old, new

    def visit(self, node: ast.AST) -> ast.AST:
        if node is self.old:
            return self.new
        visited: ast.AST = super().visit(node)
        return visited


def _replace_not(tree: ast.Module, node: ast.AST) -> ast.Module:
    assert isinstance(node, ast.UnaryOp)
    out = _Replacer(node, node.operand).visit(tree)
    assert isinstance(out, ast.Module)
    return ast.fix_missing_locations(out)


def _swap_loop(tree: ast.Module, node: ast.AST) -> ast.Module:
    new: ast.stmt = ast.Continue() if isinstance(node, ast.Break) else ast.Break()
    out = _Replacer(node, ast.copy_location(new, node)).visit(tree)
    assert isinstance(out, ast.Module)
    return ast.fix_missing_locations(out)


def snapshot(into: Path) -> Path:
    """A copy of what the tests need; returns its root."""
    for part in SNAPSHOT_PARTS:
        source, target = ROOT / part, into / part
        if source.is_dir():
            shutil.copytree(source, target, ignore=shutil.ignore_patterns("__pycache__"))
        elif source.exists():
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target)
    return into


def module_file(module: str) -> str:
    """The file of a module, relative to the package: ``signatures.standard`` ->
    ``signatures/standard.py``."""
    return module.replace(".", "/") + ".py"


def source_of(module: str, root: Path = ROOT) -> str:
    return (root / "layers" / "opstate" / "opstate" / module_file(module)).read_text()


def mutants_of(module: str, root: Path = ROOT) -> list[Mutant]:
    tree = ast.parse(source_of(module, root))
    return [
        Mutant(module, i, getattr(node, "lineno", 0), _describe(node, kind, slot))
        for i, (node, kind, slot) in enumerate(_points(tree))
    ]


def equivalent_lines(source: str) -> dict[int, str]:
    """line number -> why, for every line marked ``# mutant: equivalent — why``."""
    marked: dict[int, str] = {}
    for number, text in enumerate(source.splitlines(), start=1):
        found = EQUIVALENT.search(text)
        if found:
            marked[number] = found.group(1).strip()
    return marked


@dataclass(frozen=True)
class Selection:
    """A module's mutants split by the markers: those to run, those skipped as equivalent,
    and the marked lines no mutant is on (a stale claim)."""

    run: list[Mutant]
    skipped: list[Mutant]
    stale: list[str]


def select(module: str, root: Path = ROOT) -> Selection:
    marked = equivalent_lines(source_of(module, root))
    mutants = mutants_of(module, root)
    lines = {m.line for m in mutants}
    return Selection(
        run=[m for m in mutants if m.line not in marked],
        skipped=[m for m in mutants if m.line in marked],
        stale=[f"{module_file(module)}:{n}" for n in sorted(marked) if n not in lines],
    )


def run_mutant(mutant: Mutant, timeout_s: float, root: Path = ROOT) -> bool:
    """True when the tests killed the mutant (index -1: the module unmutated, the baseline)."""
    source = root / "layers" / "opstate" / "opstate"
    tree = ast.parse((source / module_file(mutant.module)).read_text())
    mutated = tree if mutant.index < 0 else _apply(tree, mutant.index)[0]
    with tempfile.TemporaryDirectory(prefix="opstate-mutant-") as scratch:
        package = Path(scratch) / "opstate"
        shutil.copytree(source, package, ignore=shutil.ignore_patterns("__pycache__"))
        (package / module_file(mutant.module)).write_text(ast.unparse(mutated) + "\n")
        args = ["-x", "-q", "-p", "no:cacheprovider", "--hypothesis-seed=0"]
        child = _forks().Process(
            target=exec,
            args=(
                _CHILD,
                {
                    "PATHS": [scratch, str(root)],
                    "CWD": str(root),
                    "ARGS": [*args, *TARGETS[mutant.module]],
                },
            ),
        )
        child.start()
        child.join(timeout_s)
        if child.is_alive():  # a mutant that loops: killed by its timeout
            child.kill()
            child.join()
            return True
        return child.exitcode != 0


# The tests of a mutant run in a process forked from one that imported pytest and hypothesis
# once (never opstate: each child imports the scratch copy afresh), so a mutant costs its
# tests, not an interpreter's start and pytest's imports (domain.retry's tests at load 20 on
# two cores: 7.9 s a run, 15.7 s as a fresh ``python -m pytest``). The child re-runs this
# file as ``__mp_main__`` (multiprocessing's rule): nothing runs outside ``main``.
_PRELOAD = ["pytest", "hypothesis"]
_CHILD = """
import os, sys
sys.dont_write_bytecode = True
os.environ["PYTHONPATH"] = os.pathsep.join(PATHS)  # for a subprocess a test starts
os.environ["PYTHONDONTWRITEBYTECODE"] = "1"
sys.path[:0] = PATHS
os.chdir(CWD)
quiet = os.open(os.devnull, os.O_WRONLY)
os.dup2(quiet, 1)
os.dup2(quiet, 2)
import pytest
status = pytest.main(ARGS)
sys.stdout.flush()
os._exit(int(status))
"""
_context: list[multiprocessing.context.ForkServerContext] = []


def _forks() -> multiprocessing.context.ForkServerContext:
    if not _context:
        context = multiprocessing.get_context("forkserver")
        context.set_forkserver_preload(_PRELOAD)
        _context.append(context)
    return _context[0]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--module", action="append", choices=sorted(TARGETS))
    parser.add_argument("--all", action="store_true", help="every module of TARGETS")
    parser.add_argument(
        "--marked", action="store_true", help="run only the mutants marked equivalent"
    )
    parser.add_argument("--max", type=int, default=0, help="at most N mutants per module")
    parser.add_argument("--jobs", type=int, default=max(1, (os.cpu_count() or 2) // 2))
    parser.add_argument("--timeout", type=float, default=120.0)
    parser.add_argument("--list", action="store_true", help="list the mutants, run nothing")
    args = parser.parse_args(argv)

    modules = args.module or (list(TARGETS) if args.all else list(GATED))
    chosen = {module: select(module, ROOT) for module in modules}
    skipped = {module: len(s.skipped) for module, s in chosen.items()}
    mutants = [m for s in chosen.values() for m in s.run[: args.max or None]]
    if args.marked:
        mutants, skipped = [m for s in chosen.values() for m in s.skipped], {}
    if args.list:
        marked = {(m.module, m.index) for s in chosen.values() for m in s.skipped}
        for m in [m for module in modules for m in mutants_of(module, ROOT)[: args.max or None]]:
            flag = " (marked equivalent)" if (m.module, m.index) in marked else ""
            print(f"{module_file(m.module)}:{m.line}: #{m.index} {m.description}{flag}")
        return 0
    stale = [where for s in chosen.values() for where in s.stale]
    for where in stale:
        print(f"{where}: marked '# mutant: equivalent' but no mutant is on that line")
    with tempfile.TemporaryDirectory(prefix="opstate-mutate-") as frozen:
        done = _run(args, modules, mutants, snapshot(Path(frozen)), skipped)
    return 1 if stale and done == 0 else done


def _run(
    args: argparse.Namespace,
    modules: list[str],
    mutants: list[Mutant],
    root: Path,
    skipped: dict[str, int] | None = None,
) -> int:
    started = time.monotonic()
    skipped = skipped or {}
    for module in modules:  # the tests must pass on the unmutated copy, or nothing is learnt
        if run_mutant(Mutant(module, -1, 0, "baseline"), args.timeout, root):
            print(f"the tests of {module} fail without any mutation: fix them first")
            return 2
    print(
        f"{len(mutants)} mutants in {', '.join(modules)} ({sum(skipped.values())} skipped: marked "
        f"equivalent); {args.jobs} at a time",
        flush=True,
    )

    done: list[Mutant] = []

    def one(m: Mutant) -> tuple[Mutant, bool]:
        killed = run_mutant(m, args.timeout, root)
        done.append(m)
        if len(done) % 25 == 0:
            print(f"  {len(done)}/{len(mutants)} run", flush=True)
        if killed and args.marked:
            where = f"{module_file(m.module)}:{m.line}"
            print(f"  killed, though marked equivalent: {where}: #{m.index} {m.description}")
        if not killed:
            where = f"{module_file(m.module)}:{m.line}"
            print(f"  survived {where}: #{m.index} {m.description}", flush=True)
        return m, killed

    with ThreadPoolExecutor(max_workers=args.jobs) as pool:
        results = list(pool.map(one, mutants))
    survivors = [m for m, killed in results if not killed]
    for module in modules:
        mine = [killed for m, killed in results if m.module == module]
        print(
            f"{module:<21} {len(mine):>4} mutants run, {len(mine) - sum(mine):>3} survived, "
            f"{skipped.get(module, 0):>3} skipped"
        )
    for m in [] if args.marked else survivors:
        print(f"SURVIVED {module_file(m.module)}:{m.line}: #{m.index} {m.description}")
    print(
        f"{len(results)} mutants run, {len(survivors)} survived, {sum(skipped.values())} "
        "skipped (marked "
        f"equivalent), {time.monotonic() - started:.0f} s",
        flush=True,
    )
    if args.marked:  # the claims hold when every marked mutant survives
        return 1 if len(survivors) < len(results) else 0
    return 1 if survivors else 0


if __name__ == "__main__":
    sys.exit(main())
