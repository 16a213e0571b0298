"""Synthetic workloads of seeded pseudo-text, sized in tokens (``chars_per_token`` characters
each: 1 for the byte tokenizer of the simulated backend, about 4 for a BPE model).

- ``random_lengths``: independent prompts whose input and output lengths are uniform in
  ``[L(1 - r), L(1 + r)]`` (``vllm bench serve``'s random dataset with ``--random-range-ratio``).
- ``long_context``: a few long documents, each asked several short questions in a shuffled
  order (retrieval over long inputs: the document is the shared prefix).
"""

from __future__ import annotations

import random

from loadtest.workloads.chats import Chain, ChatRequest, text


def _length(rng: random.Random, mean: int, ratio: float) -> int:
    low, high = round(mean * (1 - ratio)), round(mean * (1 + ratio))
    return max(1, rng.randint(max(1, low), max(1, high)))


def random_lengths(
    count: int,
    input_tokens: int,
    output_tokens: int,
    range_ratio: float,
    seed: int,
    chars_per_token: float = 1.0,
) -> list[Chain]:
    if not 0 <= range_ratio < 1:
        raise ValueError(f"range ratio {range_ratio} must be in [0, 1)")
    rng = random.Random(seed)
    chains: list[Chain] = []
    for i in range(count):
        chars = round(_length(rng, input_tokens, range_ratio) * chars_per_token)
        message = {"role": "user", "content": f"request {seed}-{i}: " + text(rng, chars)}
        chains.append(
            [
                ChatRequest(
                    [message],
                    group=f"random-{i}",
                    max_tokens=_length(rng, output_tokens, range_ratio),
                )
            ]
        )
    return chains


def long_context(
    documents: int,
    questions: int,
    document_tokens: int,
    seed: int,
    chars_per_token: float = 1.0,
) -> list[Chain]:
    rng = random.Random(seed)
    bodies = [
        f"document {d}:\n" + text(rng, round(document_tokens * chars_per_token))
        for d in range(documents)
    ]
    requests = [
        ChatRequest(
            [
                {"role": "system", "content": "Answer from the document only."},
                {"role": "user", "content": bodies[d] + f"\n\nquestion {q}: " + text(rng, 60)},
            ],
            group=f"document-{d}",
        )
        for d in range(documents)
        for q in range(questions)
    ]
    rng.shuffle(requests)
    return [[r] for r in requests]
