"""The ``epp:`` section: plugins by name and type, profiles of weighted references."""

from __future__ import annotations

from policies.fields import Fields, child
from policies.plugin_catalog import PluginCatalog
from policies.schema import (
    DEFAULT_EPP_PLUGINS,
    DEFAULT_EPP_PROFILES,
    Epp,
    Objective,
    PluginSpec,
    ProfileRef,
    ProfileSpec,
    Saturation,
)


def load_epp(top: Fields, plugin_types: PluginCatalog | None) -> Epp:
    f = top.sub(
        "epp",
        {
            "picker",
            "plugins",
            "profiles",
            "scrape_interval",
            "scrape_idle_interval",
            "saturation",
            "objectives",
        },
    )
    picker = f.text("picker", "epp", choices=("epp", "least-in-flight"))
    plugins: list[PluginSpec] = []
    kinds: dict[str, str] = {}
    for path, item in f.items("plugins"):
        p = Fields(f.source, item, path, {"name", "type", "params"})
        name, type_name = p.text("name"), p.text("type")
        params = p.raw("params") or {}
        if not isinstance(params, dict):
            p.error(child(path, "params"), "must be a mapping")
            params = {}
        if name in kinds:
            p.error(child(path, "name"), f"plugin name {name!r} is used twice")
        if name and type_name and plugin_types is None:
            kinds[name] = ""
        elif name and type_name and plugin_types is not None:
            kind = plugin_types.kind_of(type_name)
            try:
                plugin_types.check(type_name, name, params)
            except ValueError as exc:
                p.error(child(path, "params" if kind else "type"), str(exc))
            else:
                kinds[name] = kind or ""
        plugins.append(PluginSpec(name, type_name, params))
    if not plugins:
        plugins, kinds = list(DEFAULT_EPP_PLUGINS), {p.name: "" for p in DEFAULT_EPP_PLUGINS}
    profiles = _profiles(f, kinds) if f.has("profiles") else list(DEFAULT_EPP_PROFILES)
    return Epp(
        picker,
        tuple(plugins),
        tuple(profiles),
        f.duration("scrape_interval", 0.05),
        f.duration("scrape_idle_interval", 0.2),
        _saturation(f),
        _objectives(f),
    )


def _objectives(f: Fields) -> tuple[Objective, ...]:
    """``objectives: {name: {priority: N}}`` (GIE's InferenceObjective: below 0 is sheddable)."""
    objectives = []
    for path, name, value in f.entries("objectives"):
        o = Fields(f.source, value, path, {"priority"})
        objectives.append(Objective(name, o.integer("priority", 0, low=-1000, high=1000)))
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
