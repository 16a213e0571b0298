"""The ``pools:`` section: each pool's endpoints, model, engine, KV events, PD, metrics and
TLS."""

from __future__ import annotations

import re
from pathlib import Path

from policies.fields import Fields
from policies.schema import ENGINES, METRIC_OVERRIDES, ROLES, EndpointSpec, Pool
from policies.tls_section import load_client_tls

CAPACITY = ("configured", "measured")  # a pool's capacity: each endpoint's, or measured
MAX_RETENTION = 300.0  # seconds: what the reference engine caps a pin at
_ADDRESS = re.compile(r"^[A-Za-z0-9.\-]+:[0-9]{1,5}$|^\[[0-9a-fA-F:]+\]:[0-9]{1,5}$")


POOL_KEYS = {
    "model",
    "engine",
    "endpoints",
    "api_key",
    "adapters",
    "max_adapters",
    "kv_events",
    "pd",
    "max_concurrency",
    "max_model_len",
    "metrics",
    "tls",
    "token_ids",
    "capacity",
    "kv_retention",
    "tokenized_prompts",
}


def load_pools(top: Fields, base_dir: Path) -> dict[str, Pool]:
    pools: dict[str, Pool] = {}
    if not top.has("pools"):
        top.error("pools", "is required: at least one pool of endpoints")
    for path, name, value in top.entries("pools"):
        f = Fields(top.source, value, path, POOL_KEYS)
        kv_events = f.sub("kv_events", {"port", "bind", "replay_port"})
        bind = _kv_events_bind(f, path, kv_events)
        names = f.sub("metrics", set(METRIC_OVERRIDES))
        metric_names = {key: names.text(key) for key in METRIC_OVERRIDES if names.has(key)}
        pd = f.sub("pd", {"min_uncached_tokens", "max_prefill_in_flight"})
        pools[name] = Pool(
            name=name,
            endpoints=_endpoints(f, path),
            model=f.opt_str("model"),
            engine=f.text("engine", "vllm", choices=ENGINES),
            api_key=f.opt_str("api_key"),
            adapters=_adapter_names(f),
            adapter_paths=_adapter_paths(f, path),
            max_adapters=f.integer("max_adapters", 4, low=1, high=1024),
            kv_events_port=kv_events.opt_int("port", low=1, high=65535),
            kv_events_bind=bind,
            kv_events_replay_port=kv_events.opt_int("replay_port", low=0, high=65535),
            pd_min_uncached_tokens=pd.opt_int("min_uncached_tokens", low=0),
            pd_max_prefill_in_flight=pd.opt_int("max_prefill_in_flight", low=1),
            max_concurrency=f.opt_int("max_concurrency", low=1),
            max_model_len=f.opt_int("max_model_len", low=1),
            measured_capacity=f.text("capacity", "configured", choices=CAPACITY) == "measured",
            tls=load_client_tls(f, base_dir),
            metric_names=metric_names,
            token_ids=f.flag("token_ids", False) if f.has("token_ids") else None,
            kv_retention=_kv_retention(f),
            tokenized_prompts=f.flag("tokenized_prompts", False),
        )
    return pools


def _kv_retention(f: Fields) -> float:
    seconds = f.duration("kv_retention", 0.0)
    if seconds > MAX_RETENTION:
        f.error(f"{f.path}.kv_retention", f"must be at most {MAX_RETENTION:.0f}s (engines cap it)")
    return seconds


def _adapter_names(f: Fields) -> tuple[str, ...]:
    """The pool's LoRA adapters: a list of names, or the keys of a name -> path mapping."""
    raw = f.raw("adapters")
    if isinstance(raw, dict):
        return tuple(str(name) for name in raw)
    return f.str_list("adapters") or ()


def _adapter_paths(f: Fields, path: str) -> dict[str, str]:
    """``adapters: {name: path}``: the adapters the gateway loads itself, from these paths on
    the engines' hosts."""
    raw = f.raw("adapters")
    if not isinstance(raw, dict):
        return {}
    paths = {}
    for name, source in raw.items():
        if not isinstance(source, str) or not source:
            f.error(f"{path}.adapters.{name}", "must be the path the engines load it from")
        else:
            paths[str(name)] = source
    return paths


def _kv_events_bind(f: Fields, path: str, kv_events: Fields) -> str | None:
    """Where the picker binds for engines to send their KV events to (or None: it connects)."""
    bind = kv_events.opt_str("bind")
    if bind is not None and not bind.startswith(("tcp://", "ipc://", "inproc://")):
        f.error(f"{path}.kv_events.bind", f"must be a ZMQ address like tcp://*:5557; got {bind!r}")
    if bind is not None and kv_events.has("port"):
        f.error(
            f"{path}.kv_events", "set port (the EPP connects) or bind (engines connect), not both"
        )
    return bind


def _endpoints(f: Fields, path: str) -> tuple[EndpointSpec, ...]:
    """The pool's endpoints: at least one, none listed twice."""
    endpoints: list[EndpointSpec] = []
    for item_path, item in f.items("endpoints", required=True):
        endpoint = _endpoint(f, item_path, item)
        if endpoint is not None:
            endpoints.append(endpoint)
    if f.has("endpoints") and not endpoints and isinstance(f.raw("endpoints"), list):
        f.error(f"{path}.endpoints", "must list at least one endpoint")
    addresses = [e.address for e in endpoints]
    for address in {a for a in addresses if addresses.count(a) > 1}:
        f.error(f"{path}.endpoints", f"endpoint {address} is listed twice")
    return tuple(endpoints)


def _endpoint(parent: Fields, path: str, item: object) -> EndpointSpec | None:
    if isinstance(item, str):
        item = {"address": item}
    f = Fields(
        parent.source,
        item,
        path,
        {
            "address",
            "role",
            "labels",
            "capacity",
            "kv_events_port",
            "kv_events_replay_port",
            "kv_events_topic",
        },
    )
    address = f.text("address")
    scheme, _, rest = address.rpartition("://")
    if scheme in ("http", "https"):
        address = rest
    elif scheme:
        f.error(f"{path}.address", f"must be host:port, http:// or https://; got {address!r}")
    if address and not _ADDRESS.match(address):
        f.error(f"{path}.address", f"must be host:port; got {address!r}")
    labels = f.raw("labels") or {}
    if not isinstance(labels, dict) or not all(isinstance(v, str) for v in labels.values()):
        f.error(f"{path}.labels", "must map names to strings")
        labels = {}
    if not address:
        return None
    port = f.opt_int("kv_events_port", low=1, high=65535)
    return EndpointSpec(
        address=address,
        role=f.text("role", "both", choices=ROLES),
        tls=scheme == "https",
        labels=labels,
        capacity=f.number("capacity", 1.0, low=0.01, high=1000.0),
        kv_events_port=port,
        kv_events_topic=f.opt_str("kv_events_topic"),
        kv_events_replay_port=f.opt_int("kv_events_replay_port", low=0, high=65535),
    )
