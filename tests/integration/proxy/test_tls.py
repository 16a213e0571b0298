"""TLS on every hop, with certificates the tests make and real TLS servers on
loopback: clients to the gateway (and mutual TLS, and a rotated certificate), the gateway and
its embedded picker to https:// backends, and the picker's gRPC port."""

from __future__ import annotations

import shutil
import socket
import ssl
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import openai
import pytest
from cryptography import x509
from grpc_health.v1 import health_pb2, health_pb2_grpc

from kvgate.wire.http.tls import client_context
from loadtest.harness.processes import KvgateProcess, backend_process, epp_process, free_port
from loadtest.harness.tls_certs import CertificateAuthority, Pem


@pytest.fixture
def ca(tmp_path: Path) -> CertificateAuthority:
    return CertificateAuthority(tmp_path)


@pytest.fixture
def started() -> Iterator[list[KvgateProcess]]:
    processes: list[KvgateProcess] = []
    yield processes
    for process in processes:
        process.stop()


def tls_backend(ca: CertificateAuthority, started: list[KvgateProcess]) -> str:
    """A simulated backend serving HTTPS with a certificate ``ca`` signed: its address."""
    pem = ca.issue("backend")
    port = free_port()
    proc = backend_process(
        port, "--cost", "zero", "--ssl-certfile", pem.cert, "--ssl-keyfile", pem.key
    )
    proc.health_url = f"https://127.0.0.1:{port}/health"
    proc.health_tls = client_context(ca.path)
    started.append(proc.start())
    return f"127.0.0.1:{port}"


def start_tls_gateway(
    tmp_path: Path,
    policy: str,
    started: list[KvgateProcess],
    health_tls: ssl.SSLContext,
) -> tuple[str, str]:
    """A gateway on ``policy`` (which sets listen.tls): its https URL and its log file."""
    path = tmp_path / f"policy-{len(started)}.yaml"
    path.write_text(policy)
    port = free_port()
    log = str(tmp_path / f"gateway-{len(started)}.log")
    args = ["gateway", "--policy", str(path), "--host", "127.0.0.1", "--port", str(port)]
    health = f"https://127.0.0.1:{port}/healthz"
    started.append(KvgateProcess(args, health, log=log, health_tls=health_tls).start())
    return f"https://127.0.0.1:{port}", log


def listen_tls(server: Pem, client_ca: str | None = None) -> str:
    extra = f", client_ca: {client_ca}" if client_ca else ""
    return f"listen: {{tls: {{cert: {server.cert}, key: {server.key}{extra}}}}}"


def complete(url: str, http_client: openai.DefaultHttpxClient) -> str:
    with openai.OpenAI(base_url=f"{url}/v1", api_key="k", http_client=http_client) as client:
        done = client.completions.create(model="kvgate-sim", prompt="hello", max_tokens=4)
    assert done.usage is not None and done.usage.completion_tokens == 4
    return done.choices[0].text


def serial_seen(port: int, ca: str) -> int:
    """The serial number of the certificate a new connection to ``port`` is shown."""
    context = client_context(ca)
    with (
        socket.create_connection(("127.0.0.1", port), timeout=5) as raw,
        context.wrap_socket(raw, server_hostname="127.0.0.1") as tls,
    ):
        der = tls.getpeercert(binary_form=True)
    assert der is not None
    return x509.load_der_x509_certificate(der).serial_number


def test_https_end_to_end_and_a_rotated_certificate(
    tmp_path: Path, ca: CertificateAuthority, started: list[KvgateProcess]
) -> None:
    backend = tls_backend(ca, started)
    server = ca.issue("gateway")
    live = Pem(str(tmp_path / "live.pem"), str(tmp_path / "live-key.pem"))
    shutil.copy(server.cert, live.cert)
    shutil.copy(server.key, live.key)
    url, _ = start_tls_gateway(
        tmp_path,
        f"""
{listen_tls(live)}
pools: {{p: {{endpoints: ["https://{backend}"], tls: {{ca: {ca.path}}}}}}}
routes: [{{model: kvgate-sim, pool: p}}]
""",
        started,
        client_context(ca.path),
    )
    # the official client over HTTPS; the gateway dials the backend (and the embedded picker
    # scrapes it) over HTTPS too, verified against the CA
    assert complete(url, openai.DefaultHttpxClient(verify=client_context(ca.path)))
    with pytest.raises(openai.APIConnectionError):  # the CA is not the system's
        complete(url, openai.DefaultHttpxClient())
    port = int(url.rsplit(":", 1)[1])
    with socket.create_connection(("127.0.0.1", port), timeout=5) as plain:
        plain.sendall(b"GET /healthz HTTP/1.1\r\nhost: x\r\n\r\n")
        assert not plain.recv(100).startswith(b"HTTP/1.1 200")  # no plaintext on a TLS port
    first = serial_seen(port, ca.path)
    rotated = ca.issue("gateway-rotated")
    shutil.copy(rotated.key, live.key)
    shutil.copy(rotated.cert, live.cert)
    deadline = time.monotonic() + 10
    while serial_seen(port, ca.path) == first and time.monotonic() < deadline:
        time.sleep(0.2)
    assert serial_seen(port, ca.path) != first  # new connections get the new certificate
    assert complete(url, openai.DefaultHttpxClient(verify=client_context(ca.path)))


