"""The upstream connection pool against real sockets: reuse, stale connections, broken and
close-delimited bodies, timeouts and cancellation."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from kvgate.wire.http.client import (
    MAX_UPSTREAM_HEAD,
    UpstreamBodyTooLarge,
    UpstreamConnectionError,
    UpstreamResponse,
)
from kvgate.wire.http.connection_pool import ConnectionPool
from tests.http_servers import Upstream, loopback_server, started

OK = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\r\n{}"


async def wait_for_a_close(up: Upstream) -> None:
    """Until the upstream has seen a connection close (up to a second)."""
    for _ in range(50):
        if up.closed:
            return
        await asyncio.sleep(0.02)


async def call(pool: ConnectionPool, up: Upstream, first_byte: float | None = None) -> bytes:
    response = await pool.request(
        f"127.0.0.1:{up.port}", "POST", "/v1/x", b"a: b\r\n", b"{}", first_byte=first_byte
    )
    try:
        return await response.read(idle=2)
    finally:
        response.close()


async def test_connections_are_reused() -> None:
    up, server = await started(lambda n: OK)
    pool = ConnectionPool(connect_timeout=1)
    for _ in range(5):
        assert await call(pool, up) == b"{}"
    assert (up.connections, up.requests) == (1, 5)
    pool.close()
    server.close()


async def test_a_stale_kept_alive_connection_is_retried_once_on_a_fresh_one() -> None:
    up, server = await started(lambda n: OK if n != 2 else None)  # closes after reading #2
    pool = ConnectionPool(connect_timeout=1)
    assert await call(pool, up) == b"{}"
    assert await call(pool, up) == b"{}"  # #2 is dropped unanswered; #3 on a new connection
    assert (up.connections, up.requests) == (2, 3)
    pool.close()
    server.close()


async def answer_once_and_close(reply: bytes) -> tuple[int, asyncio.Server]:
    """A server that reads one request, sends ``reply`` and closes the connection."""

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n{}")
        writer.write(reply)
        await writer.drain()
        writer.close()

    server = await loopback_server(serve)
    return server.sockets[0].getsockname()[1], server


async def test_a_body_cut_short_raises() -> None:
    port, server = await answer_once_and_close(
        b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\n{part"
    )
    pool = ConnectionPool(connect_timeout=1)
    response = await pool.request(f"127.0.0.1:{port}", "POST", "/", b"", b"{}")
    assert response.status == 200
    with pytest.raises(UpstreamConnectionError):
        await response.read(idle=2)
    response.close()
    pool.close()
    server.close()


@pytest.mark.parametrize(
    "head",
    [
        b"x-big: " + b"v" * (MAX_UPSTREAM_HEAD + 1) + b"\r\n\r\n{}",
        b"".join(b"x-h%d: %b\r\n" % (i, b"v" * 100) for i in range(1000)) + b"\r\n{}",
        b"x-endless: " + b"v" * (MAX_UPSTREAM_HEAD + 1),  # never finished
    ],
    ids=["one huge header", "many headers", "an unfinished head"],
)
async def test_an_oversized_response_head_fails_the_request(head: bytes) -> None:
    up, server = await started(lambda n: b"HTTP/1.1 200 OK\r\n" + head)
    pool = ConnectionPool(connect_timeout=1)
    with pytest.raises(UpstreamConnectionError, match="headers exceed"):
        await call(pool, up, first_byte=5)
    await wait_for_a_close(up)  # the connection is closed, not kept for reuse
    assert up.closed == [1]
    pool.close()
    server.close()


async def test_a_large_body_with_a_normal_head_is_fine() -> None:
    body = b"[" + b"1," * 100_000 + b"1]"
    reply = b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n%b" % (len(body), body)
    up, server = await started(lambda n: reply)
    pool = ConnectionPool(connect_timeout=1)
    assert await call(pool, up) == body
    pool.close()
    server.close()


async def test_close_delimited_body_is_complete_at_eof() -> None:
    reply = b"HTTP/1.1 200 OK\r\nconnection: close\r\n\r\nall of it"
    port, server = await answer_once_and_close(reply)
    pool = ConnectionPool(connect_timeout=1)
    response = await pool.request(f"127.0.0.1:{port}", "POST", "/", b"", b"{}")
    assert await response.read(idle=2) == b"all of it"
    response.close()
    pool.close()
    server.close()


async def test_first_byte_timeout_aborts_the_connection() -> None:
    up, server = await started(lambda n: None if n > 1 else b"")  # never answers #1
    pool = ConnectionPool(connect_timeout=1)
    with pytest.raises(TimeoutError):
        await call(pool, up, first_byte=0.2)
    await wait_for_a_close(up)
    assert up.closed == [1]  # the upstream saw the connection close: it can stop generating
    pool.close()
    server.close()


def sweeping(pool: ConnectionPool) -> bool:
    """Whether the pool's timer runs (read afresh: it changes while the test awaits)."""
    return pool.sweeping


