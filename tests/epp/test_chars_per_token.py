"""The approximate index sizes each endpoint's LRU in characters by the ratio its answers show."""

from __future__ import annotations

from epp.datalayer.indexes.approximate import ApproximatePrefixCache
from epp.datalayer.indexes.chars_per_token import MIN_TOKENS, CharsPerToken
from epp.datalayer.indexes.prefix_index import PrefixIndexParams
from epp.framework import SchedulingRequest
from tests.epp.builders import make_endpoint

A, B = "10.0.0.1:8000", "10.0.0.2:8000"


def test_the_ratio_is_unknown_until_enough_tokens_were_seen() -> None:
    ratios = CharsPerToken()
    ratios.observe(A, 1_000, MIN_TOKENS - 1)
    assert ratios.of(A) is None
    ratios.observe(A, 10, 1)
    assert ratios.of(A) is not None
    assert abs(ratios.of(A) - 1_010 / MIN_TOKENS) < 0.01  # type: ignore[operator]
    assert ratios.of(B) is None


def test_implausible_samples_are_ignored_and_a_new_model_is_followed() -> None:
    ratios = CharsPerToken()
    for _ in range(20):
        ratios.observe(A, 400, 100)  # 4 characters per token
        ratios.observe(A, 100_000, 1)  # a misreport: 100,000 characters in one token
        ratios.observe(A, 5, 0)
    assert ratios.of(A) == 4.0
    for _ in range(2_000):  # the address now serves a byte-tokenized model
        ratios.observe(A, 110, 100)
    assert abs(ratios.of(A) - 1.1) < 0.01  # type: ignore[operator]
    ratios.forget(A)
    assert ratios.of(A) is None


def test_capacity_in_characters_follows_the_measured_ratio() -> None:
    index = ApproximatePrefixCache(PrefixIndexParams(block_size_tokens=16, chars_per_token=4))
    endpoint = make_endpoint(A)
    endpoint.metrics.block_size, endpoint.metrics.num_gpu_blocks = 16, 1_000
    assert index.capacity_of(endpoint) == 1_000  # configured: 4 characters per token
    text = "x" * 1_100
    request = SchedulingRequest("r", "m", text, body={"prompt": text})
    for _ in range(3):
        index.observe_usage(request, endpoint, 1_000)  # a byte tokenizer: 1.1 per token
    assert index.capacity_of(endpoint) == 275  # 16,000 tokens x 1.1 = 17,600 characters


def test_eviction_follows_the_calibrated_capacity() -> None:
    index = ApproximatePrefixCache(PrefixIndexParams(block_size_tokens=4, chars_per_token=4))
    endpoint = make_endpoint(A)
    endpoint.metrics.block_size, endpoint.metrics.num_gpu_blocks = 4, 8  # 32 tokens
    calibrate = "y" * 4_000
    index.observe_usage(
        SchedulingRequest("c", "m", calibrate, body={"prompt": calibrate}), endpoint, 4_000
    )
    # 1 character per token: the engine holds 32 characters, two 16-character blocks
    text = "".join(chr(ord("a") + i) * 16 for i in range(6))
    request = SchedulingRequest("r", "m", text, body={"prompt": text})
    index.learn(request, endpoint)
    assert index.blocks_of(A) == 2


def test_a_pinned_ratio_is_not_measured() -> None:
    params = PrefixIndexParams(block_size_tokens=16, measure_chars_per_token=False)
    index = ApproximatePrefixCache(params)
    endpoint = make_endpoint(A)
    endpoint.metrics.block_size, endpoint.metrics.num_gpu_blocks = 16, 1_000
    text = "x" * 4_000
    index.observe_usage(SchedulingRequest("r", "m", text, body={"prompt": text}), endpoint, 4_000)
    assert index.capacity_of(endpoint) == 1_000  # still 4 characters per token
