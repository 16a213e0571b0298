"""A request's JSON object body, read once for every endpoint of the backend: what is wrong with
one that is not (too large, unreadable, not JSON, not an object) is a ``BodyError`` each API
answers in its own error shape."""

from __future__ import annotations

import json

from aiohttp import web


class BodyError(ValueError):
    """The body is not a JSON object: ``status`` (413 or 400) and the message to answer."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


async def read_object(request: web.Request) -> dict[str, object]:
    """The request's body as a JSON object; ``BodyError`` when it is not one."""
    try:
        body = json.loads(await request.read())
    except web.HTTPRequestEntityTooLarge as exc:
        raise BodyError(413, "request body too large") from exc
    except web.RequestPayloadError as exc:  # e.g. a body that is not what its encoding says
        raise BodyError(400, f"cannot read the request body: {exc}") from exc
    except ValueError as exc:
        raise BodyError(400, f"invalid JSON body: {exc}") from exc
    if not isinstance(body, dict):
        raise BodyError(400, "the request body must be a JSON object")
    return body
