"""vLLM's ``/tokenize`` and ``/detokenize``: the server's own tokenizer and chat template."""

from __future__ import annotations

from aiohttp import web

from backends.server.errors import error_response
from backends.server.protocol import RequestError, parse_messages, parse_prompts
from backends.server.request_body import BodyError, read_object
from backends.server.state import STATE


async def _body(request: web.Request) -> dict[str, object]:
    try:
        body = await read_object(request)
    except BodyError as exc:
        raise RequestError(exc.message, status=exc.status) from exc
    if "model" in body:
        request.app[STATE].resolve_model(str(body["model"]))
    return body


async def tokenize(request: web.Request) -> web.Response:
    """``{"prompt": str}`` or ``{"messages": [...]}`` -> ``{"count", "max_model_len",
    "tokens", "token_strs"}``."""
    state = request.app[STATE]
    try:
        body = await _body(request)
        if isinstance(body.get("messages"), list):
            (tokens,) = parse_messages(body["messages"], state.tokenizer)
        elif isinstance(body.get("prompt"), str):
            (tokens,) = parse_prompts(body["prompt"], state.tokenizer, state.tokenizer.vocab_size)
        else:
            raise RequestError("prompt (a string) or messages is required", "prompt")
    except RequestError as exc:
        return error_response(exc.status, exc.message, exc.param)
    return web.json_response(
        {
            "count": len(tokens),
            "max_model_len": state.engine.config.max_model_len,
            "tokens": tokens,
            "token_strs": None,
        }
    )


async def detokenize(request: web.Request) -> web.Response:
    """``{"tokens": [ids]}`` -> ``{"prompt": text}``."""
    state = request.app[STATE]
    try:
        body = await _body(request)
    except RequestError as exc:
        return error_response(exc.status, exc.message, exc.param)
    tokens = body.get("tokens")
    vocab = state.vocab_size or state.tokenizer.vocab_size
    if not isinstance(tokens, list) or not all(
        isinstance(t, int) and not isinstance(t, bool) and 0 <= t < vocab for t in tokens
    ):
        return error_response(400, f"tokens must be a list of token ids in [0, {vocab})", "tokens")
    return web.json_response({"prompt": state.tokenizer.decode([int(t) for t in tokens])})
