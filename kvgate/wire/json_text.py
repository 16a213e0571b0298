"""Canonical JSON text: the same value always gives the same string (hashing, limit keys)."""

from __future__ import annotations

import json
from collections.abc import Iterable

import orjson

_COMPACT = (",", ":")


def compact_json(value: object) -> str:
    """Compact JSON with sorted keys and UTF-8 text (orjson; json for what it refuses, such as
    integers past 64 bits)."""
    try:
        return orjson.dumps(value, option=orjson.OPT_SORT_KEYS).decode()
    except TypeError:
        return json.dumps(value, separators=_COMPACT, sort_keys=True, ensure_ascii=False)


def nested_deeper_than(value: object, limit: int) -> bool:
    """Whether ``value`` (parsed JSON) nests lists and objects more than ``limit`` deep;
    iterative, so any depth is safe to ask about."""
    stack: list[tuple[object, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            children: Iterable[object] = item.values()
        elif isinstance(item, list):
            children = item
        else:
            continue
        if depth > limit:
            return True
        stack.extend((child, depth + 1) for child in children if isinstance(child, dict | list))
    return False
