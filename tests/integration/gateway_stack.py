"""A gateway in front of real simulated backends, for the integration tests."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path

from loadtest.harness.processes import KvgateProcess, backend_process, free_port, gateway_process
from tests.gateway.jwt_keys import Keys, make_keys

API_KEY = "sk-integration-acme"
OTHER_KEY = "sk-integration-beta"


@dataclass
class Stack:
    url: str
    backends: list[str]
    gateway: KvgateProcess
    backend_procs: list[KvgateProcess]
    keys: Keys
    log: Path


def one_upstream_policy(port: int) -> str:
    """A gateway policy routing model ``m`` to a scripted upstream on 127.0.0.1:``port``
    (a short first-byte timeout, the picker that reads no metrics)."""
    return f"""
pools: {{p: {{endpoints: [127.0.0.1:{port}]}}}}
routes: [{{model: m, pool: p}}]
timeouts: {{first_byte: 5s, idle: 10s}}
epp: {{picker: least-in-flight}}
"""


def stack_policy(backend_ports: list[int], jwks: Path, extra: str = "") -> str:
    endpoints = ", ".join(f"127.0.0.1:{p}" for p in backend_ports)
    acme = hashlib.sha256(API_KEY.encode()).hexdigest()
    beta = hashlib.sha256(OTHER_KEY.encode()).hexdigest()
    return f"""
listen: {{max_body: 256KiB, shutdown_grace: 10s}}
auth:
  api_keys:
    - {{sha256: {acme}, tenant: acme, name: acme-key}}
    - {{sha256: {beta}, tenant: beta, name: beta-key, models: [kvgate-sim]}}
  jwt:
    - {{issuer: "https://idp.test", audience: kvgate, jwks_file: {jwks},
        algorithms: [RS256, ES256], claims: {{tenant: org, class: tier}}}}
pools:
  sims: {{endpoints: [{endpoints}]}}
  renamed: {{model: kvgate-sim, endpoints: [{endpoints}]}}
routes:
  - {{model: kvgate-sim, pool: sims}}
  - {{model: public-alias, pool: renamed}}
timeouts: {{connect: 1s, first_byte: 10s, idle: 5s}}
retries: {{attempts: 2, backoff: 5ms}}
{extra}
"""


@contextmanager
def gateway_stack(
    directory: Path, *backend_args: str, backends: int = 2, extra: str = ""
) -> Iterator[Stack]:
    keys = make_keys(directory)
    ports = [free_port() for _ in range(backends)]
    with ExitStack() as stack:
        procs = [stack.enter_context(backend_process(p, *backend_args)) for p in ports]
        policy = directory / "policy.yaml"
        policy.write_text(stack_policy(ports, keys.jwks_path, extra))
        gw_port = free_port()
        log = directory / "gateway.log"
        gateway = stack.enter_context(gateway_process(str(policy), gw_port, log=str(log)))
        yield Stack(
            f"http://127.0.0.1:{gw_port}",
            [f"http://127.0.0.1:{p}" for p in ports],
            gateway,
            procs,
            keys,
            log,
        )
