"""Speculative decoding's draft side: n-gram prompt lookup, as vLLM's ``ngram`` method.

A decoding sequence whose last ``n`` tokens (``prompt_lookup_max`` down to
``prompt_lookup_min``) occurred earlier in its prompt or output proposes the tokens that
followed that earlier occurrence (the earliest one of the longest match: the most tokens
follow it, so a loop of a few tokens drafts whole), up to ``num_speculative_tokens`` and no
further than the sequence goes, as vLLM's proposer does. The runner computes the sequence's
last token and the drafts in one forward pass through the paged KV cache and keeps the drafts
its own sampling agrees with (``backends.runners.sampler``), so the output is the model's,
only faster where the text repeats itself (summaries, edits, code, extraction).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from backends.engine.sequence import Sequence

METHODS = ("ngram",)


@dataclass(frozen=True, slots=True)
class SpeculativeConfig:
    """vLLM's ``--speculative-config`` fields for the ``ngram`` method."""

    num_speculative_tokens: int = 4
    prompt_lookup_max: int = 4
    prompt_lookup_min: int = 1
    method: str = "ngram"

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise ValueError(f"speculative method {self.method!r} is not supported (ngram is)")
        if not 1 <= self.num_speculative_tokens <= 32:
            raise ValueError("num_speculative_tokens must be in [1, 32]")
        if not 1 <= self.prompt_lookup_min <= self.prompt_lookup_max:
            raise ValueError("prompt_lookup_min must be in [1, prompt_lookup_max]")

    @classmethod
    def parse(cls, text: str) -> SpeculativeConfig:
        """From ``--speculative-config``'s JSON (vLLM's keys; raises ``ValueError``)."""
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ValueError(f"--speculative-config is not JSON: {exc}") from exc
        if not isinstance(data, dict):
            raise ValueError("--speculative-config must be a JSON object")
        counts = {"num_speculative_tokens", "prompt_lookup_max", "prompt_lookup_min"}
        unknown = sorted(set(data) - counts - {"method"})
        if unknown:
            raise ValueError(f"unknown --speculative-config keys: {', '.join(unknown)}")
        if not all(type(data.get(k, 1)) is int for k in counts):
            raise ValueError("--speculative-config's counts must be integers")
        d = cls()
        lookup_max = data.get("prompt_lookup_max", d.prompt_lookup_max)
        return cls(
            data.get("num_speculative_tokens", d.num_speculative_tokens),
            lookup_max,
            data.get("prompt_lookup_min", min(d.prompt_lookup_min, lookup_max)),
            data.get("method", "ngram"),
        )


def propose(token_ids: list[int], config: SpeculativeConfig, limit: int) -> list[int]:
    """At most ``limit`` draft tokens for what follows ``token_ids`` (none when its last
    ``prompt_lookup_min`` tokens never occurred before)."""
    count = len(token_ids)
    if limit <= 0 or count < config.prompt_lookup_min + 1:
        return []
    last = token_ids[-1]
    longest = config.prompt_lookup_max
    best_length, best_end = 0, -1
    earlier = [i for i, token in enumerate(token_ids[:-1]) if token == last]
    for end in earlier:  # the earliest first (the most tokens follow it); a longer match wins
        length = 1
        while (
            length < longest
            and end - length >= 0
            and token_ids[end - length] == token_ids[count - 1 - length]
        ):
            length += 1
        if length > best_length:
            best_length, best_end = length, end
            if length == longest:
                break
    if best_length < config.prompt_lookup_min:
        return []
    wanted = min(limit, config.num_speculative_tokens)
    return token_ids[best_end + 1 : best_end + 1 + wanted]  # what followed the match


@dataclass(slots=True)
class SpeculationStats:
    """vLLM's ``vllm:spec_decode_*`` counters."""

    num_drafts: int = 0  # sequences that were given drafts, summed over steps
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    accepted_per_position: list[int] = field(default_factory=list)

    def record(self, drafted: int, accepted: int) -> None:
        self.num_drafts += 1
        self.num_draft_tokens += drafted
        self.num_accepted_tokens += accepted
        missing = drafted - len(self.accepted_per_position)
        if missing > 0:
            self.accepted_per_position.extend([0] * missing)
        for position in range(accepted):
            self.accepted_per_position[position] += 1


def drafts_for(
    seq: Sequence, config: SpeculativeConfig, budget: int, max_model_len: int
) -> list[int]:
    """The drafts a decoding ``seq`` may be given this step: within the step's token
    ``budget`` (its own token included), its ``max_tokens`` and the context; none for a
    sequence that asks for log-probabilities (they are computed per sampled position)."""
    sampling = seq.sampling
    if sampling.logprobs or sampling.prompt_logprobs is not None:
        return []
    limit = min(
        budget - 1,
        sampling.max_tokens - seq.num_output_tokens - 1,
        max_model_len - seq.num_tokens - 1,
    )
    return propose(seq.token_ids, config, limit)
