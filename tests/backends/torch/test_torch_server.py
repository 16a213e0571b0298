"""``kvgate backend --runner torch`` on a transformers-saved model, driven by the openai client
(a real subprocess on loopback), as the simulated runner's server tests drive it."""

from __future__ import annotations

import json
import shutil
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest
import torch
from openai.types.chat import ChatCompletionMessageParam

from loadtest.harness.processes import backend_process, free_port
from tests.backends.torch.conftest import hf_greedy
from tests.backends.torch.test_lora_and_sampling import merged, save_adapter
from tests.fakes import close_after_test
from tests.integration.metrics_util import scrape

MODEL = "tiny-llama"


class Reply:
    def __init__(self, status_code: int, text: str) -> None:
        self.status_code, self.text = status_code, text

    def json(self) -> dict[str, Any]:
        body = json.loads(self.text)
        assert isinstance(body, dict)
        return body


def post(url: str, body: object) -> Reply:
    request = urllib.request.Request(
        url, json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return Reply(response.status, response.read().decode())
    except urllib.error.HTTPError as exc:
        return Reply(exc.code, exc.read().decode())


@pytest.fixture(scope="module", params=["thread", "engine-process"])
def served(
    request: pytest.FixtureRequest,
    model_folders: dict[str, Path],
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[str, Path, Path]]:
    tmp = tmp_path_factory.mktemp("served")
    adapter = tmp / "sql"
    save_adapter(model_folders["llama"], adapter, 5, ["q_proj", "v_proj"])
    port = free_port()
    args: tuple[str, ...] = (
        "--model-path",
        str(model_folders["llama"]),
        "--kv-cache-memory",
        "32MiB",
        "--max-model-len",
        "1024",
    )
    if request.param == "engine-process":
        args += ("--engine-process",)
    with backend_process(port, *args, "--max-loras", "1", model=MODEL, runner="torch"):
        yield f"http://127.0.0.1:{port}", model_folders["llama"], adapter


def api(url: str) -> openai.OpenAI:
    return close_after_test(
        openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=60)
    )


def test_greedy_completion_is_transformers_own_with_usage_and_token_ids(
    served: tuple[str, Path, Path], hf_models: dict[str, object]
) -> None:
    url, _, _ = served
    tokens = post(f"{url}/tokenize", {"prompt": "hello world river"}).json()["tokens"]
    result = api(url).completions.create(
        model=MODEL,
        prompt="hello world river",
        max_tokens=16,
        temperature=0,
        extra_body={"ignore_eos": True, "return_token_ids": True},
    )
    choice = result.choices[0]
    expected = hf_greedy(hf_models["llama"], tokens, 16)
    assert choice.model_extra is not None
    assert choice.model_extra["token_ids"] == expected
    assert choice.model_extra["prompt_token_ids"] == tokens
    assert choice.text == post(f"{url}/detokenize", {"tokens": expected}).json()["prompt"]
    assert result.usage is not None
    assert (result.usage.prompt_tokens, result.usage.completion_tokens) == (len(tokens), 16)


def test_top_logprobs_are_transformers_log_softmax(
    served: tuple[str, Path, Path], hf_models: dict[str, object]
) -> None:
    """Each position's 5 most likely tokens and their log-probabilities, as a chat carries them,
    against transformers' log-softmax on the same weights (one forward pass over the prompt and
    what was generated); a completion's have the same values, keyed by text. Measured: within
    2e-6; asserted within 1e-3, as a differently batched step once moved a few past 1e-4."""
    url, _, _ = served
    messages: list[ChatCompletionMessageParam] = [{"role": "user", "content": "where is it"}]
    prompt = post(f"{url}/tokenize", {"messages": messages}).json()["tokens"]
    chat = api(url).chat.completions.create(
        model=MODEL,
        messages=messages,
        max_tokens=6,
        temperature=0,
        logprobs=True,
        top_logprobs=5,
        extra_body={"ignore_eos": True, "return_token_ids": True},
    )
    choice = chat.choices[0]
    assert choice.model_extra is not None and choice.logprobs is not None
    generated = choice.model_extra["token_ids"]
    with torch.no_grad():
        logits = hf_models["llama"](torch.tensor([prompt + generated])).logits[0]  # type: ignore[operator]
    expected = torch.topk(torch.log_softmax(logits.float(), -1)[len(prompt) - 1 : -1], 5)
    content = choice.logprobs.content
    assert content is not None and len(content) == 6
    for entry, values, ids in zip(content, expected.values, expected.indices, strict=True):
        assert [a.logprob for a in entry.top_logprobs] == pytest.approx(values.tolist(), abs=1e-3)
        texts = post(f"{url}/detokenize", {"tokens": ids[:1].tolist()}).json()["prompt"]
        assert entry.top_logprobs[0].token == entry.token == texts  # greedy: the likeliest
        assert entry.logprob == pytest.approx(float(values[0]), abs=1e-3)
    completion = api(url).completions.create(
        model=MODEL, prompt=prompt, max_tokens=3, temperature=0, logprobs=2
    )
    logprobs = completion.choices[0].logprobs
    assert logprobs is not None and logprobs.top_logprobs and logprobs.tokens
    for alternatives, token, chosen in zip(
        logprobs.top_logprobs, logprobs.tokens, logprobs.token_logprobs or [], strict=True
    ):
        assert 1 <= len(alternatives) <= 3 and alternatives[token] == chosen  # chosen + top 2
        assert all(value <= 0 for value in alternatives.values())


