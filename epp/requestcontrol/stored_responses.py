"""Stored responses behind ext_proc (``/v1/responses``): which endpoint holds each one.

A backend keeps the responses it created in its own memory (vLLM, the bundled backend), so a
request about one — ``GET``/``DELETE /v1/responses/{id}``, ``.../cancel``, ``.../input_items``, a
create that continues it (``previous_response_id``) — must reach the endpoint that created it.
The picker remembers where each response it saw created lives (bounded; the least recently used
is forgotten first, as the gateway's). An id it does not know (another picker replica saw it
created, or this one restarted) is looked up by asking the candidate endpoints at once
(``GET /v1/responses/{id}``); the first that has it is remembered.
"""

from __future__ import annotations

import ssl

from epp.framework import Endpoint
from kvgate.response_homes import Home, ResponseHomes, holds
from kvgate.wire.http.connection_pool import ConnectionPool
from kvgate.wire.http.messages import header_block

LOOKUP_TIMEOUT = 2.0  # seconds an endpoint is given to say whether it holds a response
ACCEPT_JSON = header_block([("accept", "application/json")])


class StoredResponses:
    """Response id -> the endpoint holding it, remembered or looked up."""

    def __init__(self, tls: dict[str, tuple[ssl.SSLContext, str]]) -> None:
        self.homes = ResponseHomes()
        self._tls = tls
        self._client: ConnectionPool | None = None

    def created(self, response_id: str, pool: str, endpoint: str, model: str) -> None:
        if response_id:
            self.homes.remember(response_id, Home(pool, endpoint, model, None))

    def deleted(self, response_id: str) -> None:
        self.homes.forget(response_id)

    async def home(
        self, response_id: str, candidates: dict[str, list[Endpoint]]
    ) -> tuple[str, Endpoint, str] | None:
        """(pool, endpoint, the public model it was created with: "" when not known) among
        ``candidates`` (pool -> endpoints) that holds ``response_id``, or None when none of
        them has it."""
        addresses = {pool: [e.address for e in endpoints] for pool, endpoints in candidates.items()}
        found = await self.homes.find(
            response_id, addresses, lambda _, address: self._has(address, response_id), _unknown
        )
        if found is None:
            return None
        endpoint = next(e for e in candidates[found.pool] if e.address == found.endpoint)
        return found.pool, endpoint, found.model

    async def _has(self, address: str, response_id: str) -> bool:
        return await holds(self._connect(), address, response_id, ACCEPT_JSON, LOOKUP_TIMEOUT)

    def close(self) -> None:
        if self._client is not None:
            self._client.close()

    def _connect(self) -> ConnectionPool:
        if self._client is None:
            self._client = ConnectionPool(connect_timeout=LOOKUP_TIMEOUT)
            for address, (context, name) in self._tls.items():
                self._client.use_tls(address, context, name)
        return self._client


def _unknown(pool: str) -> str:
    return ""  # the public model of a response this picker did not see created
