"""A minimal streaming OpenAI client over aiohttp: when each content chunk came, the text and
the usage the server reported."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from dataclasses import dataclass, field

import aiohttp


@dataclass
class StreamResult:
    status: int
    ttft: float = 0.0  # seconds from send to the first content chunk
    latency: float = 0.0  # seconds from send to the end of the stream
    chunk_times: list[float] = field(default_factory=list)  # seconds from send, per content chunk
    text: str = ""
    token_ids: list[int] = field(default_factory=list)  # vLLM's, when the request asked for them
    chunks: int = 0
    usage: dict[str, object] = field(default_factory=dict)
    error: str = ""
    done: bool = False  # saw ``data: [DONE]``

    @property
    def output_tokens(self) -> int:
        """Completion tokens as the server counted them, else the content chunks seen."""
        reported = self.usage.get("completion_tokens")
        return int(reported) if isinstance(reported, int) else self.chunks

    @property
    def prompt_tokens(self) -> int:
        reported = self.usage.get("prompt_tokens")
        return int(reported) if isinstance(reported, int) else 0

    @property
    def cached_tokens(self) -> int:
        details = self.usage.get("prompt_tokens_details")
        if isinstance(details, dict):
            return int(details.get("cached_tokens") or 0)
        return 0


async def stream_request(
    session: aiohttp.ClientSession,
    url: str,
    body: dict[str, object],
    headers: dict[str, str] | None = None,
) -> StreamResult:
    """POST ``body`` with ``stream`` and usage on, and read the SSE stream to its end."""
    body = {**body, "stream": True, "stream_options": {"include_usage": True}}
    start = time.perf_counter()
    async with session.post(url, json=body, headers=headers) as response:
        result = StreamResult(response.status)
        if response.status != 200:
            result.error = await response.text()
            return result
        async for raw in response.content:
            line = raw.strip()
            if not line.startswith(b"data:"):
                continue
            data = line[5:].strip()
            if data == b"[DONE]":
                result.done = True
                result.latency = time.perf_counter() - start
                await _drain(response)
                return result
            chunk = json.loads(data)
            if "error" in chunk:
                result.error = json.dumps(chunk["error"])
                break
            if chunk.get("usage"):
                result.usage = chunk["usage"]
            for choice in chunk.get("choices") or []:
                result.token_ids += choice.get("token_ids") or ()
                piece = choice.get("text")
                calls: list[dict[str, object]] = []
                if piece is None:
                    delta = choice.get("delta") or {}
                    calls = delta.get("tool_calls") or []
                    piece = delta.get("content") or "".join(map(_arguments, calls))
                if piece or calls:  # a tool call's first delta may carry only its name
                    result.chunk_times.append(time.perf_counter() - start)
                    if not result.chunks:
                        result.ttft = result.chunk_times[0]
                    result.chunks += 1
                result.text += piece
        result.latency = time.perf_counter() - start
        return result


def _arguments(call: dict[str, object]) -> str:
    """The piece of a streamed tool call's arguments a delta carries."""
    function = call.get("function")
    arguments = function.get("arguments") if isinstance(function, dict) else None
    return arguments if isinstance(arguments, str) else ""


DRAIN_TIMEOUT = 1.0  # seconds to wait for the body's end after [DONE]


async def _drain(response: aiohttp.ClientResponse) -> None:
    """Read the body to its end after ``[DONE]``, as the openai client does: a server that
    sends the end apart from the last event then keeps the connection for the next request
    (left unread, the connection is closed). One that never ends the body is given up on."""
    with contextlib.suppress(TimeoutError, aiohttp.ClientError):
        async with asyncio.timeout(DRAIN_TIMEOUT):
            await response.content.read()
