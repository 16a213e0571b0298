"""Plugin registry: type name → its kind, parameter check and factory; duplicates are refused.

``CATALOG`` is what the policy loader checks the ``epp:`` section against
(``policies.plugin_catalog.PluginCatalog``): a parameter check builds nothing, so each plugin
is constructed once, when the EPP builds its profile.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Protocol

from epp.framework import Filter, Picker, Scorer
from epp.scheduling.filters.health import HealthFilter, ModelFilter
from epp.scheduling.filters.load_balance import LoadBalanceFilter
from epp.scheduling.filters.placed_adapter import PlacedAdapterFilter
from epp.scheduling.filters.role import RoleFilter
from epp.scheduling.filters.saturation import SaturationFilter
from epp.scheduling.handle import PluginHandle
from epp.scheduling.pickers.max_score import MaxScorePicker
from epp.scheduling.pickers.random_picker import RandomPicker
from epp.scheduling.scorers.active_requests import ActiveRequestScorer
from epp.scheduling.scorers.cold_spread import ColdSpreadScorer
from epp.scheduling.scorers.kv_cache_utilization import KVCacheUtilizationScorer
from epp.scheduling.scorers.latency import LatencyScorer
from epp.scheduling.scorers.lora_affinity import LoraAffinityScorer
from epp.scheduling.scorers.prefix_cache import PrefixCacheScorer
from epp.scheduling.scorers.queue import QueueScorer
from epp.scheduling.scorers.running_requests import RunningRequestsScorer
from epp.scheduling.scorers.session_affinity import SessionAffinityScorer
from epp.scheduling.scorers.token_backlog import TokenBacklogScorer
from epp.scheduling.scorers.zone_affinity import ZoneAffinityScorer
from policies.plugin_catalog import PluginKind

Plugin = Filter | Scorer | Picker
Factory = Callable[[str, Mapping[str, object], PluginHandle], Plugin]
ParamCheck = Callable[[str, Mapping[str, object]], object]


@dataclass(frozen=True, slots=True)
class PluginType:
    """A registered plugin type: what it is, how its parameters are checked, how it is built."""

    kind: PluginKind
    check: ParamCheck  # raises ParamError (a ValueError) for invalid params; builds nothing
    factory: Factory


REGISTRY: dict[str, PluginType] = {}


def register(type_name: str, plugin_type: PluginType) -> None:
    if type_name in REGISTRY:
        raise ValueError(f"plugin type {type_name!r} is already registered")
    REGISTRY[type_name] = plugin_type


def _lookup(type_name: str) -> PluginType:
    plugin_type = REGISTRY.get(type_name)
    if plugin_type is None:
        raise ValueError(
            f"unknown plugin type {type_name!r} (known: {', '.join(sorted(REGISTRY))})"
        )
    return plugin_type


def build(type_name: str, name: str, params: Mapping[str, object], handle: PluginHandle) -> Plugin:
    """A plugin of a registered type, built with what it shares with the EPP (``handle``)."""
    return _lookup(type_name).factory(name, params, handle)


class Catalog:
    """The registry as the policy loader sees it (``PluginCatalog``)."""

    def kind_of(self, type_name: str) -> PluginKind | None:
        plugin_type = REGISTRY.get(type_name)
        return None if plugin_type is None else plugin_type.kind

    def check(self, type_name: str, name: str, params: Mapping[str, object]) -> None:
        _lookup(type_name).check(name, params)


CATALOG = Catalog()


class _Configurable(Protocol):
    """A plugin class that needs nothing shared: its parameter check and its factory."""

    def parse_config(self, name: str, raw: Mapping[str, object]) -> object: ...
    def from_config(self, name: str, raw: Mapping[str, object]) -> Plugin: ...


class _Sharing(Protocol):
    """A plugin class built with the EPP's shared components (``PluginHandle``)."""

    def parse_config(self, name: str, raw: Mapping[str, object]) -> object: ...
    def from_config(self, name: str, raw: Mapping[str, object], handle: PluginHandle) -> Plugin: ...


def _plugin(kind: PluginKind, cls: _Configurable) -> PluginType:
    return PluginType(kind, cls.parse_config, lambda name, raw, _: cls.from_config(name, raw))


def _shared(kind: PluginKind, cls: _Sharing) -> PluginType:
    return PluginType(kind, cls.parse_config, cls.from_config)


BUILTINS: dict[str, PluginType] = {
    "queue-scorer": _plugin("scorer", QueueScorer),
    "active-request-scorer": _plugin("scorer", ActiveRequestScorer),
    "cold-spread-scorer": _shared("scorer", ColdSpreadScorer),
    "load-balance-filter": _plugin("filter", LoadBalanceFilter),
    "running-requests-size-scorer": _plugin("scorer", RunningRequestsScorer),
    "kv-cache-utilization-scorer": _plugin("scorer", KVCacheUtilizationScorer),
    "latency-scorer": _shared("scorer", LatencyScorer),
    "prefix-cache-scorer": _shared("scorer", PrefixCacheScorer),
    "lora-affinity-scorer": _plugin("scorer", LoraAffinityScorer),
    "session-affinity-scorer": _shared("scorer", SessionAffinityScorer),
    "token-backlog-scorer": _shared("scorer", TokenBacklogScorer),
    "zone-affinity-scorer": _shared("scorer", ZoneAffinityScorer),
    "max-score-picker": _plugin("picker", MaxScorePicker),
    "random-picker": _plugin("picker", RandomPicker),
    "saturation-filter": _shared("filter", SaturationFilter),
    "placed-adapter-filter": _shared("filter", PlacedAdapterFilter),
    "health-filter": _plugin("filter", HealthFilter),
    "model-filter": _plugin("filter", ModelFilter),
    "decode-filter": PluginType(
        "filter", RoleFilter.parse_config, lambda name, raw, _: RoleFilter.decode(name, raw)
    ),
    "prefill-filter": PluginType(
        "filter", RoleFilter.parse_config, lambda name, raw, _: RoleFilter.prefill(name, raw)
    ),
}
# plugins that read what every tenant's requests taught the picker (the shared prefix index,
# the sessions' homes): what they say of a request tells whether others sent the same prompt
SHARED_KNOWLEDGE = frozenset(
    {
        "prefix-cache-scorer",
        "cold-spread-scorer",
        "token-backlog-scorer",
        "session-affinity-scorer",
        "latency-scorer",
    }
)
for _type_name, _plugin_type in BUILTINS.items():
    register(_type_name, _plugin_type)
