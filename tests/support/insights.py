"""A small evaluator of the CloudWatch Logs Insights subset the saved queries use.

It runs a query over JSON log lines (dicts as Powertools writes them), so the tests can check
that the template's queries find what the code really logs. Supported commands: ``fields``,
``filter``, ``stats count(*) [as x] by a, b``, ``sort``, ``limit``. Filter expressions:
``and``, ``or``, ``not``, parentheses, ``=``, ``!=``, ``like /regex/`` or ``like "text"``,
``in [..]``, ``ispresent(f)``; values are "strings", numbers, ``true``/``false``. As in Logs
Insights, a comparison on a field the line lacks is false, and ``@timestamp`` / ``@message``
are the line's ``timestamp`` and its raw text. Anything else raises ``QueryError``, so a query
written beyond this subset fails its test loudly rather than passing vacuously.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

Line = Mapping[str, Any]
Predicate = Callable[[Line], bool]

_TOKEN = re.compile(
    r"""\s*(?:
        (?P<string>"(?:[^"\\]|\\.)*")
      | (?P<regex>/(?:[^/\\]|\\.)*/)
      | (?P<number>-?\d+(?:\.\d+)?)
      | (?P<op>!=|=|\(|\)|\[|\]|,)
      | (?P<word>[@A-Za-z_][\w.@]*)
    )""",
    re.X,
)


class QueryError(ValueError):
    """The query uses something this evaluator does not implement."""


def value_of(line: Line, field: str) -> Any:
    if field == "@timestamp":
        return line.get("timestamp")
    if field == "@message":
        return json.dumps(line)
    value: Any = line
    for part in field.split("."):
        if not isinstance(value, Mapping) or part not in value:
            return None
        value = value[part]
    return value


def _tokens(text: str) -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []
    pos = 0
    text = text.rstrip()
    while pos < len(text):
        match = _TOKEN.match(text, pos)
        if match is None or match.end() == pos:
            raise QueryError(f"cannot read {text[pos:]!r}")
        kind = match.lastgroup
        assert kind is not None
        out.append((kind, match.group(kind)))
        pos = match.end()
    return out


class _Parser:
    def __init__(self, text: str) -> None:
        self.tokens = _tokens(text)
        self.pos = 0

    def peek(self) -> tuple[str, str] | None:
        return self.tokens[self.pos] if self.pos < len(self.tokens) else None

    def take(self, value: str | None = None) -> tuple[str, str]:
        token = self.peek()
        if token is None or (value is not None and token[1].lower() != value):
            raise QueryError(f"expected {value or 'a token'}, found {token}")
        self.pos += 1
        return token

    def at_word(self, word: str) -> bool:
        token = self.peek()
        return token is not None and token[0] == "word" and token[1].lower() == word

    def parse(self) -> Predicate:
        predicate = self.or_expr()
        if self.peek() is not None:
            raise QueryError(f"unexpected {self.peek()}")
        return predicate

    def or_expr(self) -> Predicate:
        parts = [self.and_expr()]
        while self.at_word("or"):
            self.take()
            parts.append(self.and_expr())
        return parts[0] if len(parts) == 1 else (lambda line: any(p(line) for p in parts))

    def and_expr(self) -> Predicate:
        parts = [self.unary()]
        while self.at_word("and"):
            self.take()
            parts.append(self.unary())
        return parts[0] if len(parts) == 1 else (lambda line: all(p(line) for p in parts))

    def unary(self) -> Predicate:
        if self.at_word("not"):
            self.take()
            inner = self.unary()
            return lambda line: not inner(line)
        token = self.peek()
        if token is not None and token[1] == "(":
            self.take()
            inner = self.or_expr()
            self.take(")")
            return inner
        if self.at_word("ispresent"):
            self.take()
            self.take("(")
            field = self.take()[1]
            self.take(")")
            return lambda line: value_of(line, field) is not None
        return self.comparison()

    def literal(self) -> Any:
        kind, text = self.take()
        if kind == "string":
            return json.loads(text)
        if kind == "number":
            return float(text)
        if kind == "word" and text.lower() in ("true", "false"):
            return text.lower() == "true"
        raise QueryError(f"expected a value, found {text!r}")

    def comparison(self) -> Predicate:
        kind, field = self.take()
        if kind != "word":
            raise QueryError(f"expected a field, found {field!r}")
        op = self.take()[1].lower()
        if op in ("=", "!="):
            expected = self.literal()
            negate = op == "!="

            def compare(line: Line) -> bool:
                value = value_of(line, field)
                if value is None:
                    return False
                if isinstance(expected, float) and not isinstance(value, bool):
                    equal = isinstance(value, (int, float)) and float(value) == expected
                else:
                    equal = value == expected
                return equal != negate

            return compare
        if op == "like":
            kind, text = self.take()
            if kind == "regex":
                pattern = re.compile(text[1:-1])
            elif kind == "string":
                pattern = re.compile(re.escape(json.loads(text)))
            else:
                raise QueryError(f"like needs /regex/ or a string, found {text!r}")
            return lambda line: (
                isinstance(value_of(line, field), str)
                and bool(pattern.search(value_of(line, field)))
            )
        if op == "in":
            self.take("[")
            options = [self.literal()]
            while self.peek() is not None and self.peek() == ("op", ","):
                self.take()
                options.append(self.literal())
            self.take("]")
            return lambda line: value_of(line, field) in options
        raise QueryError(f"unsupported operator {op!r}")


def parse_filter(expression: str) -> Predicate:
    return _Parser(expression).parse()


def _fields(text: str) -> list[str]:
    return [part.strip() for part in text.split(",") if part.strip()]


def commands(query: str) -> list[tuple[str, str]]:
    """The query's commands as (command, argument text), split on ``|`` at line starts."""
    out: list[tuple[str, str]] = []
    for raw in re.split(r"\n\s*\|", query):
        command, _, rest = raw.strip().partition(" ")
        out.append((command.lower(), rest.strip()))
    return out


