"""Build the scheduling profile from the policy's ``epp:`` section (fresh plugin instances)."""

from __future__ import annotations

from epp.framework import Filter, Picker, Profile, Scorer, WeightedScorer
from epp.scheduling.handle import PluginHandle
from epp.scheduling.registry import Plugin, build
from policies.schema import Epp


def build_plugins(config: Epp, handle: PluginHandle) -> dict[str, Plugin]:
    """Every plugin of the ``epp:`` section by name, each built once."""
    return {spec.name: build(spec.type, spec.name, spec.params, handle) for spec in config.plugins}


def build_profile(
    config: Epp,
    name: str = "default",
    handle: PluginHandle | None = None,
    plugins: dict[str, Plugin] | None = None,
) -> Profile:
    """The named profile (or the first one), from ``plugins`` (built from their specs with
    ``handle`` when not given)."""
    if plugins is None:
        plugins = build_plugins(config, handle or PluginHandle())
    spec = next((p for p in config.profiles if p.name == name), config.profiles[0])
    filters: list[Filter] = []
    scorers: list[WeightedScorer] = []
    picker: Picker | None = None
    for ref in spec.plugins:
        plugin = plugins[ref.ref]
        if isinstance(plugin, Scorer):
            scorers.append(WeightedScorer(plugin, 1.0 if ref.weight is None else ref.weight))
        elif isinstance(plugin, Picker):
            picker = plugin
        elif isinstance(plugin, Filter):
            filters.append(plugin)
    if picker is None:
        raise ValueError(f"profile {spec.name!r} has no picker")
    return Profile(spec.name, tuple(filters), tuple(scorers), picker)
