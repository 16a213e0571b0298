"""Seeded agent sessions, as coding agents send them: long sessions of many calls, each
appending a tool result to a growing context, with a pause while the tool runs.

A session belongs to one of ``agents`` agents; every session of an agent starts with that
agent's system prompt and tool schemas (several thousand tokens, shared as an agent's users
share them), then a task of its own. It makes between ``min_calls`` and ``max_calls`` calls,
each offering the agent's ``tools`` and, but for the last, requiring a call of one
(``tool_choice: "required"``; the last answers in text); each call after the first appends the
previous answer (an assistant message calling a tool, its text fixed so the prompts are known
before the run) and the tool's result, whose size is drawn from a log-normal distribution
around ``tool_chars`` (from a short listing to a long file, at most four times the median, as
agents cut what they read), and waits first for the tool: a
pause drawn from an exponential distribution of mean ``pause`` seconds. A session is a chain (the
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
from typing import Any

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


PARAMETERS = {"type": "object", "properties": {"path": {"type": "string"}}}
FIELD_TOOLS = [
    {"type": "function", "function": {"name": n, "parameters": PARAMETERS}} for n in TOOLS
]


def agent_prompt(rng: random.Random, agent: int, chars: int) -> str:
    """An agent's system prompt: instructions, then its tools' schemas as JSON (as a chat
    template renders the request's ``tools``)."""
    tools = [{"name": n, "description": text(rng, 120), "parameters": PARAMETERS} for n in TOOLS]
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
        history: list[dict[str, Any]] = [
            {"role": "system", "content": rng.choice(prompts)},
            {"role": "user", "content": f"task {s}: " + text(rng, 2 * shape.answer_chars)},
        ]
        chain: Chain = []
        calls = rng.randint(shape.min_calls, shape.max_calls)
        for call in range(calls):
            pause = 0.0
            if call:
                history = [*history, *_tool_turn(rng, shape, f"call_{seed}_{s}_{call}")]
                pause = rng.expovariate(1 / shape.pause) if shape.pause else 0.0
            choice = "required" if call < calls - 1 else "none"
            offered = {**fields, "tools": FIELD_TOOLS, "tool_choice": choice}
            chain.append(ChatRequest(history, headers, group=name, pause=pause, fields=offered))
        chains.append(chain)
    return chains


def _tool_turn(rng: random.Random, shape: AgentShape, ident: str) -> list[dict[str, Any]]:
    """The previous answer, a call of a tool, and the tool's result."""
    tool = rng.choice(TOOLS)
    arguments = json.dumps({"path": text(rng, 24)})
    size = round(shape.tool_chars * min(4.0, math.exp(rng.gauss(0.0, 0.8))))  # a long file, cut
    call = {"id": ident, "type": "function", "function": {"name": tool, "arguments": arguments}}
    return [
        {"role": "assistant", "content": text(rng, shape.answer_chars), "tool_calls": [call]},
        {"role": "tool", "tool_call_id": ident, "content": f"{tool}: " + text(rng, size)},
    ]
