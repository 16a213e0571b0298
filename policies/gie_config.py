"""A GIE / llm-d ``EndpointPickerConfig``, read as kvgate's picker configuration: the same
plugins, weights and profiles mean the same here as there.

Given to ``kvgate epp --config FILE``, or inline as the policy's ``epp.config``::

    apiVersion: inference.networking.x-k8s.io/v1alpha1
    kind: EndpointPickerConfig
    plugins:
      - {type: prefix-cache-scorer, parameters: {blockSizeTokens: 16, maxPrefixBlocksToMatch: 256}}
      - {type: queue-scorer}
      - {type: kv-cache-utilization-scorer}
      - {type: max-score-picker}
      - {type: single-profile-handler}
    schedulingProfiles:
      - name: default
        plugins:
          - {pluginRef: prefix-cache-scorer, weight: 3}
          - {pluginRef: queue-scorer, weight: 2}
          - {pluginRef: kv-cache-utilization-scorer, weight: 2}
          - {pluginRef: max-score-picker}

A plugin's ``name`` defaults to its type, as in GIE. GIE parameters are renamed to kvgate's
(``GIE_PARAMETERS``); a profile without a picker gets ``max-score-picker``, as in GIE. The
``utilization-detector`` sets the one saturation setting (and, referenced in a profile, is
kvgate's ``saturation-filter``). The data layer and parser GIE configures (metrics source,
core extractor, OpenAI parser) are what kvgate does built in. Any other type is an error that
names it.
"""

from __future__ import annotations

from dataclasses import dataclass

from policies.fields import Fields, child
from policies.schema import PluginSpec, ProfileRef, ProfileSpec, Saturation

API_VERSION = "inference.networking.x-k8s.io/v1alpha1"
KIND = "EndpointPickerConfig"

# GIE type -> (kvgate type, {GIE parameter: kvgate parameter})
GIE_PARAMETERS: dict[str, tuple[str, dict[str, str]]] = {
    "prefix-cache-scorer": (
        "prefix-cache-scorer",
        {
            "blockSizeTokens": "block_size_tokens",
            "maxPrefixBlocksToMatch": "max_prefix_blocks",
            "lruCapacityPerServer": "lru_capacity_per_endpoint",
        },
    ),
    "queue-scorer": ("queue-scorer", {}),
    "kv-cache-utilization-scorer": ("kv-cache-utilization-scorer", {}),
    "lora-affinity-scorer": ("lora-affinity-scorer", {}),
    "running-requests-size-scorer": ("running-requests-size-scorer", {}),
    "session-affinity-scorer": ("session-affinity-scorer", {}),
    "max-score-picker": ("max-score-picker", {}),
    "random-picker": ("random-picker", {}),
    "decode-filter": ("decode-filter", {}),
    "prefill-filter": ("prefill-filter", {}),
}
# accepted parameters that change nothing here: (type, parameter) -> the value that is kvgate's
KVGATE_DOES_THIS: dict[tuple[str, str], object] = {
    ("prefix-cache-scorer", "autoTune"): True,  # the index sizes itself from cache_config_info
    ("max-score-picker", "maxNumOfEndpoints"): 1,  # one pick; the ranking orders the retries
}
BUILT_IN = {  # the data layer and parser kvgate always runs
    "single-profile-handler",
    "metrics-data-source",
    "core-metrics-extractor",
    "openai-parser",
}
DETECTOR = "utilization-detector"
DETECTOR_PARAMETERS = {
    "queueDepthThreshold": "queue_depth",
    "kvCacheUtilThreshold": "kv_usage",
    "metricsStalenessThreshold": "max_metrics_age",
    "headroom": "",
}


@dataclass(frozen=True)
class PickerConfig:
    plugins: tuple[PluginSpec, ...]
    profiles: tuple[ProfileSpec, ...]
    saturation: Saturation


TOP_LEVEL = {
    "apiVersion",
    "kind",
    "featureGates",
    "plugins",
    "schedulingProfiles",
    "saturationDetector",
    "data",
    "parser",
    "flowControl",
}


