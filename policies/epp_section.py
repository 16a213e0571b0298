"""The ``epp:`` section: plugins by name and type, profiles of weighted references."""

from __future__ import annotations

from policies.fields import Fields, child
from policies.gie_config import TOP_LEVEL as GIE_TOP_LEVEL
from policies.gie_config import load_gie_config
from policies.plugin_catalog import PluginCatalog
from policies.schema import (
    DEFAULT_EPP_PLUGINS,
    DEFAULT_EPP_PROFILES,
    PICK_OPEN_TIMEOUT,
    SAMPLE_CANDIDATES,
    Epp,
    Objective,
    PluginSpec,
    ProfileRef,
    ProfileSpec,
    Replicas,
    Saturation,
)

EPP_KEYS = {
    "picker",
    "plugins",
    "profiles",
    "scrape_interval",
    "scrape_idle_interval",
    "scrape_quiet_interval",
    "pick_open_timeout",
    "saturation",
    "objectives",
    "config",
    "replicas",
    "zone",
    "region",
    "sample_candidates",
}


def load_epp(top: Fields, plugin_types: PluginCatalog | None) -> Epp:
    f = top.sub("epp", EPP_KEYS)
    picker = f.text("picker", "epp", choices=("epp", "least-in-flight"))
    if f.has("config"):  # a GIE EndpointPickerConfig, in place of plugins, profiles, saturation
        for key in ("plugins", "profiles", "saturation"):
            if f.has(key):
                f.error(child(f.path, key), "cannot be set beside epp.config (the GIE config)")
        gie = f.sub("config", GIE_TOP_LEVEL)
        translated = load_gie_config(gie)
        check_plugins(gie, child(gie.path, "plugins"), translated.plugins, plugin_types)
        plugins, profiles, saturation = (
            list(translated.plugins),
            list(translated.profiles),
            translated.saturation,
        )
    else:
        plugins = []
        for path, item in f.items("plugins"):
            p = Fields(f.source, item, path, {"name", "type", "params"})
            params = p.raw("params") or {}
            if not isinstance(params, dict):
                p.error(child(path, "params"), "must be a mapping")
                params = {}
            plugins.append(PluginSpec(p.text("name"), p.text("type"), params))
        kinds = check_plugins(f, child(f.path, "plugins"), plugins, plugin_types, itemised=True)
        if not plugins:
            plugins, kinds = list(DEFAULT_EPP_PLUGINS), {p.name: "" for p in DEFAULT_EPP_PLUGINS}
        profiles = _profiles(f, kinds) if f.has("profiles") else list(DEFAULT_EPP_PROFILES)
        saturation = _saturation(f)
    return Epp(
        picker,
        tuple(plugins),
        tuple(profiles),
        f.duration("scrape_interval", 0.05),
        f.duration("scrape_idle_interval", 0.2),
        f.duration("scrape_quiet_interval", 1.0),
        saturation,
        _objectives(f),
        _pick_open_timeout(f),
        _replicas(f),
        f.opt_str("zone") or "",
        f.opt_str("region") or "",
        f.integer("sample_candidates", SAMPLE_CANDIDATES, low=0),
    )


def _replicas(f: Fields) -> Replicas | None:
    """``replicas: {store: redis://..., key, history, timeout}``: share picks with the other
    replicas (left out: this picker learns from its own picks only)."""
    if not f.has("replicas"):
        return None
    r = f.sub("replicas", {"store", "key", "history", "timeout"})
    store = r.text("store")
    if store and not store.startswith(("redis://", "rediss://", "unix://")):
        r.error(child(r.path, "store"), "must be a Redis URL (redis://host:port/db)")
    default = Replicas(store)
    timeout = r.duration("timeout", default.timeout)
    if timeout == 0:
        r.error(child(r.path, "timeout"), "must be more than 0 (1s by default)")
    return Replicas(
        store,
        r.text("key", default.key),
        r.integer("history", default.history, low=1),
        timeout or default.timeout,
    )


def _pick_open_timeout(f: Fields) -> float:
    seconds = f.duration("pick_open_timeout", PICK_OPEN_TIMEOUT)
    if seconds == 0:
        f.error(child(f.path, "pick_open_timeout"), "must be more than 0 (5m by default)")
    return seconds or PICK_OPEN_TIMEOUT


def check_plugins(
    f: Fields,
    path: str,
    plugins: list[PluginSpec] | tuple[PluginSpec, ...],
    plugin_types: PluginCatalog | None,
    *,
    itemised: bool = False,
) -> dict[str, str]:
    """Each plugin's kind by name, its type and parameters checked against the catalog (when
    there is one); errors at ``path`` (``itemised``: at ``path[i].field``)."""
    kinds: dict[str, str] = {}
    for number, spec in enumerate(plugins):
        at = child(path, number) if itemised else path
        if spec.name in kinds:
            f.error(
                child(at, "name") if itemised else at, f"plugin name {spec.name!r} is used twice"
            )
        if not spec.name or not spec.type:
            continue
        if plugin_types is None:
            kinds[spec.name] = ""
            continue
        kind = plugin_types.kind_of(spec.type)
        try:
            plugin_types.check(spec.type, spec.name, spec.params)
        except ValueError as exc:
            f.error(child(at, "params" if kind else "type") if itemised else at, str(exc))
        else:
            kinds[spec.name] = kind or ""
    return kinds


def _objectives(f: Fields) -> tuple[Objective, ...]:
    """``objectives: {name: {priority: N, class: C}}`` (GIE's InferenceObjective: below 0 is
    sheddable; ``class``: the gateway's admission class for its requests, checked by the
    loader against the policy's classes)."""
    objectives = []
    for path, name, value in f.entries("objectives"):
        o = Fields(f.source, value, path, {"priority", "class"})
        objectives.append(
            Objective(name, o.integer("priority", 0, low=-1000, high=1000), o.opt_str("class"))
        )
    return tuple(objectives)


def _saturation(f: Fields) -> Saturation:
    s = f.sub("saturation", {"queue_depth", "kv_usage", "max_metrics_age"})
    default = Saturation()
    return Saturation(
        s.integer("queue_depth", default.queue_depth, low=1),
        s.number("kv_usage", default.kv_usage, low=0.01, high=1.0),
        s.duration("max_metrics_age", default.max_metrics_age),
    )


def _profiles(f: Fields, kinds: dict[str, str]) -> list[ProfileSpec]:
    profiles: list[ProfileSpec] = []
    for path, item in f.items("profiles"):
        p = Fields(f.source, item, path, {"name", "plugins"})
        refs: list[ProfileRef] = []
        pickers = 0
        for ref_path, ref_item in p.items("plugins", required=True):
            r = Fields(f.source, ref_item, ref_path, {"ref", "weight"})
            ref = r.text("ref")
            weight = r.number("weight", None, low=0.0) if r.has("weight") else None
            kind = kinds.get(ref)
            if ref and kind is None:
                r.error(child(ref_path, "ref"), f"unknown plugin {ref!r}")
            if kind == "picker":
                pickers += 1
            if weight is not None and kind in ("picker", "filter"):
                r.error(
                    child(ref_path, "weight"), f"only scorers take a weight; {ref!r} is a {kind}"
                )
            refs.append(ProfileRef(ref, weight))
        if pickers != 1 and all(kinds.get(r.ref) for r in refs):
            p.error(child(path, "plugins"), f"needs exactly one picker, has {pickers}")
        profiles.append(ProfileSpec(p.text("name"), tuple(refs)))
    return profiles
