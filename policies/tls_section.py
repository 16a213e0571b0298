"""``listen.tls`` and a pool's ``tls:``: certificate files, relative to the policy's folder,
checked to exist when the policy loads (the loader names the field of a missing one)."""

from __future__ import annotations

from pathlib import Path

from policies.fields import Fields, child
from policies.schema import ClientTls, ServerTls


def _file(f: Fields, key: str, base_dir: Path) -> str | None:
    value = f.opt_str(key)
    if value is None:
        return None
    file = Path(value) if Path(value).is_absolute() else base_dir / value
    if not file.is_file():
        f.error(child(f.path, key), f"no such file: {file}")
    return str(file)


def load_server_tls(parent: Fields, base_dir: Path) -> ServerTls | None:
    """``listen.tls: {cert, key, client_ca}``; None when absent."""
    if not parent.has("tls"):
        return None
    f = parent.sub("tls", {"cert", "key", "client_ca"})
    for required in ("cert", "key"):
        if not f.has(required):
            f.error(child(f.path, required), "is required (a PEM file)")
    cert = _file(f, "cert", base_dir) or ""
    key = _file(f, "key", base_dir) or ""
    return ServerTls(cert, key, _file(f, "client_ca", base_dir))


def load_client_tls(parent: Fields, base_dir: Path) -> ClientTls:
    """A pool's ``tls: {ca, cert, key, insecure_skip_verify, server_name}``."""
    f = parent.sub("tls", {"ca", "cert", "key", "insecure_skip_verify", "server_name"})
    cert = _file(f, "cert", base_dir)
    key = _file(f, "key", base_dir)
    if (cert is None) != (key is None):
        f.error(f.path, "cert and key go together (the client certificate for mutual TLS)")
    return ClientTls(
        ca=_file(f, "ca", base_dir),
        cert=cert,
        key=key,
        insecure_skip_verify=f.flag("insecure_skip_verify", False),
        server_name=f.opt_str("server_name"),
    )