def test_prompt_logprobs_are_transformers_log_softmax_whether_or_not_the_prompt_was_cached(
    served: tuple[str, Path, Path], hf_models: dict[str, object]
) -> None:
    """Each prompt token's log-probability given the tokens before it, its rank and the 3
    likeliest tokens there, from the prefill's own logits, against transformers' (asserted
    within 1e-3, as above); asked again (the prompt now in the prefix cache), the same: it is
    computed whole."""
    url, _, _ = served
    prompt = post(f"{url}/tokenize", {"prompt": "the parcel went to the depot by river"}).json()[
        "tokens"
    ]
    with torch.no_grad():
        logits = hf_models["llama"](torch.tensor([prompt])).logits[0]  # type: ignore[operator]
    expected = torch.log_softmax(logits.float(), -1)[:-1]  # position i predicts token i + 1
    answers = []
    for _ in range(2):
        result = api(url).completions.create(
            model=MODEL,
            prompt=prompt,
            max_tokens=1,
            extra_body={"prompt_logprobs": 3},
        )
        assert result.choices[0].model_extra is not None
        answers.append(result.choices[0].model_extra["prompt_logprobs"])
    for positions in answers:
        assert positions[0] is None and len(positions) == len(prompt)
        for index, (token, position) in enumerate(zip(prompt[1:], positions[1:], strict=True)):
            row = expected[index]
            entry = position[str(token)]
            assert entry["logprob"] == pytest.approx(float(row[token]), abs=1e-3)
            assert entry["rank"] == int((row > row[token]).sum()) + 1
            top = torch.topk(row, 3)
            ranked = {int(i): float(v) for i, v in zip(top.indices, top.values, strict=True)}
            for other, value in ranked.items():
                assert position[str(other)]["logprob"] == pytest.approx(value, abs=1e-3)


def test_chat_uses_the_models_template_and_streams_what_it_returns_whole(
    served: tuple[str, Path, Path],
) -> None:
    url, _, _ = served
    messages = [{"role": "user", "content": "where is the parcel"}]
    rendered = post(f"{url}/tokenize", {"messages": messages}).json()["tokens"]
    assert rendered[:2] == [0, 2]  # BOS then <|start_header_id|>, as the template writes them
    client = api(url)
    kwargs: dict[str, Any] = {
        "model": MODEL,
        "messages": messages,
        "max_tokens": 12,
        "temperature": 0,
        "seed": 1,
    }
    whole = client.chat.completions.create(**kwargs)
    chunks = list(client.chat.completions.create(stream=True, **kwargs))
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert streamed == whole.choices[0].message.content
    assert whole.usage is not None and whole.usage.prompt_tokens == len(rendered)


def test_logprobs_of_the_chosen_tokens_and_a_stop_string(served: tuple[str, Path, Path]) -> None:
    url, _, _ = served
    client = api(url)
    base: dict[str, Any] = {
        "model": MODEL,
        "prompt": "the gateway",
        "max_tokens": 20,
        "temperature": 0,
    }
    full = client.completions.create(**base, logprobs=0, extra_body={"ignore_eos": True})
    logprobs = full.choices[0].logprobs
    assert logprobs is not None and logprobs.token_logprobs is not None
    assert len(logprobs.token_logprobs) == 20 and all(lp <= 0 for lp in logprobs.token_logprobs)
    text = full.choices[0].text
    stop = text[8:11]
    cut = client.completions.create(**base, stop=[stop], extra_body={"ignore_eos": True})
    assert cut.choices[0].text == text[: text.find(stop)]
    assert cut.choices[0].finish_reason == "stop"


