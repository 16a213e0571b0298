"""Where each stored response lives (``/v1/responses``): response id -> pool, endpoint, public
model and creator, bounded (the least recently used is forgotten first); found where it is
not known by asking the candidate endpoints themselves, all at once. The gateway and the
picker behind Envoy both find homes this way."""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Mapping, Sequence
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

    async def find(
        self,
        response_id: str,
        candidates: Mapping[str, Sequence[str]],
        has: Callable[[str, str], Awaitable[bool]],
        model_of: Callable[[str], str],
    ) -> Home | None:
        """The home of ``response_id`` among ``candidates`` (pool -> endpoint addresses): the
        remembered one where it is a candidate, else the first whose endpoint says it holds
        the response (``has(pool, address)``, every candidate asked at once), remembered from
        then on (its model the one remembered, else ``model_of(pool)``); None when none has
        it."""
        known = self.get(response_id)
        if known is not None and known.endpoint in candidates.get(known.pool, ()):
            return known
        asked = [(pool, address) for pool, addresses in candidates.items() for address in addresses]
        found = await asyncio.gather(*(has(pool, address) for pool, address in asked))
        for (pool, address), held in zip(asked, found, strict=True):
            if held:
                model = known.model if known is not None else model_of(pool)
                home = Home(pool, address, model, None)
                self.remember(response_id, home)
                return home
        return None


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
