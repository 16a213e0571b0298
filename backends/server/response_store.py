"""The responses the bundled backend created (``/v1/responses`` with ``store``), kept in memory
as vLLM keeps them, but bounded: the oldest is forgotten first."""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

STORED_RESPONSES = 4096


@dataclass(frozen=True, slots=True)
class StoredResponse:
    """A response object as it was returned, the input items it answered (with their ids) and
    the conversation a continuation (``previous_response_id``) starts from."""

    response: dict[str, object]
    input_items: list[dict[str, object]]
    history: list[dict[str, str]]  # chat messages: earlier turns, this input, this output


class ResponseStore:
    """Response id -> ``StoredResponse``, at most ``capacity`` of them."""

    def __init__(self, capacity: int = STORED_RESPONSES) -> None:
        self.capacity = capacity
        self._stored: OrderedDict[str, StoredResponse] = OrderedDict()

    def put(self, response_id: str, stored: StoredResponse) -> None:
        self._stored[response_id] = stored
        if len(self._stored) > self.capacity:
            self._stored.popitem(last=False)

    def get(self, response_id: str) -> StoredResponse | None:
        return self._stored.get(response_id)

    def delete(self, response_id: str) -> bool:
        return self._stored.pop(response_id, None) is not None