def test_lora_adapters_load_serve_and_unload_and_a_broken_one_is_refused(
    served: tuple[str, Path, Path], tmp_path: Path
) -> None:
    url, base, adapter = served
    broken = tmp_path / "broken"
    shutil.copytree(adapter, broken)
    (broken / "adapter_model.safetensors").write_bytes(b"garbage")
    refused = post(f"{url}/v1/load_lora_adapter", {"lora_name": "bad", "lora_path": str(broken)})
    assert refused.status_code == 400 and "adapter_model.safetensors" in refused.text
    loaded = post(f"{url}/v1/load_lora_adapter", {"lora_name": "sql", "lora_path": str(adapter)})
    assert loaded.status_code == 200
    tokens = post(f"{url}/tokenize", {"prompt": "select count"}).json()["tokens"]
    result = api(url).completions.create(
        model="sql",
        prompt=tokens,
        max_tokens=10,
        temperature=0,
        extra_body={"ignore_eos": True, "return_token_ids": True},
    )
    assert result.choices[0].model_extra is not None
    assert result.choices[0].model_extra["token_ids"] == hf_greedy(
        merged(base, adapter), tokens, 10
    )
    info = scrape(url)["vllm:lora_requests_info"]
    assert all(sample.labels["max_lora"] == "1" for sample in info)
    assert post(f"{url}/v1/unload_lora_adapter", {"lora_name": "sql"}).status_code == 200
    with pytest.raises(openai.NotFoundError):
        api(url).completions.create(model="sql", prompt="x", max_tokens=1)
    assert api(url).completions.create(model=MODEL, prompt="still serving", max_tokens=2).choices


def test_a_stream_carries_the_token_ids_and_logprobs_of_each_delta(
    served: tuple[str, Path, Path],
) -> None:
    url, _, _ = served
    client = api(url)
    body: dict[str, Any] = {
        "model": MODEL,
        "prompt": "the river",
        "max_tokens": 12,
        "temperature": 0,
        "logprobs": 0,
    }
    extra = {"ignore_eos": True, "return_token_ids": True}
    whole = client.completions.create(**body, extra_body=extra).choices[0]
    chunks = [
        c for c in client.completions.create(**body, stream=True, extra_body=extra) if c.choices
    ]
    streamed_ids: list[int] = []
    streamed_logprobs: list[float] = []
    for chunk in chunks:
        choice = chunk.choices[0]
        assert choice.model_extra is not None
        streamed_ids += choice.model_extra.get("token_ids") or []
        if choice.logprobs is not None and choice.logprobs.token_logprobs:
            streamed_logprobs += choice.logprobs.token_logprobs
    assert whole.model_extra is not None and whole.logprobs is not None
    assert streamed_ids == whole.model_extra["token_ids"]
    assert streamed_logprobs == pytest.approx(whole.logprobs.token_logprobs)
    first = chunks[0].choices[0].model_extra
    assert first is not None and first["prompt_token_ids"] == whole.model_extra["prompt_token_ids"]


def test_health_fails_once_the_engine_process_is_gone() -> None:
    import os
    import signal
    import time
    import urllib.request

    from loadtest.harness.proc_stats import children

    port = free_port()
    args = (
        "--preset",
        "tiny",
        "--kv-cache-memory",
        "16MiB",
        "--max-model-len",
        "512",
        "--engine-process",
    )
    with backend_process(port, *args, model=MODEL, runner="torch") as server:
        assert server.proc is not None
        url = f"http://127.0.0.1:{port}"
        with urllib.request.urlopen(f"{url}/health", timeout=10) as response:
            assert response.status == 200
        engines = children(server.proc.pid)  # the engine (and multiprocessing's tracker)
        assert engines, "the engine process runs as a child of the server"
        for pid in engines:
            os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 10
        reply = Reply(200, "")
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(f"{url}/health", timeout=10) as response:
                    status = response.status
            except urllib.error.HTTPError as exc:
                status = exc.code
                reply = Reply(status, exc.read().decode())
            if status == 503:
                break
            time.sleep(0.2)
        assert reply.status_code == 503 and "not running" in reply.text
