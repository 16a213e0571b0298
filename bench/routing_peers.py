"""The routers ``make bench-routing`` compares, each started in front of the same backends.

kvgate's gateway with its embedded picker (the default profile: approximate prefix, sticky
until the backlog outweighs a miss; the same with precise prefix from the backends' KV events,
as the shipped ``policies/examples/precise.yaml`` configures it; either with the pool's
``kv_retention``, the engines told to keep an agent call's blocks through its tool pause;
least-in-flight, blind to caches; ``candidate``: the profile in ``KVGATE_BENCH_EPP``, an
``epp:`` section to try against the rest, the default when unset), and the real peer
packages, installed into a venv of their own (``~/.cache/kvgate/router-peers``):
sglang-router 0.3.2 (``round_robin``, ``cache_aware``) and vllm-router 0.1.17
(``cache_aware``, ``consistent_hash``, which keys ``X-Session-ID``); NVIDIA Dynamo 1.6.1's KV
router (``--router-mode kv``, from the engines' KV events) through one relay worker per engine
(``bench.dynamo_peer``; the relays' CPU is reported apart from the router's); and the floor of a
Python router's CPU per request, ``bench.floor_proxy`` (round robin, bytes passed through).
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import yaml

from bench.dynamo_peer import dynamo_python, running_dynamo
from bench.venvs import venv_bin
from loadtest.harness.processes import external_process, free_port, gateway_process
from policies.schema import DEFAULT_EPP_PLUGINS, DEFAULT_EPP_PROFILES

CACHE = Path(os.environ.get("KVGATE_CACHE", Path.home() / ".cache" / "kvgate"))
PEER_VENV = CACHE / "router-peers"
PEER_PACKAGES = ("sglang-router==0.3.2", "vllm-router==0.1.17")


@dataclass(frozen=True)
class Backend:
    port: int
    kv_events_port: int

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


@dataclass(frozen=True)
class Peer:
    name: str
    router: str  # kvgate | sglang | vllm-router | dynamo | floor (bench.floor_proxy)
    policy: str  # kvgate: default | precise | least-in-flight; a peer's --policy otherwise
    workers: int = 1  # kvgate: gateway worker processes on one port
    compiled: bool = False  # kvgate: run the mypyc build (`make compiled`), as production does
    retention: bool = False  # kvgate: the pool's kv_retention (agents' blocks kept 30 s)
    pool: str = ""  # kvgate: more keys of the pool (", max_concurrency: 16")
    extra: str = ""  # kvgate: more sections of the policy (an ``epp:`` one replaces the profile)


PEERS = (
    Peer("kvgate (default profile)", "kvgate", "default"),
    Peer("kvgate (precise, KV events)", "kvgate", "precise"),
    Peer("kvgate (default, retention)", "kvgate", "default", retention=True),
    Peer("kvgate (precise, retention)", "kvgate", "precise", retention=True),
    Peer("kvgate compiled (default profile)", "kvgate", "default", compiled=True),
    Peer("kvgate --workers 2", "kvgate", "default", workers=2),
    Peer("kvgate least-in-flight", "kvgate", "least-in-flight"),
    Peer("kvgate candidate", "kvgate", "candidate"),
    Peer("sglang-router round_robin", "sglang", "round_robin"),
    Peer("sglang-router cache_aware", "sglang", "cache_aware"),
    Peer("vllm-router cache_aware", "vllm-router", "cache_aware"),
    Peer("vllm-router consistent_hash", "vllm-router", "consistent_hash"),
    Peer("dynamo kv router", "dynamo", "kv"),
    Peer("dynamo kv router (approximate)", "dynamo", "approximate"),
    # the least a Python relay costs on this work: its CPU per request is kvgate's floor
    Peer("python relay floor (round robin)", "floor", "round_robin"),
)


COMPILED = Path(__file__).resolve().parents[1] / "build" / "compiled"


def compiled_tree() -> Path | None:
    """The tree `make compiled` built, if it is there."""
    return COMPILED if (COMPILED / ".stamp").exists() else None


def peer_bin() -> tuple[Path | None, str]:
    """The peers' venv ``bin`` (made on first use from the package registry), or None and why."""
    return venv_bin(PEER_VENV, PEER_PACKAGES)


def default_profile_with(
    prefix_params: dict[str, object], types: dict[str, str] | None = None
) -> str:
    """The default profile as an ``epp:`` section, its prefix scorer given ``prefix_params``
    and its plugins of a type in ``types`` of the type it maps them to instead."""
    plugins = []
    for spec in DEFAULT_EPP_PLUGINS:
        params = {**spec.params, **prefix_params} if spec.name == "prefix" else spec.params
        kind = (types or {}).get(spec.type, spec.type)
        plugins.append({"name": spec.name, "type": kind, "params": dict(params)})
    profiles = [
        {
            "name": profile.name,
            "plugins": [
                {"ref": ref.ref} if ref.weight is None else {"ref": ref.ref, "weight": ref.weight}
                for ref in profile.plugins
            ],
        }
        for profile in DEFAULT_EPP_PROFILES
    ]
    return "epp: " + json.dumps({"plugins": plugins, "profiles": profiles})