async def test_an_idle_pool_keeps_no_timer_and_still_times_out_later() -> None:
    up, server = await started(lambda n: OK if n == 1 else b"")  # never answers #2
    pool = ConnectionPool(connect_timeout=1)
    assert await call(pool, up, first_byte=5) == b"{}"
    assert not sweeping(pool)  # nothing awaited: no timer wakes the event loop
    started_at = asyncio.get_running_loop().time()
    waiting = asyncio.create_task(call(pool, up, first_byte=0.2))
    await asyncio.sleep(0.05)
    assert sweeping(pool)
    with pytest.raises(TimeoutError):
        await waiting
    assert 0.2 <= asyncio.get_running_loop().time() - started_at < 0.2 + 4 * pool.SWEEP
    assert not sweeping(pool)
    pool.close()
    server.close()


async def test_a_shorter_first_byte_timeout_is_not_held_up_by_a_longer_one() -> None:
    up, server = await started(lambda n: b"")  # never answers
    pool = ConnectionPool(connect_timeout=1)
    patient = asyncio.create_task(call(pool, up, first_byte=30))
    await asyncio.sleep(0.05)
    started_at = asyncio.get_running_loop().time()
    with pytest.raises(TimeoutError):
        await call(pool, up, first_byte=0.2)
    assert asyncio.get_running_loop().time() - started_at < 0.2 + 4 * pool.SWEEP
    assert pool.sweeping and not patient.done()  # the longer deadline is still watched
    patient.cancel()
    with pytest.raises(asyncio.CancelledError):
        await patient
    pool.close()
    server.close()


async def test_cancelling_the_caller_aborts_the_connection() -> None:
    up, server = await started(lambda n: b"")  # reads, never answers
    pool = ConnectionPool(connect_timeout=1)
    task = asyncio.create_task(call(pool, up))
    await asyncio.sleep(0.2)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await wait_for_a_close(up)
    assert up.closed == [1]
    pool.close()
    server.close()


async def test_connect_refused_raises_connection_error() -> None:
    up, server = await started(lambda n: OK)
    server.close()
    await server.wait_closed()
    pool = ConnectionPool(connect_timeout=1)
    with pytest.raises(UpstreamConnectionError):
        await call(pool, up)


async def test_a_stalled_body_times_out_after_idle_seconds() -> None:
    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n{}")
        writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n2\r\nab\r\n")
        await writer.drain()
        await asyncio.sleep(0.15)
        writer.write(b"2\r\ncd\r\n")  # within the idle limit: the timer re-arms
        await writer.drain()
        await asyncio.sleep(5)  # then a stall
        writer.close()

    server = await loopback_server(serve)
    pool = ConnectionPool(connect_timeout=1)
    port = server.sockets[0].getsockname()[1]
    response = await pool.request(f"127.0.0.1:{port}", "POST", "/", b"", b"{}")
    assert await response.readany(idle=0.3) == b"ab"
    assert await response.readany(idle=0.3) == b"cd"
    started = asyncio.get_running_loop().time()
    with pytest.raises(TimeoutError):
        await response.readany(idle=0.3)
    assert 0.25 <= asyncio.get_running_loop().time() - started < 2
    response.close()
    pool.close()
    server.close()


async def test_a_large_body_is_read_whole_through_backpressure() -> None:
    payload = bytes(range(256)) * 12_000  # about 3 MB: past the 256 KiB pause threshold

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n{}")
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n" % len(payload) + payload)
        await writer.drain()
        await reader.read()  # keep the connection until the client is done

    server = await loopback_server(serve)
    pool = ConnectionPool(connect_timeout=1)
    port = server.sockets[0].getsockname()[1]
    response = await pool.request(f"127.0.0.1:{port}", "POST", "/", b"", b"{}")
    await asyncio.sleep(0.2)  # let the transport fill the buffer and pause
    assert await response.read(idle=2) == payload
    response.close()
    pool.close()
    server.close()


async def test_a_connection_paused_by_a_large_body_is_reused_unpaused() -> None:
    payload = b"x" * 400_000  # arrives in two reads: paused and complete at once

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            try:
                await reader.readuntil(b"\r\n\r\n{}")
            except asyncio.IncompleteReadError:
                return
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n" % len(payload) + payload)
            await writer.drain()

    server = await loopback_server(serve)
    pool = ConnectionPool(connect_timeout=1)
    address = f"127.0.0.1:{server.sockets[0].getsockname()[1]}"
    for _ in range(3):  # the same kept-alive connection each time
        response = await pool.request(address, "POST", "/", b"", b"{}", first_byte=2)
        await asyncio.sleep(0.1)
        assert await response.read(idle=2) == payload
        response.close()
    pool.close()
    server.close()


