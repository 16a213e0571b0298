"""``listen.tls``, ``https://`` endpoints and a pool's ``tls:`` in the policy: files relative to
the policy's folder, and errors naming the field."""

from __future__ import annotations

from pathlib import Path

import pytest

from epp.scheduling.registry import CATALOG
from policies.errors import PolicyError
from policies.loader import load_policy_text

ROUTES = "routes: [{model: m, pool: a}]\n"


def load(text: str, base: Path) -> object:
    return load_policy_text(text, plugins=CATALOG, base_dir=base)


def test_files_are_found_next_to_the_policy(tmp_path: Path) -> None:
    for name in ("server.pem", "server-key.pem", "ca.pem"):
        (tmp_path / name).write_text("PEM")
    policy = load_policy_text(
        "listen: {tls: {cert: server.pem, key: server-key.pem, client_ca: ca.pem}}\n"
        "pools: {a: {endpoints: [https://10.0.0.1:8443, 10.0.0.2:8000], "
        "tls: {ca: ca.pem, server_name: vllm.internal}}}\n" + ROUTES,
        plugins=CATALOG,
        base_dir=tmp_path,
    )
    tls = policy.listen.tls
    assert tls is not None and tls.cert == str(tmp_path / "server.pem")
    assert tls.client_ca == str(tmp_path / "ca.pem")
    secure, plain = policy.pools["a"].endpoints
    assert (secure.address, secure.tls, secure.url) == (
        "10.0.0.1:8443",
        True,
        "https://10.0.0.1:8443",
    )
    assert (plain.tls, plain.url) == (False, "http://10.0.0.2:8000")
    assert policy.pools["a"].tls.server_name == "vllm.internal"
    assert not policy.pools["a"].tls.insecure_skip_verify


@pytest.mark.parametrize(
    ("text", "error"),
    [
        (
            "listen: {tls: {cert: missing.pem, key: missing.pem}}\npools: {a: {endpoints: [h:1]}}\n",
            "listen.tls.cert (line 1): no such file: ",
        ),
        (
            "listen: {tls: {key: k.pem}}\npools: {a: {endpoints: [h:1]}}\n",
            "listen.tls.cert (line 1): is required (a PEM file)",
        ),
        (
            "pools: {a: {endpoints: [ftp://h:1]}}\n",
            "pools.a.endpoints[0].address (line 1): must be host:port, http:// or https://",
        ),
        (
            "pools: {a: {endpoints: [h:1], tls: {cert: k.pem}}}\n",
            "pools.a.tls (line 1): cert and key go together",
        ),
        (
            "pools: {a: {endpoints: [h:1], tls: {verify: false}}}\n",
            "pools.a.tls.verify (line 1): unknown field",
        ),
    ],
)
def test_errors_name_the_field(tmp_path: Path, text: str, error: str) -> None:
    (tmp_path / "k.pem").write_text("PEM")
    with pytest.raises(PolicyError) as err:
        load(text + ROUTES, tmp_path)
    assert any(e.startswith(error) for e in err.value.errors), err.value.errors