PRECISE_EXAMPLE = Path(__file__).resolve().parents[1] / "policies" / "examples" / "precise.yaml"


def precise_profile() -> str:
    """The ``epp:`` section of the shipped precise example (``policies/examples/precise.yaml``),
    whose block size is the simulated backends' (16)."""
    epp = yaml.safe_load(PRECISE_EXAMPLE.read_text())["epp"]
    return "epp: " + json.dumps(epp)


def kvgate_policy(
    peer: Peer, backends: list[Backend], model: str, adapters: tuple[str, ...] = ()
) -> str:
    if peer.policy == "precise":
        epp = precise_profile()
    elif peer.policy == "candidate":
        epp = os.environ.get("KVGATE_BENCH_EPP", "")
    else:
        epp = "epp: {picker: least-in-flight}" if peer.policy == "least-in-flight" else ""
    if "epp:" in peer.extra:
        epp = ""
    if "precise" in epp:  # the engines' KV events feed its index
        endpoints = ", ".join(
            f"{{address: 127.0.0.1:{b.port}, kv_events_port: {b.kv_events_port}}}" for b in backends
        )
    else:
        endpoints = ", ".join(f"127.0.0.1:{b.port}" for b in backends)
    routes = ", ".join(f"{{model: {m}, pool: p}}" for m in (model, *adapters))
    retention = (", kv_retention: 30s" if peer.retention else "") + peer.pool
    return f"""
listen: {{host: 127.0.0.1}}
pools: {{p: {{endpoints: [{endpoints}], adapters: [{", ".join(adapters)}]{retention}}}}}
routes: [{routes}]
observability: {{access_log: "off"}}
timeouts: {{first_byte: 120s}}
{epp}
{peer.extra}
"""


@contextmanager
def running_peer(
    peer: Peer,
    backends: list[Backend],
    model: str,
    workdir: Path,
    bin_dir: Path | None,
    adapters: tuple[str, ...] = (),
    tree: Path | None = None,
) -> Iterator[tuple[str, int, list[int]]]:
    """``peer`` started in front of ``backends``; yields its base URL, its process id (whose
    tree is the router: a gateway's workers are its children) and the process ids of what it
    needs beside it to reach the backends (Dynamo's relay workers), whose CPU is not the
    router's. ``tree``: a kvgate peer runs from that checkout instead."""
    port = free_port()
    if peer.router == "kvgate":
        policy = workdir / f"policy-{port}.yaml"
        policy.write_text(kvgate_policy(peer, backends, model, adapters))
        extra = ("--workers", str(peer.workers)) if peer.workers > 1 else ()
        tree = compiled_tree() if peer.compiled else tree
        if peer.compiled and tree is None:
            raise RuntimeError("no compiled build: run `make compiled`")
        gateway = gateway_process(
            str(policy),
            port,
            *extra,
            log=str(workdir / "kvgate.log"),
            tree=str(tree) if tree else None,
        )
        with gateway:
            assert gateway.proc is not None
            yield f"http://127.0.0.1:{port}", gateway.proc.pid, []
        return
    if peer.router == "dynamo":
        python, why = dynamo_python()
        if python is None:
            raise RuntimeError(why)
        engines = [(b.url, b.kv_events_port) for b in backends]
        with running_dynamo(python, engines, model, workdir, peer.policy) as running:
            yield running
        return
    log = workdir / f"{peer.router}.log"
    health = f"http://127.0.0.1:{port}/health"  # the relay passes it to a backend
    if peer.router == "floor":
        upstreams = ",".join(str(b.port) for b in backends)
        argv = [sys.executable, "-m", "bench.floor_proxy", str(port), upstreams]
        with external_process(argv, health, log=log) as proc:
            yield f"http://127.0.0.1:{port}", proc.pid, []
        return
    if bin_dir is None:
        raise RuntimeError("the peer routers are not installed")
    workers = [b.url for b in backends]
    common = ["--host", "127.0.0.1", "--port", str(port), "--worker-urls", *workers]
    metrics = ["--prometheus-host", "127.0.0.1", "--prometheus-port", str(free_port())]
    if peer.router == "sglang":
        argv = [str(bin_dir / "sglang-router"), "launch", *common, "--policy", peer.policy]
        argv += ["--log-level", "warn", *metrics, "--shutdown-grace-period-secs", "1"]
    else:
        argv = [str(bin_dir / "vllm-router"), *common, "--policy", peer.policy]
        argv += ["--log-level", "warning", *metrics]
    env = {"HF_HUB_OFFLINE": "1"}  # sglang-router looks for a tokenizer otherwise
    with external_process(argv, health, env=env, log=log) as proc:
        yield f"http://127.0.0.1:{port}", proc.pid, []
