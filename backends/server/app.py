"""The reference backend's aiohttp application: an OpenAI server in front of the engine."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator

import aiohttp
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from backends.server import lora, messages_api, openai_api, responses_api, tokenize_api
from backends.server.errors import error_middleware, error_response
from backends.server.state import STATE, ServerState

MAX_BODY_BYTES = 32 * 1024 * 1024


async def models(request: web.Request) -> web.Response:
    state = request.app[STATE]
    base = {
        "object": "model",
        "created": state.created,
        "owned_by": "kvgate",
        "max_model_len": state.engine.config.max_model_len,
    }
    data = [{"id": state.model_name, "root": state.model_name, "parent": None, **base}]
    for name, path in state.lora_adapters.items():
        data.append({"id": name, "root": path, "parent": state.model_name, **base})
    return web.json_response({"object": "list", "data": data})


async def health(request: web.Request) -> web.Response:
    """200 while the engine can compute; 503 once its runner is dead (an engine process that
    exited), as vLLM's ``/health`` fails when its engine core is gone."""
    if not request.app[STATE].engine.runner.is_alive():
        return error_response(503, "the model runner is not running", code="engine_dead")
    return web.Response()


async def metrics(request: web.Request) -> web.Response:
    """Prometheus text; ``?name[]=A&name[]=B`` restricts it to those series, as
    prometheus_client's own exposition does (a picker polling a few gauges every 50 ms then
    costs the server a fraction of the whole)."""
    registry = request.app[STATE].metrics.registry
    names = request.query.getall("name[]", [])
    body = generate_latest(registry.restricted_registry(names) if names else registry)
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})


def setup_routes(app: web.Application) -> None:
    app.router.add_post("/v1/completions", openai_api.completions)
    app.router.add_post("/v1/chat/completions", openai_api.chat_completions)
    app.router.add_get("/v1/models", models)
    responses_api.add_routes(app)
    messages_api.add_routes(app)
    app.router.add_post("/v1/load_lora_adapter", lora.load_lora_adapter)
    app.router.add_post("/v1/unload_lora_adapter", lora.unload_lora_adapter)
    app.router.add_post("/tokenize", tokenize_api.tokenize)
    app.router.add_post("/detokenize", tokenize_api.detokenize)
    app.router.add_get("/health", health)
    app.router.add_get("/metrics", metrics)


def create_app(state: ServerState) -> web.Application:
    """The backend app; the engine loop runs for the app's lifetime."""
    app = web.Application(middlewares=[error_middleware], client_max_size=MAX_BODY_BYTES)
    state.created = int(time.time())
    app[STATE] = state

    async def engine_context(app: web.Application) -> AsyncIterator[None]:
        if state.transfer_server is not None and state.pd is not None:
            state.pd.port = await state.transfer_server.start()
        if state.pd is not None:
            state.pd.start()
        if state.role == "decode":
            state.prefill_session = aiohttp.ClientSession()
        state.engine.start()
        yield
        await state.engine.stop()
        if state.prefill_session is not None:
            await state.prefill_session.close()
        if state.pd is not None:
            await state.pd.stop()
        if state.transfer_server is not None:
            await state.transfer_server.stop()
        if state.tracer is not None:
            state.tracer.close()

    app.cleanup_ctx.append(engine_context)
    setup_routes(app)
    return app
