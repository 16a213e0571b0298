"""``kvgate epp``: one gRPC server with Envoy's ext_proc, the Pick API and gRPC health; and
Prometheus metrics (and ``/readyz``) on their own port."""

from __future__ import annotations

import asyncio
import logging
import signal
from dataclasses import dataclass

import grpc
from aiohttp import web
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from prometheus_client import CONTENT_TYPE_LATEST

from epp.metrics import exposition
from epp.servers.ext_proc import ExternalProcessor
from epp.servers.pick_api import PickApi
from epp.service import EppService
from kvgate.api import epp_pb2_grpc
from kvgate.api.envoy import external_processor_pb2_grpc as ep_grpc
from policies.schema import Policy

log = logging.getLogger("kvgate.epp")
HEALTH_NAMES = ("", "liveness", "readiness", "envoy.service.ext_proc.v3.ExternalProcessor")
MAX_MESSAGE = 64 * 2**20


@dataclass(frozen=True)
class GrpcTls:
    """The gRPC port's TLS: PEM files; with ``client_ca``, clients (Envoy) must present a
    certificate it signed."""

    cert: str
    key: str
    client_ca: str | None = None

    def credentials(self) -> grpc.ServerCredentials:
        with open(self.key, "rb") as key, open(self.cert, "rb") as cert:
            pair = (key.read(), cert.read())
        roots = None
        if self.client_ca is not None:
            with open(self.client_ca, "rb") as ca:
                roots = ca.read()
        return grpc.ssl_server_credentials(
            [pair], root_certificates=roots, require_client_auth=roots is not None
        )


async def serve(
    policy: Policy,
    host: str,
    grpc_port: int,
    metrics_port: int,
    tls: GrpcTls | None = None,
    *,
    reuse_port: bool = False,
) -> None:
    """Serve until SIGTERM or SIGINT; with ``tls``, the gRPC port speaks TLS only; with
    ``reuse_port``, other workers share both ports (else a port in use is an error)."""
    service = EppService(policy)
    await service.start()
    server, health_servicer = _grpc_server(service, reuse_port)
    if tls is None:
        server.add_insecure_port(f"{host}:{grpc_port}")
    else:
        server.add_secure_port(f"{host}:{grpc_port}", tls.credentials())
    await server.start()
    for name in HEALTH_NAMES:
        await health_servicer.set(name, health_pb2.HealthCheckResponse.SERVING)
    runner = web.AppRunner(_http_app(service), access_log=None)
    await runner.setup()
    await web.TCPSite(runner, host, metrics_port, reuse_port=reuse_port).start()
    log.info(
        "epp: gRPC%s on %s:%d, metrics on %s:%d",
        " (TLS)" if tls else "",
        host,
        grpc_port,
        host,
        metrics_port,
    )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    for name in HEALTH_NAMES:
        await health_servicer.set(name, health_pb2.HealthCheckResponse.NOT_SERVING)
    await server.stop(grace=5)
    await runner.cleanup()
    await service.stop()


def _grpc_server(
    service: EppService, reuse_port: bool
) -> tuple[grpc.aio.Server, health.aio.HealthServicer]:
    """The gRPC server of ``service``: ext_proc, the Pick API and gRPC health."""
    server = grpc.aio.server(
        options=[
            ("grpc.max_receive_message_length", MAX_MESSAGE),
            ("grpc.max_send_message_length", MAX_MESSAGE),
            ("grpc.so_reuseport", 1 if reuse_port else 0),  # grpc's own default is 1
        ]
    )
    ep_grpc.add_ExternalProcessorServicer_to_server(ExternalProcessor(service), server)  # type: ignore[no-untyped-call]
    epp_pb2_grpc.add_EndpointPickerServicer_to_server(PickApi(service), server)  # type: ignore[no-untyped-call]
    health_servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    return server, health_servicer


def _http_app(service: EppService) -> web.Application:
    """``/metrics`` and ``/readyz`` of ``service``."""

    async def metrics(request: web.Request) -> web.Response:
        service.update_gauges()
        return web.Response(
            body=exposition(service.metrics.registry),
            headers={"Content-Type": CONTENT_TYPE_LATEST},
        )

    async def readyz(request: web.Request) -> web.Response:
        """Ready while serving; with ``epp.replicas``, ``view`` says whether the picks are
        shared with the other replicas or, the store unreachable, local only."""
        body = {"status": "ready"}
        if service.shared is not None:
            body["view"] = "shared" if service.shared.shared else "local only"
        return web.json_response(body)

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/readyz", readyz)
    return app
