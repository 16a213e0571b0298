"""What a request head says, read the way RFC 9112 asks of a server: its target in origin form,
the refusals llhttp leaves to its caller, its method, and the head again without an upgrade the
server does not make."""

from __future__ import annotations

import httptools
from multidict import CIMultiDict

_UPGRADE_HEADERS = (b"upgrade", b"http2-settings")  # dropped from a head whose upgrade is ignored
_METHODS = {m.encode(): m for m in ("GET", "POST", "PUT", "DELETE", "HEAD", "OPTIONS", "PATCH")}


def origin_form(target: bytes) -> bytes:
    """The path and query of an absolute-form request target (``http://host/v1/x?q``, as
    a client configured with a proxy sends it; RFC 9112 says a server must accept it);
    anything else as it is."""
    scheme, sep, rest = target.partition(b"://")
    if not sep or scheme.lower() not in (b"http", b"https"):
        return target
    ends = [at for at in (rest.find(b"/"), rest.find(b"?")) if at >= 0]
    if not ends:
        return b"/"
    path = rest[min(ends) :]
    return path if path.startswith(b"/") else b"/" + path


def framing_refusal(
    headers: CIMultiDict[str], parser: httptools.HttpRequestParser
) -> tuple[int, str] | None:
    """Why a request head must be refused where llhttp lets it through (RFC 9112): an
    HTTP/1.1 request without a Host header, or with more than one (a gateway and the server
    behind it could read different ones); a transfer coding other than ``chunked`` alone,
    which this server cannot undo before reading the body (501, as nginx answers)."""
    hosts = len(headers.getall("host", ()))
    if hosts > 1:
        return 400, "more than one Host header"
    if not hosts and parser.get_http_version() != "1.0":
        return 400, "an HTTP/1.1 request needs a Host header"
    if "transfer-encoding" in headers:
        codings = [
            coding.strip().lower()
            for value in headers.getall("transfer-encoding")
            for coding in value.split(",")
        ]
        if codings != ["chunked"]:
            return 501, f"transfer coding {', '.join(codings)!r} is not supported: only chunked"
    return None


def method_of(raw: bytes) -> str:
    """The request method as a string (the common ones without decoding)."""
    method = _METHODS.get(raw)
    return method if method is not None else raw.decode("latin-1")


def head_without_upgrade(
    parser: httptools.HttpRequestParser, url: bytes, headers: list[tuple[bytes, bytes]]
) -> bytes:
    """The head ``parser`` read, written again without its upgrade (``Upgrade``,
    ``HTTP2-Settings``, and those options of ``Connection``), to be parsed as a plain request."""
    version = parser.get_http_version().encode()
    lines = [parser.get_method() + b" " + url + b" HTTP/" + version + b"\r\n"]
    for name, value in headers:
        lower = name.lower()
        if lower in _UPGRADE_HEADERS:
            continue
        if lower == b"connection":  # keep its other options (close, keep-alive)
            options = [o.strip() for o in value.split(b",")]
            value = b", ".join(o for o in options if o and o.lower() not in _UPGRADE_HEADERS)
            if not value:
                continue
        lines.append(name + b": " + value + b"\r\n")
    return b"".join(lines) + b"\r\n"
