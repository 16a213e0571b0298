"""CORS for browser callers, as the policy's ``cors:`` section allows (``policies.cors_section``).

A preflight (``OPTIONS`` with ``Origin`` and ``Access-Control-Request-Method``) is answered
here, before authentication (browsers send it without credentials): 204 with what is allowed,
or 403 for an origin that is not. Every other response to an allowed origin carries
``Access-Control-Allow-Origin`` and exposes the gateway's own headers (request id, rate
limits, the A/B arm); a response to any other origin carries nothing, so the browser keeps it
from the page.
"""

from __future__ import annotations

from multidict import CIMultiDict

from gateway.request.error_responses import http_error
from kvgate.wire.http.messages import Response, header_line
from policies.cors_section import Cors

ALLOWED_METHODS = "GET, POST, DELETE, OPTIONS"
EXPOSED = "x-request-id, x-kvgate-ab-arm, x-ratelimit-limit-requests, " + (
    "x-ratelimit-remaining-requests, x-ratelimit-limit-tokens, x-ratelimit-remaining-tokens"
)


def is_preflight(method: str, headers: CIMultiDict[str]) -> bool:
    return method == "OPTIONS" and "access-control-request-method" in headers


def _allowed_origin(cors: Cors, origin: str) -> str | None:
    """The ``Access-Control-Allow-Origin`` value for ``origin``, or None: not allowed."""
    if origin in cors.origins:
        return origin
    if "*" in cors.origins:
        return "*"
    return None


def preflight(cors: Cors, headers: CIMultiDict[str]) -> Response:
    origin = headers.get("origin", "")
    allowed = _allowed_origin(cors, origin)
    if allowed is None:
        return http_error(403, f"origin {origin!r} is not allowed (policy cors.origins)")
    requested = headers.get("access-control-request-headers", "")
    allow_headers = requested if "*" in cors.headers else ", ".join(cors.headers)
    response = Response(status=204)
    response.block = _origin_lines(cors, allowed) + (
        header_line(b"access-control-allow-methods", ALLOWED_METHODS)
        + header_line(b"access-control-allow-headers", allow_headers)
        + header_line(b"access-control-max-age", str(int(cors.max_age)))
    )
    return response


def response_lines(cors: Cors, origin: str | None) -> bytes:
    """The CORS lines of a response to a request from ``origin`` (b"": none)."""
    if origin is None:
        return b""
    allowed = _allowed_origin(cors, origin)
    if allowed is None:
        return b""
    return _origin_lines(cors, allowed) + header_line(b"access-control-expose-headers", EXPOSED)


def _origin_lines(cors: Cors, allowed: str) -> bytes:
    lines = header_line(b"access-control-allow-origin", allowed) + b"vary: origin\r\n"
    if cors.credentials:
        lines += b"access-control-allow-credentials: true\r\n"
    return lines
