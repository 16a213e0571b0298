"""Seeded chat workloads (the routing benchmark's and the load tester's): requests whose
prefixes repeat the way real traffic's do, as chains (a chain's requests go one after
another; chains run side by side).

- ``shared_prefix``: ``groups`` long system prompts (one per application or tenant), each
  asked ``per_group`` short questions; every request is a chain of its own, in a seeded
  shuffled order. A router that keeps each group on one backend prefills each system prompt
  once; one that spreads them prefills them again and again.
- ``multi_turn``: ``sessions`` conversations of ``turns`` turns; each turn resends the whole
  history (its own system prompt, earlier questions and fixed answers) plus a new question, so
  a turn's prefix is the previous turn's whole prompt. A session is a chain, and carries
  ``x-session-id`` (and the OpenAI ``user`` field) as clients of session-aware routers do.
  With ``systems``, the sessions share that many system prompts (an assistant's few prompts,
  its users' many conversations): a session's first turn is cached wherever its prompt is.

Answers in the history are fixed text, not what the backend said: every router sees exactly
the same prompts, so the prompts are known before the run (the oracle in
``bench.routing_oracle`` needs them).
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

SYLLABLES = ("ka", "lo", "mi", "ne", "su", "ta", "ri", "po", "de", "va", "zu", "he", "ko", "ba")


@dataclass(frozen=True)
class ChatRequest:
    """One chat request of a workload. ``max_tokens`` and ``model`` (a LoRA adapter, say)
    override the run's defaults for this request only."""

    messages: list[dict[str, Any]]  # role, content (and a tool call's fields)
    headers: dict[str, str] = field(default_factory=dict)
    group: str = ""  # what shares its prefix: the system prompt's or the session's name
    max_tokens: int | None = None
    model: str | None = None
    at: float | None = None  # a trace's send time (seconds from the start), for a chain's first
    pause: float = 0.0  # seconds its chain waits after the previous answer (an agent's tool)
    fields: dict[str, object] = field(default_factory=dict)  # more body fields

    def body(self, model: str, max_tokens: int) -> dict[str, object]:
        """The chat-completions body: ``ignore_eos`` so every answer has its full length."""
        body: dict[str, object] = {
            "model": self.model or model,
            "messages": self.messages,
            "max_tokens": self.max_tokens or max_tokens,
            "ignore_eos": True,
        }
        if "x-session-id" in self.headers:
            body["user"] = self.headers["x-session-id"]
        body.update(self.fields)
        return body


Chain = list[ChatRequest]


def text(rng: random.Random, chars: int) -> str:
    """Seeded pseudo-words, ``chars`` long (a byte tokenizer makes a token of each char)."""
    words: list[str] = []
    size = 0
    while size < chars:
        word = "".join(rng.choice(SYLLABLES) for _ in range(rng.randint(1, 4)))
        words.append(word)
        size += len(word) + 1
    return " ".join(words)[:chars]


def shared_prefix(
    groups: int, per_group: int, prefix_chars: int, seed: int, question_chars: int = 40
) -> list[Chain]:
    """``groups`` system prompts of ``prefix_chars`` (llm-d's G groups x prefix length), each
    asked ``per_group`` questions of ``question_chars`` (users per group x question length)."""
    rng = random.Random(seed)
    systems = [f"app {g}: " + text(rng, prefix_chars) for g in range(groups)]
    requests = [
        ChatRequest(
            [
                {"role": "system", "content": systems[g]},
                {"role": "user", "content": f"question {q}: " + text(rng, question_chars)},
            ],
            group=f"app-{g}",
        )
        for g in range(groups)
        for q in range(per_group)
    ]
    rng.shuffle(requests)
    return [[r] for r in requests]


def multi_turn(
    sessions: int, turns: int, system_chars: int, turn_chars: int, seed: int, systems: int = 0
) -> list[Chain]:
    rng = random.Random(seed)
    shared = [f"assistant {k}: " + text(rng, system_chars) for k in range(systems)]
    chains: list[Chain] = []
    for s in range(sessions):
        name = f"session-{seed}-{s}"
        system = rng.choice(shared) if shared else f"{name}: " + text(rng, system_chars)
        history = [{"role": "system", "content": system}]
        chain: Chain = []
        for t in range(turns):
            history = [*history, {"role": "user", "content": f"turn {t}: " + text(rng, turn_chars)}]
            chain.append(ChatRequest(history, {"x-session-id": name}, group=name))
            history = [*history, {"role": "assistant", "content": text(rng, turn_chars)}]
        chains.append(chain)
    return chains
