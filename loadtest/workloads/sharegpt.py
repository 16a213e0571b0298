"""Conversations from a ShareGPT-format JSON file (a list of ``{"conversations": [{"from":
"human" | "gpt", "value": ...}, ...]}``), as ``vllm bench serve --dataset-name sharegpt`` reads
it: the first human turn is the prompt and the reply's length is the output length; the same
filter (prompt and reply at least 4 tokens, prompt at most 1,024, both at most 2,048), with
lengths estimated as characters ÷ ``chars_per_token`` when no tokenizer is at hand.

``turns="all"`` keeps whole conversations instead: each human turn is a request that resends
the history before it (a chain), the way a chat client does.
"""

from __future__ import annotations

import itertools
import json
import random
from pathlib import Path

from loadtest.workloads.chats import Chain, ChatRequest

ROLES = {"human": "user", "user": "user", "gpt": "assistant", "chatgpt": "assistant"}


class DatasetError(ValueError):
    """The file is not ShareGPT-shaped; the message says where."""


def _turns(entry: object, index: int) -> list[tuple[str, str]]:
    if not isinstance(entry, dict) or not isinstance(entry.get("conversations"), list):
        raise DatasetError(f"entry {index}: expected an object with a 'conversations' list")
    turns: list[tuple[str, str]] = []
    for number, turn in enumerate(entry["conversations"]):
        if not isinstance(turn, dict) or not isinstance(turn.get("value"), str):
            raise DatasetError(f"entry {index}, turn {number}: expected {{from, value}}")
        role = ROLES.get(str(turn.get("from")))
        if role is not None:
            turns.append((role, turn["value"]))
    return turns


def load_sharegpt(
    path: Path,
    count: int | None,
    seed: int,
    turns: str = "first",
    chars_per_token: float = 4.0,
) -> list[Chain]:
    try:
        entries = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise DatasetError(f"{path}: {exc}") from exc
    if not isinstance(entries, list):
        raise DatasetError(f"{path}: expected a JSON list of conversations")

    def tokens(text: str) -> int:
        return max(1, round(len(text) / chars_per_token))

    chains: list[Chain] = []
    for index, entry in enumerate(entries):
        pairs = _turns(entry, index)
        chain: Chain = []
        history: list[dict[str, str]] = []
        for (role, value), (next_role, reply) in itertools.pairwise(pairs):
            if role != "user" or next_role != "assistant":
                continue
            prompt_len, output_len = tokens(value), tokens(reply)
            if turns == "first" and (
                prompt_len < 4
                or output_len < 4
                or prompt_len > 1024
                or prompt_len + output_len > 2048
            ):
                break
            history = [*history, {"role": "user", "content": value}]
            chain.append(ChatRequest(history, group=f"conversation-{index}", max_tokens=output_len))
            history = [*history, {"role": "assistant", "content": reply}]
            if turns == "first":
                break
        if chain:
            chains.append(chain)
    random.Random(seed).shuffle(chains)
    return chains[:count] if count is not None else chains
