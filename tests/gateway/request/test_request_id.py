"""Request ids: generated ones are unique 32-hex-digit strings; a client's sane one is kept."""

from __future__ import annotations

import re

from multidict import CIMultiDict

from gateway.request.request_context import request_id_of
from kvgate.wire.request_id import new_request_id


def test_generated_ids_are_32_hex_digits_and_unique() -> None:
    ids = [new_request_id() for _ in range(10_000)]
    assert all(re.fullmatch(r"[0-9a-f]{32}", i) for i in ids)
    assert len(set(ids)) == len(ids)
    assert len({i[:16] for i in ids}) == 1  # one process, one prefix


def test_a_sane_client_id_is_kept_and_anything_else_replaced() -> None:
    assert request_id_of(CIMultiDict({"X-Request-Id": "abc-123.x:y_z"})) == "abc-123.x:y_z"
    for bad in ("", "a b", "x" * 129, "id\r\nx-evil: 1", "abc\n", "é"):
        replaced = request_id_of(CIMultiDict({"x-request-id": bad}))
        assert re.fullmatch(r"[0-9a-f]{32}", replaced), bad
    assert re.fullmatch(r"[0-9a-f]{32}", request_id_of(CIMultiDict()))
