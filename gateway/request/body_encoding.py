"""Request bodies sent with a ``Content-Encoding``: decoded before the gateway reads them.

``gzip`` and ``deflate`` always (zlib), ``br`` when the ``brotli`` package is installed,
``zstd`` when ``zstandard`` is; several codings apply in the order listed (decoded in reverse).
The decoded size is bounded by ``listen.max_body_bytes`` while decoding, so a small compressed body
that expands past it (a zip bomb) is refused with 413 after reading at most that many bytes.
A body that does not decode as its header says gets 400; an unknown coding 415. The gateway
forwards the decoded body and never the header, so upstreams always get what it read.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable
from importlib import import_module

from gateway.base.errors import BadRequest, BodyTooLarge, UnsupportedEncoding
from kvgate.wire.openai_errors import body_too_large

Decoder = Callable[[bytes, int], bytes]  # (data, limit) -> decoded; raises on bad data


def _zlib(wbits: int) -> Decoder:
    def decode(data: bytes, limit: int) -> bytes:
        decompressor = zlib.decompressobj(wbits)
        out = decompressor.decompress(data, limit + 1)
        if len(out) > limit:
            raise BodyTooLarge(body_too_large(limit))
        if not decompressor.eof:
            raise zlib.error("truncated stream")
        return out

    return decode


def _deflate(data: bytes, limit: int) -> bytes:
    """HTTP's ``deflate`` is zlib-wrapped; some clients send it raw."""
    try:
        return _zlib(zlib.MAX_WBITS)(data, limit)
    except zlib.error:
        return _zlib(-zlib.MAX_WBITS)(data, limit)


def _brotli() -> Decoder | None:
    try:
        brotli = import_module("brotli")
    except ImportError:
        return None

    def decode(data: bytes, limit: int) -> bytes:
        decompressor = brotli.Decompressor()
        out: bytes = decompressor.process(data, output_buffer_limit=limit + 1)
        if len(out) > limit:
            raise BodyTooLarge(body_too_large(limit))
        return out

    return decode


def _zstd() -> Decoder | None:
    try:
        zstandard = import_module("zstandard")
    except ImportError:
        return None

    def decode(data: bytes, limit: int) -> bytes:
        out: bytes = zstandard.ZstdDecompressor().decompressobj().decompress(data)
        if len(out) > limit:
            raise BodyTooLarge(body_too_large(limit))
        return out

    return decode


DECODERS: dict[str, Decoder] = {
    "gzip": _zlib(16 + zlib.MAX_WBITS),
    "x-gzip": _zlib(16 + zlib.MAX_WBITS),
    "deflate": _deflate,
}
for _name, _make in (("br", _brotli), ("zstd", _zstd)):
    _decoder = _make()
    if _decoder is not None:
        DECODERS[_name] = _decoder


def decode_body(body: bytes, content_encoding: str, limit: int) -> bytes:
    """``body`` with every coding of ``content_encoding`` undone, at most ``limit`` bytes."""
    codings = [c.strip().lower() for c in content_encoding.split(",") if c.strip()]
    for coding in reversed(codings):
        if coding == "identity":
            continue
        decoder = DECODERS.get(coding)
        if decoder is None:
            supported = ", ".join(["identity", *DECODERS])
            raise UnsupportedEncoding(
                f"Content-Encoding {coding!r} is not supported; send one of: {supported}"
            )
        try:
            body = decoder(body, limit)
        except BodyTooLarge:
            raise
        except Exception as exc:  # zlib.error, brotli.error, zstandard.ZstdError
            raise BadRequest(
                f"the request body is not valid {coding} as its Content-Encoding says: {exc}"
            ) from exc
    return body
