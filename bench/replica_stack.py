"""The processes of one ``make bench-replicas`` run: fresh simulated backends, K gateway replicas
as separate processes (each its own ``kvgate gateway``, no shared worker directory: as on K
hosts), a real Envoy balancing round-robin over them, and a redis-server when the replicas share
their picks (``epp.replicas``)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from loadtest.harness.envoy import round_robin_envoy
from loadtest.harness.processes import KvgateProcess, backend_process, free_port, gateway_process
from loadtest.harness.redis_server import RedisServer
from policies.schema import DEFAULT_EPP_PLUGINS, DEFAULT_EPP_PROFILES

MODEL = "kvgate-sim"
MAX_MODEL_LEN = 32_768  # the trace's longest prompts, replayed at 32 tokens a block, take 12k


@dataclass(frozen=True)
class Setup:
    """One configuration: ``replicas`` gateways whose picker is ``mode`` (approximate: the
    default profile; precise: the same from the backends' KV events; least-in-flight: blind to
    caches), sharing their picks through Redis when ``shared``."""

    name: str
    replicas: int
    mode: str = "approximate"
    shared: bool = False


@dataclass
class Stack:
    """What a run drives and breaks: the front URL and the processes behind it."""

    url: str
    backends: list[KvgateProcess]
    backend_urls: list[str]
    gateways: list[KvgateProcess]
    redis: RedisServer | None
    logs: list[Path] = field(default_factory=list)


def gateway_policy(setup: Setup, ports: list[tuple[int, int]], redis_url: str | None) -> str:
    """The replicas' policy (JSON, which YAML reads): one pool of the backends at ``ports``
    (HTTP, KV events)."""
    precise = setup.mode == "precise"
    endpoints: list[object] = [
        {"address": f"127.0.0.1:{http}", "kv_events_port": events}
        if precise
        else f"127.0.0.1:{http}"
        for http, events in ports
    ]
    epp: dict[str, object] = {}
    if setup.mode == "least-in-flight":
        epp["picker"] = "least-in-flight"
    if precise:
        epp["plugins"] = [
            {
                "name": p.name,
                "type": p.type,
                "params": {**p.params, "mode": "precise"} if p.name == "prefix" else dict(p.params),
            }
            for p in DEFAULT_EPP_PLUGINS
        ]
        epp["profiles"] = [
            {"name": f.name, "plugins": [{"ref": r.ref, "weight": r.weight} for r in f.plugins]}
            for f in DEFAULT_EPP_PROFILES
        ]
    if setup.shared and redis_url is not None:
        epp["replicas"] = {"store": redis_url, "key": "bench:picks"}
    policy = {
        "listen": {"host": "127.0.0.1"},
        "pools": {"p": {"endpoints": endpoints}},
        "routes": [{"model": MODEL, "pool": "p"}],
        "observability": {"access_log": "off"},
        "timeouts": {"first_byte": "120s"},
        "epp": epp,
    }
    return json.dumps(policy)


@contextmanager
def running_stack(
    setup: Setup, backends: int, num_blocks: int, workdir: Path, envoy: Path
) -> Iterator[Stack]:
    """Everything ``setup`` needs, fresh (caches cold, an empty Redis), stopped on exit."""
    ports = [(free_port(), free_port()) for _ in range(backends)]
    with ExitStack() as stack:
        engines = []
        for http, events in ports:
            args = ["--cost", "default", "--num-blocks", str(num_blocks)]
            longest = min(MAX_MODEL_LEN, num_blocks * 16)  # the cache must hold one
            args += ["--max-model-len", str(longest), "--kv-events-port", str(events)]
            engines.append(stack.enter_context(backend_process(http, *args)))
        redis = None
        if setup.shared:
            redis = RedisServer(free_port()).start()
            stack.callback(redis.stop)
        policy = workdir / f"policy-{ports[0][0]}.json"
        policy.write_text(gateway_policy(setup, ports, redis.url if redis else None))
        gateways = []
        logs = []
        for _ in range(setup.replicas):
            port = free_port()
            log = workdir / f"gateway-{port}.log"
            logs.append(log)
            gateway = gateway_process(str(policy), port, log=str(log))
            gateway.end_with_parent = True
            gateways.append(stack.enter_context(gateway))
        front = stack.enter_context(
            round_robin_envoy(envoy, [_port(g) for g in gateways], workdir, workdir / "envoy.log")
        )
        urls = [f"http://127.0.0.1:{http}" for http, _ in ports]
        yield Stack(front, engines, urls, gateways, redis, logs)


def _port(gateway: KvgateProcess) -> int:
    return int(gateway.args[gateway.args.index("--port") + 1])
