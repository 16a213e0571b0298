"""Typed reads of one YAML mapping, collecting errors that name the field path and line."""

from __future__ import annotations

import re
from collections.abc import Iterator

from policies.yaml_source import Source

MISSING = object()
_DURATION = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*(ms|s|m|h|d)?\s*$")
_DURATION_UNITS = {None: 1.0, "ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_SIZE = re.compile(r"^\s*([0-9]+)\s*(B|KB|KiB|MB|MiB|GB|GiB)?\s*$")
_SIZE_UNITS = {
    None: 1,
    "B": 1,
    "KB": 1000,
    "KiB": 1024,
    "MB": 10**6,
    "MiB": 2**20,
    "GB": 10**9,
    "GiB": 2**30,
}


def child(path: str, key: object) -> str:
    if isinstance(key, int):
        return f"{path}[{key}]"
    return f"{path}.{key}" if path else str(key)


class Fields:
    """One mapping at ``path``; unknown keys and bad values become errors in ``source``."""

    def __init__(self, source: Source, value: object, path: str, allowed: set[str]) -> None:
        self.source = source
        self.path = path
        self.data: dict[str, object] = {}
        if value is None:
            return
        if not isinstance(value, dict):
            self.error(path, "must be a mapping")
            return
        self.data = value
        for key in value:
            if key not in allowed:
                hint = ", ".join(sorted(allowed))
                self.error(child(path, key), f"unknown field (expected one of: {hint})")

    def error(self, path: str, message: str) -> None:
        self.source.errors.append(f"{self.source.where(path or '<root>')}: {message}")

    def has(self, key: str) -> bool:
        return key in self.data and self.data[key] is not None

    def raw(self, key: str) -> object:
        return self.data.get(key)

    def _get(self, key: str, default: object) -> object:
        value = self.data.get(key)
        if value is None:
            if default is MISSING:
                self.error(child(self.path, key), "is required")
            return default
        return value

    def text(self, key: str, default: object = MISSING, choices: tuple[str, ...] = ()) -> str:
        value = self._get(key, default)
        if value is MISSING or value is None:
            return "" if value is MISSING else value  # type: ignore[return-value]
        if not isinstance(value, str) or not value:
            self.error(child(self.path, key), "must be a non-empty string")
            return ""
        if choices and value not in choices:
            self.error(child(self.path, key), f"must be one of {', '.join(choices)}; got {value!r}")
        return value

    def opt_str(self, key: str) -> str | None:
        """An optional string; empty (e.g. an unset ``${VAR:-}``) means unset."""
        if self.data.get(key) == "":
            return None
        return self.text(key, None) or None

    def integer(
        self,
        key: str,
        default: object = MISSING,
        *,
        low: int | None = None,
        high: int | None = None,
    ) -> int:
        value = self._get(key, default)
        if value is MISSING:
            return 0
        if isinstance(value, bool) or not isinstance(value, int):
            self.error(child(self.path, key), f"must be an integer; got {value!r}")
            return 0
        self._range(key, value, low, high)
        return value

    def opt_int(self, key: str, *, low: int | None = None, high: int | None = None) -> int | None:
        """An optional integer; None when absent."""
        return self.integer(key, low=low, high=high) if self.has(key) else None

    def number(
        self,
        key: str,
        default: object = MISSING,
        *,
        low: float | None = None,
        high: float | None = None,
    ) -> float:
        value = self._get(key, default)
        if value is MISSING:
            return 0.0
        if isinstance(value, bool) or not isinstance(value, int | float):
            self.error(child(self.path, key), f"must be a number; got {value!r}")
            return 0.0
        self._range(key, float(value), low, high)
        return float(value)

    def flag(self, key: str, default: bool) -> bool:
        value = self._get(key, default)
        if not isinstance(value, bool):
            self.error(child(self.path, key), f"must be true or false; got {value!r}")
            return default
        return value

    def duration(self, key: str, default: object = MISSING) -> float:
        """Seconds, from a number or ``"20ms"``, ``"5s"``, ``"10m"``, ``"1h"``, ``"28d"``."""
        value = self._get(key, default)
        if isinstance(value, bool):
            value = None
        if isinstance(value, int | float):
            seconds = float(value)
        elif isinstance(value, str) and (match := _DURATION.match(value)):
            seconds = float(match.group(1)) * _DURATION_UNITS[match.group(2)]
        else:
            if value is not MISSING:
                self.error(
                    child(self.path, key), f"must be a duration like 500ms or 5s; got {value!r}"
                )
            return 0.0
        if seconds < 0:
            self.error(child(self.path, key), "must not be negative")
        return seconds

    def size(self, key: str, default: object = MISSING) -> int:
        """Bytes, from an integer or ``"8MiB"``, ``"512KB"``."""
        value = self._get(key, default)
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, str) and (match := _SIZE.match(value)):
            return int(match.group(1)) * _SIZE_UNITS[match.group(2)]
        if value is not MISSING:
            self.error(child(self.path, key), f"must be a size like 8MiB; got {value!r}")
        return 0

    def str_list(self, key: str) -> tuple[str, ...] | None:
        value = self.data.get(key)
        if value is None:
            return None
        if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
            self.error(child(self.path, key), "must be a list of strings")
            return None
        return tuple(value)

    def items(self, key: str, *, required: bool = False) -> Iterator[tuple[str, object]]:
        """(path, item) for each element of a list field."""
        value = self.data.get(key)
        if value is None:
            if required:
                self.error(child(self.path, key), "is required")
            return
        if not isinstance(value, list):
            self.error(child(self.path, key), "must be a list")
            return
        for i, item in enumerate(value):
            yield child(child(self.path, key), i), item

    def entries(self, key: str) -> Iterator[tuple[str, str, object]]:
        """(path, name, value) for each entry of a mapping field."""
        value = self.data.get(key)
        if value is None:
            return
        if not isinstance(value, dict):
            self.error(child(self.path, key), "must be a mapping")
            return
        for name, item in value.items():
            yield child(child(self.path, key), name), name, item

    def sub(self, key: str, allowed: set[str]) -> Fields:
        return Fields(self.source, self.data.get(key), child(self.path, key), allowed)

    def _range(self, key: str, value: float, low: float | None, high: float | None) -> None:
        if low is not None and value < low:
            self.error(child(self.path, key), f"must be at least {low}; got {value}")
        if high is not None and value > high:
            self.error(child(self.path, key), f"must be at most {high}; got {value}")
