"""The ``routes:`` section: one pool, a canary split or an A/B test per public model, with
optional shadow traffic and fallback models."""

from __future__ import annotations

import re

from policies.cache_section import load_route_cache
from policies.canary_section import load_canary_mapping
from policies.explain_section import load_explain
from policies.fields import Fields, child
from policies.models_section import RegisteredModel
from policies.schema import AbTest, Pool, Route, Shadow, WeightedPool

ROUTE_FIELDS = {"model", "pool", "canary", "ab_test", "shadow", "fallback", "paths", "resume"}
ROUTE_FIELDS.update({"cache", "explain"})  # what traffic policies a route may add
COMPARE = ("status", "tokens", "latency", "text")
PASSTHROUGH_PATH = re.compile(r"(/[A-Za-z0-9._-]+)+")
# served by the gateway itself, for every route
OPENAI_PATHS = frozenset(
    {
        "/v1/chat/completions",
        "/v1/completions",
        "/v1/embeddings",
        "/v1/models",
        "/healthz",
        "/readyz",
    }
)


def load_routes(
    top: Fields,
    pools: dict[str, Pool],
    cache_ttl: float,
    models: dict[str, RegisteredModel] | None = None,
) -> tuple[Route, ...]:
    """``routes:`` (``cache_ttl``: how long a route's kept answers live unless it says), and
    one for each registered model that none names (``models``: the registry)."""
    registry = models or {}
    routes: list[Route] = []
    seen: set[str] = set()
    for path, item in top.items("routes", required=not registry):
        f = Fields(top.source, item, path, ROUTE_FIELDS)
        model = f.text("model")
        if model in seen:
            f.error(f"{path}.model", f"model {model!r} is routed twice")
        seen.add(model)
        mapping_canary = isinstance(f.raw("canary"), dict)  # `pool:` is then the baseline
        kinds = [k for k in ("pool", "canary", "ab_test") if f.has(k)]
        if mapping_canary:
            kinds = [k for k in kinds if k != "pool"]
        if model in registry and (kinds or mapping_canary):
            f.error(path, f"takes its pools from models.{model} (its versions' stages)")
        elif model not in registry and len(kinds) != 1:
            f.error(path, "needs exactly one of pool, canary, ab_test")
        auto = None
        if mapping_canary:
            baseline = f.text("pool", None) or ""
            candidate, weight, auto = load_canary_mapping(f, baseline)
            _check_pool(f, child(path, "canary.pool"), candidate, pools)
            canary: tuple[WeightedPool, ...] = (
                WeightedPool(baseline, 100.0 - weight, baseline),
                WeightedPool(candidate, weight, candidate),
            )
        else:
            canary = _weighted(f, "canary", pools) if f.has("canary") else ()
        ab_test = _ab_test(f, pools) if f.has("ab_test") else None
        pool = (
            production_pool(registry[model]) if model in registry else f.text("pool", None)
        ) or (
            (canary[0].pool if canary else "")
            or (ab_test.arms[0].pool if ab_test and ab_test.arms else "")
        )
        if f.has("pool"):
            _check_pool(f, child(path, "pool"), pool, pools)
        shadow = _shadow(f, pools) if f.has("shadow") else None
        extra = f.str_list("paths") or ()
        for number, extra_path in enumerate(extra):
            if not PASSTHROUGH_PATH.fullmatch(extra_path) or extra_path in OPENAI_PATHS:
                f.error(
                    f"{path}.paths[{number}]",
                    f"{extra_path!r} is not an extra path (/name/..., not one the gateway serves)",
                )
        fallback = f.str_list("fallback") or ()
        resume = f.flag("resume", True)
        cache = load_route_cache(f, path, cache_ttl)
        explain = load_explain(f)
        routes.append(
            Route(
                model, pool, canary, ab_test, shadow, fallback, extra, auto, resume, cache, explain
            )
        )
    unrouted = [m for m in registry.values() if m.name not in seen]
    routes.extend(Route(m.name, production_pool(m)) for m in unrouted)
    known = {r.model for r in routes}
    for i, route in enumerate(routes):
        for name in route.fallback:
            if name not in known or name == route.model:
                top.error(f"routes[{i}].fallback", f"{name!r} is not another routed model")
    return tuple(routes)


def production_pool(model: RegisteredModel) -> str:
    """The pool of the version ``model`` declares in production ("" when none does)."""
    return next((v.pool for v in model.versions if v.stage == "production"), "")


def _check_pool(f: Fields, path: str, pool: str, pools: dict[str, Pool]) -> None:
    if pool and pool not in pools:
        f.error(path, f"unknown pool {pool!r} (pools: {', '.join(sorted(pools)) or 'none'})")


def _weighted(f: Fields, key: str, pools: dict[str, Pool]) -> tuple[WeightedPool, ...]:
    out = []
    for path, item in f.items(key):
        w = Fields(f.source, item, path, {"pool", "weight", "name"})
        pool = w.text("pool")
        _check_pool(w, child(path, "pool"), pool, pools)
        out.append(WeightedPool(pool, w.number("weight", low=0.0), w.text("name", pool or "arm")))
    if not out:
        f.error(child(f.path, key), "needs at least one pool")
    elif sum(p.weight for p in out) <= 0:
        f.error(child(f.path, key), "weights must not all be zero")
    return tuple(out)


def _ab_test(f: Fields, pools: dict[str, Pool]) -> AbTest:
    a = f.sub("ab_test", {"name", "key", "arms"})
    key = a.text("key", "user")
    if key != "user" and not key.startswith("header:"):
        a.error(child(a.path, "key"), "must be 'user' or 'header:<name>'")
    arms = _weighted(a, "arms", pools)
    total = sum(arm.weight for arm in arms)
    if arms and total != 10_000:
        a.error(
            child(a.path, "arms"), f"weights are basis points and must sum to 10000; got {total:g}"
        )
    return AbTest(a.text("name"), key, arms)


def _shadow(f: Fields, pools: dict[str, Pool]) -> Shadow:
    s = f.sub("shadow", {"pool", "sample", "compare", "max_in_flight"})
    pool = s.text("pool")
    _check_pool(s, child(s.path, "pool"), pool, pools)
    compare = s.str_list("compare") or ("status", "tokens", "latency")
    for item in compare:
        if item not in COMPARE:
            s.error(
                child(s.path, "compare"),
                f"unknown comparison {item!r} (expected: {', '.join(COMPARE)})",
            )
    return Shadow(
        pool, s.number("sample", low=0.0, high=1.0), compare, s.integer("max_in_flight", 4, low=1)
    )