def load_gie_config(f: Fields) -> PickerConfig:
    """The picker configuration ``f`` (an ``EndpointPickerConfig`` mapping, its keys checked
    against ``TOP_LEVEL``) stands for."""
    f.text("apiVersion", API_VERSION, choices=(API_VERSION,))
    f.text("kind", KIND, choices=(KIND,))
    for gate in f.str_list("featureGates") or ():
        if gate != "dataLayer":  # kvgate's data layer is always on
            f.error(child(f.path, "featureGates"), f"feature gate {gate!r} is not supported")
    if f.has("flowControl"):
        f.error(
            child(f.path, "flowControl"),
            "not supported: kvgate's admission queue and priority classes (classes:) do this",
        )
    plugins: list[PluginSpec] = []
    names: dict[str, str] = {}  # plugin name -> GIE type
    saturation = Saturation()
    for path, item in f.items("plugins", required=True):
        p = Fields(f.source, item, path, {"name", "type", "parameters"})
        gie_type = p.text("type")
        name = p.text("name", None) or gie_type
        if name in names:
            p.error(child(path, "name"), f"plugin name {name!r} is used twice")
        names[name] = gie_type
        raw = p.raw("parameters") or {}
        if not isinstance(raw, dict):
            p.error(child(path, "parameters"), "must be a mapping")
            raw = {}
        if gie_type == DETECTOR:
            saturation = _detector(
                Fields(f.source, raw, child(path, "parameters"), set(DETECTOR_PARAMETERS))
            )
            continue
        if gie_type in BUILT_IN:
            continue
        known = GIE_PARAMETERS.get(gie_type)
        if known is None:
            if gie_type:
                supported = sorted({*GIE_PARAMETERS, *BUILT_IN, DETECTOR})
                p.error(
                    child(path, "type"),
                    f"GIE plugin type {gie_type!r} has no kvgate equivalent "
                    f"(supported: {', '.join(supported)})",
                )
            continue
        kvgate_type, renames = known
        params = _parameters(p, child(path, "parameters"), gie_type, raw, renames)
        plugins.append(PluginSpec(name, kvgate_type, params))
    profiles = [
        _profile(f, path, item, names, plugins)
        for path, item in f.items("schedulingProfiles", required=True)
    ]
    if not profiles and f.has("schedulingProfiles"):
        f.error(child(f.path, "schedulingProfiles"), "needs at least one profile")
    detectors = {
        r.ref for profile in profiles for r in profile.plugins if names.get(r.ref) == DETECTOR
    }
    plugins.extend(PluginSpec(name, "saturation-filter") for name in sorted(detectors))
    if f.has("saturationDetector"):
        s = f.sub("saturationDetector", {"pluginRef"})
        ref = s.text("pluginRef")
        if ref and names.get(ref) != DETECTOR:
            s.error(child(s.path, "pluginRef"), f"must name a {DETECTOR} plugin; got {ref!r}")
    return PickerConfig(tuple(plugins), tuple(profiles), saturation)


def _parameters(
    p: Fields, path: str, gie_type: str, raw: dict[str, object], renames: dict[str, str]
) -> dict[str, object]:
    params: dict[str, object] = {}
    for key, value in raw.items():
        if key in renames:
            params[renames[key]] = value
        elif (gie_type, key) in KVGATE_DOES_THIS:
            expected = KVGATE_DOES_THIS[(gie_type, key)]
            if value != expected:
                p.error(child(path, key), f"only {expected!r} is supported (kvgate's behaviour)")
        else:
            accepted = sorted({*renames, *(k for t, k in KVGATE_DOES_THIS if t == gie_type)})
            p.error(
                child(path, key),
                f"unknown parameter of {gie_type} (expected: {', '.join(accepted) or 'none'})",
            )
    return params


def _detector(d: Fields) -> Saturation:
    default = Saturation()
    if d.has("headroom") and d.number("headroom", 0.0) != 0.0:
        d.error(child(d.path, "headroom"), "only 0 is supported")
    return Saturation(
        d.integer("queueDepthThreshold", default.queue_depth, low=1),
        d.number("kvCacheUtilThreshold", default.kv_usage, low=0.01, high=1.0),
        d.duration("metricsStalenessThreshold", default.max_metrics_age),
    )


def _profile(
    f: Fields, path: str, item: object, names: dict[str, str], plugins: list[PluginSpec]
) -> ProfileSpec:
    p = Fields(f.source, item, path, {"name", "plugins"})
    kinds = {spec.name: spec.type for spec in plugins}
    refs: list[ProfileRef] = []
    for ref_path, ref_item in p.items("plugins", required=True):
        r = Fields(f.source, ref_item, ref_path, {"pluginRef", "weight"})
        ref = r.text("pluginRef")
        weight = r.number("weight", None, low=0.0) if r.has("weight") else None
        if ref and ref not in names:
            r.error(child(ref_path, "pluginRef"), f"unknown plugin {ref!r}")
        elif names.get(ref) in BUILT_IN:
            r.error(child(ref_path, "pluginRef"), f"{ref!r} is not a scheduling plugin")
        elif ref:
            refs.append(ProfileRef(ref, weight))
    if not any(kinds.get(r.ref, "").endswith("-picker") for r in refs):
        if "max-score-picker" not in kinds:
            plugins.append(PluginSpec("max-score-picker", "max-score-picker"))
        refs.append(ProfileRef("max-score-picker"))
    return ProfileSpec(p.text("name"), tuple(refs))
