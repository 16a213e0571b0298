"""Which headers cross the gateway, byte for byte: the client's to the upstream, the upstream's
back to the client."""

from __future__ import annotations

import pytest
from multidict import CIMultiDict

from gateway.base.forwarded import ClientAddress, forwarded_chain
from gateway.request.upstream import (
    REMEMBERED_NAMES,
    HeaderFilter,
    response_headers,
    upstream_headers,
)
from policies.schema import Pool

CLIENT = [
    (b"Authorization", b"Bearer client-key"),
    (b"API-Key", b"client-key"),
    (b"Connection", b"keep-alive"),
    (b"Content-Length", b"2"),
    (b"Content-Type", b"application/json; charset=utf-8"),
    (b"X-Request-Id", b"client-id"),
    (b"Host", b"gateway"),
    (b"Accept-Encoding", b"gzip"),
    (b"X-Custom", b"Mixed Case Value"),
    (b"traceparent", b"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"),
]
UPSTREAM = [
    (b"Content-Type", b"application/json"),
    (b"Content-Length", b"266"),
    (b"Date", b"Mon, 30 Nov 2026 22:00:00 GMT"),
    (b"server", b"uvicorn"),
    (b"x-request-id", b"upstream-id"),
    (b"Transfer-Encoding", b"chunked"),
    (b"X-Ratelimit-Remaining-Requests", b"7"),
    (b"x-backend", b"a"),
]


def test_client_credentials_framing_and_hop_by_hop_headers_stay_behind() -> None:
    pool = Pool("p", (), api_key="pool-key")
    for _ in range(2):  # the second time from the filter's memory of each name
        sent = upstream_headers(CLIENT, "gw-id", pool)
        assert sent.split(b"\r\n") == [
            b"X-Custom: Mixed Case Value",
            b"traceparent: 00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
            b"x-request-id: gw-id",
            b"content-type: application/json",
            b"authorization: Bearer pool-key",
            b"",
        ]


def test_no_pool_key_no_authorization() -> None:
    sent = upstream_headers([(b"AUTHORIZATION", b"Bearer x")], "id", Pool("p", ()))
    assert b"uthorization" not in sent.lower()
    assert sent == b"x-request-id: id\r\ncontent-type: application/json\r\n"


def test_upstream_headers_come_back_less_framing_and_its_own_request_id() -> None:
    returned = response_headers(UPSTREAM, "gw-id")
    assert returned.split(b"\r\n") == [
        b"Content-Type: application/json",
        b"X-Ratelimit-Remaining-Requests: 7",
        b"x-backend: a",
        b"x-request-id: gw-id",
        b"",
    ]


def test_headers_a_connection_header_names_stay_behind_both_ways() -> None:
    # RFC 9110 7.6.1: they are this hop's, like Connection itself (the name may come after)
    client = [(b"X-Hop", b"1"), (b"Connection", b"close, X-Hop ,x-other"), (b"x-other", b"2")]
    client.append((b"X-Kept", b"3"))
    sent = upstream_headers(client, "gw-id", Pool("p", ()))
    assert b"hop" not in sent.lower() and b"other" not in sent.lower()
    assert sent.startswith(b"X-Kept: 3\r\n")
    upstream = [(b"Connection", b"keep-alive, x-secret"), (b"x-secret", b"s"), (b"x-b", b"a")]
    assert response_headers(upstream, None) == b"x-b: a\r\n"


def test_the_gateways_own_headers_replace_the_upstreams() -> None:
    extra = {"x-ratelimit-remaining-requests": "3", "x-kvgate-ab-arm": "t=b"}
    returned = response_headers(UPSTREAM, None, extra)
    assert returned.split(b"\r\n") == [
        b"Content-Type: application/json",
        b"x-backend: a",
        b"x-ratelimit-remaining-requests: 3",
        b"x-kvgate-ab-arm: t=b",
        b"",
    ]


def test_the_filter_remembers_a_bounded_number_of_names() -> None:
    drop = HeaderFilter(frozenset({"connection"}))
    many = [(f"x-h{i}".encode(), b"v") for i in range(REMEMBERED_NAMES + 10)]
    out: list[bytes] = []
    drop.lines([*many, (b"CONNECTION", b"close")], out)
    assert len(out) == len(many)  # every other name passes, remembered or not
    assert len(drop._passes) == REMEMBERED_NAMES
    out.clear()
    drop.lines([(b"Connection", b"close"), (b"x-h5", b"w")], out)  # a new spelling is still checked
    assert out == [b"x-h5: w\r\n"]


def test_expect_upgrades_routing_and_the_clients_forwarded_headers_are_not_passed_on() -> None:
    client = [
        (b"Expect", b"100-continue"),
        (b"Upgrade", b"h2c"),
        (b"HTTP2-Settings", b"AAMAAABkAAQAoAAA"),
        (b"X-Forwarded-For", b"6.6.6.6"),
        (b"X-Forwarded-Proto", b"https"),
        (b"x-gateway-destination-endpoint", b"6.6.6.6:1"),
        (b"X-Prefiller-Host-Port", b"6.6.6.6:2"),
        (b"X-LLM-D-Prefill-Target", b"6.6.6.6:3"),
    ]
    forwarded = ClientAddress().upstream_lines("192.0.2.1", "6.6.6.6", "https")
    sent = upstream_headers(client, "id", Pool("p", ()), forwarded)
    assert sent.split(b"\r\n") == [
        b"x-forwarded-for: 6.6.6.6, 192.0.2.1",
        b"x-forwarded-proto: http",  # the peer is not a trusted proxy: its claim is replaced
        b"x-request-id: id",
        b"content-type: application/json",
        b"",
    ]


TRUSTED = ClientAddress(("10.0.0.0/8", "2001:db8::/32"))


@pytest.mark.parametrize(
    ("clients", "peer", "chain", "expected"),
    [
        (ClientAddress(), "192.0.2.1", "6.6.6.6", "192.0.2.1"),  # nothing trusted
        (TRUSTED, "192.0.2.1", "6.6.6.6", "192.0.2.1"),  # an untrusted peer's chain is not read
        (TRUSTED, "10.1.1.1", None, "10.1.1.1"),
        (TRUSTED, "10.1.1.1", "6.6.6.6", "6.6.6.6"),
        (TRUSTED, "10.1.1.1", "1.1.1.1, 6.6.6.6, 10.2.2.2", "6.6.6.6"),  # rightmost untrusted
        (TRUSTED, "10.1.1.1", "10.3.3.3, 10.2.2.2", "10.3.3.3"),  # all trusted: the first
        (TRUSTED, "2001:db8::5", "2001:db9::1", "2001:db9::1"),
        (TRUSTED, "10.1.1.1", "not-an-address, 6.6.6.6", "6.6.6.6"),
        (TRUSTED, "10.1.1.1", "6.6.6.6, garbage", "garbage"),  # untrusted, reported as sent
    ],
)
def test_client_address(
    clients: ClientAddress, peer: str, chain: str | None, expected: str
) -> None:
    assert clients.client(peer, chain) == expected


def test_several_forwarded_for_headers_make_one_chain() -> None:
    headers = CIMultiDict([("X-Forwarded-For", "1.1.1.1"), ("x-forwarded-for", "2.2.2.2")])
    assert forwarded_chain(headers) == "1.1.1.1, 2.2.2.2"
    assert forwarded_chain(CIMultiDict()) is None
