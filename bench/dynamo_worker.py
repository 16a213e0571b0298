"""A Dynamo worker in front of one OpenAI-compatible engine, so Dynamo's KV router can route to
the very engines every other router of ``make bench-routing`` routes to.

Dynamo routes only to workers registered in its own discovery, which take token ids and stream
token ids back. This one registers ``--model-dir`` (``ModelInput.Tokens``), forwards each
request's token ids to ``--engine`` as a streamed ``/v1/completions`` with
``return_token_ids``, streams the ids back, and relays the engine's ZMQ KV events
(``--kv-events``) to Dynamo's router through its ``KvEventPublisher``. It runs in Dynamo's venv
(``bench.dynamo_peer``) and imports nothing of kvgate; its CPU is Dynamo's integration cost, which
the benchmark reports apart from the router's.
"""

from __future__ import annotations

import argparse
import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import aiohttp

ENDPOINT = "dynamo.backend.generate"
SAMPLING = ("temperature", "top_p", "top_k", "seed", "presence_penalty", "frequency_penalty")


def completion_body(request: dict[str, Any], model: str) -> dict[str, Any]:
    """The engine request for Dynamo's preprocessed ``request``."""
    stop = request.get("stop_conditions") or {}
    sampling = request.get("sampling_options") or {}
    body: dict[str, Any] = {
        "model": model,
        "prompt": request["token_ids"],
        "stream": True,
        "stream_options": {"include_usage": True},
        "return_token_ids": True,
        "max_tokens": stop.get("max_tokens") or 16,
        "ignore_eos": bool(stop.get("ignore_eos")),
    }
    body.update({k: sampling[k] for k in SAMPLING if sampling.get(k) is not None})
    return body


class Relay:
    def __init__(self, engine: str, model: str) -> None:
        self.url = f"{engine}/v1/completions"
        self.model = model
        self.session: aiohttp.ClientSession | None = None

    async def generate(self, request: dict[str, Any], context: Any = None) -> AsyncIterator[Any]:
        if self.session is None:
            limits = aiohttp.TCPConnector(limit=0)
            self.session = aiohttp.ClientSession(connector=limits, timeout=aiohttp.ClientTimeout())
        body = completion_body(request, self.model)
        async with self.session.post(self.url, json=body) as response:
            if response.status != 200:
                text = await response.text()
                yield {"token_ids": [], "finish_reason": f"error: {response.status} {text[:200]}"}
                return
            answer = Answer()
            async for line in response.content:
                if line.startswith(b"data: ") and not line.startswith(b"data: [DONE]"):
                    for out in answer.outputs(json.loads(line[6:])):
                        yield out
            if not answer.ended:  # no usage event: the answer ends here
                yield {"token_ids": [], "finish_reason": answer.finish}


class Answer:
    """Dynamo's outputs for one streamed engine answer: each event's new token ids, and the
    finish reason with the usage (the engine's last event) once."""

    def __init__(self) -> None:
        self.finish = "stop"
        self.ended = False

    def outputs(self, event: dict[str, Any]) -> list[dict[str, Any]]:
        choice = (event.get("choices") or [{}])[0]
        self.finish = choice.get("finish_reason") or self.finish
        outputs = [{"token_ids": choice["token_ids"]}] if choice.get("token_ids") else []
        if event.get("usage"):
            self.ended = True
            usage = event["usage"]
            outputs.append(
                {"token_ids": [], "finish_reason": self.finish, "completion_usage": usage}
            )
        return outputs


async def serve(args: argparse.Namespace) -> None:
    from dynamo.llm import KvEventPublisher, ModelInput, ModelType, WorkerType, register_model
    from dynamo.runtime import DistributedRuntime

    runtime = DistributedRuntime(asyncio.get_running_loop(), "file", "tcp", event_plane="zmq")
    endpoint = runtime.endpoint(ENDPOINT)
    publisher = KvEventPublisher(  # relays while it lives
        endpoint,
        kv_block_size=args.block_size,
        zmq_endpoint=f"tcp://127.0.0.1:{args.kv_events}",
        zmq_topic="",
    )
    relay = Relay(args.engine, args.model_name)
    await register_model(
        ModelInput.Tokens,
        ModelType.Chat | ModelType.Completions,
        endpoint,
        args.model_dir,
        args.model_name,
        worker_type=WorkerType.Aggregated,
        kv_cache_block_size=args.block_size,
    )
    await endpoint.serve_endpoint(relay.generate)
    del publisher


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--engine", required=True, help="the engine's base URL")
    parser.add_argument("--kv-events", type=int, required=True, help="its KV-event port")
    parser.add_argument("--model-dir", required=True)
    parser.add_argument("--model-name", required=True)
    parser.add_argument("--block-size", type=int, default=16)
    import uvloop  # as Dynamo's own workers run

    uvloop.run(serve(parser.parse_args()))


if __name__ == "__main__":
    main()
