"""vLLM's dynamic LoRA endpoints: ``/v1/load_lora_adapter`` and ``/v1/unload_lora_adapter``."""

from __future__ import annotations

from aiohttp import web

from backends.server.errors import error_response
from backends.server.request_body import BodyError, read_object
from backends.server.state import STATE


async def load_lora_adapter(request: web.Request) -> web.Response:
    state = request.app[STATE]
    try:
        body = await read_object(request)
    except BodyError as exc:
        return error_response(exc.status, exc.message)
    name, path = body.get("lora_name"), body.get("lora_path")
    if not isinstance(name, str) or not name or not isinstance(path, str) or not path:
        return error_response(400, "Both 'lora_name' and 'lora_path' must be provided.")
    if name in state.lora_adapters or name == state.model_name:
        return error_response(400, f"The lora adapter '{name}' has already been loaded.")
    try:
        await state.engine.runner.load_lora(name, path)
    except ValueError as exc:
        return error_response(400, f"Failed to load LoRA adapter '{name}': {exc}")
    state.lora_adapters[name] = path
    return web.Response(text=f"Success: LoRA adapter '{name}' added successfully.")


async def unload_lora_adapter(request: web.Request) -> web.Response:
    state = request.app[STATE]
    try:
        body = await read_object(request)
    except BodyError as exc:
        return error_response(exc.status, exc.message)
    name = body.get("lora_name")
    if not isinstance(name, str) or not name:
        return error_response(400, "'lora_name' must be provided.")
    if name not in state.lora_adapters:
        return error_response(404, f"The lora adapter '{name}' cannot be found.")
    del state.lora_adapters[name]
    state.engine.runner.unload_lora(name)
    return web.Response(text=f"Success: LoRA adapter '{name}' removed successfully.")
