"""Who the client is, and the ``X-Forwarded-*`` headers the gateway sends upstream.

The connection's peer is the client unless it is one of ``listen.trusted_proxies``: then the
client is the rightmost ``X-Forwarded-For`` entry that is not itself a trusted proxy (as
nginx's ``real_ip_recursive``). A client can write anything into ``X-Forwarded-For``, so its
entries are believed only through trusted hops. Upstream, the peer is always appended to the
chain (``X-Forwarded-For: <chain>, <peer>``), and ``X-Forwarded-Proto`` is the scheme the
client used: a trusted proxy's value is kept, anyone else's replaced.
"""

from __future__ import annotations

import ipaddress

from multidict import CIMultiDict

from kvgate.wire.http.messages import header_line

Network = ipaddress.IPv4Network | ipaddress.IPv6Network


def is_loopback(host: str) -> bool:
    """Whether ``host`` (an address, or ``localhost``) is this machine's loopback."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def forwarded_chain(headers: CIMultiDict[str]) -> str | None:
    """The client's ``X-Forwarded-For`` chain (several headers joined, as RFC 9110 allows)."""
    values = headers.getall("x-forwarded-for", None)
    if not values:
        return None
    return values[0] if len(values) == 1 else ", ".join(values)


class ClientAddress:
    """Resolves each request's client address from its peer and ``X-Forwarded-For``."""

    __slots__ = ("_trusted", "scheme")

    def __init__(self, trusted: tuple[str, ...] = (), scheme: str = "http") -> None:
        """``trusted``: addresses or CIDR networks (checked by the policy loader); ``scheme``:
        the listener's own (``https`` with TLS), sent upstream unless a trusted proxy says."""
        self._trusted: tuple[Network, ...] = tuple(
            ipaddress.ip_network(value, strict=False) for value in trusted
        )
        self.scheme = scheme

    def is_trusted(self, address: str) -> bool:
        if not self._trusted or not address:
            return False
        try:
            ip = ipaddress.ip_address(address)
        except ValueError:
            return False
        return any(ip in network for network in self._trusted)

    def client(self, peer: str, chain: str | None) -> str:
        """The client's address: ``peer``, or through trusted proxies the chain's entry."""
        if not chain or not self.is_trusted(peer):
            return peer
        entries = [e.strip() for e in chain.split(",") if e.strip()]
        for entry in reversed(entries):
            if not self.is_trusted(entry):
                return entry
        return entries[0] if entries else peer

    def upstream_lines(self, peer: str, chain: str | None, proto: str | None) -> bytes:
        """The ``X-Forwarded-For`` and ``X-Forwarded-Proto`` lines sent upstream."""
        forwarded_for = f"{chain}, {peer}" if chain else peer
        if proto is None or not self.is_trusted(peer):
            proto = self.scheme
        return header_line(b"x-forwarded-for", forwarded_for) + header_line(
            b"x-forwarded-proto", proto
        )
