"""An endpoint's count of requests in flight, as one object that the gateway and the endpoint
picker embedded in it share: the gateway's attempts keep it, the picker's scorers read it (a
standalone picker keeps its own)."""

from __future__ import annotations


class InFlight:
    """Requests sent to one endpoint and not yet finished (a plain slots class)."""

    __slots__ = ("count",)

    def __init__(self, count: int = 0) -> None:
        self.count = count
