"""TLS contexts for kvgate's listeners and upstream connections, and certificate reloading.

A server context serves a certificate chain and, given a client CA, requires client certificates
signed by it (mutual TLS). A client context verifies the server against the system's CAs or a
given CA file, optionally presents a client certificate, and with ``verify=False`` checks nothing
(``insecure_skip_verify``: for tests and trusted networks only).

``CertificateReloader`` loads a changed certificate and key into the same server context, so the
handshakes after a certificate rotation use the new one while open connections keep theirs.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import ssl

log = logging.getLogger("kvgate.tls")


def server_context(cert: str, key: str, client_ca: str | None = None) -> ssl.SSLContext:
    """A TLS 1.2+ server context for ``cert``/``key`` (PEM); with ``client_ca``, clients must
    present a certificate it signed."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_cert_chain(cert, key)
    if client_ca is not None:
        context.load_verify_locations(cafile=client_ca)
        context.verify_mode = ssl.CERT_REQUIRED
    return context


def client_context(
    ca: str | None = None,
    cert: str | None = None,
    key: str | None = None,
    *,
    verify: bool = True,
) -> ssl.SSLContext:
    """A TLS 1.2+ client context: servers verified against ``ca`` (else the system's CAs)
    unless not ``verify``; ``cert``/``key``: the client certificate for mutual TLS."""
    context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=ca)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    if not verify:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    if cert is not None:
        context.load_cert_chain(cert, key)
    return context


class CertificateReloader:
    """Watches a server context's certificate and key files and loads them again when either
    changes (a file that cannot be loaded leaves the previous certificate in place)."""

    def __init__(self, context: ssl.SSLContext, cert: str, key: str, interval: float = 2.0):
        self.context = context
        self.cert = cert
        self.key = key
        self.interval = interval
        self.reloads = 0
        self._seen = self._stamp()
        self._task: asyncio.Task[None] | None = None

    def _stamp(self) -> tuple[float, float]:
        try:
            return os.stat(self.cert).st_mtime, os.stat(self.key).st_mtime
        except OSError:
            return 0.0, 0.0

    def check(self) -> bool:
        """Load the files again if they changed since the last look; True if loaded."""
        stamp = self._stamp()
        if stamp == self._seen or stamp == (0.0, 0.0):
            return False
        self._seen = stamp
        try:
            self.context.load_cert_chain(self.cert, self.key)
        except (OSError, ssl.SSLError) as exc:
            log.error(
                "cannot load the new certificate %s: %s (keeping the old one)", self.cert, exc
            )
            return False
        self.reloads += 1
        log.info("loaded the new certificate %s", self.cert)
        return True

    def start(self) -> None:
        self._task = asyncio.create_task(self._watch())

    async def _watch(self) -> None:
        while True:
            await asyncio.sleep(self.interval)
            self.check()

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
