"""Characters of routing text per prompt token, measured per endpoint from the usage it reports.

The approximate index cuts routing text into blocks of characters and must know how many of
them an endpoint's KV cache holds; that depends on the endpoint's tokenizer (about 4 characters
per token for a BPE vocabulary, 1 for a byte tokenizer) and on how its chat template renders
messages. Each answered request gives one sample: the characters of its routing text and the
``prompt_tokens`` of the response's usage. The estimate is the ratio of the two sums, decayed
so that a changed model behind the address is followed within a few hundred requests.
"""

from __future__ import annotations

from dataclasses import dataclass

DECAY = 1 / 256  # weight of the past lost per sample
MIN_TOKENS = 2_000  # tokens seen before the measurement replaces the configured ratio
BOUNDS = (0.25, 32.0)  # a measured ratio outside these is a misreport, not a tokenizer


@dataclass(slots=True)
class _Sums:
    chars: float = 0.0
    tokens: float = 0.0
    seen: int = 0  # tokens in all samples, undecayed: how much evidence there is


class CharsPerToken:
    """Per endpoint address: the measured characters per token, or None while unknown."""

    def __init__(self) -> None:
        self._sums: dict[str, _Sums] = {}

    def observe(self, address: str, chars: int, tokens: int) -> None:
        """One answered request: ``chars`` of routing text became ``tokens`` prompt tokens."""
        if chars <= 0 or tokens <= 0 or not BOUNDS[0] <= chars / tokens <= BOUNDS[1]:
            return
        sums = self._sums.get(address)
        if sums is None:
            sums = self._sums[address] = _Sums()
        keep = 1.0 - DECAY
        sums.chars = sums.chars * keep + chars
        sums.tokens = sums.tokens * keep + tokens
        sums.seen += tokens

    def of(self, address: str) -> float | None:
        """The measured ratio, once ``MIN_TOKENS`` tokens were seen; else None."""
        sums = self._sums.get(address)
        if sums is None or sums.seen < MIN_TOKENS:
            return None
        return sums.chars / sums.tokens

    def forget(self, address: str) -> None:
        self._sums.pop(address, None)
