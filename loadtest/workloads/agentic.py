"""Seeded agent sessions, as coding agents send them: long sessions of many calls, each
appending a tool result to a growing context, with a pause while the tool runs.

A session belongs to one of ``agents`` agents; every session of an agent starts with that
agent's system prompt and tool schemas (several thousand tokens, shared as an agent's users
share them), then a task of its own. It makes between ``min_calls`` and ``max_calls`` calls;
each call after the first appends the previous answer (fixed text, so the prompts are known
before the run) and a tool result whose size is drawn from a log-normal distribution around
``tool_chars`` (from a short listing to a long file), and waits first for the tool: a pause
drawn from an exponential distribution of mean ``pause`` seconds. A session is a chain (the
load tester records each request's call index: its position in the chain).

How a session identifies itself (``session_via``): a header (``x-session-id``, Claude Code's
``x-claude-code-session-id``), a body field (OpenAI's ``prompt_cache_key``, ``user``), or
nothing (``none``: the router has only the prompt to go by).
"""

from __future__ import annotations

import json
import math
import random
from dataclasses import dataclass

from loadtest.workloads.chats import Chain, ChatRequest, text

SESSION_VIA = ("x-session-id", "x-claude-code-session-id", "prompt_cache_key", "user", "none")
TOOLS = ("read_file", "write_file", "run_tests", "search", "list_dir", "shell", "edit", "grep")


@dataclass(frozen=True)
class AgentShape:
    """What the sessions look like; sizes in characters (a byte tokenizer's tokens)."""

    agents: int = 2
    system_chars: int = 4000
    min_calls: int = 10
    max_calls: int = 50
    tool_chars: int = 600  # the median tool result
    answer_chars: int = 120
    pause: float = 2.0  # the mean tool pause, seconds
    session_via: str = "x-session-id"

    def __post_init__(self) -> None:
        if self.session_via not in SESSION_VIA:
            raise ValueError(f"session_via {self.session_via!r}: one of {', '.join(SESSION_VIA)}")
        if not 1 <= self.min_calls <= self.max_calls:
            raise ValueError("calls: need 1 <= min_calls <= max_calls")
        if self.agents < 1 or self.pause < 0:
            raise ValueError("agents must be at least 1 and pause not negative")

    @property
    def mean_calls(self) -> float:
        return (self.min_calls + self.max_calls) / 2


def agent_prompt(rng: random.Random, agent: int, chars: int) -> str:
    """An agent's system prompt: instructions, then its tools' schemas as JSON."""
    tools = [
        {
            "name": name,
            "description": text(rng, 120),
            "parameters": {"type": "object", "properties": {"path": {"type": "string"}}},
        }
        for name in TOOLS
    ]
    schemas = json.dumps(tools)
    return f"agent {agent}: " + text(rng, max(0, chars - len(schemas))) + "\ntools: " + schemas


def identity(name: str, via: str) -> tuple[dict[str, str], dict[str, object]]:
    """The headers and body fields by which a session named ``name`` identifies itself."""
    if via == "none":
        return {}, {}
    if via.startswith("x-"):
        return {via: name}, {}
    return {}, {via: name}


def agentic(sessions: int, shape: AgentShape, seed: int) -> list[Chain]:
    rng = random.Random(seed)
    prompts = [agent_prompt(rng, a, shape.system_chars) for a in range(shape.agents)]
    chains: list[Chain] = []
    for s in range(sessions):
        name = f"agent-session-{seed}-{s}"
        headers, fields = identity(name, shape.session_via)
        history = [
            {"role": "system", "content": rng.choice(prompts)},
            {"role": "user", "content": f"task {s}: " + text(rng, 2 * shape.answer_chars)},
        ]
        chain: Chain = []
        for call in range(rng.randint(shape.min_calls, shape.max_calls)):
            pause = 0.0
            if call:
                size = round(shape.tool_chars * math.exp(rng.gauss(0.0, 0.8)))
                history = [
                    *history,
                    {"role": "assistant", "content": text(rng, shape.answer_chars)},
                    {"role": "tool", "content": f"{rng.choice(TOOLS)}: " + text(rng, size)},
                ]
                pause = rng.expovariate(1 / shape.pause) if shape.pause else 0.0
            chain.append(ChatRequest(history, headers, group=name, pause=pause, fields=fields))
        chains.append(chain)
    return chains
