"""Request and response objects of kvgate's own HTTP/1.1 server (``kvgate.wire.http.server``).

They carry only what the gateway reads: method, path, headers (case-insensitive), the whole
body, and per-request state (``ctx``). A handler returns a ``Response`` (written by the server
with a content-length) or a ``StreamResponse`` it has already written itself (chunked).
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from email.utils import formatdate
from http import HTTPStatus
from typing import Any, Protocol

import orjson
from aiohttp import web
from multidict import CIMultiDict


class Connection(Protocol):
    """What a response writes to: the server's connection (``server.Connection``)."""

    peer: str  # the client's address ("" when unknown)

    def write(self, data: bytes) -> None:
        """Queue ``data`` on the transport (never blocks)."""
        ...

    async def drain(self) -> None:
        """Wait while the transport's write buffer is over its high-water mark."""
        ...

    @property
    def must_drain(self) -> bool:
        """Whether a writer should ``drain`` before writing more (the buffer is over its
        high-water mark, or the client has gone: then ``drain`` raises)."""
        ...


_REASONS = {status.value: status.phrase for status in HTTPStatus}
_REASONS[499] = "Client Closed Request"


_STATUS_LINES = {
    code: f"HTTP/1.1 {code} {phrase}\r\n".encode("latin-1") for code, phrase in _REASONS.items()
}


class _DateLine:
    """The ``date:`` header line (RFC 9110 wants one on every response from a server with a
    clock), formatted once a second."""

    __slots__ = ("line", "second")

    def __init__(self) -> None:
        self.second = -1
        self.line = b""

    def current(self) -> bytes:
        now = int(time.time())
        if now != self.second:
            self.second = now
            self.line = b"date: " + formatdate(now, usegmt=True).encode("latin-1") + b"\r\n"
        return self.line


_DATE = _DateLine()


def _status_line(status: int) -> bytes:
    return _STATUS_LINES.get(status) or f"HTTP/1.1 {status} Unknown\r\n".encode("latin-1")


def header_block(headers: Iterable[tuple[str, str]]) -> bytes:
    """Header lines as sent (``name: value`` and CRLF each)."""
    return "".join([f"{name}: {value}\r\n" for name, value in headers]).encode("latin-1")


def header_line(name: bytes, value: str) -> bytes:
    """One header line as sent (``name: value`` and CRLF)."""
    return b"%b: %b\r\n" % (name, value.encode("latin-1"))


def head_bytes(
    status: int, headers: list[tuple[str, str]], framing: bytes, block: bytes = b""
) -> bytes:
    """The status line, the date, ``block`` (header lines already encoded), ``headers``, then
    ``framing`` (content-length or transfer-encoding) and the blank line."""
    lines = header_block(headers) if headers else b""
    return b"".join([_status_line(status), _DATE.current(), block, lines, framing, b"\r\n"])


def header_size(headers: list[tuple[bytes, bytes]]) -> int:
    """Bytes of these headers as sent (each ``name: value`` and CRLF)."""
    return sum([len(name) + len(value) + 4 for name, value in headers])


class Request:
    """One parsed request; ``app`` is the application whose state the handlers read."""

    __slots__ = (
        "_connection",
        "app",
        "body",
        "headers",
        "keep_alive",
        "method",
        "path",
        "query",
        "raw_headers",
        "version",
    )

    def __init__(
        self,
        method: str,
        target: bytes,
        headers: CIMultiDict[str],
        raw_headers: list[tuple[bytes, bytes]],
        body: bytes,
        version: str,
        keep_alive: bool,
        app: web.Application,
        connection: Connection | None = None,
    ) -> None:
        path, _, query = target.partition(b"?")
        self.method = method
        self.path = path.decode("latin-1")
        self.query = query.decode("latin-1")
        self.headers = headers  # case-insensitive; handlers only read it
        self.raw_headers = raw_headers  # name/value pairs as sent (what is forwarded upstream)
        self.body = body
        self.version = version
        self.keep_alive = keep_alive
        self.app = app
        self._connection = connection

    @property
    def peer(self) -> str:
        """The connection's peer address ("" for a request not read from a socket)."""
        return self._connection.peer if self._connection is not None else ""

    @property
    def connection(self) -> Connection:
        if self._connection is None:
            raise RuntimeError("this request is not attached to a connection")
        return self._connection


HeaderItems = Mapping[str, str] | Iterable[tuple[str, str]] | None


def header_list(headers: HeaderItems) -> list[tuple[str, str]]:
    """Headers as a list of (name, value) pairs; a list is taken as it is (not copied)."""
    if headers is None:
        return []
    if isinstance(headers, list):
        return headers
    if isinstance(headers, Mapping):
        return list(headers.items())
    return list(headers)


def set_header(headers: list[tuple[str, str]], name: str, value: str) -> None:
    """Replace every ``name`` header (case-insensitively) with one ``value``."""
    lowered = name.lower()
    headers[:] = [(k, v) for k, v in headers if k.lower() != lowered]
    headers.append((name, value))


