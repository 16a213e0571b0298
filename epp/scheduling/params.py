"""Plugin parameters: a frozen dataclass per plugin, parsed from the policy's raw mapping.

Unknown keys, wrong types and out-of-range values raise ``ParamError`` naming the plugin and
the field.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Self, TypeVar

T = TypeVar("T")


class ParamError(ValueError):
    pass


@dataclass(frozen=True)
class NoParams:
    """The parameters of a plugin that takes none."""


class Parameterless:
    """The parameter check and factory of a plugin that takes no parameters (any it is given
    are refused, naming the plugin)."""

    def __init__(self, name: str) -> None:
        self.name = name

    @classmethod
    def parse_config(cls, name: str, raw: Mapping[str, object]) -> NoParams:
        return parse_params(NoParams, name, raw)

    @classmethod
    def from_config(cls, name: str, raw: Mapping[str, object]) -> Self:
        cls.parse_config(name, raw)
        return cls(name)


def parse_params(
    cls: type[T],
    plugin: str,
    raw: Mapping[str, object] | None,
    checks: Mapping[str, Callable[[Any], bool]] | None = None,
) -> T:
    """Build ``cls`` from ``raw``; ``checks`` maps a field to a predicate its value must meet."""
    raw = raw or {}
    if not isinstance(raw, Mapping):
        raise ParamError(f"{plugin}: params must be a mapping")
    fields = {f.name: f for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    unknown = set(raw) - set(fields)
    if unknown:
        raise ParamError(
            f"{plugin}: unknown param(s) {', '.join(sorted(unknown))} "
            f"(expected: {', '.join(fields)})"
        )
    values: dict[str, object] = {}
    for name, value in raw.items():
        default = fields[name].default
        expected = type(default) if default not in (dataclasses.MISSING, None) else None
        if expected is float and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        wrong_bool = isinstance(value, bool) and expected is not bool
        if wrong_bool or (expected is not None and not isinstance(value, expected)):
            kind = expected.__name__ if expected else "value"
            raise ParamError(f"{plugin}.{name}: expected {kind}, got {value!r}")
        if checks and name in checks and not checks[name](value):
            raise ParamError(f"{plugin}.{name}: value {value!r} is out of range")
        values[name] = value
    return cls(**values)
