"""A GIE / llm-d ``EndpointPickerConfig`` read as kvgate's picker configuration (inline as
``epp.config``, or ``kvgate epp --config FILE``): it means what the same plugins, weights and
profiles mean in kvgate's own format, and what kvgate lacks is an error that names it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from epp.scheduling.config import build_profile
from epp.scheduling.handle import PluginHandle
from epp.scheduling.registry import CATALOG
from policies.errors import PolicyError
from policies.loader import load_policy_text, with_picker_config
from policies.schema import Policy, Saturation

BASE = "pools: {a: {endpoints: [127.0.0.1:8001]}}\nroutes: [{model: m, pool: a}]\n"
GIE_DEFAULTS = """apiVersion: inference.networking.x-k8s.io/v1alpha1
kind: EndpointPickerConfig
plugins:
  - {type: queue-scorer}
  - {type: kv-cache-utilization-scorer}
  - type: prefix-cache-scorer
    parameters: {blockSizeTokens: 32, maxPrefixBlocksToMatch: 128, lruCapacityPerServer: 1000,
                 autoTune: true}
  - {type: max-score-picker, parameters: {maxNumOfEndpoints: 1}}
  - {type: single-profile-handler}
  - {type: metrics-data-source}
  - type: utilization-detector
    parameters: {queueDepthThreshold: 7, kvCacheUtilThreshold: 0.9, metricsStalenessThreshold: 150ms}
saturationDetector: {pluginRef: utilization-detector}
schedulingProfiles:
  - name: default
    plugins:
      - {pluginRef: queue-scorer, weight: 2}
      - {pluginRef: kv-cache-utilization-scorer, weight: 2}
      - {pluginRef: prefix-cache-scorer, weight: 3}
      - {pluginRef: max-score-picker}
"""
KVGATE_FORMAT = """epp:
  plugins:
    - {name: queue-scorer, type: queue-scorer}
    - {name: kv-cache-utilization-scorer, type: kv-cache-utilization-scorer}
    - name: prefix-cache-scorer
      type: prefix-cache-scorer
      params: {block_size_tokens: 32, max_prefix_blocks: 128, lru_capacity_per_endpoint: 1000}
    - {name: max-score-picker, type: max-score-picker}
  profiles:
    - name: default
      plugins:
        - {ref: queue-scorer, weight: 2}
        - {ref: kv-cache-utilization-scorer, weight: 2}
        - {ref: prefix-cache-scorer, weight: 3}
        - {ref: max-score-picker}
  saturation: {queue_depth: 7, kv_usage: 0.9, max_metrics_age: 150ms}
"""


def inline(config: str) -> str:
    indented = "".join(f"    {line}\n" for line in config.splitlines())
    return f"{BASE}epp:\n  config:\n{indented}"


def policy(text: str) -> Policy:
    return load_policy_text(text, plugins=CATALOG)


def errors_of(text: str) -> list[str]:
    with pytest.raises(PolicyError) as err:
        policy(text)
    return err.value.errors


def test_it_means_what_kvgates_own_format_means() -> None:
    gie = policy(inline(GIE_DEFAULTS)).epp
    own = policy(BASE + KVGATE_FORMAT).epp
    assert (gie.plugins, gie.profiles, gie.saturation) == (
        own.plugins,
        own.profiles,
        own.saturation,
    )
    assert gie.saturation == Saturation(7, 0.9, 0.15)
    profile = build_profile(gie, handle=PluginHandle())  # and it builds
    assert [(s.scorer.name, s.weight) for s in profile.scorers] == [
        ("queue-scorer", 2.0),
        ("kv-cache-utilization-scorer", 2.0),
        ("prefix-cache-scorer", 3.0),
    ]


def test_a_profile_gets_gies_defaults_and_the_detector_filters() -> None:
    epp = policy(
        inline("""plugins: [{name: q, type: queue-scorer}, {name: sat, type: utilization-detector}]
