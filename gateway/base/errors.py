"""Gateway errors: a shallow tree, each with its HTTP status, mapped to OpenAI JSON in one place."""

from __future__ import annotations

from kvgate.wire.http.messages import Response, json_response
from kvgate.wire.openai_errors import error_body


class GatewayError(Exception):
    """An error the gateway answers itself; ``status``, ``type`` and ``code`` shape the body."""

    status = 500
    type = "server_error"
    code: str | None = None

    def __init__(
        self,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        self.headers = headers or {}
        if code is not None:
            self.code = code

    def to_response(self) -> Response:
        return error_response(
            self.status, self.message, self.type, self.param, self.code, self.headers
        )


class BadRequest(GatewayError):
    status, type = 400, "invalid_request_error"


class BodyTooLarge(GatewayError):
    """The body, decoded, is larger than ``listen.max_body_bytes`` (413)."""

    status, type, code = 413, "invalid_request_error", "request_too_large"


class UnsupportedEncoding(GatewayError):
    """A ``Content-Encoding`` the gateway cannot decode (415)."""

    status, type, code = 415, "invalid_request_error", "unsupported_content_encoding"


class Unauthorized(GatewayError):
    status, type, code = 401, "authentication_error", "invalid_api_key"


class ModelNotFound(GatewayError):
    status, type, code = 404, "invalid_request_error", "model_not_found"


class UpstreamError(GatewayError):
    """The upstream failed or answered garbage (502)."""

    status, type, code = 502, "server_error", "upstream_error"


class NoEndpoint(GatewayError):
    """No endpoint of the pool could take the request (503)."""

    status, type, code = 503, "server_error", "no_healthy_upstream"


class Forbidden(GatewayError):
    status, type, code = 403, "permission_error", "forbidden"


class NotFound(GatewayError):
    status, type, code = 404, "invalid_request_error", "not_found"


class MethodNotAllowed(GatewayError):
    status, type, code = 405, "invalid_request_error", "method_not_allowed"


class UpstreamTimeout(GatewayError):
    status, type, code = 504, "server_error", "upstream_timeout"


# The admission queue's refusals (here, not in the compiled gateway.guards.admission: mypyc's
# classes do not override the class attributes of an interpreted base such as GatewayError).
class Rejected(GatewayError):
    """Refused before queueing."""

    status, type, code = 429, "rate_limit_error", "queue_full"
    reason = "full"  # the queue rejections' label


class QueueFull(Rejected):
    pass


class DeadlineUnmet(Rejected):
    """Refused because it cannot start by its deadline (``gateway.guards.deadlines``): as it
    arrived, from the queue's expected wait, or when the deadline came while it waited."""

    code = "deadline_unmet"
    reason = "deadline"


class SloShed(Rejected):
    """Refused because a budget of the route's SLOs is spent and the caller's class is among
    those shed first (``slos.shed_when_exhausted``)."""

    code = "slo_budget_exhausted"


class Evicted(GatewayError):
    """Given up after queueing."""

    status, type, code = 503, "server_error", "queue_timeout"
    reason = "expired"


class Expired(Evicted):
    pass


def error_response(
    status: int,
    message: str,
    error_type: str,
    param: str | None = None,
    code: str | None = None,
    headers: dict[str, str] | None = None,
) -> Response:
    body = error_body(message, error_type, param, code)
    return json_response(body, status=status, headers=headers)
