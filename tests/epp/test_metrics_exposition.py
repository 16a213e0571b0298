"""The metrics parser on the whole text exposition format: one series per engine (data
parallel), timestamps, escaped label values, odd values; checked against
``prometheus_client.parser`` on generated text."""

from __future__ import annotations

import math

from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families

from epp.datalayer.metrics_parser import VLLM, names_for, parse_labels, parse_metrics
from policies.loader import load_policy_text

DP_SCRAPE = """# HELP vllm:num_requests_waiting Number of requests waiting.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="m"} 7.0
vllm:num_requests_waiting{engine="1",model_name="m"} 0.0
vllm:num_requests_running{engine="0",model_name="m"} 4.0
vllm:num_requests_running{engine="1",model_name="m"} 2.0
vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.95
vllm:kv_cache_usage_perc{engine="1",model_name="m"} 0.1
vllm:cache_config_info{block_size="128",engine="0",num_gpu_blocks="300"} 1.0
vllm:cache_config_info{block_size="128",engine="1",num_gpu_blocks="300"} 1.0
vllm:lora_requests_info{engine="0",max_lora="2",running_lora_adapters="a",waiting_lora_adapters=""} 5.0
vllm:lora_requests_info{engine="0",max_lora="2",running_lora_adapters="old",waiting_lora_adapters=""} 1.0
vllm:lora_requests_info{engine="1",max_lora="2",running_lora_adapters="b",waiting_lora_adapters="c"} 4.0
vllm:request_success_total{engine="0",finished_reason="stop",model_name="m"} 12.0
vllm:request_success_created{engine="0",finished_reason="stop",model_name="m"} 1.7e9
"""


def test_engines_combine_so_a_saturated_one_stays_visible() -> None:
    metrics = parse_metrics(DP_SCRAPE)
    assert (metrics.waiting, metrics.running) == (7, 6)  # summed
    assert metrics.kv_usage == 0.95  # the fullest engine
    assert (metrics.block_size, metrics.num_gpu_blocks) == (128, 600)
    assert metrics.running_loras == {"a", "b"} and metrics.waiting_loras == {"c"}
    assert metrics.max_loras == 2


def test_timestamps_escapes_and_odd_values() -> None:
    text = "\n".join(
        [
            'vllm:num_requests_waiting{model_name="a \\"quoted\\" name, with = and }"} 3 1700000000000',
            'vllm:num_requests_running{model_name="back\\\\slash\\nnewline"} 2.0',
            'vllm:kv_cache_usage_perc{model_name="m",} NaN',
            "vllm:cache_config_info{} +Inf",
        ]
    )
    metrics = parse_metrics(text)
    assert (metrics.waiting, metrics.running) == (3, 2)  # the timestamp is not the value
    assert metrics.kv_usage == 0.0  # NaN reads as no usage
    assert parse_labels('a="x\\"y",b="\\\\",c="1\\n2"') == {"a": 'x"y', "b": "\\", "c": "1\n2"}


def test_the_older_kv_usage_name_and_per_pool_names() -> None:
    assert parse_metrics("vllm:gpu_cache_usage_perc 0.5\n").kv_usage == 0.5
    both = "vllm:gpu_cache_usage_perc 0.5\nvllm:kv_cache_usage_perc 0.25\n"
    assert parse_metrics(both).kv_usage == 0.25
    custom = names_for("vllm", {"waiting": "my:queue", "kv_usage": "my:kv"})
    assert (
        parse_metrics("my:queue 4\nmy:kv 0.3\nvllm:num_requests_waiting 9\n", custom).waiting == 4
    )
    assert parse_metrics("vllm:gpu_cache_usage_perc 0.5\n", custom).kv_usage == 0.0
    policy = load_policy_text("""
pools: {p: {endpoints: [127.0.0.1:1], metrics: {waiting: my:queue, kv_usage: my:kv}}}
routes: [{model: m, pool: p}]
""")
    assert dict(policy.pools["p"].metric_names) == {"waiting": "my:queue", "kv_usage": "my:kv"}


label_values = st.text(alphabet=st.sampled_from(list('ab ,={}"\\\n0')), min_size=0, max_size=8)
values = st.one_of(
    st.floats(min_value=0, max_value=1e6, allow_nan=False), st.sampled_from([math.nan])
)


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


@st.composite
def scrapes(draw: st.DrawFn) -> str:
    """Exposition text: the picker's series, one per engine, with noise series and odd labels
    around them, some with timestamps."""
    lines = []
    for engine in range(draw(st.integers(1, 3))):
        for name in (VLLM.waiting, VLLM.running, VLLM.kv_usage, "vllm:other_total"):
            label = _escape(draw(label_values))
            value = draw(values)
            stamp = f" {draw(st.integers(1, 2**40))}" if draw(st.booleans()) else ""
            lines.append(f'{name}{{engine="{engine}",model_name="{label}"}} {value!r}{stamp}')
        lines.append(f"# HELP {VLLM.waiting} {draw(label_values).replace(chr(10), ' ')}")
    return "\n".join(draw(st.permutations(lines))) + "\n"


def reference(text: str) -> tuple[int, int, float]:
    """What prometheus_client's parser reads, combined the way the picker combines engines."""
    found: dict[str, list[float]] = {VLLM.waiting: [], VLLM.running: [], VLLM.kv_usage: []}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name in found:
                found[sample.name].append(sample.value if math.isfinite(sample.value) else 0.0)
    return (
        int(sum(found[VLLM.waiting])),
        int(sum(found[VLLM.running])),
        max(found[VLLM.kv_usage], default=0.0),
    )


@settings(max_examples=150, deadline=None)
@given(scrapes())
def test_agrees_with_prometheus_client_on_generated_text(text: str) -> None:
    metrics = parse_metrics(text)
    assert (metrics.waiting, metrics.running, metrics.kv_usage) == reference(text)
