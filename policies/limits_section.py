"""The ``limits:`` section: token-bucket rules and where their state lives."""

from __future__ import annotations

from policies.fields import Fields, child
from policies.schema import LimitRule, Limits, LimitStore

MATCH_FIELDS = {"tenant", "api_key", "model", "route"}


def load_limits(top: Fields) -> Limits:
    f = top.sub("limits", {"store", "rules", "default_max_tokens", "chars_per_token"})
    s = f.sub("store", {"kind", "url", "timeout", "on_failure", "replicas"})
    kind = s.text("kind", "memory", choices=("memory", "redis"))
    url = s.opt_str("url")
    if kind == "redis" and not url:
        s.error("limits.store.url", "is required for the redis store (redis://host:port/db)")
    store = LimitStore(
        kind=kind,
        url=url,
        timeout=s.duration("timeout", 0.02),
        on_failure=s.text("on_failure", "fail_open", choices=("fail_open", "fail_closed")),
        replicas=s.integer("replicas", 1, low=1),
    )
    rules: list[LimitRule] = []
    names: set[str] = set()
    for path, item in f.items("rules"):
        r = Fields(f.source, item, path, {"name", "match", "requests_per_min", "tokens_per_min"})
        match = r.raw("match") or {}
        if not isinstance(match, dict):
            r.error(child(path, "match"), "must be a mapping")
            match = {}
        for key, value in match.items():
            if key not in MATCH_FIELDS:
                r.error(
                    child(child(path, "match"), key),
                    f"unknown field (expected one of: {', '.join(sorted(MATCH_FIELDS))})",
                )
            elif not isinstance(value, str) or not value:
                r.error(child(child(path, "match"), key), "must be a value or *")
        requests = r.opt_int("requests_per_min", low=1)
        tokens = r.opt_int("tokens_per_min", low=1)
        if requests is None and tokens is None:
            r.error(path, "needs requests_per_min or tokens_per_min")
        name = r.text("name", path.replace("limits.", ""))
        if name in names:
            r.error(child(path, "name"), f"rule name {name!r} is used twice")
        names.add(name)
        rules.append(LimitRule(name, {str(k): str(v) for k, v in match.items()}, requests, tokens))
    return Limits(
        store,
        tuple(rules),
        f.integer("default_max_tokens", 512, low=1),
        f.integer("chars_per_token", 4, low=1),
    )
