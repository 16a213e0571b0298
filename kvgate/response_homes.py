"""Where each stored response lives (``/v1/responses``): response id -> pool, endpoint, public
model and creator, bounded (the least recently used is forgotten first); and whether an
endpoint holds one, asked of the endpoint itself. The gateway and the picker behind Envoy both
use them."""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

from kvgate.wire.http.client import UpstreamConnectionError
from kvgate.wire.http.connection_pool import ConnectionPool
from kvgate.wire.responses_api import STORED_PREFIX

REMEMBERED = 100_000  # ids kept: about 20 MB


@dataclass(frozen=True, slots=True)
class Home:
    """Where a stored response lives, and whose it is."""

    pool: str
    endpoint: str  # host:port
    model: str  # the public model it was created with
    owner: str | None  # the creating tenant; None: not known (anyone allowed may reach it)


class ResponseHomes:
    """Response id -> ``Home``, the ``capacity`` most recently used."""

    def __init__(self, capacity: int = REMEMBERED) -> None:
        self.capacity = capacity
        self._homes: OrderedDict[str, Home] = OrderedDict()

    def __len__(self) -> int:
        return len(self._homes)

    def remember(self, response_id: str, home: Home) -> None:
        self._homes[response_id] = home
        self._homes.move_to_end(response_id)
        if len(self._homes) > self.capacity:
            self._homes.popitem(last=False)

    def get(self, response_id: str) -> Home | None:
        home = self._homes.get(response_id)
        if home is not None:
            self._homes.move_to_end(response_id)
        return home

    def forget(self, response_id: str) -> None:
        self._homes.pop(response_id, None)


async def holds(
    client: ConnectionPool, address: str, response_id: str, headers: bytes, first_byte: float
) -> bool:
    """Whether the endpoint at ``address`` holds ``response_id`` (its ``GET`` answers 200); an
    endpoint that cannot be reached, or does not answer within ``first_byte`` seconds, does
    not."""
    path = f"{STORED_PREFIX}{response_id}"
    try:
        response = await client.request(address, "GET", path, headers, b"", first_byte=first_byte)
    except (UpstreamConnectionError, TimeoutError):
        return False
    try:
        return response.status == 200
    finally:
        response.close()
