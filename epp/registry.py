"""Plugin registry: type name → factory ``(name, params) -> plugin``; duplicates are refused."""

from __future__ import annotations

from collections.abc import Callable, Mapping

from epp.filters.health import HealthFilter, ModelFilter
from epp.filters.role import RoleFilter
from epp.filters.saturation import SaturationFilter
from epp.framework import Filter, Picker, Scorer
from epp.pickers.max_score import MaxScorePicker
from epp.pickers.random_picker import RandomPicker
from epp.scorers.kv_cache_utilization import KVCacheUtilizationScorer
from epp.scorers.lora_affinity import LoraAffinityScorer
from epp.scorers.prefix_cache import PrefixCacheScorer
from epp.scorers.queue import QueueScorer
from epp.scorers.running_requests import RunningRequestsScorer
from epp.scorers.session_affinity import SessionAffinityScorer

Plugin = Filter | Scorer | Picker
Factory = Callable[[str, Mapping[str, object]], Plugin]

REGISTRY: dict[str, Factory] = {}


def register(type_name: str, factory: Factory) -> None:
    if type_name in REGISTRY:
        raise ValueError(f"plugin type {type_name!r} is already registered")
    REGISTRY[type_name] = factory


def build(type_name: str, name: str, params: Mapping[str, object]) -> Plugin:
    factory = REGISTRY.get(type_name)
    if factory is None:
        raise ValueError(
            f"unknown plugin type {type_name!r} (known: {', '.join(sorted(REGISTRY))})"
        )
    return factory(name, params)


BUILTINS: dict[str, Factory] = {
    "queue-scorer": QueueScorer.from_config,
    "running-requests-size-scorer": RunningRequestsScorer.from_config,
    "kv-cache-utilization-scorer": KVCacheUtilizationScorer.from_config,
    "prefix-cache-scorer": PrefixCacheScorer.from_config,
    "lora-affinity-scorer": LoraAffinityScorer.from_config,
    "session-affinity-scorer": SessionAffinityScorer.from_config,
    "max-score-picker": MaxScorePicker.from_config,
    "random-picker": RandomPicker.from_config,
    "saturation-filter": SaturationFilter.from_config,
    "health-filter": HealthFilter.from_config,
    "model-filter": ModelFilter.from_config,
    "decode-filter": RoleFilter.decode,
    "prefill-filter": RoleFilter.prefill,
}
for _type_name, _factory in BUILTINS.items():
    register(_type_name, _factory)
