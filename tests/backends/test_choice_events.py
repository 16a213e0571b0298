"""A streamed choice's deltas: one per batch of new tokens, text or not (as vLLM streams)."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

from backends.engine.engine import RequestStream
from backends.engine.sequence import SamplingParams, Sequence
from backends.server.openai_api import choice_events
from backends.server.protocol import GenerationRequest
from kvgate.wire.tokenizer import ByteTokenizer


def request(stop: tuple[str, ...] = ()) -> GenerationRequest:
    return GenerationRequest(
        model="m",
        prompts=[[104, 105]],
        sampling=SamplingParams(max_tokens=8),
        stream=True,
        include_usage=False,
        stop=stop,
        priority=0,
        is_chat=False,
    )


async def deltas(req: GenerationRequest, batches: list[list[int]]) -> list[tuple[str, list[int]]]:
    """The (text, tokens) of each delta, read after each batch of tokens arrives."""
    state: Any = SimpleNamespace(tokenizer=SimpleNamespace(decoder=ByteTokenizer().decoder))
    stream = RequestStream(Sequence([104, 105], req.sampling))
    events = choice_events(state, req, 0, stream)
    out = []
    for batch in batches:
        for token in batch:
            stream.push(token)
        _, text, _, tokens = await asyncio.wait_for(anext(events), timeout=2)
        out.append((text, list(tokens)))
    return out


def test_a_token_whose_character_is_unfinished_still_gets_its_delta() -> None:
    e_acute = list("é".encode())  # two byte tokens: no text until the second
    got = asyncio.run(deltas(request(), [e_acute[:1], e_acute[1:], [120]]))
    assert got == [("", e_acute[:1]), ("é", e_acute[1:]), ("x", [120])]


def test_text_held_back_for_a_stop_string_still_sends_the_tokens_delta() -> None:
    got = asyncio.run(deltas(request(stop=("END",)), [list(b"E"), list(b"N")]))
    assert got == [("", list(b"E")), ("", list(b"N"))]