def run_query(query: str, lines: Iterable[Line]) -> list[dict[str, Any]]:
    """The rows ``query`` returns over ``lines`` (in order, as Logs Insights would)."""
    rows: list[dict[str, Any]] = [dict(line) for line in lines]
    shown: list[str] | None = None
    for command, arg in commands(query):
        if command == "fields":
            shown = _fields(arg)
        elif command == "filter":
            predicate = parse_filter(arg)
            rows = [row for row in rows if predicate(row)]
        elif command == "stats":
            rows, shown = _stats(arg, rows), None
        elif command == "sort":
            field, _, direction = arg.partition(" ")
            rows.sort(key=lambda r: _sort_key(value_of(r, field)), reverse=direction == "desc")
        elif command == "limit":
            rows = rows[: int(arg)]
        else:
            raise QueryError(f"unsupported command {command!r}")
    if shown is None:
        return rows
    return [{field: value_of(row, field) for field in shown} for row in rows]


def _sort_key(value: Any) -> tuple[int, Any]:
    return (0, "") if value is None else (1, value if not isinstance(value, bool) else int(value))


def _stats(arg: str, rows: Sequence[Line]) -> list[dict[str, Any]]:
    match = re.fullmatch(r"count\(\*\)(?:\s+as\s+(\w+))?\s+by\s+(.+)", arg.strip(), re.I)
    if match is None:
        raise QueryError(f"unsupported stats {arg!r}")
    alias = match.group(1) or "count(*)"
    keys = _fields(match.group(2))
    counts: dict[tuple[Any, ...], int] = {}
    for row in rows:
        group = tuple(value_of(row, key) for key in keys)
        counts[group] = counts.get(group, 0) + 1
    return [{**dict(zip(keys, group, strict=True)), alias: n} for group, n in counts.items()]


def referenced_fields(query: str) -> set[str]:
    """Every log field the query names (in fields, filter, stats ... by), ``@`` fields and
    stats aliases excepted: what a renamed log field would silently break."""
    names: set[str] = set()
    aliases: set[str] = set()
    for command, arg in commands(query):
        if command == "fields":
            names.update(_fields(arg))
        elif command == "filter":
            tokens = _tokens(arg)
            for index, (kind, text) in enumerate(tokens):
                following = tokens[index + 1][1].lower() if index + 1 < len(tokens) else ""
                if kind == "word" and following in ("=", "!=", "like", "in"):
                    names.add(text)
                if kind == "word" and text.lower() == "ispresent":
                    names.add(tokens[index + 2][1])
        elif command == "stats":
            match = re.fullmatch(r"count\(\*\)(?:\s+as\s+(\w+))?\s+by\s+(.+)", arg.strip(), re.I)
            if match is None:
                raise QueryError(f"unsupported stats {arg!r}")
            if match.group(1):
                aliases.add(match.group(1))
            names.update(_fields(match.group(2)))
    return {n for n in names if not n.startswith("@")} - aliases
