"""A streamed choice's deltas: one per batch of new tokens, text or not, and a chat's opening
chunk with the first of them (as vLLM streams)."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

from backends.engine.engine import RequestStream
from backends.engine.sequence import SamplingParams, Sequence
from backends.server.openai_api import choice_events, write_deltas
from backends.server.protocol import GenerationRequest
from backends.server.sse import ChunkFormatter
from kvgate.wire.tokenizer import ByteTokenizer


def request(stop: tuple[str, ...] = (), *, is_chat: bool = False) -> GenerationRequest:
    return GenerationRequest(
        model="m",
        prompts=[[104, 105]],
        sampling=SamplingParams(max_tokens=8),
        stream=True,
        include_usage=False,
        stop=stop,
        priority=0,
        is_chat=is_chat,
    )


def served_state() -> Any:
    return SimpleNamespace(tokenizer=SimpleNamespace(decoder=ByteTokenizer().decoder))


async def deltas(req: GenerationRequest, batches: list[list[int]]) -> list[tuple[str, list[int]]]:
    """The (text, tokens) of each delta, read after each batch of tokens arrives."""
    stream = RequestStream(Sequence([104, 105], req.sampling))
    events = choice_events(served_state(), req, 0, stream)
    out = []
    for batch in batches:
        stream.seq.token_ids.extend(batch)  # what the engine appended, then delivered
        stream.push_new()
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


class Written:
    def __init__(self) -> None:
        self.chunks: list[bytes] = []

    async def write(self, data: bytes) -> None:
        self.chunks.append(data)


def test_a_chats_opening_chunk_waits_for_the_first_token() -> None:
    async def scenario() -> tuple[list[bytes], list[bytes]]:
        req = request(is_chat=True)
        stream = RequestStream(Sequence([104, 105], req.sampling))
        response = Written()
        fmt = ChunkFormatter(req, "r1", 0)
        writing = asyncio.ensure_future(
            write_deltas(response, fmt, served_state(), req, [stream])  # type: ignore[arg-type]
        )
        for _ in range(5):
            await asyncio.sleep(0)
        before = list(response.chunks)  # nothing made yet: nothing sent
        stream.seq.token_ids.append(120)
        stream.push_new()
        for _ in range(5):
            await asyncio.sleep(0)
        writing.cancel()
        return before, response.chunks

    before, after = asyncio.run(scenario())
    assert before == []
    assert len(after) == 1  # the role and the first delta, in one write
    assert after[0].count(b"data: ") == 2
    assert b'"role":"assistant"' in after[0] and b'"content":"x"' in after[0]
