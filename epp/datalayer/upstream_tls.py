"""The TLS each ``https://`` endpoint of a policy is dialled with, from its pool's ``tls:``
(one client context per pool), for the gateway's requests and the picker's scrapes alike."""

from __future__ import annotations

import logging
import ssl

from kvgate.wire.http.tls import client_context
from policies.schema import Policy

log = logging.getLogger("kvgate.tls")


def upstream_tls(policy: Policy) -> dict[str, tuple[ssl.SSLContext, str]]:
    """Address of each ``https://`` endpoint -> (client context, the name its certificate
    must carry: "" for the address's host)."""
    dialled: dict[str, tuple[ssl.SSLContext, str]] = {}
    for pool in policy.pools.values():
        https = [e for e in pool.endpoints if e.tls]
        if not https:
            continue
        tls = pool.tls
        if tls.insecure_skip_verify:
            log.warning(
                "pool %s: insecure_skip_verify is set: its endpoints' certificates are not "
                "checked, and anyone on the path can read and change its traffic",
                pool.name,
            )
        context = client_context(tls.ca, tls.cert, tls.key, verify=not tls.insecure_skip_verify)
        for endpoint in https:
            dialled[endpoint.address] = (context, tls.server_name or "")
    return dialled
