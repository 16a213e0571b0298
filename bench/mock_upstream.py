"""A fast OpenAI-compatible mock upstream for proxy benchmarks (no model, no delay).

``python -m bench.mock_upstream --port P``: chat and completion requests answer at once,
non-streaming with a fixed JSON body, streaming with 16 content chunks (``KVGATE_MOCK_CHUNKS``),
a usage chunk when asked and ``data: [DONE]`` — the same shape as the mock the peers were
measured against.
"""

from __future__ import annotations

import argparse
import json
import os

from aiohttp import web

CHUNKS = int(os.environ.get("KVGATE_MOCK_CHUNKS", "16"))  # content events per stream


def _chunk(index: int, last: bool) -> bytes:
    body = {
        "id": "chatcmpl-mock",
        "object": "chat.completion.chunk",
        "created": 0,
        "model": "mock",
        "choices": [
            {
                "index": 0,
                "delta": {"content": f"tok{index} "},
                "finish_reason": "length" if last else None,
            }
        ],
    }
    return f"data: {json.dumps(body)}\n\n".encode()


STREAM = [_chunk(i, i == CHUNKS - 1) for i in range(CHUNKS)]
USAGE = {"prompt_tokens": 20, "completion_tokens": CHUNKS, "total_tokens": 20 + CHUNKS}
USAGE_CHUNK = (
    "data: "
    + json.dumps(
        {
            "id": "chatcmpl-mock",
            "object": "chat.completion.chunk",
            "created": 0,
            "model": "mock",
            "choices": [],
            "usage": USAGE,
        }
    )
    + "\n\n"
).encode()
BODY = json.dumps(
    {
        "id": "chatcmpl-mock",
        "object": "chat.completion",
        "created": 0,
        "model": "mock",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": "hello"},
                "finish_reason": "stop",
            }
        ],
        "usage": USAGE,
    }
).encode()


async def complete(request: web.Request) -> web.StreamResponse:
    body = await request.json()
    if not body.get("stream"):
        return web.Response(body=BODY, content_type="application/json")
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await response.prepare(request)
    for chunk in STREAM:
        await response.write(chunk)
    options = body.get("stream_options") or {}
    tail = (USAGE_CHUNK if options.get("include_usage") else b"") + b"data: [DONE]\n\n"
    await response.write_eof(tail)
    return response


METRICS = (  # what a picker scrapes: an idle vLLM
    "vllm:num_requests_running 0\nvllm:num_requests_waiting 0\nvllm:kv_cache_usage_perc 0\n"
)


async def metrics(request: web.Request) -> web.Response:
    return web.Response(text=METRICS, content_type="text/plain")


async def models(request: web.Request) -> web.Response:
    return web.json_response({"object": "list", "data": [{"id": "mock", "object": "model"}]})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=18001)
    args = parser.parse_args()
    import uvloop

    uvloop.install()
    app = web.Application()
    app.router.add_post("/v1/chat/completions", complete)
    app.router.add_post("/v1/completions", complete)
    app.router.add_get("/v1/models", models)
    app.router.add_get("/health", models)
    app.router.add_get("/healthz", models)
    app.router.add_get("/metrics", metrics)  # a load balancer's health checks
    web.run_app(app, host=args.host, port=args.port, access_log=None, print=None)


if __name__ == "__main__":
    main()
