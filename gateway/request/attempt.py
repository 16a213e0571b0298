"""One try of a request on one endpoint, from dispatch to the end of its response.

An ``Attempt`` is the one owner of what a try changes: the endpoint's in-flight count (raised
when it starts, lowered exactly once when it ends), the breaker's verdict (a typed
``AttemptOutcome``, recorded when the response head arrives or the try fails, and again if
the response breaks mid-way), and the upstream response (closed when the attempt closes).
Every exit path ends in ``fail`` or ``close``.

A 5xx head gets no verdict until the upstream call knows whose fault it is: ``blame`` when
another endpoint answered the same request, ``absolve`` when a second endpoint failed it too
(the request is the cause, not the endpoint).
"""

from __future__ import annotations

from collections.abc import Callable
from enum import Enum

from gateway.routing.endpoint_picker import EndpointState, Ranking
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

    __slots__ = (
        "_open",
        "_probe",
        "_ranking",
        "_release",
        "_undecided",
        "broken",
        "endpoint",
        "outcome",
        "response",
    )

    def __init__(self, endpoint: EndpointState, ranking: Ranking | None = None) -> None:
        """``ranking``: the picker's, told when this try is over (``Ranking.finished``)."""
        self.endpoint = endpoint
        self._ranking = ranking
        self.response: UpstreamResponse | None = None
        self.outcome: AttemptOutcome | None = None
        self.broken = False
        self._open = True
        self._undecided = False
        self._release: Callable[[], None] | None = None
        self._probe = not endpoint.breaker.closed
        endpoint.requests.count += 1
        if self._probe:
            endpoint.breaker.on_dispatch()  # half-open: uses up a probe

    def hold(self, release: Callable[[], None]) -> None:
        """Call ``release`` when the attempt closes (what the try holds on the endpoint: its
        LoRA adapter's slot)."""
        self._release = release

    def answered(self, response: UpstreamResponse) -> AttemptOutcome:
        """The response head arrived: below 500 the breaker counts a success; a 5xx waits
        for ``blame`` or ``absolve``."""
        self.response = response
        if response.status < 500:
            self.outcome = ANSWERED
            self.endpoint.breaker.record(ok=True)
        else:
            self.outcome = SERVER_ERROR
            self._undecided = True
        return self.outcome

    def first_token(self) -> None:
        """The response's first token arrived: the picker no longer counts the prompt as
        waiting to be computed (``Ranking.started``)."""
        if self._ranking is not None and self._open:
            self._ranking.started(self.endpoint)

    def blame(self) -> None:
        """The 5xx was the endpoint's fault: the breaker counts a failure."""
        if self._undecided:
            self._undecided = False
            self.endpoint.breaker.record(ok=False)

    def absolve(self) -> None:
        """The 5xx was the request's fault (another endpoint failed it too): no verdict."""
        if self._undecided:
            self._undecided = False
            if self._probe:
                self.endpoint.breaker.release_probe()

    def fail(self, outcome: AttemptOutcome) -> None:
        """The try ended before a response head; ``CANCELLED`` records no verdict."""
        if not self._open:
            return
        self.outcome = outcome
        if outcome is not CANCELLED:
            self.endpoint.breaker.record(ok=False)
        elif self._probe:
            self.endpoint.breaker.release_probe()
        self.close()

    def break_off(self) -> None:
        """The response failed after its head: the breaker counts one more failure on close."""
        self.broken = True

    def close(self, prompt_tokens: int | None = None) -> None:
        """End the attempt: lower the in-flight count, close the response (idempotent).
        ``prompt_tokens``: the usage the endpoint reported, for the picker."""
        if not self._open:
            return
        self._open = False
        if self._undecided:  # a 5xx nobody absolved counts
            self.blame()
        self.endpoint.requests.count -= 1
        if self._release is not None:
            self._release()
        if self._ranking is not None:
            self._ranking.finished(self.endpoint, prompt_tokens)
        if self.response is not None:
            self.response.close()
        if self.broken:
            self.outcome = BROKEN
            self.endpoint.breaker.record(ok=False)