class Response:
    """A whole response; the server adds content-length. ``headers`` is a list of pairs (no
    case-insensitive mapping is built per response: use ``set_header`` to replace one);
    ``block``: more header lines, already encoded (a proxied upstream's, passed on as bytes),
    sent before them."""

    __slots__ = ("block", "body", "headers", "status")
    prepared = False

    def __init__(
        self,
        body: bytes = b"",
        *,
        status: int = 200,
        headers: HeaderItems = None,
        content_type: str | None = None,
        block: bytes = b"",
    ) -> None:
        self.status = status
        self.body = body
        self.headers = header_list(headers)
        self.block = block
        if content_type is not None:
            set_header(self.headers, "content-type", content_type)

    def head(self, keep_alive: bool) -> bytes:
        framing = b"content-length: %d\r\n" % len(self.body)
        if not keep_alive:
            framing = b"connection: close\r\n" + framing
        return head_bytes(self.status, self.headers, framing, self.block)


def json_response(
    data: Any, *, status: int = 200, headers: Mapping[str, str] | None = None
) -> Response:
    body = orjson.dumps(data)
    return Response(body, status=status, headers=headers, content_type="application/json")


class StreamResponse:
    """A response written piece by piece: ``prepare``, ``write``..., ``write_eof``.

    HTTP/1.1 clients get chunked transfer encoding; HTTP/1.0 clients get the body up to the
    connection's close. With ``length`` (a body whose size is known ahead, as an upstream's
    ``Content-Length`` says) every client gets that ``Content-Length`` and the body as it is.
    With ``copy`` a list, every piece of the body written is appended to it too, up to
    ``copy_limit`` bytes: past them the copy is cleared and ``copy`` becomes None.
    """

    __slots__ = (
        "_chunked",
        "_connection",
        "_copied",
        "block",
        "copy",
        "copy_limit",
        "finished",
        "headers",
        "length",
        "prepared",
        "status",
    )

    def __init__(
        self,
        *,
        status: int = 200,
        headers: HeaderItems = None,
        block: bytes = b"",
        length: int | None = None,
    ) -> None:
        self.status = status
        self.length = length
        self.headers = header_list(headers)
        self.block = block  # header lines already encoded, sent before ``headers``
        self.prepared = False
        self.finished = False
        self.copy: list[bytes] | None = None
        self.copy_limit = 0
        self._copied = 0
        self._connection: Connection | None = None
        self._chunked = True

    async def prepare(self, request: Request) -> None:
        connection = request.connection
        self._connection = connection
        if self.length is not None:
            self._chunked = False
            framing = b"content-length: %d\r\n" % self.length
        else:
            self._chunked = request.version != "1.0"
            framing = b"transfer-encoding: chunked\r\n" if self._chunked else b""
        if not request.keep_alive or not (self._chunked or self.length is not None):
            framing = b"connection: close\r\n" + framing
            request.keep_alive = False
        connection.write(head_bytes(self.status, self.headers, framing, self.block))
        self.prepared = True

    async def write(self, data: bytes) -> None:
        if not data or self.write_now(data):
            return
        await self._require().drain()

    def write_now(self, data: bytes) -> bool:
        """Queue ``data`` without waiting; False when the writer should ``drain`` before
        writing more."""
        connection = self._require()
        if data:
            if self.copy is not None:
                self._keep_copy(data)
            if self._chunked:
                connection.write(b"%x\r\n%b\r\n" % (len(data), data))
            else:
                connection.write(data)
        return not connection.must_drain

    async def drain(self) -> None:
        """Wait until the client has read enough of what was written (``ConnectionResetError``
        if it has gone)."""
        await self._require().drain()

    async def finish(self, data: bytes) -> None:
        """``data`` and the end of the body in one write: a client that stops reading at the
        stream's last event (``[DONE]``) then finds the body complete and can reuse the
        connection; sent apart, the end often comes after the client gave up on it and
        closed the connection."""
        if self.finished:
            return
        connection = self._require()
        self.write_last(data)
        await connection.drain()

    def write_last(self, data: bytes) -> None:
        """``data`` and the end of the body, without waiting for the client to read them (the
        connection is about to close)."""
        if self.finished or self._connection is None:
            return
        self.finished = True
        if self.copy is not None and data:
            self._keep_copy(data)
        if not self._chunked:
            self._connection.write(data)
        elif data:
            self._connection.write(b"%x\r\n%b\r\n0\r\n\r\n" % (len(data), data))
        else:  # an empty chunk would itself end the body
            self._connection.write(b"0\r\n\r\n")

    def _keep_copy(self, data: bytes) -> None:
        copy = self.copy
        assert copy is not None
        self._copied += len(data)
        if self._copied > self.copy_limit:
            copy.clear()
            self.copy = None
        else:
            copy.append(data)

    async def write_eof(self) -> None:
        if self.finished:
            return
        self.finished = True
        if self._chunked:
            self._require().write(b"0\r\n\r\n")

    def cut(self, request: Request) -> None:
        """End the response without ending its body, and the connection after it: the client
        sees the body cut short (a body with no room for an error of its own). An HTTP/1.0
        client, whose body ends at the close, cannot tell."""
        self.finished = True
        request.keep_alive = False

    def _require(self) -> Connection:
        if self._connection is None:
            raise RuntimeError("prepare() the stream response before writing")
        return self._connection


AnyResponse = Response | StreamResponse