@pytest.mark.parametrize(
    "interim",
    [b"HTTP/1.1 100 Continue\r\n\r\n", b"HTTP/1.1 103 Early Hints\r\nlink: </a>\r\n\r\n" * 2],
    ids=["100 Continue", "two 103 Early Hints"],
)
async def test_interim_1xx_responses_are_skipped_for_the_final_one(interim: bytes) -> None:
    up, server = await started(lambda n: interim + OK)
    pool = ConnectionPool(connect_timeout=1)
    response = await pool.request(f"127.0.0.1:{up.port}", "POST", "/v1/x", b"", b"{}")
    try:
        assert response.status == 200
        assert all(name.lower() != b"link" for name, _ in response.raw_headers)
        assert await response.read(idle=2) == b"{}"
    finally:
        response.close()
    assert await call(pool, up) == b"{}"  # the connection is still in step
    assert up.connections == 1
    pool.close()
    server.close()


async def chunked_server(*parts: bytes, pause: float = 0.05) -> asyncio.Server:
    """Answers one request with a chunked body of ``parts``, ``pause`` seconds apart."""

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n{}")
        writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n")
        for part in parts:
            writer.write(b"%x\r\n%b\r\n" % (len(part), part))
            await writer.drain()
            await asyncio.sleep(pause)
        writer.write(b"0\r\n\r\n")
        await writer.drain()
        await reader.read()

    return await loopback_server(serve)


class Sink:
    """Takes pushed chunks (and when each came); says stop after ``stop_at``."""

    def __init__(self, stop_at: bytes | None = None) -> None:
        self.stop_at = stop_at
        self.taken: list[bytes] = []
        self.at: list[float] = []

    def __call__(self, chunk: bytes) -> bool:
        self.taken.append(chunk)
        self.at.append(asyncio.get_running_loop().time())
        return chunk != self.stop_at


async def test_push_hands_each_chunk_to_the_sink_as_it_arrives() -> None:
    server = await chunked_server(b"ab", b"cd", b"ef")
    pool = ConnectionPool(connect_timeout=1)
    port = server.sockets[0].getsockname()[1]
    response = await pool.request(f"127.0.0.1:{port}", "POST", "/", b"", b"{}")
    sink = Sink()
    assert await response.push(sink, 2.0)
    assert b"".join(sink.taken) == b"abcdef"
    assert sink.at[-1] - sink.at[0] >= 0.08  # as they came, not all at the end
    response.close()
    pool.close()
    server.close()


async def test_the_chunks_of_one_read_reach_the_sink_together() -> None:
    """A relay handed the events that arrived together writes them on in one write."""

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n{}")
        chunks = b"".join(b"%x\r\n%b\r\n" % (len(p), p) for p in (b"ab", b"cd", b"ef"))
        writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n" + chunks)
        await writer.drain()
        await asyncio.sleep(0.1)
        writer.write(b"2\r\ngh\r\n0\r\n\r\n")
        await writer.drain()
        await reader.read()

    server = await loopback_server(serve)
    pool = ConnectionPool(connect_timeout=1)
    port = server.sockets[0].getsockname()[1]
    response = await pool.request(f"127.0.0.1:{port}", "POST", "/", b"", b"{}")
    sink = Sink()
    assert await response.push(sink, 2.0)
    assert sink.taken == [b"abcdef", b"gh"]
    response.close()
    pool.close()
    server.close()


async def test_a_sink_that_says_stop_gets_its_task_back_and_the_rest_reads_on() -> None:
    server = await chunked_server(b"ab", b"cd", b"ef")
    pool = ConnectionPool(connect_timeout=1)
    port = server.sockets[0].getsockname()[1]
    response = await pool.request(f"127.0.0.1:{port}", "POST", "/", b"", b"{}")
    sink = Sink(stop_at=b"ab")
    assert not await response.push(sink, 2.0)
    assert sink.taken == [b"ab"]
    rest = b"".join([chunk async for chunk in _chunks(response)])
    assert rest == b"cdef"
    response.close()
    pool.close()
    server.close()


async def _chunks(response: UpstreamResponse) -> AsyncIterator[bytes]:
    while chunk := await response.readany(2.0):
        yield chunk


async def test_what_the_sink_raises_is_raised_in_the_pushing_task() -> None:
    server = await chunked_server(b"ab", b"cd")
    pool = ConnectionPool(connect_timeout=1)
    port = server.sockets[0].getsockname()[1]
    response = await pool.request(f"127.0.0.1:{port}", "POST", "/", b"", b"{}")

    def sink(chunk: bytes) -> bool:
        raise ValueError(f"cannot take {chunk!r}")

    with pytest.raises(ValueError, match="cannot take"):
        await response.push(sink, 2.0)
    response.close()
    pool.close()
    server.close()


