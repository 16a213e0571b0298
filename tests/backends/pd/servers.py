"""Prefill, decode and monolithic workers in this test's event loop, built from the real
command line (``kvgate backend ...``) so the wiring under test is the product's."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import aiohttp
from aiohttp import web
from aiohttp.test_utils import TestServer

from backends.cli import build_state
from backends.server.app import create_app
from backends.server.state import ServerState
from kvgate.cli import build_parser

ServerFactory = Callable[..., Awaitable[TestServer]]


@dataclass
class Worker:
    url: str
    state: ServerState

    async def post(
        self, session: aiohttp.ClientSession, body: dict[str, Any], path: str = "/v1/completions"
    ) -> tuple[int, dict[str, Any]]:
        async with session.post(self.url + path, json=body) as response:
            return response.status, await response.json()

    async def metric(self, session: aiohttp.ClientSession, name: str) -> float:
        """The sum of a metric's samples (every label set) on ``/metrics``."""
        async with session.get(self.url + "/metrics") as response:
            text = await response.text()
        values = [
            float(line.rsplit(" ", 1)[1])
            for line in text.splitlines()
            if line.startswith(name) and line[len(name) : len(name) + 1] in ("{", " ")
        ]
        return sum(values)

    @property
    def blocks_in_use(self) -> int:
        manager = self.state.engine.block_manager
        return manager.num_blocks - manager.num_free_blocks


async def start_worker(aiohttp_server: ServerFactory, *argv: str) -> Worker:
    args = build_parser().parse_args(["backend", *argv])
    state = build_state(args)
    app: web.Application = create_app(state)
    server = await aiohttp_server(app)
    return Worker(f"http://127.0.0.1:{server.port}", state)


def prefill_body(body: dict[str, Any]) -> dict[str, Any]:
    """The prefill hop a router sends (vLLM's toy proxy): one token, no stream, held KV."""
    return {
        **body,
        "max_tokens": 1,
        "stream": False,
        "kv_transfer_params": {"do_remote_decode": True, "do_remote_prefill": False},
    }
