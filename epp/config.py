"""Build the scheduling profile from the policy's ``epp:`` section (fresh plugin instances)."""

from __future__ import annotations

from epp.framework import Filter, Picker, Profile, Scorer, WeightedScorer
from epp.registry import build
from policies.schema import Epp


def build_profile(config: Epp, name: str = "default") -> Profile:
    """The named profile (or the first one), its plugins instantiated from their specs."""
    plugins = {spec.name: build(spec.type, spec.name, spec.params) for spec in config.plugins}
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
