"""How a setting is read from the environment: the error, the readers of one variable each, and
``Part``, the base of every part of the settings.

A reader returns None when its variable is unset or blank ("keep the field's default", see
``given``) and raises ``ConfigError`` naming the variable for a value it cannot use.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, Self


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


def bounded_int(env: Mapping[str, str], key: str, maximum: int, minimum: int = 0) -> int | None:
    value = read_int(env, key, minimum=minimum)
    if value is not None and value > maximum:
        raise ConfigError(f"{key} must be at most {maximum}, got {value}")
    return value


class Part:
    """What every part of the settings provides: ``from_env`` on top of ``env_values``."""

    @classmethod
    def env_values(cls, env: Mapping[str, str]) -> dict[str, Any]:
        """The fields whose variables are set in ``env``, checked (``ConfigError``); a field
        left out keeps its dataclass default, the one place that default is written."""
        raise NotImplementedError

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> Self:
        return cls(**cls.env_values(env))
