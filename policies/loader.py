"""Load a policy file: parse → defaults → validate → build, with every error at once.

``load_policy(path)`` returns a ``Policy`` or raises ``PolicyError`` whose ``errors`` each name
the field path and, where known, the YAML line: ``routes[2].pool (line 14): unknown pool 'x'``.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import replace
from pathlib import Path

from policies.admin_section import load_admin
from policies.auth_section import check_classes, load_auth, load_classes, load_tenants
from policies.cache_section import load_cache_store
from policies.cors_section import load_cors
from policies.epp_section import check_plugins, load_epp
from policies.errors import PolicyError
from policies.fields import Fields
from policies.gie_config import TOP_LEVEL as GIE_TOP_LEVEL
from policies.gie_config import load_gie_config
from policies.limits_section import load_limits
from policies.models_section import load_models
from policies.plugin_catalog import PluginCatalog
from policies.pools_section import load_pools
from policies.routes_section import load_routes
from policies.schema import (
    Breakers,
    Listen,
    Observability,
    Policy,
    Retries,
    Timeouts,
    Tracing,
)
from policies.slo_section import load_slos
from policies.spend_section import load_spend
from policies.tls_section import load_server_tls
from policies.yaml_source import Source, parse_yaml

TOP_LEVEL = {
    "version",
    "cors",
    "listen",
    "auth",
    "tenants",
    "pools",
    "routes",
    "timeouts",
    "retries",
    "observability",
    "epp",
    "limits",
    "breakers",
    "classes",
    "slos",
    "state_dir",
    "response_cache",
    "spend",
    "models",
}
_SHA256 = re.compile(r"^[0-9a-f]{64}$")


def load_policy(path: str | Path, *, plugins: PluginCatalog | None = None) -> Policy:
    """The policy in ``path``, validated; ``plugins`` (the EPP's catalog) also checks the
    ``epp:`` plugins' types and parameters."""
    file = Path(path)
    try:
        text = file.read_text()
    except OSError as exc:
        raise PolicyError([f"cannot read policy file: {exc.strerror}"], str(file)) from exc
    return load_policy_text(text, source=str(file), base_dir=file.parent, plugins=plugins)


def with_picker_config(
    policy: Policy, path: str | Path, *, plugins: PluginCatalog | None = None
) -> Policy:
    """``policy`` with the picker configuration of the GIE ``EndpointPickerConfig`` file at
    ``path`` in place of its ``epp`` plugins, profiles and saturation (``kvgate epp --config``)."""
    file = Path(path)
    try:
        text = file.read_text()
    except OSError as exc:
        raise PolicyError([f"cannot read picker config: {exc.strerror}"], str(file)) from exc
    parsed = parse_yaml(text)
    if parsed.data is None:
        raise PolicyError(parsed.errors or ["the picker config is empty"], str(file))
    top = Fields(parsed, parsed.data, "", GIE_TOP_LEVEL)
    config = load_gie_config(top)
    check_plugins(top, "plugins", config.plugins, plugins)
    if parsed.errors:
        raise PolicyError(parsed.errors, str(file))
    epp = replace(
        policy.epp, plugins=config.plugins, profiles=config.profiles, saturation=config.saturation
    )
    return replace(policy, epp=epp)


def load_policy_text(
    text: str,
    *,
    source: str = "<policy>",
    base_dir: Path | None = None,
    plugins: PluginCatalog | None = None,
) -> Policy:
    parsed = parse_yaml(text)
    if parsed.errors and parsed.data is None:
        raise PolicyError(parsed.errors, source)
    policy = _build(parsed, source, base_dir or Path.cwd(), plugins)
    if parsed.errors:
        raise PolicyError(parsed.errors, source)
    return policy


def _build(src: Source, source: str, base_dir: Path, plugins: PluginCatalog | None) -> Policy:
    top = Fields(src, src.data, "", TOP_LEVEL)
    version = top.integer("version", 1, low=1, high=1)
    pools = load_pools(top, base_dir)
    tenants = load_tenants(top)
    limits = load_limits(top)
    cache_store = load_cache_store(top, limits.store.url)
    models = load_models(top, pools)
    routes = load_routes(top, pools, cache_store.ttl, models)
    classes = load_classes(top)
    auth = load_auth(top, tenants, base_dir)
    check_classes(top, classes, tenants, auth)
    epp = load_epp(top, plugins)
    if not any(
        p.type == "prefix-cache-scorer" and p.params.get("mode") == "precise" for p in epp.plugins
    ):
        for name in (name for name, pool in pools.items() if pool.tokenized_prompts):
            top.error(
                f"pools.{name}.tokenized_prompts",
                "needs the precise prefix index (a prefix-cache-scorer with mode: precise), whose "
                "tokenizer makes the ids",
            )
    for objective in epp.objectives:
        if objective.priority_class is not None and objective.priority_class not in classes:
            top.error(
                f"epp.objectives.{objective.name}.class",
                f"unknown class {objective.priority_class!r}",
            )
    return Policy(
        pools=pools,
        routes=routes,
        version=version,
        listen=_listen(top, base_dir, tuple(issuer.issuer for issuer in auth.jwt)),
        auth=auth,
        tenants=tenants,
        timeouts=_timeouts(top),
        retries=_retries(top),
        breakers=_breakers(top),
        classes=classes,
        observability=_observability(top),
        cors=load_cors(top),
        epp=epp,
        limits=limits,
        slos=load_slos(top, tuple(r.model for r in routes), tuple(classes)),
        state_dir=_state_dir(top, base_dir),
        response_cache=cache_store,
        spend=load_spend(top),
        models=models,
        source=source,
    )


def _state_dir(top: Fields, base_dir: Path) -> str:
    """``state_dir``, relative to the policy file's folder; "" when unset."""
    value = top.opt_str("state_dir")
    return str(base_dir / value) if value else ""


def _listen(top: Fields, base_dir: Path, issuers: tuple[str, ...]) -> Listen:
    f = top.sub(
        "listen",
        {
            "host",
            "port",
            "workers",
            "max_body",
            "max_json_depth",
            "shutdown_grace",
            "header_timeout",
            "body_timeout",
            "trusted_proxies",
            "admin",
            "ready_with_dead_pools",
            "tls",
        },
    )
    port = f.integer("port", Listen().port, low=0, high=65535)
    admin = load_admin(f, port, issuers) if f.has("admin") else None
    trusted = f.str_list("trusted_proxies") or ()
    for number, value in enumerate(trusted):
        try:
            ipaddress.ip_network(value.strip(), strict=False)
        except ValueError:
            f.error(f"listen.trusted_proxies[{number}]", f"{value!r} is not an address or network")
    d = Listen()
    return Listen(
        host=f.text("host", d.host),
        port=port,
        workers=f.integer("workers", d.workers, low=1, high=64),
        max_body_bytes=f.size("max_body", d.max_body_bytes),
        max_json_depth=f.integer("max_json_depth", d.max_json_depth, low=2, high=1000),
        shutdown_grace=f.duration("shutdown_grace", d.shutdown_grace),
        header_timeout=f.duration("header_timeout", d.header_timeout),
        body_timeout=f.duration("body_timeout", d.body_timeout),
        trusted_proxies=trusted,
        admin=admin,
        ready_with_dead_pools=f.flag("ready_with_dead_pools", d.ready_with_dead_pools),
        tls=load_server_tls(f, base_dir),
    )


def _timeouts(top: Fields) -> Timeouts:
    f = top.sub("timeouts", {"connect", "first_byte", "idle"})
    d = Timeouts()
    return Timeouts(
        f.duration("connect", d.connect),
        f.duration("first_byte", d.first_byte),
        f.duration("idle", d.idle),
    )


def _retries(top: Fields) -> Retries:
    f = top.sub(
        "retries",
        {"attempts", "backoff", "max_backoff", "budget_ratio", "min_retries_per_second", "resumes"},
    )
    d = Retries()
    return Retries(
        f.integer("attempts", d.attempts, low=0, high=10),
        f.duration("backoff", d.backoff),
        f.duration("max_backoff", d.max_backoff),
        f.number("budget_ratio", d.budget_ratio, low=0.0, high=10.0),
        f.number("min_retries_per_second", d.min_retries_per_second, low=0.0),
        f.integer("resumes", d.resumes, low=0, high=10),
    )


def _breakers(top: Fields) -> Breakers:
    f = top.sub(
        "breakers",
        {
            "consecutive_failures",
            "failure_ratio",
            "window",
            "min_requests",
            "cool_down",
            "half_open_probes",
        },
    )
    d = Breakers()
    return Breakers(
        f.integer("consecutive_failures", d.consecutive_failures, low=1),
        f.number("failure_ratio", d.failure_ratio, low=0.0, high=1.0),
        f.duration("window", d.window),
        f.integer("min_requests", d.min_requests, low=1),
        f.duration("cool_down", d.cool_down),
        f.integer("half_open_probes", d.half_open_probes, low=1),
    )


def _observability(top: Fields) -> Observability:
    f = top.sub("observability", {"metrics", "tracing", "access_log"})
    metrics = f.sub("metrics", {"path", "token", "public"})
    token = metrics.opt_str("token")
    if token is not None and len(token) < 16:
        metrics.error("observability.metrics.token", "must be at least 16 characters")
    tracing = f.sub("tracing", {"exporter", "endpoint", "sample", "service_name"})
    exporter = tracing.text("exporter", "none", choices=("none", "console", "otlp"))
    endpoint = tracing.opt_str("endpoint")
    if exporter == "otlp" and not endpoint:
        tracing.error("observability.tracing.endpoint", "is required with the otlp exporter")
    path = metrics.text("path", "/metrics")
    if path and not path.startswith("/"):
        metrics.error("observability.metrics.path", "must start with /")
    return Observability(
        metrics_path=path,
        metrics_token=token,
        metrics_public=metrics.flag("public", False),
        tracing=Tracing(
            exporter,
            endpoint,
            tracing.number("sample", 1.0, low=0.0, high=1.0),
            tracing.text("service_name", "kvgate"),
        ),
        access_log="off"
        if f.raw("access_log") is False
        # YAML 1.1 reads `off` as false
        else f.text("access_log", "json", choices=("json", "off")),
    )
