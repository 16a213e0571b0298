"""The drop-in proxy through a real gateway: the APIs, bodies, headers, TLS, clients at the edges."""