def test_mutual_tls_refuses_clients_without_a_certificate(
    tmp_path: Path, ca: CertificateAuthority, started: list[KvgateProcess]
) -> None:
    backend = tls_backend(ca, started)
    client = ca.issue("client", server=False)
    url, _ = start_tls_gateway(
        tmp_path,
        f"""
{listen_tls(ca.issue("gateway"), client_ca=ca.path)}
pools: {{p: {{endpoints: ["https://{backend}"], tls: {{ca: {ca.path}}}}}}}
routes: [{{model: kvgate-sim, pool: p}}]
""",
        started,
        client_context(ca.path, client.cert, client.key),
    )
    assert complete(
        url, openai.DefaultHttpxClient(verify=client_context(ca.path, client.cert, client.key))
    )
    with pytest.raises(openai.APIConnectionError):
        complete(url, openai.DefaultHttpxClient(verify=client_context(ca.path)))


def test_an_upstream_certificate_that_fails_verification_is_never_used(
    tmp_path: Path, ca: CertificateAuthority, started: list[KvgateProcess]
) -> None:
    backend = tls_backend(ca, started)
    (tmp_path / "other").mkdir()
    stranger = CertificateAuthority(tmp_path / "other", "other CA")
    policy = f"""
{listen_tls(ca.issue("gateway"))}
pools: {{p: {{endpoints: ["https://{backend}"], tls: {{ca: {stranger.path}}}}}}}
routes: [{{model: kvgate-sim, pool: p}}]
retries: {{attempts: 0}}
"""
    url, _ = start_tls_gateway(tmp_path, policy, started, client_context(ca.path))
    with (
        openai.OpenAI(
            base_url=f"{url}/v1",
            api_key="k",
            http_client=openai.DefaultHttpxClient(verify=client_context(ca.path)),
            max_retries=0,
        ) as client,
        pytest.raises(openai.APIStatusError) as err,
    ):
        client.completions.create(model="kvgate-sim", prompt="hello", max_tokens=4)
    assert err.value.status_code in (502, 503)
    skipping = policy.replace(f"{{ca: {stranger.path}}}", "{insecure_skip_verify: true}")
    url, log = start_tls_gateway(tmp_path, skipping, started, client_context(ca.path))
    assert complete(url, openai.DefaultHttpxClient(verify=client_context(ca.path)))
    assert "insecure_skip_verify is set" in Path(log).read_text()


def test_the_pickers_grpc_port_speaks_tls(
    tmp_path: Path,
    ca: CertificateAuthority,
    started: list[KvgateProcess],
    start_backend: Callable[..., str],
) -> None:
    backend = start_backend("--cost", "zero").removeprefix("http://")
    policy = tmp_path / "epp.yaml"
    policy.write_text(
        f"pools: {{p: {{endpoints: [{backend}]}}}}\nroutes: [{{model: m, pool: p}}]\n"
    )
    server = ca.issue("epp")
    grpc_port, metrics_port = free_port(), free_port()
    proc = epp_process(str(policy), grpc_port, metrics_port)
    proc.args += ["--tls-cert", server.cert, "--tls-key", server.key]
    started.append(proc.start())
    with open(ca.path, "rb") as file:
        credentials = grpc.ssl_channel_credentials(root_certificates=file.read())
    with grpc.secure_channel(f"127.0.0.1:{grpc_port}", credentials) as channel:
        answer = health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(), timeout=5
        )
        assert answer.status == health_pb2.HealthCheckResponse.SERVING
    with grpc.insecure_channel(f"127.0.0.1:{grpc_port}") as channel, pytest.raises(grpc.RpcError):
        health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=2)
