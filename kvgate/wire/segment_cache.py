"""Encoding a long conversation at the cost of what is new in it.

A ``tokenizers`` tokenizer cuts its input at its added tokens (a chat template's
``<|start_header_id|>``, ``<|eot_id|>``...) before anything else, and encodes each piece between
them on its own. So the pieces of a rendered chat can be encoded one by one, and a piece seen
before (an earlier turn of the same conversation, a shared system prompt) is taken from memory:
the result is the tokenizer's own, token for token. Where a tokenizer's pieces are not
independent (an added token that eats the spaces beside it, a normalized added token under a
normalizer, a ``Metaspace`` pre-tokenizer that marks only the input's start, truncation), the
text is encoded whole, as before.
"""

from __future__ import annotations

import json
import re
from collections import OrderedDict
from typing import Any

CACHE_CHARS = 8_000_000  # characters of text whose ids are remembered (about 40 MB at most)


class SegmentedEncoder:
    """``encode(text)`` equals ``tokenizer.encode(text, add_special_tokens=False).ids``; the
    ids of each piece between added tokens are remembered, least recently used dropped first
    past ``cache_chars`` characters. ``segmented`` says whether the tokenizer allows it."""

    def __init__(self, tokenizer: Any, cache_chars: int = CACHE_CHARS) -> None:
        self._tokenizer = tokenizer
        self._cache_chars = cache_chars
        self._cached_chars = 0
        self._cache: OrderedDict[str, tuple[int, ...]] = OrderedDict()
        # every piece's ids are the same int objects: a remembered id costs its pointer alone
        self._shared = tuple(range(tokenizer.get_vocab_size(with_added_tokens=True)))
        config = json.loads(tokenizer.to_str())
        added = [t for t in config.get("added_tokens") or [] if t.get("content")]
        self._ids = {t["content"]: t["id"] for t in added}
        self.segmented = bool(added) and _independent_pieces(config, added)
        contents = sorted(self._ids, key=len, reverse=True)  # leftmost, longest first
        pattern = "|".join(re.escape(c) for c in contents)
        self._split = re.compile(pattern) if self.segmented else None
        self.hits = 0  # pieces taken from memory
        self.misses = 0  # pieces encoded

    def encode(self, text: str) -> list[int]:
        split = self._split
        if split is None:  # the tokenizer's pieces are not independent: the whole text
            return self._encoded(text)
        ids: list[int] = []
        start = 0
        for found in split.finditer(text):
            if found.start() > start:
                ids.extend(self._piece(text[start : found.start()]))
            ids.append(self._ids[found.group()])
            start = found.end()
        if start < len(text):
            ids.extend(self._piece(text[start:]))
        return ids

    def _piece(self, piece: str) -> tuple[int, ...]:
        cache = self._cache
        ids = cache.get(piece)
        if ids is not None:
            cache.move_to_end(piece)
            self.hits += 1
            return ids
        self.misses += 1
        shared = self._shared
        ids = tuple([shared[i] if i < len(shared) else i for i in self._encoded(piece)])
        if len(piece) <= self._cache_chars:
            cache[piece] = ids
            self._cached_chars += len(piece)
            while self._cached_chars > self._cache_chars:
                old, _ = cache.popitem(last=False)
                self._cached_chars -= len(old)
        return ids

    def _encoded(self, text: str) -> list[int]:
        ids: list[int] = self._tokenizer.encode(text, add_special_tokens=False).ids
        return ids


def _independent_pieces(config: dict[str, Any], added: list[dict[str, Any]]) -> bool:
    """Whether encoding the pieces between added tokens one by one gives the whole's ids."""
    if config.get("truncation"):
        return False
    if any(t.get("lstrip") or t.get("rstrip") or t.get("single_word") for t in added):
        return False
    if config.get("normalizer") and any(t.get("normalized") for t in added):
        return False
    return "Metaspace" not in json.dumps(config.get("pre_tokenizer"))
