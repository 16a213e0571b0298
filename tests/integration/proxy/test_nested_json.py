"""Deeply nested JSON gets a clear 400, never a 500 with a traceback: the
gateway bounds nesting where it reads the body (``listen.max_json_depth``)."""

from __future__ import annotations

from collections.abc import Callable

import aiohttp
import orjson

from loadtest.harness.processes import KvgateProcess


def nested(depth: int) -> str:
    """JSON text of a string inside ``depth - 1`` lists (written out: serializers refuse it)."""
    return "[" * (depth - 1) + '"x"' + "]" * (depth - 1)


async def post(url: str, body: str) -> tuple[int, dict[str, object]]:
    async with (
        aiohttp.ClientSession() as session,
        session.post(f"{url}/v1/chat/completions", data=body.encode()) as response,
    ):
        return response.status, orjson.loads(await response.read())


async def test_nesting_is_bounded_where_the_body_is_read(
    start_backend: Callable[..., str], start_gateway: Callable[..., tuple[str, KvgateProcess]]
) -> None:
    backend = start_backend("--cost", "zero").removeprefix("http://")
    url, _ = start_gateway(f"""
pools: {{p: {{endpoints: [{backend}]}}}}
routes: [{{model: kvgate-sim, pool: p}}]
limits: {{rules: [{{name: t, match: {{tenant: "*"}}, tokens_per_min: 1000000}}]}}
""")
    for depth in (1000, 100):  # the JSON parser takes up to 1024; later stages recursed
        for where in ("tools", "content"):
            content = nested(depth) if where == "content" else '"hi"'
            tools = f', "tools": {nested(depth)}' if where == "tools" else ""
            body = f'{{"model": "kvgate-sim", "messages": [{{"role": "user", "content": {content}}}]{tools}}}'
            status, answer = await post(url, body)
            assert status == 400, (depth, where, answer)
            assert "nests deeper than 64 levels" in str(answer["error"]), answer
    shallow = {
        "model": "kvgate-sim",
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 1,
    }
    assert (await post(url, orjson.dumps(shallow).decode()))[0] == 200
