"""Streaming detokenization with stop strings held back across chunk boundaries."""

from __future__ import annotations

import pytest

from backends.server.text_stream import TextStream
from kvgate.wire.tokenizer import ByteTokenizer


def run(chunks: list[str], stop: tuple[str, ...]) -> tuple[list[str], bool]:
    stream = TextStream(ByteTokenizer().decoder(), stop)
    out = []
    for i, chunk in enumerate(chunks):
        out.append(stream.feed(list(chunk.encode()), final=i == len(chunks) - 1))
        if stream.stopped:
            break
    return out, stream.stopped


@pytest.mark.parametrize(
    ("chunks", "stop", "joined", "stopped"),
    [
        (["hello", " world"], (), "hello world", False),
        (["hel", "lo END more"], ("END",), "hello ", True),
        (["abcE", "ND"], ("END",), "abc", True),
        (["abcE", "Nx"], ("END",), "abcENx", False),
        (["xx", "yy"], ("zzz",), "xxyy", False),
    ],
)
def test_stop_strings(chunks: list[str], stop: tuple[str, ...], joined: str, stopped: bool) -> None:
    out, did_stop = run(chunks, stop)
    assert "".join(out) == joined
    assert did_stop is stopped


def test_multibyte_characters_split_across_tokens() -> None:
    stream = TextStream(ByteTokenizer().decoder())
    data = list("é€".encode())
    first = stream.feed(data[:1])
    rest = stream.feed(data[1:], final=True)
    assert first == "" and rest == "é€"
