"""A request's deadline: by when it must have started (left the admission queue), else it is
refused (429 ``deadline_unmet``, with ``Retry-After``) rather than served late.

The deadline is the client's ``x-kvgate-deadline-ms`` header (milliseconds from the gateway's
receipt of the request), else its class's ``deadline``: a duration, or ``objective`` (the route's
tightest TTFT objective for the class, ``slos:``); else there is none. Within a class and tenant,
queued requests start earliest deadline first; one whose expected wait already runs past its
deadline is refused as it arrives, one still queued at its deadline then.
"""

from __future__ import annotations

import math
import time

from multidict import CIMultiDict

from gateway.base.errors import BadRequest
from policies.schema import PriorityClass
from policies.slo_section import Slos, ttft_target

DEADLINE_HEADER = "x-kvgate-deadline-ms"
MAX_DEADLINE_MS = 86_400_000  # a day


def requested_deadline(headers: CIMultiDict[str]) -> float | None:
    """Seconds from arrival the client gave its request to start in; None if it gave none.
    BadRequest for a value that is not a whole number of milliseconds from 1 to a day."""
    value = headers.get(DEADLINE_HEADER)
    if value is None:
        return None
    if not value.isdigit() or not 1 <= int(value) <= MAX_DEADLINE_MS:
        raise BadRequest(
            f"{DEADLINE_HEADER} must be a whole number of milliseconds from 1 to "
            f"{MAX_DEADLINE_MS}; got {value[:32]!r}",
            param=DEADLINE_HEADER,
        )
    return int(value) / 1000


def deadline(
    requested: float | None, spec: PriorityClass, slos: Slos, route: str, started: float
) -> float:
    """The ``time.monotonic()`` by which a request that arrived at ``started``
    (``time.perf_counter()``) must start: ``requested`` seconds, else its class's; inf if none."""
    within = requested
    if within is None:
        within = ttft_target(slos, route, spec.name) if spec.deadline_objective else spec.deadline
    if within is None:
        return math.inf
    return time.monotonic() + within - (time.perf_counter() - started)
