"""The reference backend driven by the official openai client, as a user would."""

from __future__ import annotations

import time

import openai
import pytest

from tests.integration.metrics_util import scrape, value

LONG_PROMPT = "The quarterly logistics report covers parcels, pallets and containers. " * 30


def client(base_url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{base_url}/v1", api_key="unused", max_retries=0, timeout=30)


def test_completion_and_usage(backend_url: str) -> None:
    result = client(backend_url).completions.create(
        model="kvgate-sim", prompt="Hello", max_tokens=5
    )
    assert result.object == "text_completion"
    assert result.choices[0].finish_reason == "length"
    assert len(result.choices[0].text) == 5  # one byte token per character
    assert result.usage is not None
    assert (result.usage.prompt_tokens, result.usage.completion_tokens) == (5, 5)


def test_completion_batch_of_prompts(backend_url: str) -> None:
    result = client(backend_url).completions.create(
        model="kvgate-sim", prompt=["one", "two", "three"], max_tokens=3
    )
    assert sorted(c.index for c in result.choices) == [0, 1, 2]
    assert result.usage is not None and result.usage.completion_tokens == 9


def test_streamed_completion_with_usage(backend_url: str) -> None:
    chunks = list(
        client(backend_url).completions.create(
            model="kvgate-sim",
            prompt="Stream me",
            max_tokens=8,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    assert len(text) == 8
    assert chunks[-2].choices[0].finish_reason == "length"
    usage = chunks[-1].usage
    assert usage is not None and usage.completion_tokens == 8 and chunks[-1].choices == []


def test_chat_stream_and_determinism(backend_url: str) -> None:
    messages = [{"role": "user", "content": "Tell me a story"}]
    api = client(backend_url)
    stream = api.chat.completions.create(
        model="kvgate-sim",
        messages=messages,
        max_tokens=10,
        stream=True,  # type: ignore[arg-type]
    )
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    whole = api.chat.completions.create(model="kvgate-sim", messages=messages, max_tokens=10)  # type: ignore[arg-type]
    assert whole.choices[0].message.content == streamed
    assert whole.object == "chat.completion"


def test_stop_string_ends_generation(backend_url: str) -> None:
    api = client(backend_url)
    full = api.completions.create(model="kvgate-sim", prompt="stop test", max_tokens=40)
    text = full.choices[0].text
    stop = text[10:13]
    cut = api.completions.create(model="kvgate-sim", prompt="stop test", max_tokens=40, stop=[stop])
    assert cut.choices[0].text == text[: text.find(stop)]
    assert cut.choices[0].finish_reason == "stop"


def test_models_list(backend_url: str) -> None:
    models = client(backend_url).models.list()
    assert models.data[0].id == "kvgate-sim"


def test_repeated_prompt_hits_the_prefix_cache(backend_url: str) -> None:
    api = client(backend_url)
    hits_before = value(backend_url, "vllm:prefix_cache_hits_total")
    timings = []
    usages = []
    for _ in range(2):
        start = time.perf_counter()
        stream = api.completions.create(
            model="kvgate-sim",
            prompt=LONG_PROMPT,
            max_tokens=2,
            stream=True,
            stream_options={"include_usage": True},
        )
        first = None
        for chunk in stream:
            if first is None and chunk.choices and chunk.choices[0].text:
                first = time.perf_counter() - start
            if chunk.usage:
                usages.append(chunk.usage)
        timings.append(first)
    prompt_len = len(LONG_PROMPT)
    assert usages[0].prompt_tokens_details.cached_tokens == 0
    assert usages[1].prompt_tokens_details.cached_tokens == (prompt_len - 1) // 16 * 16
    assert (
        value(backend_url, "vllm:prefix_cache_hits_total") - hits_before
        == (prompt_len - 1) // 16 * 16
    )
    # ~2,100 uncached prompt tokens cost ~105 ms in the default cost model; cached ones ~nothing.
    assert timings[1] is not None and timings[0] is not None
    assert timings[1] < timings[0] / 2


def test_metrics_have_vllm_names_and_labels(backend_url: str) -> None:
    client(backend_url).completions.create(model="kvgate-sim", prompt="metrics", max_tokens=2)
    samples = scrape(backend_url)
    for name in (
        "vllm:num_requests_running",
        "vllm:num_requests_waiting",
        "vllm:kv_cache_usage_perc",
        "vllm:prefix_cache_queries_total",
        "vllm:prefix_cache_hits_total",
        "vllm:num_preemptions_total",
        "vllm:prompt_tokens_total",
        "vllm:generation_tokens_total",
        "vllm:time_to_first_token_seconds_bucket",
        "vllm:inter_token_latency_seconds_bucket",
        "vllm:e2e_request_latency_seconds_count",
        "vllm:request_success_total",
    ):
        assert name in samples, name
        assert samples[name][0].labels.get("model_name") == "kvgate-sim"
        assert samples[name][0].labels.get("engine") == "0"
    info = samples["vllm:cache_config_info"][0]
    assert info.labels["block_size"] == "16" and info.labels["num_gpu_blocks"] == "512"
    assert samples["vllm:generation_tokens_total"][0].value >= 2


@pytest.mark.parametrize(
    ("call", "status"),
    [
        (lambda api: api.completions.create(model="nope", prompt="x"), 404),
        (lambda api: api.completions.create(model="kvgate-sim", prompt="x", max_tokens=0), 400),
        (lambda api: api.completions.create(model="kvgate-sim", prompt="x" * 9000), 400),
        (lambda api: api.completions.create(model="kvgate-sim", prompt="x", max_tokens=9000), 400),
        (lambda api: api.chat.completions.create(model="kvgate-sim", messages=[]), 400),
    ],
)
def test_bad_requests_get_openai_errors(backend_url: str, call, status: int) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(openai.APIStatusError) as err:
        call(client(backend_url))
    assert err.value.status_code == status
    body = err.value.body
    assert isinstance(body, dict) and {"message", "type", "param", "code"} <= set(body)


def test_cache_salt_separates_prefix_caches(backend_url: str) -> None:
    api = client(backend_url)
    prompt = "Salted prompts share cached blocks only within one salt. " * 8

    def cached(salt: str) -> int:
        result = api.completions.create(
            model="kvgate-sim", prompt=prompt, max_tokens=1, extra_body={"cache_salt": salt}
        )
        assert result.usage is not None and result.usage.prompt_tokens_details is not None
        return result.usage.prompt_tokens_details.cached_tokens or 0

    assert cached("tenant-a") == 0
    assert cached("tenant-a") > 0
    assert cached("tenant-b") == 0
