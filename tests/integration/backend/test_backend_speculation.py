"""Speculative decoding through the real server, as a vLLM user turns it on: ``kvgate backend
--runner torch --speculative-config '{"method": "ngram", ...}'`` answers the official openai
client with the same greedy text as a server without it, streamed or not, and exports vLLM's
``vllm:spec_decode_*`` counters."""

from __future__ import annotations

from collections.abc import Iterator

import openai
import pytest

from loadtest.harness.processes import backend_process, free_port
from tests.fakes import close_after_test
from tests.integration.metrics_util import scrape

SPECULATIVE = '{"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 3}'
PROMPT = "Repeat after me: the parcel left the depot at noon. " * 4


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    """Two torch servers on the same random Llama: without drafts, and with them."""
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from tests.vllm.tiny_model import build_model, build_tokenizer

    folder = tmp_path_factory.mktemp("llama")
    build_tokenizer(folder)
    build_model(folder)
    args = ["--model-path", str(folder), "--kv-cache-memory", "16MiB", "--max-model-len", "1024"]
    plain, drafted = free_port(), free_port()
    with (
        backend_process(plain, *args, model="tiny-llama", runner="torch"),
        backend_process(
            drafted, *args, "--speculative-config", SPECULATIVE, model="tiny-llama", runner="torch"
        ),
    ):
        yield f"http://127.0.0.1:{plain}", f"http://127.0.0.1:{drafted}"


def client(url: str) -> openai.OpenAI:
    return close_after_test(
        openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=120)
    )


def test_the_same_greedy_text_streamed_or_not_and_the_counters(
    servers: tuple[str, str],
) -> None:
    texts = []
    for url in servers:
        done = client(url).completions.create(
            model="tiny-llama", prompt=PROMPT, max_tokens=40, temperature=0, seed=1
        )
        assert done.usage is not None and done.usage.completion_tokens == 40
        stream = client(url).completions.create(
            model="tiny-llama", prompt=PROMPT, max_tokens=40, temperature=0, stream=True
        )
        streamed = "".join(chunk.choices[0].text for chunk in stream if chunk.choices)
        assert streamed == done.choices[0].text
        texts.append(streamed)
    assert texts[1] == texts[0]
    samples = scrape(servers[1])
    drafts, draft_tokens, accepted = (
        samples[f"vllm:spec_decode_num_{name}_total"][0].value
        for name in ("drafts", "draft_tokens", "accepted_tokens")
    )
    per_position = samples["vllm:spec_decode_num_accepted_tokens_per_pos_total"]
    assert drafts > 0 and draft_tokens >= drafts and 0 <= accepted <= draft_tokens
    assert [s.labels["position"] for s in per_position] == ["0", "1", "2", "3"]
    assert sum(s.value for s in per_position) == accepted
    assert "vllm:spec_decode_num_drafts_total" not in scrape(servers[0])


def test_a_bad_speculative_config_stops_the_server_with_its_reason(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from kvgate.cli import main

    assert main(["backend", "--speculative-config", '{"method": "eagle"}', "--port", "0"]) == 2
    error = capsys.readouterr().err
    assert "invalid configuration: speculative method 'eagle' is not supported" in error
