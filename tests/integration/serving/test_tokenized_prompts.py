"""A pool with ``tokenized_prompts`` gets completions' text prompts as the token ids the precise
index made of them, so its engines tokenize nothing: the body the engine receives, and a real
reference backend's greedy answer, equal to the one it gives the text."""

from __future__ import annotations

from collections.abc import Callable

import aiohttp
import openai
from aiohttp import web

from kvgate.wire.request_tokenizer import ReferenceTokenizer
from loadtest.harness.processes import KvgateProcess, free_port
from tests.fakes import close_after_test

PRECISE = """
epp:
  plugins:
    - {name: prefix, type: prefix-cache-scorer, params: {mode: precise, block_size_tokens: 16}}
    - {name: pick, type: max-score-picker}
  profiles: [{name: default, plugins: [{ref: prefix}, {ref: pick}]}]
"""
ANSWER = {
    "id": "cmpl-1",
    "object": "text_completion",
    "created": 0,
    "model": "kvgate-sim",
    "choices": [{"index": 0, "text": "ok", "finish_reason": "stop", "logprobs": None}],
    "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4},
}


def policy(address: str, tokenized: bool) -> str:
    flag = ", tokenized_prompts: true" if tokenized else ""
    return f"""
pools: {{p: {{endpoints: [{address}]{flag}}}}}
routes: [{{model: kvgate-sim, pool: p}}]
observability: {{access_log: "off"}}
{PRECISE}"""


async def test_the_engine_receives_the_prompts_token_ids(
    start_gateway: Callable[..., tuple[str, KvgateProcess]],
) -> None:
    received: list[dict[str, object]] = []

    async def completions(request: web.Request) -> web.Response:
        received.append(await request.json())
        return web.json_response(ANSWER)

    app = web.Application()
    app.router.add_post("/v1/completions", completions)
    app.router.add_post("/v1/chat/completions", completions)
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    try:
        url, _ = start_gateway(policy(f"127.0.0.1:{port}", tokenized=True))
        plain, _ = start_gateway(policy(f"127.0.0.1:{port}", tokenized=False))
        async with aiohttp.ClientSession() as session:
            for base, body in (
                (url, {"prompt": "héllo wörld"}),
                (url, {"prompt": "héllo", "echo": True}),  # echoed as text: the text goes
                (url, {"prompt": ["a", "b"]}),  # several prompts: as they are
                (url, {"messages": [{"role": "user", "content": "hi"}]}),  # chat: as it is
                (plain, {"prompt": "héllo wörld"}),  # a pool without it: the text
            ):
                path = "/v1/chat/completions" if "messages" in body else "/v1/completions"
                sent = {"model": "kvgate-sim", **body}
                async with session.post(base + path, json=sent) as response:
                    assert response.status == 200, await response.text()
    finally:
        await runner.cleanup()
    prompts = [r.get("prompt", r.get("messages")) for r in received]
    assert prompts == [
        ReferenceTokenizer().prompt_ids("héllo wörld"),
        "héllo",
        ["a", "b"],
        [{"role": "user", "content": "hi"}],
        "héllo wörld",
    ]


def test_a_real_engine_answers_the_ids_as_it_answers_the_text(
    start_backend: Callable[..., str],
    start_gateway: Callable[..., tuple[str, KvgateProcess]],
) -> None:
    backend = start_backend("--cost", "zero")
    url, _ = start_gateway(policy(backend.removeprefix("http://"), tokenized=True))
    prompt = "the gateway sends token ids: " * 20
    answers = []
    for base in (url, backend):
        api = close_after_test(openai.OpenAI(base_url=f"{base}/v1", api_key="x", max_retries=0))
        done = api.completions.create(
            model="kvgate-sim", prompt=prompt, max_tokens=12, temperature=0, seed=7
        )
        assert done.usage is not None
        answers.append((done.choices[0].text, done.usage.prompt_tokens))
        streamed = api.completions.create(
            model="kvgate-sim", prompt=prompt, max_tokens=12, temperature=0, seed=7, stream=True
        )
        answers.append(("".join(c.choices[0].text for c in streamed if c.choices), 0))
    assert answers[:2] == answers[2:]
    assert answers[0][1] == len(prompt)  # one byte a token: the whole prompt, as ids
