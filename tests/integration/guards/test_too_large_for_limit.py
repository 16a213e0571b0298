"""A request that can never fit its token limit is refused once, at once:
the official client does not retry it for minutes."""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable

import openai
import pytest

from loadtest.harness.processes import KvgateProcess
from tests.fakes import close_after_test
from tests.integration.metrics_util import scrape

KEY = "sk-too-large"


def test_the_openai_client_gets_one_clear_refusal(
    start_backend: Callable[..., str], start_gateway: Callable[..., tuple[str, KvgateProcess]]
) -> None:
    backend = start_backend("--cost", "zero").removeprefix("http://")
    url, _ = start_gateway(f"""
pools: {{p: {{endpoints: [{backend}]}}}}
routes: [{{model: kvgate-sim, pool: p}}]
auth: {{api_keys: [{{sha256: {hashlib.sha256(KEY.encode()).hexdigest()}, tenant: t}}]}}
limits: {{rules: [{{name: tpm, match: {{tenant: "*"}}, tokens_per_min: 200000}}]}}
""")
    client = close_after_test(
        openai.OpenAI(base_url=f"{url}/v1", api_key=KEY)
    )  # the default: 2 retries
    started = time.monotonic()
    with pytest.raises(openai.RateLimitError) as err:
        client.completions.create(model="kvgate-sim", prompt="x", max_tokens=1_000_000)
    assert time.monotonic() - started < 1.0  # no backoff-and-retry rounds
    assert "Limit 200000, Requested" in str(err.value)
    refused = [
        s.value for s in scrape(url)["kvgate_requests_total"] if s.labels.get("status") == "429"
    ]
    assert sum(refused) == 1
    with pytest.raises(openai.BadRequestError, match="max_tokens must be a positive integer"):
        client.completions.create(model="kvgate-sim", prompt="x", max_tokens=1e9)  # type: ignore[call-overload]


def test_with_the_context_length_known_the_engine_answers_instead(
    start_backend: Callable[..., str], start_gateway: Callable[..., tuple[str, KvgateProcess]]
) -> None:
    backend = start_backend("--cost", "zero").removeprefix("http://")
    url, _ = start_gateway(f"""
pools: {{p: {{endpoints: [{backend}], max_model_len: 4096}}}}
routes: [{{model: kvgate-sim, pool: p}}]
auth: {{api_keys: [{{sha256: {hashlib.sha256(KEY.encode()).hexdigest()}, tenant: t}}]}}
limits: {{rules: [{{name: tpm, match: {{tenant: "*"}}, tokens_per_min: 200000}}]}}
""")
    client = close_after_test(openai.OpenAI(base_url=f"{url}/v1", api_key=KEY, max_retries=0))
    # the estimate is at most the context length, so the limit admits it; the engine is the
    # one to say that a million output tokens cannot fit its context
    with pytest.raises(openai.BadRequestError) as err:
        client.completions.create(model="kvgate-sim", prompt="x", max_tokens=1_000_000)
    assert "Limit 200000" not in str(err.value)
    done = client.completions.create(model="kvgate-sim", prompt="x", max_tokens=5)
    assert done.usage is not None and done.usage.completion_tokens == 5