schedulingProfiles: [{name: default, plugins: [{pluginRef: sat}, {pluginRef: q}]}]
""")
    ).epp
    assert [(p.name, p.type) for p in epp.plugins] == [
        ("q", "queue-scorer"),
        ("max-score-picker", "max-score-picker"),  # a profile without a picker gets GIE's
        ("sat", "saturation-filter"),  # the detector in a profile filters saturated endpoints
    ]
    assert [r.ref for r in epp.profiles[0].plugins] == ["sat", "q", "max-score-picker"]


def test_what_kvgate_lacks_is_an_error_that_names_it() -> None:
    errors = errors_of(
        inline("""apiVersion: inference.networking.x-k8s.io/v1alpha2
kind: EndpointPickerConfig
featureGates: [flowControl]
plugins:
  - {type: latency-scorer}
  - {type: prefix-cache-scorer, parameters: {autoTune: false, blockSize: 64}}
  - {type: queue-scorer, parameters: {blockSizeTokens: -1}}
  - {type: queue-scorer}
schedulingProfiles:
  - {name: default, plugins: [{pluginRef: nope}, {pluginRef: metrics}]}
flowControl: {maxRequests: 10}
""")
    )
    assert errors[0] == (
        "epp.config.apiVersion (line 5): must be one of inference.networking.x-k8s.io/v1alpha1;"
        " got 'inference.networking.x-k8s.io/v1alpha2'"
    )
    assert "epp.config.featureGates (line 7): feature gate 'flowControl' is not supported" in errors
    assert any(e.startswith("epp.config.flowControl (line 15): not supported") for e in errors)
    assert any(
        e.startswith(
            "epp.config.plugins[0].type (line 9): GIE plugin type 'latency-scorer' has no kvgate"
            " equivalent (supported: "
        )
        for e in errors
    )
    assert (
        "epp.config.plugins[1].parameters.autoTune (line 10): only True is supported"
        " (kvgate's behaviour)" in errors
    )
    assert any(
        e.startswith("epp.config.plugins[1].parameters.blockSize (line 10): unknown parameter")
        for e in errors
    )
    assert any(
        e.startswith("epp.config.plugins[2].parameters.blockSizeTokens (line 11): unknown")
        for e in errors
    )
    assert (
        "epp.config.plugins[3].name (line 12): plugin name 'queue-scorer' is used twice" in errors
    )
    assert (
        "epp.config.schedulingProfiles[0].plugins[0].pluginRef (line 14): unknown plugin 'nope'"
        in errors
    )


def test_kvgate_checks_the_parameters_it_is_given() -> None:
    errors = errors_of(
        inline("""plugins: [{type: prefix-cache-scorer, parameters: {blockSizeTokens: 0}}]
schedulingProfiles: [{name: default, plugins: [{pluginRef: prefix-cache-scorer}]}]
""")
    )
    assert errors == [
        "epp.config.plugins (line 5): prefix-cache-scorer.block_size_tokens: value 0 is out of range"
    ]


def test_it_cannot_sit_beside_kvgates_own_format() -> None:
    text = inline(GIE_DEFAULTS).replace("epp:\n", "epp:\n  saturation: {queue_depth: 3}\n", 1)
    assert errors_of(text) == [
        "epp.saturation (line 4): cannot be set beside epp.config (the GIE config)"
    ]


def test_kvgate_epp_config_replaces_the_policys_picker(tmp_path: Path) -> None:
    config = tmp_path / "epp-config.yaml"
    config.write_text(GIE_DEFAULTS)
    replaced = with_picker_config(policy(BASE), config, plugins=CATALOG)
    assert replaced.epp == policy(inline(GIE_DEFAULTS)).epp
    assert replaced.pools == policy(BASE).pools
    bad = tmp_path / "bad.yaml"
    bad.write_text("plugins: [{type: token-load-scorer}]\nschedulingProfiles: []\n")
    policy_file = tmp_path / "policy.yaml"
    policy_file.write_text(BASE)
    done = subprocess.run(
        [sys.executable, "-m", "kvgate", "epp", "--policy", str(policy_file), "--config", str(bad)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 1
    assert "GIE plugin type 'token-load-scorer' has no kvgate equivalent" in done.stderr
    assert "schedulingProfiles (line 2): needs at least one profile" in done.stderr
