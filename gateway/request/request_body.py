"""The client's request body: decoded as its ``Content-Encoding`` says, parsed (JSON, or a
multipart form on the paths that take one) and bounded in size and depth."""

from __future__ import annotations

import orjson

from gateway.base.errors import BadRequest
from gateway.request.body_encoding import decode_body
from gateway.request.form_body import FormBody, is_form, parse_form
from kvgate.wire.http.messages import Request
from kvgate.wire.json_text import nested_deeper_than
from kvgate.wire.openai_errors import NOT_AN_OBJECT, invalid_json


def content_encoding(headers: list[tuple[bytes, bytes]]) -> str:
    """The request's ``Content-Encoding`` ("" when none), read from the raw header pairs: no
    case-insensitive mapping lookup on every request for a header that is nearly never sent."""
    for name, value in headers:
        if len(name) == 16 and name.lower() == b"content-encoding":
            return value.decode("latin-1")
    return ""


def read_body(
    request: Request, max_body: int, max_depth: int, forms: bool
) -> tuple[bytes, dict[str, object], FormBody | None]:
    """The body as sent (decoded), its fields, and the form when it is a multipart form (taken
    on ``forms`` paths only: the extra paths a route lists, such as ``/v1/audio/*``)."""
    raw = request.body  # the server has already refused bodies over listen.max_body
    encoding = content_encoding(request.raw_headers)
    if encoding:  # decoded here, bounded again; forwarded decoded, without the header
        raw = decode_body(raw, encoding, max_body)
    content_type = request.headers.get("content-type", "")
    if content_type.startswith("multipart/") and is_form(content_type):
        if not forms:
            raise BadRequest(f"{request.path} takes a JSON body, not a multipart form")
        form = parse_form(raw, content_type)
        return raw, form.fields, form
    try:
        body = orjson.loads(raw)
    except ValueError as exc:
        raise BadRequest(invalid_json(exc)) from exc
    if not isinstance(body, dict):
        raise BadRequest(NOT_AN_OBJECT)
    # every later stage (routing text, the limiter's estimate) may recurse into the body; a
    # body with fewer brackets than the limit cannot nest deeper than it
    if raw.count(b"[") + raw.count(b"{") > max_depth and nested_deeper_than(body, max_depth):
        raise BadRequest(f"the request body nests deeper than {max_depth} levels")
    return raw, body, None
