"""Request parsing: what OpenAI allows is accepted, everything else names its parameter."""

from __future__ import annotations

import pytest

from backends.server.protocol import RequestError, parse_request
from kvgate.wire.request_tokenizer import ReferenceTokenizer

TOK = ReferenceTokenizer()


def parse(body: object, chat: bool = False):  # type: ignore[no-untyped-def]
    return parse_request(body, TOK, is_chat=chat, default_max_tokens=16)


@pytest.mark.parametrize(
    ("prompt", "expected"),
    [
        ("ab", [[97, 98]]),
        (["a", "b"], [[97], [98]]),
        ([1, 2, 3], [[1, 2, 3]]),
        ([[1, 2], [3]], [[1, 2], [3]]),
        (["a", [5]], [[97], [5]]),
    ],
)
def test_prompt_forms(prompt: object, expected: list[list[int]]) -> None:
    assert parse({"model": "m", "prompt": prompt}).prompts == expected


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ([], None),
        ({"prompt": "x"}, "model"),
        ({"model": "m"}, "prompt"),
        ({"model": "m", "prompt": ""}, "prompt"),
        ({"model": "m", "prompt": []}, "prompt"),
        ({"model": "m", "prompt": [1, 999]}, "prompt"),
        ({"model": "m", "prompt": [True]}, "prompt"),
        ({"model": "m", "prompt": {"a": 1}}, "prompt"),
        ({"model": "m", "prompt": "x", "max_tokens": "9"}, "max_tokens"),
        ({"model": "m", "prompt": "x", "max_tokens": 0}, "max_tokens"),
        ({"model": "m", "prompt": "x", "max_tokens": -3}, "max_tokens"),
        ({"model": "m", "prompt": "x", "top_p": 0}, "top_p"),
        ({"model": "m", "prompt": "x", "temperature": "hot"}, "temperature"),
        ({"model": "m", "prompt": "x", "n": 0}, "n"),
        ({"model": "m", "prompt": "x", "n": 129}, "n"),
        ({"model": "m", "prompt": "x", "stream": "yes"}, "stream"),
        ({"model": "m", "prompt": "x", "stop": [1]}, "stop"),
        ({"model": "m", "prompt": "x", "stream_options": 3}, "stream_options"),
        ({"model": "m", "prompt": "x", "cache_salt": ""}, "cache_salt"),
        ({"model": "m", "prompt": "x", "cache_salt": 7}, "cache_salt"),
        ({"model": "m", "prompt": "x", "top_k": -2}, "top_k"),
        ({"model": "m", "prompt": "x", "min_tokens": 99}, "min_tokens"),
        ({"model": "m", "prompt": "x", "stop_token_ids": ["a"]}, "stop_token_ids"),
        ({"model": "m", "prompt": "x", "logprobs": 21}, "logprobs"),
        ({"model": "m", "prompt": "x", "logprobs": -1}, "logprobs"),
        ({"model": "m", "prompt": "x", "logprobs": True}, "logprobs"),
        ({"model": "m", "prompt": "x", "prompt_logprobs": 21}, "prompt_logprobs"),
        ({"model": "m", "prompt": "x", "prompt_logprobs": 1, "stream": True}, "prompt_logprobs"),
        ({"model": "m", "prompt": "x", "seed": 2**63}, "seed"),  # vLLM: a torch.long
        ({"model": "m", "prompt": "x", "seed": -(2**63) - 1}, "seed"),
    ],
)
def test_bad_completion_requests(body: object, param: str | None) -> None:
    with pytest.raises(RequestError) as err:
        parse(body)
    assert err.value.status == 400
    assert err.value.param == param


def test_n_samples_of_each_prompt() -> None:
    assert parse({"model": "m", "prompt": ["a", "b"], "n": 3}).n == 3


def test_logprobs_and_their_alternatives_are_read_as_vllm_reads_them() -> None:
    sampling = parse({"model": "m", "prompt": "x", "logprobs": 5}).sampling
    assert (sampling.logprobs, sampling.top_logprobs) == (True, 5)
    sampling = parse({"model": "m", "prompt": "x", "logprobs": 0}).sampling
    assert (sampling.logprobs, sampling.top_logprobs) == (True, 0)
    chat = {"model": "m", "messages": [{"role": "user", "content": "x"}]}
    sampling = parse({**chat, "logprobs": True, "top_logprobs": 20}, chat=True).sampling
    assert (sampling.logprobs, sampling.top_logprobs) == (True, 20)
    for bad, param in (
        ({"top_logprobs": 2}, "top_logprobs"),  # without logprobs
        ({"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
        ({"logprobs": 1}, "logprobs"),
    ):
        with pytest.raises(RequestError) as err:
            parse({**chat, **bad}, chat=True)
        assert err.value.param == param


def test_a_seed_at_either_end_of_64_bits_is_accepted() -> None:
    for seed in (2**63 - 1, -(2**63)):
        assert parse({"model": "m", "prompt": "x", "seed": seed}).sampling.seed == seed


@pytest.mark.parametrize(
    "messages",
    [None, [], ["hi"], [{"content": "x"}], [{"role": "user", "content": [{"type": "image_url"}]}]],
)
def test_bad_chat_messages(messages: object) -> None:
    with pytest.raises(RequestError):
        parse({"model": "m", "messages": messages}, chat=True)


def test_an_unknown_role_is_refused_naming_the_message() -> None:
    messages = [{"role": "user", "content": "hi"}, {"role": "wizard", "content": "abracadabra"}]
    with pytest.raises(RequestError) as err:
        parse({"model": "m", "messages": messages}, chat=True)
    assert err.value.status == 400 and err.value.param == "messages[1].role"
    assert "'wizard'" in str(err.value)


def test_chat_renders_all_messages_and_prefers_max_completion_tokens() -> None:
    body = {
        "model": "m",
        "messages": [
            {"role": "system", "content": "S"},
            {"role": "user", "content": [{"type": "text", "text": "U"}]},
        ],
        "max_tokens": 5,
        "max_completion_tokens": 7,
        "stream": True,
        "stream_options": {"include_usage": True},
        "stop": "END",
    }
    req = parse(body, chat=True)
    text = bytes(req.prompts[0]).decode()
    assert (
        text
        == "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nU<|im_end|>\n<|im_start|>assistant\n"
    )
    assert req.sampling.max_tokens == 7 and req.stream and req.include_usage
    assert req.stop == ("END",)


def test_continue_final_message_goes_on_with_the_assistant_s_message() -> None:
    """vLLM's ``continue_final_message``: no generation prompt, the final message left open."""
    messages = [{"role": "user", "content": "U"}, {"role": "assistant", "content": "Once up"}]
    body = {"model": "m", "messages": messages, "continue_final_message": True}
    refused = {**body, "add_generation_prompt": True}
    req = parse({**body, "add_generation_prompt": False}, chat=True)
    text = bytes(req.prompts[0]).decode()
    assert text == "<|im_start|>user\nU<|im_end|>\n<|im_start|>assistant\nOnce up"
    with pytest.raises(RequestError) as err:
        parse(body, chat=True)  # add_generation_prompt is true unless said otherwise
    assert err.value.param == "continue_final_message"
    with pytest.raises(RequestError):
        parse(refused, chat=True)
