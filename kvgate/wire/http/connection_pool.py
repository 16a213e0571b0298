"""Idle upstream connections per endpoint, reused most recent first, and the one timer that
enforces every first-byte deadline (``kvgate.wire.http.client`` is the connection itself)."""

from __future__ import annotations

import asyncio
import ssl
import time

from kvgate.wire.http.client import UpstreamConnection, UpstreamConnectionError, UpstreamResponse


class ConnectionPool:
    """Idle connections per endpoint (``host:port``), reused most recent first. An address
    given a context by ``use_tls`` is dialled with TLS (its ``server_name`` checked)."""

    # a first-byte deadline is checked by one timer, set for the earliest deadline but no
    # sooner than this after it is set: timeouts fire up to this late, and heads awaited
    # together share a wake-up
    SWEEP = 0.05

    def __init__(self, *, connect_timeout: float, keepalive: float = 30.0) -> None:
        self.connect_timeout = connect_timeout
        self.keepalive = keepalive
        self._idle: dict[str, list[UpstreamConnection]] = {}
        self._deadlines: dict[UpstreamConnection, float] = {}  # waiting for a response head
        self._timer: asyncio.TimerHandle | None = None
        self._tls: dict[str, tuple[ssl.SSLContext, str]] = {}  # address -> (context, name)

    def use_tls(self, address: str, context: ssl.SSLContext, server_name: str = "") -> None:
        """Dial ``address`` with TLS from now on; ``server_name``: the name its certificate
        must carry (default: the address's host)."""
        self._tls[address] = (context, server_name or address.rpartition(":")[0].strip("[]"))

    def watch(self, conn: UpstreamConnection, deadline: float) -> None:
        self._deadlines[conn] = deadline
        if self._timer is None or deadline < self._timer.when():
            self._set_timer(deadline)  # the first awaited head, or one due sooner

    @property
    def sweeping(self) -> bool:
        """Whether a timer is set for a first-byte deadline (only while some head is awaited,
        and then one timer, for the earliest)."""
        return self._timer is not None

    def unwatch(self, conn: UpstreamConnection) -> None:
        self._deadlines.pop(conn, None)
        if not self._deadlines and self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _set_timer(self, at: float) -> None:
        """The timer for a deadline at ``at``, unless one is set for sooner."""
        loop = asyncio.get_running_loop()
        at = max(at, loop.time() + self.SWEEP)
        if self._timer is not None:
            if at >= self._timer.when():
                return
            self._timer.cancel()
        self._timer = loop.call_at(at, self._expire)

    def _expire(self) -> None:
        """Fail the heads whose deadline has passed; set the timer for the next deadline, or
        none when no head is awaited (an idle pool wakes nothing)."""
        self._timer = None
        now = asyncio.get_running_loop().time()
        for conn, deadline in list(self._deadlines.items()):
            if now >= deadline:
                del self._deadlines[conn]
                conn.expire_head()
        if self._deadlines:
            self._set_timer(min(self._deadlines.values()))

    async def request(
        self,
        address: str,
        method: str,
        path: str,
        headers: bytes,
        body: bytes,
        *,
        first_byte: float | None = None,
    ) -> UpstreamResponse:
        """Send the request and wait for the response headers: TimeoutError after
        ``connect_timeout`` connecting, or ``first_byte`` seconds waiting for the response.

        ``headers``: the header lines, encoded (``header_block`` makes them from pairs); the
        pool adds host and content-length."""
        start = f"{method} {path} HTTP/1.1\r\nhost: {address}\r\n".encode("latin-1")
        message = b"".join([start, headers, b"content-length: %d\r\n\r\n" % len(body), body])
        conn = self._take(address)
        if conn is not None:
            try:
                return await conn.start(message, first_byte)
            except UpstreamConnectionError:
                conn.abort()
                if conn.answered:
                    raise
                # the upstream closed this kept-alive connection before reading it: once more
            except BaseException:  # timed out or cancelled: the upstream must stop too
                conn.abort()
                raise
        conn = await self._connect(address)
        try:
            return await conn.start(message, first_byte)
        except BaseException:
            conn.abort()
            raise

    def _take(self, address: str) -> UpstreamConnection | None:
        idle = self._idle.get(address)
        now = time.monotonic()
        while idle:
            conn = idle.pop()
            if not conn.lost and now - conn.idle_since < self.keepalive:
                return conn
            conn.abort()
        return None

    async def _connect(self, address: str) -> UpstreamConnection:
        host, _, port = address.rpartition(":")
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(self.connect_timeout):
                context, name = self._tls.get(address, (None, None))
                _, conn = await loop.create_connection(
                    lambda: UpstreamConnection(self, address),
                    host.strip("[]"),
                    int(port),
                    ssl=context,
                    server_hostname=name,
                )
        except OSError as exc:  # ssl.SSLError (a failed handshake) is an OSError
            raise UpstreamConnectionError(f"cannot connect to {address}: {exc}") from exc
        return conn

    def put_back(self, conn: UpstreamConnection) -> None:
        conn.idle_since = time.monotonic()
        self._idle.setdefault(conn.key, []).append(conn)

    def forget(self, conn: UpstreamConnection) -> None:
        idle = self._idle.get(conn.key)
        if idle and conn in idle:
            idle.remove(conn)

    def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        for idle in self._idle.values():
            for conn in idle:
                conn.abort()
        self._idle.clear()
