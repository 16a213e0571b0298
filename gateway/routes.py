"""The gateway's routes: the proxied OpenAI API, models, health, readiness and metrics."""

from __future__ import annotations

import time

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST

from gateway import proxy
from gateway.context import CONTEXT
from gateway.keys import METRICS, RUNTIME, SHUTTING_DOWN


async def models(request: web.Request) -> web.Response:
    """The public models this caller may use."""
    identity = request[CONTEXT].identity
    created = int(time.time())
    data = [
        {"id": model, "object": "model", "created": created, "owned_by": "kvgate"}
        for model in request.app[RUNTIME].current.policy.public_models
        if identity is None or identity.may_use(model)
    ]
    return web.json_response({"object": "list", "data": data})


async def healthz(request: web.Request) -> web.Response:
    return web.json_response({"status": "ok"})


async def readyz(request: web.Request) -> web.Response:
    limiter = request.app[RUNTIME].current.limiter.status
    if request.app[SHUTTING_DOWN][0]:
        return web.json_response({"status": "shutting down", "limiter": limiter}, status=503)
    if limiter == "down":  # fail-closed and the limit store is unreachable: nothing is admitted
        return web.json_response({"status": "not ready", "limiter": limiter}, status=503)
    return web.json_response({"status": "ready", "limiter": limiter})


async def metrics(request: web.Request) -> web.Response:
    embedded = request.app[RUNTIME].current.embedded
    if embedded is not None:
        embedded.service.update_gauges()  # the picker's index sizes, read when scraped
    body = request.app[METRICS].exposition()
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})


def setup_routes(app: web.Application) -> None:
    app.router.add_post("/v1/chat/completions", proxy.chat_completions)
    app.router.add_post("/v1/completions", proxy.completions)
    app.router.add_post("/v1/embeddings", proxy.embeddings)
    app.router.add_get("/v1/models", models)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get(app[RUNTIME].current.policy.observability.metrics_path, metrics)
