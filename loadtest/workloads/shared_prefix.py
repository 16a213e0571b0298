"""Shared-prefix chat requests: many conversations reuse one of a few long system prompts
(the workload where KV-cache-aware routing pays). Seeded and reproducible."""

from __future__ import annotations

CHARS_PER_TOKEN = 4  # the approximate size of a token in these prompts
WORDS = [
    "the",
    "quick",
    "brown",
    "fox",
    "jumps",
    "over",
    "a",
    "lazy",
    "dog",
    "while",
    "parcels",
    "travel",
    "across",
    "the",
    "harbour",
]


def prompt(tokens: int, seed: int) -> str:
    words, size, i = [f"tenant-{seed}"], 0, 0
    while size < tokens * CHARS_PER_TOKEN:
        word = WORDS[(seed * 7 + i) % len(WORDS)]
        words.append(word)
        size += len(word) + 1
        i += 1
    return " ".join(words)


def chat(tokens: int, seed: int) -> dict[str, object]:
    return {
        "model": "m",
        "messages": [
            {"role": "system", "content": prompt(tokens, seed % 50)},
            {"role": "user", "content": f"question {seed}"},
        ],
    }
