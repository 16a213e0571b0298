"""The long-prompt benchmark's workload: prompts of the lengths it names, as its tokenizer
counts them, and conversations whose measured calls each extend the call before."""

from __future__ import annotations

import json
from pathlib import Path

from bench.long_prompts import LENGTHS, build_tokenizer, workloads
from kvgate.wire.request_tokenizer import make_tokenizer


def test_the_calls_are_as_long_as_named_and_conversations_grow(tmp_path: Path) -> None:
    tokenizer = build_tokenizer(tmp_path / "model")
    model = make_tokenizer(str(tmp_path / "model"))
    calls = workloads(tokenizer, scale=0.05)
    assert sorted({length for _, length in calls}) == list(LENGTHS)
    for (shape, length), bodies in calls.items():
        chats = [json.loads(body)["messages"] for body, _ in bodies]
        sizes = [len(model.chat_ids(chat)) for chat in chats]
        assert all(0.6 * length <= size <= 1.3 * length for size in sizes), (shape, length, sizes)
        measured = [flag for _, flag in bodies]
        if shape == "single":
            assert all(measured)
            continue
        assert not measured[0]  # each conversation's earlier call goes first, unmeasured
        assert sum(measured) == len(bodies) - (sum(measured) + 3) // 4
        for before, after, counted in zip(chats, chats[1:], measured[1:], strict=False):
            if counted:
                assert after[: len(before)] == before and len(after) > len(before)
