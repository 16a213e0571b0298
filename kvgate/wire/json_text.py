"""Canonical JSON text: the same value always gives the same string (hashing, limit keys)."""

from __future__ import annotations

import json

import orjson

_COMPACT = (",", ":")


def compact_json(value: object) -> str:
    """Compact JSON with sorted keys and UTF-8 text (orjson; json for what it refuses, such as
    integers past 64 bits)."""
    try:
        return orjson.dumps(value, option=orjson.OPT_SORT_KEYS).decode()
    except TypeError:
        return json.dumps(value, separators=_COMPACT, sort_keys=True, ensure_ascii=False)