async def test_a_stalled_body_times_out_while_pushing() -> None:
    server = await chunked_server(b"ab", pause=5)
    pool = ConnectionPool(connect_timeout=1)
    port = server.sockets[0].getsockname()[1]
    response = await pool.request(f"127.0.0.1:{port}", "POST", "/", b"", b"{}")
    sink = Sink()
    with pytest.raises(TimeoutError):
        await response.push(sink, 0.3)
    assert sink.taken == [b"ab"]
    response.close()
    pool.close()
    server.close()


async def test_a_body_read_whole_stops_past_its_limit() -> None:
    server = await chunked_server(b"a" * 1000, b"b" * 1000, b"c" * 1000, pause=0.01)
    pool = ConnectionPool(connect_timeout=1)
    port = server.sockets[0].getsockname()[1]
    response = await pool.request(f"127.0.0.1:{port}", "POST", "/", b"", b"{}")
    with pytest.raises(UpstreamBodyTooLarge, match="over 1500 bytes"):
        await response.read(2.0, limit=1500)
    response.close()
    response = await pool.request(f"127.0.0.1:{port}", "POST", "/", b"", b"{}")
    assert len(await response.read(2.0, limit=3000)) == 3000  # at the limit: whole
    response.close()
    pool.close()
    server.close()


UNSOLICITED = b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\n"  # a head with no request


async def test_bytes_after_a_complete_response_retire_the_connection() -> None:
    # an upstream that sends more than the response it owed (buggy, or poisoning the pool):
    # reused, the connection would read the next request's answer as that extra's body
    up, server = await started(lambda n: OK + UNSOLICITED if n == 1 else OK)
    pool = ConnectionPool(connect_timeout=1)
    assert await call(pool, up) == b"{}"
    assert await call(pool, up) == b"{}"  # on a new connection
    assert (up.connections, up.requests) == (2, 2)
    pool.close()
    server.close()


async def test_bytes_an_idle_connection_receives_retire_it() -> None:
    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            await reader.readexactly(int(head.lower().split(b"content-length: ")[1][:1]))
            writer.write(OK)
            await asyncio.sleep(0.1)  # the connection is back in the pool by now
            writer.write(UNSOLICITED)

    server = await loopback_server(answer)
    up = Upstream(lambda n: OK, port=server.sockets[0].getsockname()[1])
    pool = ConnectionPool(connect_timeout=1)
    assert await call(pool, up) == b"{}"
    await asyncio.sleep(0.3)
    assert await call(pool, up) == b"{}"  # not read as the unsolicited message's body
    pool.close()
    server.close()


async def test_a_101_nobody_asked_for_fails_the_request() -> None:
    switched = b"HTTP/1.1 101 Switching Protocols\r\nupgrade: foo\r\nconnection: upgrade\r\n\r\n"
    up, server = await started(lambda n: switched + b"not HTTP any more")
    pool = ConnectionPool(connect_timeout=1)
    with pytest.raises(UpstreamConnectionError, match="switched protocols"):
        await call(pool, up)
    pool.close()
    server.close()


async def test_a_discarded_rest_keeps_the_connection_once_the_body_ends() -> None:
    """The client got what it needed (a stream's [DONE]); the body's end comes 50 ms later,
    or never: the connection is reused once it ends, and closed if it does not in time."""
    connections: list[int] = []

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connections.append(len(connections))
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            await reader.readexactly(int(head.split(b"content-length: ")[1].split(b"\r\n")[0]))
            writer.write(
                b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
                b"transfer-encoding: chunked\r\n\r\n8\r\ndata: x\n\r\n"
            )
            await writer.drain()
            if b"never" in head:
                await asyncio.sleep(3600)
            await asyncio.sleep(0.05)
            writer.write(b"6\r\n\ntail\n\r\n0\r\n\r\n")  # more of the body, then its end
            await writer.drain()

    server = await loopback_server(serve)
    address = f"127.0.0.1:{server.sockets[0].getsockname()[1]}"
    pool = ConnectionPool(connect_timeout=1)

    async def first_chunk_then_leave(path: str, within: float) -> None:
        response = await pool.request(address, "POST", path, b"", b"{}")
        assert await response.readany(idle=2) == b"data: x\n"
        response.discard_rest(within)
        response.close()  # the attempt is over: the connection waits for the body's end

    await first_chunk_then_leave("/ends", within=1.0)
    await asyncio.sleep(0.2)
    await first_chunk_then_leave("/ends", within=1.0)
    assert len(connections) == 1  # reused once the first body ended
    await asyncio.sleep(0.2)
    await first_chunk_then_leave("/never", within=0.1)
    await asyncio.sleep(0.3)
    await first_chunk_then_leave("/ends", within=1.0)
    assert len(connections) == 2  # the one whose body never ended was closed, not reused
    pool.close()
    server.close()
