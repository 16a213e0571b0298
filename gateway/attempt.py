"""One try of a request on one endpoint, from dispatch to the end of its response.

An ``Attempt`` is the one owner of what a try changes: the endpoint's in-flight count (raised
when it starts, lowered exactly once when it ends), the breaker's verdict (a typed
``AttemptOutcome``, recorded when the response head arrives or the try fails, and again if
the response breaks mid-way), and the upstream response (closed when the attempt closes).
Every exit path ends in ``fail`` or ``close``.
"""

from __future__ import annotations

from enum import Enum

from gateway.endpoint_picker import EndpointState
from kvgate.wire.http.client import UpstreamResponse


class AttemptOutcome(Enum):
    """How a try ended, as the endpoint's breaker sees it."""

    ANSWERED = "answered"  # a response head below 500 (a 4xx is the client's doing)
    SERVER_ERROR = "server_error"  # a 5xx response head
    CONNECT_FAILED = "connect_failed"
    TIMED_OUT = "timed_out"  # no response head in time
    BROKEN = "broken"  # the response failed after its head (stream cut, stall, lost body)
    CANCELLED = "cancelled"  # the client went away or the gateway gave up: no verdict


# Module constants: an Enum class attribute read goes through the metaclass (see breaker.py).
ANSWERED, SERVER_ERROR = AttemptOutcome.ANSWERED, AttemptOutcome.SERVER_ERROR
CONNECT_FAILED, TIMED_OUT = AttemptOutcome.CONNECT_FAILED, AttemptOutcome.TIMED_OUT
BROKEN, CANCELLED = AttemptOutcome.BROKEN, AttemptOutcome.CANCELLED


class Attempt:
    """A request in flight to ``endpoint`` (a plain slots class: one is made per try)."""

    __slots__ = ("_open", "broken", "endpoint", "outcome", "response")

    def __init__(self, endpoint: EndpointState) -> None:
        self.endpoint = endpoint
        self.response: UpstreamResponse | None = None
        self.outcome: AttemptOutcome | None = None
        self.broken = False
        self._open = True
        endpoint.in_flight += 1
        if not endpoint.breaker.closed:
            endpoint.breaker.on_dispatch()  # half-open: uses up a probe

    def answered(self, response: UpstreamResponse) -> AttemptOutcome:
        """The response head arrived: record the breaker's verdict on its status."""
        self.response = response
        ok = response.status < 500
        self.outcome = ANSWERED if ok else SERVER_ERROR
        self.endpoint.breaker.record(ok=ok)
        return self.outcome

    def fail(self, outcome: AttemptOutcome) -> None:
        """The try ended before a response head; ``CANCELLED`` records no verdict."""
        if not self._open:
            return
        self.outcome = outcome
        if outcome is not CANCELLED:
            self.endpoint.breaker.record(ok=False)
        self.close()

    def break_off(self) -> None:
        """The response failed after its head: the breaker counts one more failure on close."""
        self.broken = True

    def close(self) -> None:
        """End the attempt: lower the in-flight count, close the response (idempotent)."""
        if not self._open:
            return
        self._open = False
        self.endpoint.in_flight -= 1
        if self.response is not None:
            self.response.close()
        if self.broken:
            self.outcome = BROKEN
            self.endpoint.breaker.record(ok=False)
