"""What a plugin may share with the EPP that builds it (GIE's plugin handle).

Plugins get a ``PluginHandle`` when they are built and keep only what they need from it: the
prefix index (one per distinct parameters, owned by the service, which starts it, feeds it and
teaches it each dispatched pick) and the pool's saturation detector (the same thresholds the
gateway's admission gate and ext_proc's shedding use), and where the picker runs (its zone and
region, ``epp.zone`` and ``epp.region``), and the TTFT model (built for a ``latency-scorer``;
the service then trains it with every first token).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from epp.datalayer.indexes.approximate import ApproximatePrefixCache
from epp.datalayer.indexes.precise import KVEventHooks
from epp.datalayer.indexes.precise_cache import PrecisePrefixCache
from epp.datalayer.indexes.prefix_index import PrefixIndex, PrefixIndexParams
from epp.datalayer.latency_model import LatencyModel
from epp.framework import Endpoint
from epp.scheduling.saturation import SaturationDetector


@dataclass(eq=False)
class PluginHandle:
    """Shared components for plugins; ``prefix_index`` builds an index on first request."""

    saturation: SaturationDetector = field(default_factory=SaturationDetector)
    endpoints: list[Endpoint] = field(default_factory=list)  # whose KV events a precise index reads
    kv_event_hooks: KVEventHooks | None = None  # what a precise index reports to metrics
    indexes: dict[PrefixIndexParams, PrefixIndex] = field(default_factory=dict)
    zone: str = ""  # where this picker runs ("": unknown)
    region: str = ""
    latency: LatencyModel | None = None  # None: no plugin predicts latency

    def latency_model(self) -> LatencyModel:
        """The shared TTFT model (built the first time it is asked for)."""
        if self.latency is None:
            self.latency = LatencyModel()
        return self.latency

    def prefix_index(self, params: PrefixIndexParams) -> PrefixIndex:
        """The shared index for ``params`` (built the first time it is asked for).

        Raises ``ValueError`` when a precise index's tokenizer cannot be loaded."""
        index = self.indexes.get(params)
        if index is None:
            if params.mode == "precise":
                index = PrecisePrefixCache(params, self.endpoints, self.kv_event_hooks)
            else:
                index = ApproximatePrefixCache(params)
            self.indexes[params] = index
        return index

    @property
    def primary_index(self) -> PrefixIndex | None:
        """The first index built (what prefill/decode decisions and gauges read)."""
        return next(iter(self.indexes.values()), None)
