"""How a setting is read from the environment: the error, the readers of one variable each, and
``Part``, the base of every part of the settings, with ``part``, their dataclass decorator.

A reader returns None when its variable is unset or blank ("keep the field's default", see
``given``) and raises ``ConfigError`` naming the variable for a value it cannot use.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import MISSING, Field, dataclass, field, fields
from typing import Any, Self, cast, dataclass_transform


class ConfigError(ValueError):
    """An environment variable holds a value this system cannot use."""


def given(**values: Any) -> dict[str, Any]:
    """The values that were given: None means "unset, keep the field's default"."""
    return {name: value for name, value in values.items() if value is not None}


def scaled(factor: float, value: float | None) -> float | None:
    return None if value is None else factor * value


def read_int(env: Mapping[str, str], key: str, minimum: int = 0) -> int | None:
    raw = env.get(key)
    if raw is None or raw.strip() == "":
        return None
    try:
        value = int(raw)
    except ValueError:
        raise ConfigError(f"{key} must be an integer, got {raw!r}") from None
    if value < minimum:
        raise ConfigError(f"{key} must be at least {minimum}, got {value}")
    return value


# The longest a Lambda function may run: no duration setting is meaningful beyond it.
MAX_SECONDS = 900.0


def read_float(
    env: Mapping[str, str],
    key: str,
    minimum: float = 0.0,
    maximum: float = MAX_SECONDS,
) -> float | None:
    raw = env.get(key)
    if raw is None or raw.strip() == "":
        return None
    try:
        value = float(raw)
    except ValueError:
        raise ConfigError(f"{key} must be a number, got {raw!r}") from None
    # float() accepts "nan", "inf" and "1e999" (= inf): none is a usable duration, and NaN
    # compares false with everything, so it would pass the range checks below.
    if not math.isfinite(value):
        raise ConfigError(f"{key} must be a finite number of seconds, got {raw.strip()!r}")
    if value < minimum:
        raise ConfigError(f"{key} must be at least {minimum:g}, got {value:g}")
    if value > maximum:
        raise ConfigError(f"{key} must be at most {maximum:g}, got {value:g}")
    return value


def read_str(env: Mapping[str, str], key: str) -> str | None:
    raw = env.get(key)
    if raw is None or raw.strip() == "":
        return None
    return raw.strip()


def read_token(env: Mapping[str, str], key: str, min_length: int) -> str | None:
    """A bearer token: at least ``min_length`` characters without spaces; None when unset."""
    token = read_str(env, key)
    if token is not None and (len(token) < min_length or any(c.isspace() for c in token)):
        raise ConfigError(
            f"{key} must be at least {min_length} characters without spaces (e.g. the output "
            "of `openssl rand -hex 32`)"
        )
    return token


def read_bool(env: Mapping[str, str], key: str) -> bool | None:
    """``true``/``1``/``yes`` or ``false``/``0``/``no`` (any case); None when unset."""
    raw = read_str(env, key)
    if raw is None:
        return None
    value = raw.lower()
    if value in ("true", "1", "yes"):
        return True
    if value in ("false", "0", "no"):
        return False
    raise ConfigError(f"{key} must be true or false, got {raw!r}")


def bounded_int(env: Mapping[str, str], key: str, maximum: int, minimum: int = 0) -> int | None:
    value = read_int(env, key, minimum=minimum)
    if value is not None and value > maximum:
        raise ConfigError(f"{key} must be at most {maximum}, got {value}")
    return value


class Part:
    """What every part of the settings provides: ``from_env`` on top of ``env_values``, and the
    methods ``@dataclass`` would write for each part (``part``)."""

    @classmethod
    def env_values(cls, env: Mapping[str, str]) -> dict[str, Any]:
        """The fields whose variables are set in ``env``, checked (``ConfigError``); a field
        left out keeps its dataclass default, the one place that default is written."""
        raise NotImplementedError

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> Self:
        return cls(**cls.env_values(env))

    # What the generated methods of a frozen, keyword-only dataclass do, over ``fields``: the
    # same values, errors, repr (fields with repr=False left out), equality and hash.

    def __init__(self, *args: Any, **values: Any) -> None:
        name = f"{type(self).__qualname__}.__init__()"
        if args:
            raise TypeError(f"{name} takes 1 positional argument but {len(args) + 1} were given")
        known = _fields(self)
        accepted = {f.name for f in known if f.init}
        for key in values:
            if key not in accepted:
                raise TypeError(f"{name} got an unexpected keyword argument {key!r}")
        for f in known:
            if f.init and f.name in values:
                value = values[f.name]
            elif f.default is not MISSING:
                value = f.default
            elif f.default_factory is not MISSING:
                value = f.default_factory()
            else:
                raise TypeError(f"{name} missing 1 required keyword-only argument: {f.name!r}")
            object.__setattr__(self, f.name, value)

    def __repr__(self) -> str:
        shown = ", ".join(f"{f.name}={getattr(self, f.name)!r}" for f in _fields(self) if f.repr)
        return f"{type(self).__qualname__}({shown})"

    def __eq__(self, other: object) -> bool:
        if self is other:
            return True
        if other.__class__ is not self.__class__:
            return NotImplemented
        compared = [f.name for f in _fields(self) if f.compare]
        return [getattr(self, n) for n in compared] == [getattr(other, n) for n in compared]

    def __hash__(self) -> int:
        hashed = (f for f in _fields(self) if (f.compare if f.hash is None else f.hash))
        return hash(tuple(getattr(self, f.name) for f in hashed))


def _fields(part: Part) -> tuple[Field[Any], ...]:
    return fields(cast(Any, part))


@dataclass_transform(frozen_default=True, kw_only_default=True, field_specifiers=(field,))
def settings_part[P: Part](cls: type[P]) -> type[P]:
    """``@dataclass(frozen=True, kw_only=True)`` for a part of the settings (and ``Settings``,
    all of them), with ``Part``'s ``__init__``, ``__repr__``, ``__eq__`` and ``__hash__``
    instead of generated ones: the same behaviour, without compiling them for every class at
    every start (about half of importing ``opstate.config``, which every Lambda's init does;
    ``Settings`` alone has some sixty fields; benchmarks/bench_cold.py)."""
    build: Callable[[type[P]], type[P]] = dataclass(
        frozen=True, kw_only=True, init=False, repr=False, eq=False
    )
    return build(cls)
